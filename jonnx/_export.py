"""``jonnx.save``: write a model, with new parameters and running statistics, back to ONNX."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import jax
import numpy as np
import onnx
import onnx.helper
import onnx.numpy_helper

from jonnx import errors
from jonnx._attributes import attribute_graphs
from jonnx._build import field_is_repeated
from jonnx._inference_graph import to_inference
from jonnx._ir import Graph
from jonnx._state import StateSlot
from jonnx._tensors import np_dtype

__all__ = ["copy_except", "detach_initializers", "inline_external", "save", "serialize_with"]

# Protobuf cannot serialize a message of 2 GiB or more.
PROTOBUF_LIMIT = 2**31 - 1
# Smaller tensors stay inline, as onnx's and onnxruntime's own writers do.
_MIN_EXTERNAL_BYTES = 1024
# Offsets in the data file: page-aligned for large tensors (so a runtime can mmap them),
# 64-byte aligned for the rest.
_PAGE, _LARGE, _ALIGN = 4096, 1 << 20, 64
# Upper bound on what putting one tensor's raw bytes back adds besides the bytes themselves
# (field tag and varint lengths of the tensor and its enclosing messages).
_PER_TENSOR_OVERHEAD = 32

_A = onnx.AttributeProto


def save(
    model: Any,
    path: str | os.PathLike,
    *,
    params: Mapping[str, Any] | None = None,
    state: Mapping[str, Any] | None = None,
    train: bool | None = None,
    external_data: bool | None = None,
    size_threshold: int = PROTOBUF_LIMIT,
) -> None:
    """Write ``model`` to an ONNX file, with new parameter and running-statistic values.

    The file is a copy of ``model.proto``: the same nodes, attributes, inputs, outputs,
    opsets and metadata. Only the initializers named in ``params`` and ``state`` get new
    values; each keeps its ONNX element type (a float16 or bfloat16 initializer stays so) and
    its shape. Every other initializer keeps its bytes.

    Running statistics: the saved BatchNormalization means and variances are the ones
    passed in ``state``, typically the ``new_state`` that ``model.apply(..., train=True)``
    returned. The graph, including each BatchNormalization's ``momentum`` attribute, is left
    as it was, and jonnx updated the statistics with ONNX's convention
    ``running * momentum + batch * (1 - momentum)``. So statistics and attribute stay
    consistent for any ONNX runtime that goes on training the saved model. PyTorch's
    ``momentum`` is the other way round: it is ``1 - momentum`` in ONNX terms, and
    ``torch.onnx.export`` writes the ONNX value. A statistic that reached its node through
    an ``Identity`` (see :attr:`jonnx.Model.state`) is written as an initializer of its own
    under its state name, in place of that ``Identity``.

    Inference form (``train=False``): a model exported in training mode is written so that
    every runtime runs it in inference mode: BatchNormalization with ``training_mode=0`` and
    only its ``Y`` output (what read its running-statistics outputs reads the running
    statistics themselves, through ``Identity`` nodes), Dropout without its
    ``training_mode`` input. onnxruntime then computes what ``model.apply(params, ...,
    state=state, train=False)`` does.

    External data: a serialized model of 2 GB or more is more than protobuf can hold. When
    the model would be larger than ``size_threshold`` bytes (protobuf's limit by default), or
    when ``external_data=True``, every initializer of at least 1 KiB (in the main graph or a
    subgraph) goes to one data file beside the model, named ``<file name>.data``
    (``model.onnx.data``), at aligned offsets (4096 bytes for tensors of 1 MiB or more,
    64 for the others). Its location is written relative to the model file. If the source
    model kept tensors in external files, their values are taken from what jonnx loaded:
    they were checked then, no file is read again, and the saved model never points to the
    source's files.

    Nothing is written through a link or into an existing file: the data file and then the
    model file are written under temporary names in the target folder and renamed into
    place.

    Args:
        model: a :class:`jonnx.Model`.
        path: the ``.onnx`` file to write.
        params: new values of trainable initializers, by name (a subset of
            ``model.params``); names left out keep their values.
        state: new running statistics, by name (a subset of ``model.state``).
        train: ``False`` writes the inference form (above); ``None`` (default) keeps the
            graph as it was.
        external_data: ``True`` writes the data file, ``False`` refuses it (and raises if
            the model is too large), ``None`` (default) writes it only when needed.
        size_threshold: the serialized size, in bytes, above which ``external_data=None``
            switches to external data.

    Raises:
        jonnx.errors.InputError: an unknown name, or a value whose shape or dtype differs
            from its initializer's, or a traced value.
        jonnx.errors.ExternalDataError: the data file would go through a symbolic link, would
            overwrite the source model's own external data, or the file name is unusable as
            an external data location; or a source tensor's external data cannot be resolved.
        ValueError: ``external_data=False`` but the model is over ``size_threshold`` even
            with its tensors inline.
        OSError: the files cannot be written.

    Example:
        >>> import numpy as np, onnx, onnx.helper as oh, jonnx, tempfile, os
        >>> w = onnx.numpy_helper.from_array(np.ones(2, np.float32), "w")
        >>> graph = oh.make_graph([oh.make_node("Mul", ["x", "w"], ["y"])], "g",
        ...                       [oh.make_tensor_value_info("x", 1, [2])],
        ...                       [oh.make_tensor_value_info("y", 1, [2])], initializer=[w])
        >>> model = jonnx.load(oh.make_model(graph))
        >>> path = os.path.join(tempfile.mkdtemp(), "scaled.onnx")
        >>> jonnx.save(model, path, params={"w": np.array([2.0, 3.0], np.float32)})
        >>> jonnx.load(path)(np.ones(2, np.float32))[0].tolist()
        [2.0, 3.0]
    """
    path = os.fspath(path)
    if train not in (None, False):
        raise ValueError(
            f"train={train!r}: jonnx.save writes the graph as it was (train=None) or its inference form (train=False)"
        )
    if external_data not in (None, True, False):
        raise TypeError(f"external_data must be True, False or None, not {external_data!r}")
    if isinstance(size_threshold, bool) or not isinstance(size_threshold, int) or size_threshold < 0:
        raise ValueError(f"size_threshold must be a non-negative int, not {size_threshold!r}")
    folder, name = os.path.split(os.path.abspath(path))
    if not name:
        raise ValueError(f"{path!r} names a folder, not a model file")
    data_name = name + ".data"
    data_path = os.path.join(folder, data_name)

    proto: onnx.ModelProto = model.proto
    new = _new_values(model, proto.graph, params, state)
    # model.proto holds no initializer data (see jonnx.Model.proto): copying it is cheap, and
    # each initializer's bytes are produced only when written (one tensor at a time).
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    _materialize_state(out, model.state_plan.slots, new)
    sources: set[str] = set()
    pending = detach_initializers(out.graph, model.graph, new, sources)
    _replace_initializers(out.graph, new)
    sources |= inline_external(out, model.graph)
    if train is False:
        to_inference(out)

    tensors = [t for t in _initializers(out.graph) if len(t.raw_data) >= _MIN_EXTERNAL_BYTES]
    blobs = [t.raw_data for t in tensors]
    for t in tensors:
        t.ClearField("raw_data")
    inline_size = (
        out.ByteSize()
        + sum(len(b) + _PER_TENSOR_OVERHEAD for b in blobs)
        + sum(v.nbytes + _PER_TENSOR_OVERHEAD for _, v in pending)
    )
    if external_data is False and inline_size > size_threshold:
        raise ValueError(
            f"the model would be about {inline_size} bytes, over size_threshold={size_threshold} "
            f"(protobuf cannot hold 2 GB); save it with external_data=True or None"
        )
    needed = external_data is True or (external_data is None and inline_size > size_threshold)
    large = [(t, v) for t, v in pending if v.nbytes >= _MIN_EXTERNAL_BYTES]
    external = bool(blobs or large) and needed

    if not external:
        if inline_size > PROTOBUF_LIMIT:
            raise ValueError(
                f"the model would be about {inline_size} bytes, over protobuf's 2 GB limit, and "
                "has no initializer of 1 KiB or more to move to external data"
            )
        for t, blob in zip(tensors, blobs):
            t.raw_data = blob
        _write_atomic(folder, name, serialize_with(out, pending))
        return

    _check_data_location(data_name)
    _refuse_source_data(data_path, model.base_dir, sources)
    small = [(t, v) for t, v in pending if v.nbytes < _MIN_EXTERNAL_BYTES]
    for t, v in small:
        t.raw_data = _raw_bytes(v).tobytes()
    items = [(t, memoryview(b)) for t, b in zip(tensors, blobs)] + large

    def data_chunks() -> Iterator[Any]:
        offset = 0
        for t, value in items:
            raw = _raw_bytes(value) if isinstance(value, np.ndarray) else value
            align = _PAGE if raw.nbytes >= _LARGE else _ALIGN
            pad = -offset % align
            if pad:
                yield bytes(pad)
                offset += pad
            _point_to(t, data_name, offset, raw.nbytes)
            yield raw
            offset += raw.nbytes

    # The data file first: writing it fills in each tensor's offset, which the model file holds.
    _write_atomic(folder, data_name, data_chunks())
    skeleton = out.SerializeToString()
    if len(skeleton) > PROTOBUF_LIMIT:
        raise ValueError(
            f"the model is {len(skeleton)} bytes even with its initializers in external data: "
            "its graph or attribute tensors pass protobuf's 2 GB limit"
        )
    _write_atomic(folder, name, [skeleton])


def _point_to(tensor: onnx.TensorProto, location: str, offset: int, length: int) -> None:
    tensor.data_location = onnx.TensorProto.EXTERNAL
    del tensor.external_data[:]
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value


# -- initializer data written one tensor at a time --------------------------------------------


def _has_data(tensor: onnx.TensorProto) -> bool:
    return tensor.HasField("raw_data") or any(len(getattr(tensor, f)) for f in _DATA_FIELDS[:6])


def detach_initializers(
    graph: onnx.GraphProto, ir: Graph, new: Mapping[str, np.ndarray], sources: set[str]
) -> list[tuple[onnx.TensorProto, np.ndarray]]:
    """The main graph's initializers whose bytes come from loaded values, with those values.

    These are the ones ``jonnx.Model.proto`` keeps without data (and those in external
    files, whose locations are added to ``sources``), plus those given new values. Each
    tensor is left with no data; the value is its new one, else the loaded one, as numpy of
    the tensor's own element type (no copy where the dtype already is).
    """
    pending = []
    for tensor in graph.initializer:
        if tensor.name in new:
            value = new[tensor.name]
        elif (_is_external(tensor) or not _has_data(tensor)) and tensor.name in ir.initializers:
            value = _to_numpy(
                tensor.name,
                ir.initializers[tensor.name],
                np_dtype(tensor.data_type),
                tuple(tensor.dims),
                "initializer",
            )
        else:
            continue
        if _is_external(tensor):
            sources.update(e.value for e in tensor.external_data if e.key == "location")
        for field in _DATA_FIELDS:
            tensor.ClearField(field)
        pending.append((tensor, value))
    return pending


def _raw_bytes(value: np.ndarray) -> np.ndarray:
    """``value``'s ONNX raw_data as a flat uint8 array (a view where no packing is needed)."""
    if value.dtype.itemsize and value.dtype.kind != "O" and value.dtype.name not in _PACKED:
        flat = np.ascontiguousarray(value).reshape(-1)
        return flat.view(np.uint8)
    return np.frombuffer(onnx.numpy_helper.from_array(value).raw_data, np.uint8)


# Element types stored packed (several per byte) in raw_data.
_PACKED = frozenset({"int4", "uint4", "float4_e2m1fn", "int2", "uint2", "float6_e2m3fn", "float6_e3m2fn"})


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def serialize_with(model: onnx.ModelProto, pending: list[tuple[onnx.TensorProto, np.ndarray]]) -> Iterator[Any]:
    """The serialized ``model`` with each pending tensor's data put back, as chunks.

    Protobuf accepts a message's fields in any order, so the graph is written last, its
    pending initializers after its other fields, each tensor's raw bytes straight from its
    array: no serialized copy of the whole model is ever held. The pending tensors are those
    of ``model.graph.initializer`` listed in ``pending`` (see :func:`detach_initializers`).
    """
    names = {id(t) for t, _ in pending}
    headers = []
    for tensor, value in pending:
        raw = _raw_bytes(value)
        header = tensor.SerializeToString() + _varint(9 << 3 | 2) + _varint(raw.nbytes)
        headers.append((header, raw))
    graph = onnx.GraphProto()
    copy_except(model.graph, graph, "initializer")
    graph.initializer.extend(t for t in model.graph.initializer if id(t) not in names)
    head = graph.SerializeToString()
    body = sum(len(_varint(len(h) + r.nbytes)) + 1 + len(h) + r.nbytes for h, r in headers)
    rest = onnx.ModelProto()
    copy_except(model, rest, "graph")
    yield rest.SerializeToString()
    yield _varint(7 << 3 | 2) + _varint(len(head) + body)
    yield head
    for header, raw in headers:
        yield _varint(5 << 3 | 2) + _varint(len(header) + raw.nbytes) + header
        yield raw


def copy_except(src: Any, dst: Any, *skip: str) -> None:
    """Copy every field of message ``src`` but those named in ``skip`` into the empty ``dst``."""
    for field, value in src.ListFields():
        if field.name in skip:
            continue
        if field_is_repeated(field) and field.type == field.TYPE_MESSAGE:
            # add().CopyFrom, not extend: extend round-trips through the parser, which refuses
            # deeply nested (but legal) subgraphs.
            for item in value:
                getattr(dst, field.name).add().CopyFrom(item)
        elif field_is_repeated(field):
            getattr(dst, field.name).extend(value)
        elif field.type == field.TYPE_MESSAGE:
            getattr(dst, field.name).CopyFrom(value)
        else:
            setattr(dst, field.name, value)


# -- new values -------------------------------------------------------------------------------


def _new_values(
    model: Any,
    graph: onnx.GraphProto,
    params: Mapping[str, Any] | None,
    state: Mapping[str, Any] | None,
) -> dict[str, np.ndarray]:
    """The given values as numpy arrays of their initializers' dtype, checked by name and shape."""
    known_params, known_state = set(model.params), set(model.state)
    specs = {t.name: (t.data_type, tuple(t.dims)) for t in graph.initializer}
    specs.update({s.values.name: (s.values.data_type, tuple(s.dims)) for s in graph.sparse_initializer})
    # A statistic routed through an Identity has no initializer of its own: it takes its source's.
    specs.update({s.key: specs[s.source] for s in model.state_plan.slots if s.via and s.source in specs})
    new: dict[str, np.ndarray] = {}
    for given, known, other, what, other_what in (
        (params, known_params, known_state, "param", "state="),
        (state, known_state, known_params, "state value", "params="),
    ):
        if given is None:
            continue
        if not isinstance(given, Mapping):
            raise TypeError(f"{what}s must be a mapping of name -> array, not {type(given).__name__}")
        unknown = sorted(set(given) - known)
        if unknown:
            misplaced = [n for n in unknown if n in other]
            hint = f"; {misplaced[:10]} belong in {other_what}" if misplaced else ""
            raise errors.InputError(
                f"{unknown[:10]} are not {what}s of the model{hint}; known {what}s: {sorted(known)[:10]}"
                + (" ..." if len(known) > 10 else "")
            )
        for name, value in given.items():
            elem_type, dims = specs[name]
            new[name] = _to_numpy(name, value, np_dtype(elem_type), dims, what)
    return new


def _to_numpy(name: str, value: Any, dtype: np.dtype, dims: tuple[int, ...], what: str) -> np.ndarray:
    if isinstance(value, jax.core.Tracer):
        raise errors.InputError(f"{what} {name!r} is a traced value: call jonnx.save outside jax.jit / jax.grad")
    array = np.asarray(value)
    # With 64-bit types off, JAX holds a float64 initializer as float32: widen it back.
    if array.dtype != dtype and array.dtype != jax.dtypes.canonicalize_dtype(dtype):
        raise errors.InputError(
            f"{what} {name!r} has dtype {array.dtype}, but its initializer is {dtype}; "
            f"cast it (.astype({dtype.name!r})) if that is what you mean"
        )
    if array.shape != dims:
        raise errors.InputError(
            f"{what} {name!r} has shape {list(array.shape)}, but its initializer has shape {list(dims)}"
        )
    return np.ascontiguousarray(array.astype(dtype, copy=False))


def _encode(value: np.ndarray, name: str, elem_type: int) -> onnx.TensorProto:
    tensor = onnx.numpy_helper.from_array(value, name)
    if tensor.data_type != elem_type or not tensor.HasField("raw_data"):
        raise errors.ExternalDataError(
            f"tensor {name!r}: cannot encode its {value.dtype} value as ONNX element type {elem_type}"
        )
    return tensor


_DATA_FIELDS = (
    "float_data",
    "int32_data",
    "string_data",
    "int64_data",
    "double_data",
    "uint64_data",
    "raw_data",
    "external_data",
    "data_location",
)


def _set_raw(tensor: onnx.TensorProto, raw: bytes) -> None:
    """Replace ``tensor``'s data by ``raw``, keeping its name, dims, type, doc and metadata."""
    for field in _DATA_FIELDS:
        tensor.ClearField(field)
    tensor.raw_data = raw


def _replace_initializers(graph: onnx.GraphProto, new: Mapping[str, np.ndarray]) -> None:
    # Dense initializers get their new values from detach_initializers. A trained sparse
    # initializer is dense now: it becomes an ordinary initializer.
    sparse = [s for s in graph.sparse_initializer if s.values.name in new]
    for s in sparse:
        graph.initializer.append(_encode(new[s.values.name], s.values.name, s.values.data_type))
        graph.sparse_initializer.remove(s)


def _materialize_state(model: onnx.ModelProto, slots: tuple[StateSlot, ...], new: Mapping[str, np.ndarray]) -> None:
    """Give each new statistic that an Identity produced an initializer of its own.

    The Identity producing it goes; its source initializer goes too when nothing else reads it.
    """
    graph = model.graph
    routed = {s.key: s for s in slots if s.via and s.key in new}
    if not routed:
        return
    for node in [n for n in graph.node if n.op_type == "Identity" and n.output[0] in routed]:
        graph.node.remove(node)
    types = {t.name: t.data_type for t in graph.initializer}
    for key, slot in routed.items():
        graph.initializer.append(_encode(new[key], key, types[slot.source]))
        if model.ir_version < 4:  # initializers were graph inputs too before IR version 4
            graph.input.append(onnx.helper.make_tensor_value_info(key, types[slot.source], new[key].shape))
    read = _names_read(graph)
    for source in {s.source for s in routed.values()} - read:
        for container in (graph.initializer, graph.input):
            for item in [t for t in container if t.name == source]:
                container.remove(item)


def _names_read(graph: onnx.GraphProto) -> set[str]:
    """Every value name a node of ``graph`` or of its subgraphs reads, and the graph's outputs."""
    names = {o.name for o in graph.output}
    for node in graph.node:
        names.update(node.input)
        for attr in node.attribute:
            for g in attribute_graphs(attr):
                names |= _names_read(g)
    return names


# -- the source model's external data ---------------------------------------------------------


def inline_external(out: onnx.ModelProto, ir: Graph) -> set[str]:
    """Put the loaded values of the source's external tensors back inline.

    Returns the locations (relative to the source's folder) of the source's data files.
    """
    sources: set[str] = set()
    _inline_graph(out.graph, ir, sources, "the main graph")
    for function in out.functions:
        if any(_needs_inlining(a) for node in function.node for a in node.attribute):
            raise errors.ExternalDataError(
                f"model-local function {function.name!r} holds tensors in external data, which "
                "jonnx.save cannot re-read (jonnx inlines functions at load time)"
            )
    return sources


def _inline_graph(graph: onnx.GraphProto, ir: Graph, sources: set[str], where: str) -> None:
    for tensor in graph.initializer:
        if _is_external(tensor):
            _inline(tensor, ir.initializers[tensor.name], sources)
    for sparse in graph.sparse_initializer:
        if _is_external(sparse.values) or _is_external(sparse.indices):
            raise errors.ExternalDataError(
                f"sparse initializer {sparse.values.name!r} in {where} keeps its data in an "
                "external file, which jonnx.save cannot re-read"
            )
    by_outputs = None
    for node in graph.node:
        if not any(_needs_inlining(attr) for attr in node.attribute):
            continue
        if by_outputs is None:
            by_outputs = {(n.op_type, n.outputs): n for n in ir.nodes}
        loaded = by_outputs.get((node.op_type, tuple(node.output)))
        if loaded is None:
            raise errors.ExternalDataError(
                f"node {node.name or node.op_type!r} in {where} has attribute tensors in external "
                "data, but no loaded node matches it (a model-local function call?)"
            )
        for attr in node.attribute:
            value = loaded.attrs.get(attr.name)
            if attr.type == _A.TENSOR and _is_external(attr.t):
                _inline(attr.t, value, sources)
            elif attr.type == _A.TENSORS:
                for tensor, v in zip(attr.tensors, value):
                    if _is_external(tensor):
                        _inline(tensor, v, sources)
            elif attr.type in (_A.GRAPH, _A.GRAPHS):
                loaded_graphs = (value,) if attr.type == _A.GRAPH else value
                for g, v in zip(attribute_graphs(attr), loaded_graphs):
                    _inline_graph(g, v, sources, f"a subgraph of node {loaded.name!r}")
            elif attr.type in (_A.SPARSE_TENSOR, _A.SPARSE_TENSORS) and _needs_inlining(attr):
                raise errors.ExternalDataError(
                    f"node {loaded.name!r}: sparse attribute tensor {attr.name!r} keeps its data "
                    "in an external file, which jonnx.save cannot re-read"
                )


def _inline(tensor: onnx.TensorProto, value: np.ndarray, sources: set[str]) -> None:
    sources.update(e.value for e in tensor.external_data if e.key == "location")
    _set_raw(tensor, _encode(np.asarray(value), tensor.name, tensor.data_type).raw_data)


def _is_external(tensor: onnx.TensorProto) -> bool:
    return tensor.data_location == onnx.TensorProto.EXTERNAL


def _attribute_tensors(attr: onnx.AttributeProto) -> Iterator[onnx.TensorProto]:
    """The tensors an attribute holds directly (not those of its subgraphs)."""
    if attr.type == _A.TENSOR:
        yield attr.t
    elif attr.type == _A.TENSORS:
        yield from attr.tensors
    elif attr.type == _A.SPARSE_TENSOR:
        yield from (attr.sparse_tensor.values, attr.sparse_tensor.indices)
    elif attr.type == _A.SPARSE_TENSORS:
        for s in attr.sparse_tensors:
            yield from (s.values, s.indices)


def _needs_inlining(attr: onnx.AttributeProto) -> bool:
    """Whether ``attr`` holds, at any depth, a tensor with external data."""
    graphs = attribute_graphs(attr)
    if graphs:
        return any(_graph_has_external(g) for g in graphs)
    return any(_is_external(t) for t in _attribute_tensors(attr))


def _graph_has_external(graph: onnx.GraphProto) -> bool:
    return (
        any(_is_external(t) for t in graph.initializer)
        or any(_is_external(s.values) or _is_external(s.indices) for s in graph.sparse_initializer)
        or any(_needs_inlining(a) for n in graph.node for a in n.attribute)
    )


def _initializers(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """The initializers of ``graph`` and of its subgraphs (what onnx's own writer externalizes)."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            for g in attribute_graphs(attr):
                yield from _initializers(g)


# -- writing ----------------------------------------------------------------------------------


def _check_data_location(data_name: str) -> None:
    """The data file's name must be a location jonnx.load (and onnx's checker) accept."""
    if any(c in data_name for c in (":", "\\", "\0")):
        raise errors.ExternalDataError(
            f"the external data file name {data_name!r} (from the model's file name) is not a "
            "safe relative location: rename the model file (no ':', '\\\\' or NUL)"
        )


def _refuse_source_data(data_path: str, base_dir: str | None, sources: set[str]) -> None:
    """Refuse to replace a link, or the very file holding the source model's external data.

    Replacing the source's data file would break every model file (the source first) that
    points into it; a copy of it elsewhere is another file and may be replaced.
    """
    if os.path.islink(data_path):
        raise errors.ExternalDataError(f"{data_path!r} is a symbolic link; jonnx.save writes no data through links")
    if base_dir is None or not os.path.lexists(data_path):
        return
    for location in sources:
        source = os.path.join(base_dir, location)
        if os.path.exists(source) and os.path.samefile(source, data_path):
            raise errors.ExternalDataError(
                f"{data_path!r} holds the source model's own external data; writing the new "
                "data there would break the source model file: save under another file name "
                "or folder"
            )


def _write_atomic(folder: str, name: str, chunks: Iterable[Any]) -> None:
    """Write ``folder/name`` under a temporary name, then rename it into place."""
    tmp = os.path.join(folder, f".{name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
        os.replace(tmp, os.path.join(folder, name))
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
