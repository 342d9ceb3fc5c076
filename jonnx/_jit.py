"""``jonnx.jit``: ``jax.jit`` with the XLA compiler options jonnx needs to be correct.

XLA's CPU backend in jaxlib 0.10 miscompiles a dot whose operand is a broadcast when it fuses
the dot, through YNNPACK, with the reduction after it (a mean, a softmax): the result is garbage
or NaN. All-equal constants reach XLA as broadcasts, so a model whose MatMul/Gemm weights are
``ConstantOfShape`` fills (the light model zoo of the onnx test data) feeding a Softmax or a
ReduceMean hits it. Limiting YNNPACK to fusions of one dot avoids the bad fusion and keeps
YNNPACK's dot kernels. Measured on the benchmark models: small_cnn unchanged,
tiny_transformer at batch 32 about 10-20% slower than with XLA's defaults (turning YNNPACK
fusions off altogether costs 30-40% there). Other fusion sets that were tried (adding elementwise
or dot fusions) still miscompile. The reproducer, in plain JAX, is in docs/known_issues.md.

Convolutions are left to XLA's own emitter rather than YNNPACK's (jaxlib's default gives
YNNPACK both): on the Intel Xeon the suite runs on it was the faster in nearly every case
measured, alone (a 3x3 over 64 channels on 32x32 at batch 32 0.60x the time, a grouped one
0.28-0.71x, ResNet-50's strided 3x3s at batch 1 0.62-0.87x, a 1-D convolution 1.08x) and in
the models: ResNet-50 0.94x at batch 1 and 0.77x at batch 32, MobileNetV2 0.91x at batch 32
(unchanged at batch 1, where its convolutions are jonnx's own lowerings), the ResNet-18
training step 0.79x (docs/performance.md, "Which library runs the convolutions").

Compiling a large model makes XLA (LLVM) allocate and free hundreds of megabytes, which glibc
keeps mapped; the first run then maps its temporaries on top. :func:`jit` therefore returns the
freed memory to the system (``malloc_trim``) right after each backend compile of half a second
or more (a few milliseconds, against seconds of compiling): ResNet-50's first call peaked at 3.3x
its weights' bytes without it and 2.6x with it (benchmarks/bench_memory.py).
JAX's compile events have no owner, so the listener is process-wide: once jonnx has compiled
anything, a user's own long compiles are trimmed after too (a few milliseconds each; glibc
only, a no-op elsewhere).

YNNPACK may take reductions too (and with them the dot before a reduction: attention's scores
with their softmax, a LayerNorm's means), which is what the miscompile needs, but only where a
contraction reads data computed from broadcasts alone. ``Model.__call__``, ``predict``,
``evaluate``, the training steps of ``jonnx.training`` and :func:`jit` therefore compile each new signature
with YNNPACK's reductions, read the compiled module (:func:`jonnx._hlo.ynn_fusions_are_safe`),
and keep it only where every contraction in a YNNPACK fusion reads stored data, and none has
the slow form of :func:`jonnx._hlo.ynn_fusions_are_fast` (a 1x1 kernel read as a matrix
beside a global average pool); elsewhere they compile with single dots
(:class:`DotChoosingJit`). BERT at batch 1 0.92x the time, its int8 version 0.91x, the
ResNet-18 training step 0.89x, the BERT fine-tuning step 0.96x. ResNet-50 and an
EfficientNet-B0 at batch 1 had the slow form; they keep the reductions since big 1x1 kernels
reach the module as an 11OI view (0.975x and 0.957x the time of single dots, 2026-12-03).
NCHW (``optimize={"channels_last": False}``) reads them as a matrix: ResNet-50's ReLU, a
select, keeps its products out of the pool's fusion, while EfficientNet-B0's SiLU lets them
in, and that call takes single dots (docs/performance.md, "YNNPACK reductions", "ReLU as a
select"). :func:`jonnx.jit` does the
same for any function; :func:`plain_jit` is the single-dot ``jax.jit``.

Every function jonnx compiles itself goes through :func:`jit` or :func:`plain_jit`; a user's own
``jax.jit`` over ``Model.apply`` can use :func:`jonnx.jit` (or
``compiler_options=jonnx.compiler_options()``, single dots).

Which library runs the dots is a second choice, made per compiled shape by ``Model.__call__``
and ``jonnx.training.predict``/``evaluate`` (:class:`DotChoosingJit`, :func:`library_dots_for`).
YNNPACK's dot wins on few rows (BERT at batch 1: 1.34x slower without it, ResNet-50 1.27x),
but it runs a batched dot (attention's 384 products of 128 x 64 x 128 at batch 32) on one core,
at 67 GFLOP/s against 84 for XLA's own dot (Eigen, both cores), and on 4096 rows XLA's dot is
5-10% faster too. With at least 90% of the float32 dot work on 1024 rows or more (counting a
batched dot's batch), the call compiles with ``compiler_options(library_dots=False)``, without
YNNPACK. BERT at batch 32 0.91x, MobileNetV2 0.97x, ResNet-50 0.985x; a
BERT at batch 8 and the ResNet-18 training step unchanged (docs/performance.md).
"""

