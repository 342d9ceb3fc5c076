"""TensorProto -> numpy, with external data read safely from inside the model's folder."""

from __future__ import annotations

import math
import mmap
import os
import stat

import numpy as np
import onnx
import onnx.helper
import onnx.numpy_helper

from jonnx import errors

__all__ = ["np_dtype", "tensor_to_numpy"]

_FOUR_BIT = {
    onnx.TensorProto.INT4,
    onnx.TensorProto.UINT4,
    getattr(onnx.TensorProto, "FLOAT4E2M1", -1),
}
_TWO_BIT = {getattr(onnx.TensorProto, n, -1) for n in ("INT2", "UINT2")}
# Packing of the 6-bit floats is left to onnx.numpy_helper, which checks it itself.
_SIX_BIT = {getattr(onnx.TensorProto, n, -1) for n in ("FLOAT6E2M3", "FLOAT6E3M2")}
_UNCHECKED_RAW = _SIX_BIT | {onnx.TensorProto.STRING}
_EXTERNAL_KEYS = frozenset({"location", "offset", "length", "checksum", "basepath"})


def np_dtype(elem_type: int) -> np.dtype:
    """The numpy dtype (ml_dtypes for bfloat16/float8/int4) of an ONNX element type."""
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, TypeError, ValueError) as e:
        raise errors.LoadError(f"unknown ONNX element type {elem_type}") from e


def _expected_nbytes(tensor: onnx.TensorProto, count: int) -> int:
    if tensor.data_type in _FOUR_BIT:
        return (count + 1) // 2
    if tensor.data_type in _TWO_BIT:
        return (count + 3) // 4
    return count * np_dtype(tensor.data_type).itemsize


def _element_count(tensor: onnx.TensorProto, what: str) -> int:
    dims = list(tensor.dims)
    if any(d < 0 for d in dims):
        raise errors.LoadError(f"{what} has negative dims {dims}")
    return math.prod(dims)


def _describe(tensor: onnx.TensorProto) -> str:
    return f"tensor {tensor.name!r}" if tensor.name else "an unnamed tensor"


def _open_inside(base_dir: str, location: str, what: str) -> int:
    """Open ``location`` for reading, refusing anything that resolves outside ``base_dir``."""
    if not location:
        raise errors.ExternalDataError(f"{what}: external data has an empty location")
    if "\0" in location:
        raise errors.ExternalDataError(f"{what}: external data location contains a NUL byte")
    if os.path.isabs(location) or location.startswith(("/", "\\")) or ":" in location:
        raise errors.ExternalDataError(
            f"{what}: external data location {location!r} is absolute; only paths inside "
            "the model's folder are read"
        )
    parts = location.replace("\\", "/").split("/")
    if ".." in parts:
        raise errors.ExternalDataError(
            f"{what}: external data location {location!r} climbs out of the model's folder"
        )
    base = os.path.realpath(base_dir)
    path = base
    for part in parts:
        if part in ("", "."):
            continue
        path = os.path.join(path, part)
        if os.path.islink(path):
            raise errors.ExternalDataError(
                f"{what}: external data location {location!r} goes through a symbolic link"
            )
    if os.path.commonpath([base, os.path.realpath(path)]) != base:
        raise errors.ExternalDataError(
            f"{what}: external data location {location!r} resolves outside the model's folder"
        )
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as e:
        raise errors.ExternalDataError(
            f"{what}: cannot open external data file {location!r}: {e.strerror}"
        ) from e
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise errors.ExternalDataError(f"{what}: external data {location!r} is not a regular file")
    if info.st_nlink > 1:
        os.close(fd)
        raise errors.ExternalDataError(
            f"{what}: external data file {location!r} has {info.st_nlink} hard links; "
            "refusing it, as a hard link can point outside the model's folder"
        )
    return fd


def _read_external(tensor: onnx.TensorProto, base_dir: str | None, what: str) -> bytes:
    info: dict[str, str] = {}
    for entry in tensor.external_data:
        if entry.key not in _EXTERNAL_KEYS:
            raise errors.ExternalDataError(f"{what}: unknown external data key {entry.key!r}")
        info[entry.key] = entry.value
    if base_dir is None:
        raise errors.ExternalDataError(
            f"{what} keeps its data in an external file, but the model was not loaded from "
            "a path: call jonnx.load(path) or pass base_dir="
        )
    try:
        offset = int(info.get("offset", "0"))
        length = int(info["length"]) if "length" in info else None
    except ValueError as e:
        raise errors.ExternalDataError(f"{what}: external data offset/length is not an integer") from e
    expected = _expected_nbytes(tensor, _element_count(tensor, what))
    if offset < 0 or (length is not None and length < 0):
        raise errors.ExternalDataError(f"{what}: negative external data offset or length")
    if length is not None and length != expected:
        raise errors.ExternalDataError(
            f"{what}: external data length {length} does not match its dims and dtype "
            f"({expected} bytes)"
        )
    fd = _open_inside(base_dir, info.get("location", ""), what)
    try:
        size = os.fstat(fd).st_size
        if offset + expected > size:
            raise errors.ExternalDataError(
                f"{what}: external data needs bytes {offset}..{offset + expected} but "
                f"{info['location']!r} has only {size}"
            )
        if expected == 0:
            return b""
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mapped:
            return bytes(mapped[offset : offset + expected])
    finally:
        os.close(fd)


def tensor_to_numpy(tensor: onnx.TensorProto, base_dir: str | None = None) -> np.ndarray:
    """Decode ``tensor`` to numpy, checking its byte count against its dims.

    Args:
        tensor: the ONNX tensor.
        base_dir: the model's folder, for external data; None when the model came from bytes.

    Returns:
        The tensor's value (strings as an object array).

    Raises:
        jonnx.errors.LoadError: the data does not match the dims, or the type is unknown.
        jonnx.errors.ExternalDataError: external data is missing, malformed or unsafe.
    """
    what = _describe(tensor)
    count = _element_count(tensor, what)
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        raw = _read_external(tensor, base_dir, what)
        inline = onnx.TensorProto()
        inline.CopyFrom(tensor)
        del inline.external_data[:]
        inline.data_location = onnx.TensorProto.DEFAULT
        inline.raw_data = raw
        tensor = inline
    elif tensor.HasField("raw_data") and tensor.data_type not in _UNCHECKED_RAW:
        expected = _expected_nbytes(tensor, count)
        if len(tensor.raw_data) != expected:
            raise errors.LoadError(
                f"{what} has {len(tensor.raw_data)} bytes of raw_data but its dims "
                f"{list(tensor.dims)} and dtype need {expected}"
            )
    try:
        value = onnx.numpy_helper.to_array(tensor)
    except Exception as e:  # onnx raises ValueError, TypeError, KeyError... on bad tensors
        raise errors.LoadError(f"{what} cannot be decoded: {e}") from e
    if value.size != count:
        raise errors.LoadError(f"{what} holds {value.size} values but its dims {list(tensor.dims)} need {count}")
    return value
