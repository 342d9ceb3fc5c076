"""Read an ``.onnx`` file without holding its initializers' bytes in the parsed protobuf.

Parsing a whole ModelProto keeps every initializer's ``raw_data`` alive in the message, next
to the file's bytes, the numpy value decoded from it and the device copy of that: four copies
of the weights at once. Here the file is walked at the protobuf wire level instead: every field
is copied into a *stripped* serialization except the ``raw_data`` of the main graph's
initializers, whose position in the file is recorded. Each initializer is then read straight
from the file into its own 64-byte aligned numpy buffer (which ``jax.device_put`` on CPU adopts
without a copy), one at a time.

Only the wire format is interpreted (tags, varints, lengths); the stripped bytes are parsed by
protobuf itself, so anything unusual (groups, a truncated file) makes :func:`read_model` give up
and the caller falls back to an ordinary parse, which reports the problem as before.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import onnx

__all__ = ["InlineData", "WireError", "aligned_empty", "pread_into", "read_model"]

# Field numbers (onnx.proto3): ModelProto.graph, GraphProto.initializer, TensorProto.raw_data.
_MODEL_GRAPH, _GRAPH_INITIALIZER, _TENSOR_RAW_DATA = 7, 5, 9
_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5
# Reads of the file's small fields go through a window this large (fewer system calls).
_WINDOW = 1 << 16
ALIGNMENT = 64


class WireError(Exception):
    """The file is not wire-format protobuf this walker handles; parse it the ordinary way."""


def aligned_empty(nbytes: int) -> np.ndarray:
    """An uninitialized uint8 buffer of ``nbytes`` starting at a 64-byte boundary.

    XLA's CPU client adopts such a buffer as a device array without copying it.
    """
    raw = np.empty(nbytes + ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    return raw[start : start + nbytes]


class _File:
    """Exact positional reads of a file, with a small read-ahead window for the small fields."""

    def __init__(self, fd: int, size: int):
        self.fd, self.size = fd, size
        self._start, self._buf = 0, b""

    def read(self, offset: int, n: int) -> bytes:
        if n < 0 or offset + n > self.size:
            raise WireError("a field runs past the end of the file")
        end = self._start + len(self._buf)
        if self._start <= offset and offset + n <= end:
            return self._buf[offset - self._start : offset - self._start + n]
        if n <= _WINDOW:
            self._start, self._buf = offset, self._pread(offset, min(_WINDOW, self.size - offset))
            return self._buf[:n]
        return self._pread(offset, n)

    def _pread(self, offset: int, n: int) -> bytes:
        chunks, done = [], 0
        while done < n:
            chunk = os.pread(self.fd, min(n - done, 1 << 30), offset + done)
            if not chunk:
                raise WireError("the file ended early (changed while read?)")
            chunks.append(chunk)
            done += len(chunk)
        return b"".join(chunks)

    def varint(self, offset: int) -> tuple[int, int]:
        data = self.read(offset, min(10, self.size - offset))
        value = 0
        for i, byte in enumerate(data):
            value |= (byte & 0x7F) << (7 * i)
            if byte < 0x80:
                return value, offset + i + 1
        raise WireError("a malformed varint")


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field_end(f: _File, wire_type: int, pos: int) -> tuple[int, int]:
    """The (payload start, end) of a field whose value starts at ``pos``."""
    if wire_type == _VARINT:
        return pos, f.varint(pos)[1]
    if wire_type == _FIXED64:
        return pos, pos + 8
    if wire_type == _FIXED32:
        return pos, pos + 4
    if wire_type == _LENGTH:
        length, start = f.varint(pos)
        return start, start + length
    raise WireError(f"wire type {wire_type} (groups) is not handled")


def _walk(f: _File, start: int, end: int, visit) -> bytes:
    """Copy the fields of the message at ``[start, end)``; ``visit`` may replace a field's bytes."""
    out = bytearray()
    pos = start
    while pos < end:
        tag, value_pos = f.varint(pos)
        field, wire_type = tag >> 3, tag & 7
        if field == 0:
            raise WireError("field number 0")
        payload, field_end = _field_end(f, wire_type, value_pos)
        if field_end > end:
            raise WireError("a field runs past its message")
        replaced = visit(field, wire_type, payload, field_end) if visit else None
        if replaced is None:
            out += f.read(pos, field_end - pos)
        else:
            out += replaced
        pos = field_end
    if pos != end:
        raise WireError("a message's fields overrun its length")
    return bytes(out)


