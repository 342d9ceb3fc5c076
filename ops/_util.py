"""Private helpers shared by the op families."""

from __future__ import annotations

import collections
import functools
import threading
import types
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from jonnx import _jit
from jonnx._registry import OpContext
from jonnx._tensors import np_dtype

T = TypeVar("T")

__all__ = [
    "array_module",
    "as_strings",
    "canonical",
    "compute_type",
    "dtype_of",
    "from_attributes",
    "half_in_float32",
    "index_dtype",
    "is_half",
    "is_integer",
    "legacy_broadcast",
    "lowers_for_cpu",
    "lowers_for_xla_emitter",
    "normalize_axes",
    "normalize_axis",
    "onnx_dtype",
    "opaque",
    "opaque_constants",
    "spread",
    "spread_product",
    "static_ints",
    "static_sizes",
    "stored_transpose",
    "widen_halves",
]


def array_module(*values: Any) -> Any:
    """numpy where every value is a numpy array (or None: an absent optional input), else
    jax.numpy: initializers, numpy at trace time, stay numpy through an op's arithmetic on
    them, computed once while tracing instead of compiled."""
    return np if all(v is None or isinstance(v, np.ndarray) for v in values) else jnp


def lowers_for_cpu() -> bool:
    """Whether ops are lowered for XLA's CPU backend (the default backend is the CPU).

    The CPU lowerings (convolutions as dots and multiply-adds, pooling as passes over the
    taps, ReLU as a select, products that pick their library) beat XLA's own code there and
    lose to it on GPUs and TPUs, where cuDNN and XLA's fusions are strong. Asked while tracing,
    in this one place, so that tests can take the other side on a CPU machine.
    """
    return jax.default_backend() == "cpu"


def lowers_for_xla_emitter() -> bool:
    """Whether the function being traced compiles for XLA CPU's own emitter alone, without
    YNNPACK: the compilation :class:`jonnx._jit.DotChoosingJit` makes where large products
    dominate (``Model(x)`` at batch 32). Where it is not known (every other compilation, which
    may give YNNPACK the reductions and fuse them with the products before them), False.
    Asked while tracing."""
    return lowers_for_cpu() and _jit.traced_for() == _jit.XLA_DOTS


def as_strings(values: Any) -> np.ndarray:
    """Any array-like of str/bytes as an object array of ``str``: bytes decoded as UTF-8 (bytes
    that are not UTF-8 kept as surrogates, so they survive a round trip), anything else ``str()``."""
    arr = np.asarray(values, dtype=object)
    flat = arr.reshape(-1).tolist()
    try:
        # Almost always every element is a str already: joins (in C, a few thousand at a time
        # to bound the temporary) say so, where a check per element took 0.4 ms of 10,000
        # labels. A str subclass (numpy's str_) passes and is kept: it is a str.
        for start in range(0, len(flat), 4096):
            "".join(flat[start : start + 4096])
    except TypeError:
        pass
    else:
        return arr.copy() if arr is values else arr
    out = np.empty(arr.size, object)
    out[:] = [
        v if type(v) is str else v.decode("utf-8", errors="surrogateescape") if isinstance(v, bytes) else str(v)
        for v in flat
    ]
    return out.reshape(arr.shape)


_DERIVED: collections.OrderedDict[tuple, tuple[Any, Any]] = collections.OrderedDict()
_DERIVED_LOCK = threading.Lock()
_DERIVED_SIZE = 256


def from_attributes(attrs: Mapping[str, Any], name: str, build: Callable[[], T], *key: Hashable) -> T:
    """``build()``: a table derived from a node's attributes, built once per node, ``name`` (which
    table) and ``key``.

    Host ops run on every call of a model and trace nothing, so a table they derive from
    their attributes (a LabelEncoder's sorted keys, an encoder's category index) would be
    built again each call: 22 of a 3-label LabelEncoder's 25 us. Traced ops build theirs once
    per trace and need no cache. Entries are keyed by the identity of ``attrs`` and by ``key``,
    what else the table depends on (an input's dtype). Only a loaded node's attributes are
    kept: a read-only mapping (``types.MappingProxyType``), the same object for the node's
    life, held by its entry so that the id cannot be reused while cached; a plain dict (a
    direct call through ``jonnx.ops``) may change between calls and is built for each. The
    least recently used go first: models come and go.
    """
    if not isinstance(attrs, types.MappingProxyType):
        return build()
    slot = (id(attrs), name, *key)
    with _DERIVED_LOCK:
        entry = _DERIVED.get(slot)
        if entry is not None and entry[0] is attrs:
            _DERIVED.move_to_end(slot)
            return entry[1]
    value = build()  # outside the lock: a build may be slow, and may raise (then nothing is kept)
    with _DERIVED_LOCK:
        _DERIVED[slot] = (attrs, value)
        while len(_DERIVED) > _DERIVED_SIZE:
            _DERIVED.popitem(last=False)
    return value


