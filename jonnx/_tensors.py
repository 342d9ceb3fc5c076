"""TensorProto -> numpy, with external data read safely from inside the model's folder."""

from __future__ import annotations

import errno
import math
import os
import re
import stat
import sys

import numpy as np
import onnx
import onnx.helper
import onnx.numpy_helper

from jonnx import errors
from jonnx._wire import InlineData, aligned_empty, pread_into

__all__ = ["inline_tensor_to_numpy", "np_dtype", "sparse_to_numpy", "tensor_to_numpy"]

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
_DECIMAL = re.compile(r"-?[0-9]+")


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
    """Open ``location`` for reading, refusing anything that resolves outside ``base_dir``.

    Each folder on the way is opened relative to the previous one with ``O_NOFOLLOW``, so a
    symbolic link swapped in after the checks is refused too; the file is opened
    non-blocking, so a FIFO or device in its place cannot hang the load.
    """
    if not location:
        raise errors.ExternalDataError(f"{what}: external data has an empty location")
    if "\0" in location:
        raise errors.ExternalDataError(f"{what}: external data location contains a NUL byte")
    if os.path.isabs(location) or location.startswith(("/", "\\")) or ":" in location:
        raise errors.ExternalDataError(
            f"{what}: external data location {location!r} is absolute; only paths inside the model's folder are read"
        )
    parts = [p for p in location.replace("\\", "/").split("/") if p not in ("", ".")]
    if ".." in parts:
        raise errors.ExternalDataError(f"{what}: external data location {location!r} climbs out of the model's folder")
    if not parts:
        raise errors.ExternalDataError(f"{what}: external data location {location!r} names no file")
    base = os.path.realpath(base_dir)
    path = base
    for part in parts:
        path = os.path.join(path, part)
        if os.path.islink(path):
            raise errors.ExternalDataError(f"{what}: external data location {location!r} goes through a symbolic link")
    if os.path.commonpath([base, os.path.realpath(path)]) != base:
        raise errors.ExternalDataError(
            f"{what}: external data location {location!r} resolves outside the model's folder"
        )
    nofollow = getattr(os, "O_NOFOLLOW", 0)
    flags = os.O_RDONLY | nofollow | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    folder_flags = os.O_RDONLY | nofollow | getattr(os, "O_DIRECTORY", 0)
    fd = -1
    try:
        if os.open in os.supports_dir_fd:
            fd = os.open(base, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
            for i, part in enumerate(parts):
                last = i == len(parts) - 1
                child = os.open(part, flags if last else folder_flags, dir_fd=fd)
                os.close(fd)
                fd = child
        else:  # no openat (Windows): the checks above stand alone
            fd = os.open(path, flags)
    except OSError as e:
        if fd >= 0:
            os.close(fd)
        if e.errno == errno.ELOOP:
            reason = "goes through a symbolic link"
        else:
            reason = f"cannot be opened: {e.strerror}"
        raise errors.ExternalDataError(f"{what}: cannot open external data file {location!r}: it {reason}") from e
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


def _parse_count(value: str | None, key: str, what: str) -> int | None:
    if value is None:
        return None
    text = value.strip()
    if not _DECIMAL.fullmatch(text):
        raise errors.ExternalDataError(f"{what}: external data {key} {value!r} is not an integer")
    number = int(text)
    if number < 0:
        raise errors.ExternalDataError(f"{what}: negative external data {key} {number}")
    return number


def _read_external(tensor: onnx.TensorProto, base_dir: str | None, what: str, memory_limit: int | None) -> np.ndarray:
    info: dict[str, str] = {}
    for entry in tensor.external_data:
        if entry.key not in _EXTERNAL_KEYS:
            raise errors.ExternalDataError(f"{what}: unknown external data key {entry.key!r}")
        if entry.key in info:
            raise errors.ExternalDataError(f"{what}: external data key {entry.key!r} is given twice")
        info[entry.key] = entry.value
    if tensor.data_type in _UNCHECKED_RAW:
        raise errors.ExternalDataError(
            f"{what}: {onnx.TensorProto.DataType.Name(tensor.data_type)} tensors cannot keep "
            "their data in an external file"
        )
    if base_dir is None:
        raise errors.ExternalDataError(
            f"{what} keeps its data in an external file, but the model was not loaded from "
            "a path: call jonnx.load(path) or pass base_dir="
        )
    offset = _parse_count(info.get("offset"), "offset", what) or 0
    length = _parse_count(info.get("length"), "length", what)
    expected = _expected_nbytes(tensor, _element_count(tensor, what))
    if length is not None and length != expected:
        raise errors.ExternalDataError(
            f"{what}: external data length {length} does not match its dims "
            f"{list(tensor.dims)} and dtype ({expected} bytes)"
        )
    _check_limit(expected, memory_limit, what)
    fd = _open_inside(base_dir, info.get("location", ""), what)
    try:
        size = os.fstat(fd).st_size
        if offset + expected > size:
            raise errors.ExternalDataError(
                f"{what}: external data needs bytes {offset}..{offset + expected} but "
                f"{info['location']!r} has only {size}"
            )
        # pread, not mmap: a file truncated while it is read gives a short read here, where a
        # mapping would kill the process with SIGBUS. Read straight into an aligned buffer,
        # which becomes the tensor's memory (and, on CPU, its device array's) without a copy.
        buffer = aligned_empty(expected)
        try:
            pread_into(fd, buffer, offset)
        except OSError:
            raise errors.ExternalDataError(
                f"{what}: external data file {info['location']!r} ended early (changed while read?)"
            ) from None
        return buffer
    finally:
        os.close(fd)


def _check_limit(nbytes: int, memory_limit: int | None, what: str) -> None:
    if memory_limit is not None and nbytes > memory_limit:
        raise errors.MemoryLimitError(
            f"{what} would take {nbytes:,} bytes, over the model's memory limit of "
            f"{memory_limit:,} bytes; pass a larger memory_limit to jonnx.load if this is intended"
        )


_TYPED_FIELDS = ("float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data")


def tensor_to_numpy(
    tensor: onnx.TensorProto, base_dir: str | None = None, *, memory_limit: int | None = None
) -> np.ndarray:
    """Decode ``tensor`` to numpy, checking its byte count against its dims.

    Args:
        tensor: the ONNX tensor.
        base_dir: the model's folder, for external data; None when the model came from bytes.
        memory_limit: the largest external tensor, in bytes, that may be read (None: no limit).
            Inline data is bounded by the model file's own size.

    Returns:
        The tensor's value (strings as an object array).

    Raises:
        jonnx.errors.LoadError: the data does not match the dims, or the type is unknown.
        jonnx.errors.ExternalDataError: external data is missing, malformed or unsafe.
        jonnx.errors.MemoryLimitError: external data larger than ``memory_limit``.
    """
    what = _describe(tensor)
    try:
        np_dtype(tensor.data_type)
    except errors.LoadError:
        raise errors.LoadError(f"{what} has unknown element type {tensor.data_type}") from None
    count = _element_count(tensor, what)
    typed = [field for field in _TYPED_FIELDS if len(getattr(tensor, field))]
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        if typed or tensor.HasField("raw_data"):
            raise errors.LoadError(f"{what} has both external data and inline data ({(typed or ['raw_data'])[0]})")
        raw = _read_external(tensor, base_dir, what, memory_limit)
        if _plain_raw(tensor):
            return _view(raw, tensor)
        inline = onnx.TensorProto()
        inline.CopyFrom(tensor)
        del inline.external_data[:]
        inline.data_location = onnx.TensorProto.DEFAULT
        inline.raw_data = raw.tobytes()
        tensor = inline
    elif tensor.external_data:
        raise errors.ExternalDataError(f"{what} has external data entries but its data_location is not EXTERNAL")
    elif tensor.HasField("raw_data"):
        if typed:
            raise errors.LoadError(f"{what} has both raw_data and {typed[0]}; ONNX allows one")
        if tensor.data_type not in _UNCHECKED_RAW:
            expected = _expected_nbytes(tensor, count)
            if len(tensor.raw_data) != expected:
                raise errors.LoadError(
                    f"{what} has {len(tensor.raw_data)} bytes of raw_data but its dims "
                    f"{list(tensor.dims)} and dtype need {expected}"
                )
    elif len(typed) > 1:
        raise errors.LoadError(f"{what} has data in both {typed[0]} and {typed[1]}; ONNX allows one")
    elif not typed and count:
        raise errors.LoadError(f"{what} has dims {list(tensor.dims)} ({count} values) but no data")
    try:
        value = onnx.numpy_helper.to_array(tensor)
    except Exception as e:  # onnx raises ValueError, TypeError, KeyError... on bad tensors
        raise errors.LoadError(f"{what} cannot be decoded (dims {list(tensor.dims)}): {e}") from e
    if value.size != count:
        raise errors.LoadError(f"{what} holds {value.size} values but its dims {list(tensor.dims)} need {count}")
    return value


def _plain_raw(tensor: onnx.TensorProto) -> bool:
    """Whether ``tensor``'s raw bytes are its numpy value as they are (one element per item)."""
    return (
        sys.byteorder == "little"
        and tensor.data_type not in _FOUR_BIT | _TWO_BIT | _UNCHECKED_RAW
        and not tensor.HasField("segment")
    )


def _view(raw: np.ndarray, tensor: onnx.TensorProto) -> np.ndarray:
    value = raw.view(np_dtype(tensor.data_type)).reshape(tuple(tensor.dims))
    # The buffer may become a device array's memory (jax.device_put adopts aligned buffers on
    # CPU): nothing may write to it.
    value.flags.writeable = False
    return value


def inline_tensor_to_numpy(tensor: onnx.TensorProto, source: InlineData, span: tuple[int, int]) -> np.ndarray:
    """Decode ``tensor``, whose ``raw_data`` was left in the model file at ``span``.

    The bytes go straight from the file into a 64-byte aligned buffer, which is the returned
    array's memory: no protobuf or ``bytes`` copy of them is made.

    Raises:
        jonnx.errors.LoadError: as :func:`tensor_to_numpy`.
    """
    what = _describe(tensor)
    try:
        np_dtype(tensor.data_type)
    except errors.LoadError:
        raise errors.LoadError(f"{what} has unknown element type {tensor.data_type}") from None
    count = _element_count(tensor, what)
    if not _plain_raw(tensor) or tensor.data_location == onnx.TensorProto.EXTERNAL or tensor.external_data:
        # Rare forms (packed, strings, big-endian, raw_data next to external data): decode
        # them with their bytes put back, through the checks of the ordinary path.
        full = onnx.TensorProto()
        full.CopyFrom(tensor)
        full.raw_data = source.read_bytes(span)
        return tensor_to_numpy(full)
    typed = [field for field in _TYPED_FIELDS if len(getattr(tensor, field))]
    if typed:
        raise errors.LoadError(f"{what} has both raw_data and {typed[0]}; ONNX allows one")
    expected = _expected_nbytes(tensor, count)
    if span[1] != expected:
        raise errors.LoadError(
            f"{what} has {span[1]} bytes of raw_data but its dims {list(tensor.dims)} and dtype need {expected}"
        )
    buffer = aligned_empty(expected)
    try:
        source.read_into(buffer, span)
    except OSError as e:
        raise errors.LoadError(f"{what}: cannot read its data from the model file: {e}") from e
    return _view(buffer, tensor)


def sparse_to_numpy(
    sparse: onnx.SparseTensorProto, base_dir: str | None = None, *, memory_limit: int | None = None
) -> np.ndarray:
    """Decode ``sparse`` to a dense numpy array, checking its indices and dense size.

    Args:
        sparse: the ONNX sparse tensor (an initializer or an attribute value).
        base_dir, memory_limit: as for :func:`tensor_to_numpy`; the dense array also counts
            against ``memory_limit``.

    Raises:
        jonnx.errors.LoadError: the values or indices do not fit the dims.
        jonnx.errors.MemoryLimitError: the dense array would be larger than ``memory_limit``.
    """
    what = f"sparse tensor {sparse.values.name!r}"
    values = tensor_to_numpy(sparse.values, base_dir, memory_limit=memory_limit)
    indices = tensor_to_numpy(sparse.indices, base_dir, memory_limit=memory_limit)
    dims = tuple(int(d) for d in sparse.dims)
    if any(d < 0 for d in dims):
        raise errors.LoadError(f"{what} has negative dims {list(dims)}")
    if values.ndim != 1:
        raise errors.LoadError(f"{what}: values must be 1-D, not of shape {values.shape}")
    if indices.dtype.kind not in "iu":
        raise errors.LoadError(f"{what}: indices must be integers, not {indices.dtype}")
    nnz = values.shape[0]
    if indices.shape not in ((nnz,), (nnz, len(dims))):
        raise errors.LoadError(
            f"{what}: indices of shape {indices.shape} do not fit {nnz} values of a "
            f"rank-{len(dims)} tensor (want ({nnz},) or ({nnz}, {len(dims)}))"
        )
    size = math.prod(dims)
    nbytes = size * values.dtype.itemsize
    if memory_limit is not None and nbytes > memory_limit:
        raise errors.MemoryLimitError(
            f"{what} with dims {list(dims)} would take {nbytes:,} bytes when densified, over "
            f"the model's memory limit of {memory_limit:,} bytes; pass a larger "
            "memory_limit to jonnx.load if this is intended"
        )
    indices = indices.astype(np.int64)
    bounds = np.array([size] if indices.ndim == 1 else dims, dtype=object)
    if indices.size and (indices.min() < 0 or np.any(indices.max(axis=0).astype(object) >= bounds)):
        raise errors.LoadError(f"{what} has out-of-range indices for dims {list(dims)}")
    try:
        dense = np.zeros(dims, dtype=values.dtype)
    except (MemoryError, ValueError) as e:
        raise errors.LoadError(f"{what} with dims {list(dims)} cannot be densified: {e}") from e
    if indices.ndim == 1:
        dense.reshape(-1)[indices] = values
    else:
        dense[tuple(indices.T)] = values
    return dense