from __future__ import annotations

import ctypes
import functools
import inspect
import math
import threading
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.extend.core as jax_core
import numpy as np

from jonnx import _cpu, _hlo

_YNN_FUSION_FLAG = "xla_cpu_experimental_ynn_fusion_type"
_DOTS = "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"
# The YNNPACK fusions allowed, by library_dots: single dots, or none (convolutions never).
_SAFE_YNN_FUSIONS = {True: _DOTS, False: ""}
# Single dots and reductions (a reduction may take the dot before it): faster, and safe where
# the compiled module passes jonnx._hlo.ynn_fusions_are_safe (DotChoosingJit checks that, and
# jonnx._hlo.ynn_fusions_are_fast).
_DOTS_AND_REDUCTIONS = f"{_DOTS},LIBRARY_FUSION_TYPE_REDUCE"

# What DotChoosingJit compiles a signature with: the values of its ``choices``.
XLA_DOTS = "XLA's dots"
LIBRARY_DOTS = "YNNPACK's dots"
LIBRARY_REDUCTIONS = "YNNPACK's dots and reductions"
# library_dots_for: a dot of at least this many rows (a batched dot's batch times its rows)
# is "large", and XLA's own dot is used when large dots do at least this share of the work.
LARGE_DOT_ROWS = 1024
LARGE_DOT_SHARE = 0.9


def compiler_options(*, library_dots: bool = True) -> dict[str, str]:
    """The XLA compiler options jonnx compiles with, as a new dict: YNNPACK given single dots
    (the miscompile of docs/known_issues.md), and on AMD CPUs with AVX-512 and Intel ones with
    AMX loops vectorized 512 bits wide (``_WIDE_VECTORS``).

    ``library_dots=False`` leaves the dots to XLA's own emitter too (convolutions always are):
    faster where every dot is large (see :func:`library_dots_for`).

    Without an option where the installed jaxlib does not know it (a jaxlib without YNNPACK, or
    a newer one that renamed it): compiling with an unknown option is an error, so each is
    probed once, on a trivial function.
    """
    return dict(_probed_options(library_dots))