def _length_field(field: int, payload: bytes) -> bytes:
    return _varint_bytes(field << 3 | _LENGTH) + _varint_bytes(len(payload)) + payload


def pread_into(fd: int, buffer: np.ndarray, offset: int) -> None:
    """Fill the contiguous uint8 ``buffer`` from ``fd`` at ``offset`` (pread: no shared position).

    Raises:
        OSError: the file ended before the buffer was full (changed while read?).
    """
    view = memoryview(buffer).cast("B")
    done, length = 0, len(view)
    while done < length:
        n = os.preadv(fd, [view[done : min(length, done + (1 << 30))]], offset + done)
        if n <= 0:
            raise OSError("the file ended early (changed while read?)")
        done += n


class InlineData:
    """Where each main-graph initializer's ``raw_data`` lies in the model file.

    Attributes:
        spans: per initializer of the main graph, in order, ``(offset, length)`` of its
            ``raw_data`` bytes in the file, or None where it had none.
    """

    def __init__(self, fd: int, spans: Sequence[tuple[int, int] | None]):
        self._fd = fd
        self.spans = tuple(spans)

    def read_into(self, buffer: np.ndarray, span: tuple[int, int]) -> None:
        """Fill the uint8 ``buffer`` (exactly ``span``'s length) from the file."""
        pread_into(self._fd, buffer, span[0])

    def read_bytes(self, span: tuple[int, int]) -> bytes:
        buffer = np.empty(span[1], np.uint8)
        self.read_into(buffer, span)
        return buffer.tobytes()

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def read_model(path: str) -> tuple[onnx.ModelProto, InlineData]:
    """The model at ``path`` without its main-graph initializers' ``raw_data``, and where that is.

    The returned :class:`InlineData` keeps the file open: close it when done.

    Raises:
        OSError: the file cannot be opened or read.
        WireError: the file is not protobuf this walker handles (parse it whole instead).
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOCTTY", 0))
    try:
        f = _File(fd, os.fstat(fd).st_size)
        spans: list[tuple[int, int] | None] = []
        found: list[tuple[int, int] | None] = [None]  # the current tensor's raw_data span

        def tensor(field, wire_type, payload, field_end):
            if field == _TENSOR_RAW_DATA and wire_type == _LENGTH:
                found[0] = (payload, field_end - payload)  # the last one wins, as in protobuf
                return b""
            return None

        def graph(field, wire_type, payload, field_end):
            if field == _GRAPH_INITIALIZER and wire_type == _LENGTH:
                found[0] = None
                stripped = _walk(f, payload, field_end, tensor)
                spans.append(found[0])
                return _length_field(field, stripped)
            return None

        def model(field, wire_type, payload, field_end):
            if field == _MODEL_GRAPH and wire_type == _LENGTH:
                return _length_field(field, _walk(f, payload, field_end, graph))
            return None

        stripped = _walk(f, 0, f.size, model)
        proto = onnx.ModelProto()
        try:
            proto.ParseFromString(stripped)
        except Exception as e:  # any parse failure: the ordinary path reports it
            raise WireError(str(e)) from e
        if len(proto.graph.initializer) != len(spans):
            raise WireError("initializers found and parsed differ")
    except BaseException:
        os.close(fd)
        raise
    return proto, InlineData(fd, spans)