_HALF = (np.dtype(jnp.float16), np.dtype(jnp.bfloat16))


def is_half(x: Any) -> bool:
    """Whether ``x``, an array or a dtype, is float16 or bfloat16 (a Python number, None: no)."""
    dtype = x if isinstance(x, (np.dtype, type)) else getattr(x, "dtype", None)
    return dtype is not None and np.dtype(dtype) in _HALF


def half_in_float32(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn(x, ...)`` computed in float32 where ``x`` is float16 or bfloat16, rounded once.

    XLA computes a half-precision composite step by step, rounding after each: Selu, Sigmoid,
    Gelu, Mish, HardSwish, Asinh were one unit in the last place off the correctly rounded
    value for 10-45% of 4,000 float16 inputs, where onnxruntime computes in float32 (off for
    0-1.5%). A float attribute (an alpha of 0.01) also met the input as a half value.
    """

    @functools.wraps(fn)
    def wrapped(x, *args, **kwargs):
        if is_half(x):
            return fn(jnp.asarray(x, jnp.float32), *args, **kwargs).astype(x.dtype)
        return fn(x, *args, **kwargs)

    return wrapped


def compute_type(dtype: Any) -> np.dtype:
    """The type an op that computes in floating point works in for inputs of ``dtype``:
    float64 (and complex) stays, anything narrower or integral (float16, bfloat16, integers,
    bool) becomes float32; the op rounds or casts back once at the end."""
    return np.dtype(jnp.promote_types(dtype, jnp.float32))


def widen_halves(*values: Any) -> tuple:
    """The values with float16 and bfloat16 ones as float32 (None and the rest as they are), for
    an op that computes in float32 and rounds once at the end (see :func:`half_in_float32`)."""
    return tuple(v.astype(jnp.float32) if is_half(v) else v for v in values)


def opaque(x: Any) -> Any:
    """``x`` hidden from XLA's algebraic simplifier where it is traced (eagerly there is
    nothing to hide), for ops whose result or operand the simplifier would otherwise combine
    with a neighbouring node's: it rewrites ``exp(a) * exp(b)`` as ``exp(a + b)``, ``sqrt(x *
    x)`` as ``|x|``, ``log(exp(x))`` as ``x``, ``(a / b) / c`` as ``a / (b * c)``, ``a /
    sqrt(b)`` as ``a * rsqrt(b)``, ``1 / (1 / x)`` as ``x``. Each node of an ONNX graph rounds
    its result (and overflows) on its own, as onnxruntime's do: so rewritten, a third to
    three fifths of float32 results were one to eight units in the last place off, and where a
    node overflows (``exp(40 x) * exp(-40 x)``, ``sqrt(x * x)`` with x = 1e20) the inf or NaN
    became a finite number. XLA CPU removes the barrier after simplifying and before fusing, so
    the compiled loops are the same."""
    return jax.lax.optimization_barrier(x) if isinstance(x, jax.core.Tracer) else x


def rounded(x: Any) -> Any:
    """``x`` rounded to its type before a subtraction reads it: ``x`` plus a zero XLA cannot
    see, where ``x`` is traced.

    For a softmax XLA CPU fuses the ops that make ``x`` into both of its loops, the row maximum
    and ``exp(x - max)``, and LLVM contracts a multiply that ends ``x`` into the subtraction (a
    fused multiply-add, which XLA's CPU backend always allows). The maximum then reads the
    rounded product and the subtraction the exact one, so at the row's maximum ``x - max`` is up
    to half a unit in the last place of ``x`` instead of 0: past about 3e9 that is below -87
    (every ``exp`` of the row 0: NaN) or above 88 (inf / inf: NaN). Softmax of ``Mul(x, s)``
    with logits near 1e10 was NaN in 49 of 50 draws where onnxruntime's is right. The sum's
    operand can no longer be contracted, and both loops read one rounded value; the added zero
    costs one addition in each loop."""
    if not isinstance(x, jax.core.Tracer):
        return x
    return x + jax.lax.optimization_barrier(jnp.zeros((), jnp.result_type(x)))


def exact_divide(x, divisor):
    """``x / divisor``, correctly rounded, where a quotient is then rounded to an integer
    (quantization).

    XLA's algebraic simplifier turns ``x / broadcast(s)`` into ``x * broadcast(1 / s)`` and ``x
    / c`` for a constant ``c`` into ``x * (1 / c)``, one unit in the last place off in about
    70% of float32 quotients (and so moving ``round(x / s)`` across a tie: DynamicQuantizeLinear
    gave 25 instead of 26 on ONNX's own example). The divisor here is ``divisor`` where ``x`` is
    a number and 1 where it is NaN (whose quotient is NaN either way): no broadcast or constant
    for the simplifier to take, and computed inside the dividing loop. (An optimization barrier
    on the broadcast divisor kept the division too but wrote the divisor out in full: a 256 x
    56 x 56 quantization 0.24 against 0.14 ms.) Not in the Div node (docs/known_issues.md).
    """
    divisor = jnp.asarray(divisor)
    return x / jnp.where(jnp.isnan(x), jnp.ones_like(divisor), divisor)


def opaque_constants(*values: Any) -> tuple:
    """The values, with each floating-point constant hidden from XLA's algebraic simplifier
    where another of them is traced (a constant: a concrete array, as Constant nodes and
    subgraph initializers are while a graph is traced).

    The simplifier reassociates a chain of two constants, ``(x + c1) + c2`` as ``x + (c1 +
    c2)`` and ``(x * c1) * c2`` as ``x * (c1 * c2)``, in every float type: a third of the
    results one unit in the last place off the per-op ones, and the rounding idiom ``(x +
    1.5 * 2**23) - 1.5 * 2**23`` folded to ``x``. ONNX rounds after each node, as onnxruntime
    does. Behind an optimization barrier the simplifier sees no constant; XLA removes the
    barrier after simplification, so the compiled loop still reads the constant in place.
    Integers reassociate exactly and are left as they are.
    """
    if not any(isinstance(v, jax.core.Tracer) for v in values):
        return values
    return tuple(
        jax.lax.optimization_barrier(v)
        if v is not None and not isinstance(v, jax.core.Tracer) and jnp.issubdtype(jnp.result_type(v), jnp.inexact)
        else v
        for v in values
    )


def static_sizes(sizes: Any) -> bool:
    """Whether every size is a plain int (none symbolic, as under ``jax.export``)."""
    return all(isinstance(n, (int, np.integer)) for n in sizes)


def spread(v: Any, shape: tuple, axis: int = 0) -> Any:
    """``v`` broadcast to ``shape``, built along ``axis`` (where ``v`` has size 1) by doubling
    concatenations, so that its derivative sums over ``axis`` as a tree of halves.

    The transpose of a broadcast is a reduction, and XLA's CPU reduction of a computed
    (fused) activation over its leading axes runs 4-6x slower than adding halves of it
    elementwise: summing the product of two (32, 56, 56, 144) arrays over all but the channels
    took 30 ms as one reduction and 5.4 ms as a tree of halves. Here the transpose is
    that tree over ``axis``, then a reduction of the one remaining slice. Use it where a
    per-channel term meets a batch of activations in a function that is differentiated in
    reverse mode; forward values are exactly a broadcast's. A size that is not a static int (a
    symbolic batch) gets a plain broadcast.
    """
    n = shape[axis]
    if not isinstance(n, (int, np.integer)) or n <= 2:
        return jnp.broadcast_to(v, shape)
    block = jnp.broadcast_to(v, shape[:axis] + (1,) + shape[axis + 1 :])
    blocks, size = [], 1
    while True:
        if n & size:
            blocks.append(block)
        if 2 * size > n:
            break
        block, size = jnp.concatenate([block, block], axis), 2 * size
    return blocks[0] if len(blocks) == 1 else jnp.concatenate(blocks, axis)


def spread_product(a: Any, v: Any, axis: int = 0) -> Any:
    """``a * v``, ``v`` broadcast against ``a`` (size 1 on ``axis``), arranged so that the
    transpose in ``v`` adds the two halves' products in one fused loop, then sums the rest
    with :func:`spread`'s tree (a product taken whole would be materialized first)."""
    n = jnp.shape(a)[axis]
    if not isinstance(n, (int, np.integer)) or n < 2:
        return a * v
    h = n // 2
    half = spread(v, jnp.shape(a)[:axis] + (h,) + jnp.shape(a)[axis + 1 :], axis)
    parts = [jax.lax.slice_in_dim(a, 0, h, axis=axis) * half, jax.lax.slice_in_dim(a, h, 2 * h, axis=axis) * half]
    if n % 2:
        parts.append(jax.lax.slice_in_dim(a, 2 * h, n, axis=axis) * v)
    return jnp.concatenate(parts, axis)


def stored_transpose(a: Any) -> Any:
    """``a.T`` for a matrix ``a``, copied from ``a`` once it is stored.

    XLA's CPU backend fuses the elementwise work that computes ``a`` into a transpose of it and
    evaluates that work in the transposed order, reading its operands across rows: in a BERT
    training step the transpose of a (1024, 3072) GELU output took 45 ms, a copy of the stored
    array 1 ms. Both branches of a conditional whose predicate XLA cannot see (it passes through
    an optimization barrier) transpose their operand, so ``a`` is stored first and only copied.
    An optimization barrier on ``a`` itself does not do it: XLA CPU removes barriers before it
    fuses.
    """
    return jax.lax.cond(jax.lax.optimization_barrier(np.bool_(True)), jnp.transpose, jnp.transpose, a)


def dtype_of(x: Any) -> np.dtype:
    """The numpy dtype of an array, tracer or scalar."""
    return np.dtype(jnp.result_type(x))


def take(a: Any, indices: Any, axis: int | None = None, **kwargs: Any) -> Any:
    """``jnp.take``, correct for an empty axis: its result has the indices' dims in place of it.

    There only empty indices are in range, and jnp.take (jax 0.10) returns ``a`` itself for
    them, dropping the indices' dims (Gather of (0, 0) indices from a (2, 0) tensor gave (2, 0)
    instead of (2, 0, 0)). Out-of-range indices of an empty axis read zeros.
    """
    shape = tuple(np.shape(a)) if axis is not None else (int(np.size(a)),)  # None: a flattened
    at = 0 if axis is None else axis % len(shape)
    if isinstance(shape[at], int) and shape[at] == 0:
        return jnp.zeros(shape[:at] + tuple(np.shape(indices)) + shape[at + 1 :], dtype_of(a))
    return jnp.take(a, indices, axis=axis, **kwargs)


def is_integer(x: Any) -> bool:
    """Whether ``x`` holds integers (signed or unsigned)."""
    return bool(jnp.issubdtype(jnp.result_type(x), jnp.integer))


def canonical(dtype: Any) -> np.dtype:
    """``dtype`` as JAX will hold it (int64 -> int32 when ``jax_enable_x64`` is off)."""
    return np.dtype(jax.dtypes.canonicalize_dtype(dtype))


def index_dtype() -> np.dtype:
    """The dtype of ONNX's int64 index outputs (ArgMax, TopK, NonZero, Shape, ...)."""
    return canonical(np.int64)


def onnx_dtype(elem_type: int) -> np.dtype:
    """The numpy dtype of an ONNX ``TensorProto.DataType`` (as JAX will hold it)."""
    return canonical(np_dtype(elem_type))


def static_ints(value: Any) -> tuple[int, ...]:
    """A static (numpy) input or attribute as a tuple of Python ints.

    Under ``jax.export`` with symbolic dimensions, a shape read by ``Shape`` may hold symbolic
    dims (an object array); they are kept as they are, for ops that take them (Reshape,
    Expand, ConstantOfShape).
    """
    return tuple(v if jax.export.is_symbolic_dim(v) else int(v) for v in np.asarray(value).reshape(-1))


def normalize_axis(axis: int, rank: int, ctx: OpContext, what: str = "axis") -> int:
    """``axis`` in ``[-rank, rank)`` as a non-negative int, else an error naming the node."""
    if not -rank <= axis < max(rank, 1):
        raise ctx.error(f"{what} {axis} is out of range for a tensor of rank {rank}")
    return axis % max(rank, 1)


def normalize_axes(axes: Iterable[int], rank: int, ctx: OpContext) -> tuple[int, ...]:
    out = tuple(normalize_axis(int(a), rank, ctx, "axes entry") for a in axes)
    if len(set(out)) != len(out):
        raise ctx.error(f"axes {tuple(axes)} repeat an axis")
    return out


def legacy_broadcast(a: Any, b: Any, attrs: Any, ctx: OpContext) -> tuple[Any, Any]:
    """Align ``b`` with ``a`` under the opset 1-6 ``broadcast``/``axis`` attributes.

    Before opset 7, binary ops broadcast only when ``broadcast=1``: ``b`` then matches a
    contiguous run of ``a``'s dims, starting at ``axis`` (default: the trailing dims).
    """
    if not attrs.get("broadcast"):
        if jnp.shape(a) != jnp.shape(b):
            raise ctx.error(
                f"inputs have shapes {jnp.shape(a)} and {jnp.shape(b)}; before opset 7 they must "
                "be equal unless the node sets broadcast=1"
            )
        return a, b
    axis = attrs.get("axis")
    if axis is None:
        return a, b
    a_rank, b_shape = jnp.ndim(a), jnp.shape(b)
    axis = normalize_axis(axis, a_rank, ctx)
    trailing = a_rank - axis - len(b_shape)
    if trailing < 0:
        raise ctx.error(f"cannot broadcast shape {b_shape} into {jnp.shape(a)} at axis {axis}")
    return a, jnp.reshape(b, b_shape + (1,) * trailing)