def library_dots_for(jaxpr: Any) -> bool:
    """Whether a function (its jaxpr) should run its dots in YNNPACK (the default).

    False when float32 dots of ``LARGE_DOT_ROWS`` rows or more, counting a batched dot's
    batch, do at least ``LARGE_DOT_SHARE`` of the multiply-adds: XLA's own dot is the faster
    there (module docstring). Other types stay with YNNPACK, whose 8-bit and bfloat16 dots XLA's
    own does not match (the int8 BERT at batch 32: 1.48x slower without them). A function
    without dots keeps the default.
    """
    total = large = 0
    for lhs_shape, rhs_shape, dimension_numbers, dtypes, runs in _dots(jaxpr):
        float32 = all(t == np.float32 for t in dtypes)
        (lhs_contract, rhs_contract), (_, rhs_batch) = dimension_numbers
        rows = math.prod(n for d, n in enumerate(lhs_shape) if d not in lhs_contract)  # batch included
        contracted = math.prod(lhs_shape[d] for d in lhs_contract)
        columns = math.prod(n for d, n in enumerate(rhs_shape) if d not in (*rhs_contract, *rhs_batch))
        work = runs * rows * contracted * columns
        total += work
        large += work if float32 and rows >= LARGE_DOT_ROWS else 0
    return total == 0 or large < LARGE_DOT_SHARE * total


class DotChoosingJit:
    """``fn`` compiled with the fusions that suit it, chosen once per call signature.

    ``signature_of(*args)`` gives what the compiled shapes depend on (shapes, dtypes, static
    values; :func:`signature` for a tree of arrays), asked only where there is a choice. The
    first call with a signature traces ``fn`` (the trace the library compilations reuse) and
    picks, recording it in :attr:`choices`:

    - :data:`XLA_DOTS` where :func:`library_dots_for` says so (and ``xla_dots`` allows it);
    - else :data:`LIBRARY_REDUCTIONS` where the module compiled with YNNPACK's reductions
      passes :func:`jonnx._hlo.ynn_fusions_are_safe` and :func:`jonnx._hlo.ynn_fusions_are_fast`
      (the call then reuses that compilation);
    - else :data:`LIBRARY_DOTS`, what :func:`plain_jit` gives.

    The :data:`XLA_DOTS` compilation traces ``fn`` again, with :func:`traced_for` saying so:
    without YNNPACK in the module, some ops choose another lowering (Softmax's row maximum,
    ops/activation.py). The others share the first trace, since which of them a signature
    gets is known only once it is compiled.

    Off the CPU, or with a jaxlib without the YNNPACK option, it is :func:`plain_jit`
    (:attr:`default`).
    """

    def __init__(
        self, fn: Callable[..., Any], signature_of: Callable[..., Any], *, xla_dots: bool = True, **jit_kwargs: Any
    ):
        given = jit_kwargs.pop("compiler_options", None) or {}
        self.default = plain_jit(fn, compiler_options=given, **jit_kwargs)
        self._nested = jax.jit(fn, **jit_kwargs)  # inside the caller's jit, whose options apply
        self.__doc__ = self.default.__doc__  # fn's, as jax.jit keeps it (other names: __getattr__)
        self._signature_of = signature_of
        self._variants = {LIBRARY_DOTS: self.default}
        # The caller's own fusion option, or a jaxlib without one, leaves nothing to choose.
        if jax.default_backend() == "cpu" and _knows_ynn_fusions() and _YNN_FUSION_FLAG not in given:
            if xla_dots:
                # Traced again, for XLA's emitter alone (traced_for), from the first call choosing it.
                xla = {**given, _YNN_FUSION_FLAG: ""}
                self._variants[XLA_DOTS] = plain_jit(_tracing_for(XLA_DOTS, fn), compiler_options=xla, **jit_kwargs)
            if _knows_reduce_fusions():
                reductions = {**given, _YNN_FUSION_FLAG: _DOTS_AND_REDUCTIONS}
                self._variants[LIBRARY_REDUCTIONS] = plain_jit(fn, compiler_options=reductions, **jit_kwargs)
        self.chooses = len(self._variants) > 1
        self.choices: dict[Any, str] = {}  # per signature: a key of _variants

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.keyed(self._signature_of(*args, **kwargs) if self.chooses else None, *args, **kwargs)

    def keyed(self, key: Any, *args: Any, **kwargs: Any) -> Any:
        """The call, for a caller that has ``signature_of(*args, **kwargs)`` at hand already."""
        if key is None or not self.chooses:
            return self._call_default(args, kwargs)
        return self._variants[self._choice(key, args, kwargs)](*args, **kwargs)

    def compiled(self, *args: Any, **kwargs: Any) -> Any:
        """The compilation a call with these arguments runs (the choice made first where there
        is one), without running it; the call that follows finds it in JAX's cache."""
        key = self._signature_of(*args, **kwargs) if self.chooses else None
        variant = self.default if key is None else self._variants[self._choice(key, args, kwargs)]
        return variant.trace(*args, **kwargs).lower().compile()

    def __getattr__(self, name: str) -> Any:
        # lower, trace, eval_shape, __wrapped__...: the single-dot jax.jit function's.
        return getattr(self.default, name)

    def _call_default(self, args: tuple, kwargs: dict) -> Any:
        try:
            return self.default(*args, **kwargs)
        except ValueError as e:
            # JAX refuses a jit with compiler options inside another transformation (vmap
            # alone keeps it top-level): asked only then, so plain calls pay nothing.
            if "compiler_options" not in str(e):
                raise
            if tracing_into_jaxpr():
                # Inside the caller's jit (or scan, checkpoint): traced into it as any nested
                # jax.jit; the outermost jit's compiler options govern the whole computation.
                return self._nested(*args, **kwargs)
            name = getattr(self.default, "__name__", "f")
            raise ValueError(
                f"jonnx.jit({name}) was called under jax.grad (or jvp, linearize, vjp) outside any jit. "
                "JAX allows compiler options only on the outermost jit, and jonnx's keep XLA's CPU "
                "backend from a fusion that miscompiles (docs/known_issues.md): put the "
                "transformation inside, jonnx.jit(jax.grad(f)), or differentiate the function itself"
            ) from None

    def _choice(self, key: Any, args: tuple, kwargs: dict) -> str:
        choice = self.choices.get(key)
        if choice is None:
            choice = self.choices[key] = self._choose(args, kwargs)
        return choice

    def _choose(self, args: tuple, kwargs: dict) -> str:
        if XLA_DOTS in self._variants and not library_dots_for(self.default.trace(*args, **kwargs).jaxpr):
            return XLA_DOTS
        reductions = self._variants.get(LIBRARY_REDUCTIONS)
        if reductions is None:
            return LIBRARY_DOTS
        # Compiled here to be read; the call that follows finds this compilation in JAX's cache.
        compiled = reductions.trace(*args, **kwargs).lower().compile()
        return LIBRARY_REDUCTIONS if _hlo.ynn_fusions_suit(compiled.as_text()) else LIBRARY_DOTS


class _Tracing(threading.local):
    variant: str | None = None  # what DotChoosingJit is tracing this thread's function for


_TRACING = _Tracing()


def traced_for() -> str | None:
    """Which of :class:`DotChoosingJit`'s compilations the function being traced is for:
    :data:`XLA_DOTS`, or None where that is not known at trace time (the other choices share
    one trace; a plain jit, a user's). Asked by ops while tracing.

    A jit nested in the function may keep a trace made for another choice (JAX caches it by
    its own arguments): that costs the lowering's speed, never its result.
    """
    return _TRACING.variant


def _tracing_for(variant: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, with :func:`traced_for` giving ``variant`` while it runs: a function of its own,
    so that JAX traces it apart from ``fn``."""

    @functools.wraps(fn)  # the signature too, which jax.jit reads for static_argnames
    def traced(*args: Any, **kwargs: Any) -> Any:
        outer, _TRACING.variant = _TRACING.variant, variant
        try:
            return fn(*args, **kwargs)
        finally:
            _TRACING.variant = outer

    return traced


def tracing_into_jaxpr() -> bool:
    """Whether the calling code is being traced into a jaxpr (under ``jax.jit``, ``lax.scan``,
    ``jax.checkpoint``...), where JAX refuses a nested jit with compiler options.

    There an operation on constants is staged too and gives a tracer; eagerly, also under
    ``jax.grad`` or ``jax.vmap`` alone, it gives a value. It runs that operation (about 50
    microseconds), so callers ask only when they hold tracers.
    """
    return isinstance(jax.lax.add(np.float32(0), np.float32(0)), jax.core.Tracer)


def signature(tree: Any) -> tuple:
    """Shapes and dtypes of a tree's leaves: what a compilation of them depends on. Asked on
    every call of a model, so the dtypes stay objects (hashable; ``str`` of one costs 3 us)."""
    return tuple((np.shape(x), getattr(x, "dtype", type(x))) for x in jax.tree_util.tree_leaves(tree))


def call_signature(static: tuple[frozenset, frozenset], args: tuple, kwargs: dict) -> tuple | None:
    """What a ``jax.jit`` call compiles for: the static arguments' values (``static``: their
    positions and names), the structure of the others and their leaves' shapes, dtypes and
    weak types. None when a leaf is a tracer (the call is being traced into something else)."""
    positions, names = static
    fixed = tuple(a for i, a in enumerate(args) if i in positions or i - len(args) in positions)
    fixed += tuple(sorted((k, v) for k, v in kwargs.items() if k in names))
    dynamic = (
        [a for i, a in enumerate(args) if i not in positions and i - len(args) not in positions],
        {k: v for k, v in kwargs.items() if k not in names},
    )
    leaves, structure = jax.tree_util.tree_flatten(dynamic)
    array = _array_type()
    try:  # a jax array's aval is its shape, dtype and weak type (asked on every call: kept cheap)
        shapes = tuple([x.aval if type(x) is array else _leaf_signature(x) for x in leaves])
    except _Traced:
        return None
    return fixed, structure, shapes


class _Traced(Exception):
    """A call's argument is a tracer."""


def _leaf_signature(x: Any) -> tuple:
    if isinstance(x, jax.core.Tracer):
        raise _Traced
    return np.shape(x), getattr(x, "dtype", type(x))


@functools.cache
def _array_type() -> type:
    """The class of jax's concrete arrays (``isinstance(x, jax.Array)`` is a slower ABC check,
    and true of tracers too)."""
    return type(jax.device_put(np.zeros((), np.float32)))


def _static_arguments(fn: Callable[..., Any], jit_kwargs: dict) -> tuple[frozenset, frozenset]:
    """The positions and names of ``fn``'s static arguments, as ``jax.jit`` takes them."""
    numbers, names = jit_kwargs.get("static_argnums", ()), jit_kwargs.get("static_argnames", ())
    numbers = (numbers,) if isinstance(numbers, int) else tuple(numbers or ())
    names = (names,) if isinstance(names, str) else tuple(names or ())
    try:  # jax.jit also treats a static position's parameter name as static, and the reverse
        parameters = [
            name
            for name, p in inspect.signature(fn).parameters.items()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        parameters = []
    # A negative position counts from the end of the call's positional arguments; kept as given
    # (call_signature reads it so) and, where the parameters are known, as the index it names.
    numbers += tuple(i + len(parameters) for i in numbers if parameters and -len(parameters) <= i < 0)
    numbers += tuple(parameters.index(n) for n in names if n in parameters)
    names += tuple(parameters[i] for i in numbers if 0 <= i < len(parameters))
    return frozenset(numbers), frozenset(names)


def _dots(jaxpr: Any, runs: int = 1) -> Iterator[tuple[tuple[int, ...], tuple[int, ...], Any, tuple, int]]:
    """(lhs shape, rhs shape, dimension numbers, the operands' dtypes, how many times it runs
    per call) of every dot_general, nested jaxprs included: a scan's body runs its length
    times (a recurrent layer's small step product outweighs the input projection before it);
    other bodies (a while loop's, whose trip count is data) count once."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            lhs, rhs = (v.aval for v in eqn.invars)
            if all(isinstance(n, (int, np.integer)) for n in (*lhs.shape, *rhs.shape)):
                yield lhs.shape, rhs.shape, eqn.params["dimension_numbers"], (lhs.dtype, rhs.dtype), runs
        inner = runs * int(eqn.params["length"]) if eqn.primitive.name == "scan" else runs
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else (param,):
                if isinstance(sub, (jax_core.Jaxpr, jax_core.ClosedJaxpr)):
                    yield from _dots(sub, inner)


def _probed_options(library_dots: bool) -> tuple[tuple[str, str], ...]:
    options = ((_YNN_FUSION_FLAG, _SAFE_YNN_FUSIONS[library_dots]),) if _knows_ynn_fusions() else ()
    return options + _WIDE_VECTORS if _takes_wide_vectors() else options


# XLA CPU vectorizes its loops (elementwise work, and the multiply-add lowerings of depthwise
# and few-channel convolutions in ops/conv.py) 256 bits wide unless told otherwise. On AMD CPUs
# with AVX-512 (measured on a Zen 5) 512 bits were faster, alternating in one process:
# MobileNetV2 at batch 1 0.887 of the time, at batch 16 0.944, an EfficientNet-B0 at batch 1
# 0.840 (its SiLU's exp in those loops: 0.70 -> 0.38 ms at 112x112x96), the int8 BERT 0.964;
# ResNet-50, the BERT encoder and the ResNet-18, MobileNetV2 and BERT training steps within 1%
# (docs/performance.md). On a Zen 4 (AVX-512 as two 256-bit halves) the same: MobileNetV2 at
# batch 1 0.973-0.994, the EfficientNet-B0 0.869, the int8 BERT 0.958, the rest within 1.3%.
# The same on an Intel Xeon with AMX (Sapphire Rapids or later): MobileNetV2 at batch 1
# 0.951-0.971, at batch 16 0.954, the EfficientNet-B0 0.924, the int8 BERT 0.947, the BERT
# fine-tuning step 0.964, the rest within 1%. Older Intel CPUs with AVX-512 are unmeasured and
# keep XLA's default: some (Skylake) lower their clock for 512-bit code, which is why compilers
# prefer 256 there.
_WIDE_VECTORS = (("xla_cpu_prefer_vector_width", "512"),)


@functools.cache
def _takes_wide_vectors() -> bool:
    """Whether jonnx compiles with 512-bit vectors: an AMD CPU with AVX-512, or an Intel one
    with AMX, whose jaxlib accepts the option."""
    info = _cpu.cpu_info()
    wide = {"AuthenticAMD", "avx512f"} <= info or {"GenuineIntel", "avx512f", "amx_tile"} <= info
    if jax.default_backend() != "cpu" or not wide:
        return False
    return _compiled_text(lambda x: x + 1, dict(_WIDE_VECTORS)) is not None


@functools.cache
def _knows_ynn_fusions() -> bool:
    """Whether this jaxlib takes the YNNPACK fusion option with the values jonnx passes and
    acts on it: one small product compiled with the longer value, whose fusion types include
    the other's. jaxlib 0.8.1 accepts the option but leaves the product to XLA."""
    return _gives_ynn_fusion(lambda x: x @ x.T, _SAFE_YNN_FUSIONS[True])


@functools.cache
def _knows_reduce_fusions() -> bool:
    """Whether this jaxlib gives YNNPACK reductions when asked (see :func:`_knows_ynn_fusions`)."""
    return _knows_ynn_fusions() and _gives_ynn_fusion(lambda x: x.sum(axis=0), _DOTS_AND_REDUCTIONS)


def _gives_ynn_fusion(fn: Callable[[Any], Any], fusion_types: str) -> bool:
    """Whether ``fn`` of a (64, 64) float32 array, compiled with these YNNPACK fusion types,
    runs in a YNNPACK fusion."""
    return "ynn_fusion" in (_compiled_text(fn, {_YNN_FUSION_FLAG: fusion_types}) or "")


def _compiled_text(fn: Callable[[Any], Any], options: dict[str, str]) -> str | None:
    """The compiled module of ``fn`` of a (64, 64) float32 array under these compiler options,
    or None where this jaxlib refuses them."""
    try:
        return (
            jax.jit(fn, compiler_options=options).lower(jax.ShapeDtypeStruct((64, 64), np.float32)).compile().as_text()
        )
    except Exception:  # noqa: BLE001 - any refusal means "this jaxlib has no such option or value"
        return None


_BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_TRIM_AFTER_SECONDS = 0.5


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(None)
        return libc.malloc_trim  # glibc only
    except (OSError, AttributeError):
        return None


def release_freed_memory() -> None:
    """Return the memory freed so far to the system (glibc keeps it mapped otherwise)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _trim_after_compile(event: str, duration: float, **_: Any) -> None:
    if event == _BACKEND_COMPILE_EVENT and duration >= _TRIM_AFTER_SECONDS:
        release_freed_memory()


@functools.cache
def _listen_for_compiles() -> None:
    if _malloc_trim() is not None:
        jax.monitoring.register_event_duration_secs_listener(_trim_after_compile)


def jit(fn: Callable[..., Any], **jit_kwargs: Any) -> DotChoosingJit:
    """``jax.jit(fn, **jit_kwargs)`` with jonnx's compiler options, and YNNPACK's reductions
    where they are safe.

    On the CPU each new call signature (the arguments' structure, shapes and dtypes, and the
    static arguments' values) is compiled with YNNPACK's reductions first and kept if the
    compiled module passes :func:`jonnx._hlo.ynn_fusions_are_safe` and
    :func:`jonnx._hlo.ynn_fusions_are_fast`, else compiled with single dots
    (:func:`compiler_options`); the dots stay YNNPACK's. Called inside the caller's
    ``jax.jit`` (or ``lax.scan``, ``jax.checkpoint``) it is traced into it as a nested
    ``jax.jit``, whose compiler options are the outermost jit's (make that one ``jonnx.jit``);
    under ``jax.vmap`` it stays a top-level jit with jonnx's options; under ``jax.grad``
    outside any jit it raises a ``ValueError`` saying to write ``jonnx.jit(jax.grad(f))``, as
    JAX refuses compiler options there. ``lower``, ``trace``, ``eval_shape`` and the other
    attributes of a ``jax.jit`` function are the single-dot one's.

    >>> fast_apply = jonnx.jit(model.apply)          # doctest: +SKIP
    """
    static = _static_arguments(fn, jit_kwargs)
    return DotChoosingJit(
        fn, lambda *args, **kwargs: call_signature(static, args, kwargs), xla_dots=False, **jit_kwargs
    )


def differentiable(forward: Callable[..., Any], backward: Callable[..., Any]) -> Callable[..., Any]:
    """``forward`` made differentiable by ``jax.grad`` outside any jit, though it is a top-level
    jit with compiler options, which JAX refuses to trace into: a ``custom_vjp`` whose forward
    and backward both run on concrete values. ``backward(*args, cotangents)`` gives a cotangent
    (or None) per argument: a compiled ``jax.vjp`` that recomputes the forward rather than keep
    its residuals. Forward mode (``jax.jvp``) does not apply to it. JAX caches the wrapper's
    traces by the function, so one made once (a loop body's) is traced once per shape."""

    @jax.custom_vjp
    def call(*args):
        return forward(*args)

    def keep(*args):
        return call(*args), args

    def pull(saved, cotangents):
        return tuple(backward(*saved, cotangents))

    call.defvjp(keep, pull)
    return call


def plain_jit(fn: Callable[..., Any], **jit_kwargs: Any) -> Callable[..., Any]:
    """``jax.jit(fn, **jit_kwargs)`` with :func:`compiler_options` added (YNNPACK single dots)."""
    _listen_for_compiles()
    options = {**compiler_options(), **(jit_kwargs.pop("compiler_options", None) or {})}
    return jax.jit(fn, compiler_options=options, **jit_kwargs)
