"""``jonnx.jit``: ``jax.jit`` with the XLA compiler options jonnx needs to be correct.

XLA's CPU backend in jaxlib 0.10 miscompiles a dot whose operand is a broadcast when it fuses
the dot, through YNNPACK, with the reduction after it (a mean, a softmax): the result is garbage
or NaN. All-equal constants reach XLA as broadcasts, so a model whose MatMul/Gemm weights are
``ConstantOfShape`` fills (the light model zoo of the onnx test data) feeding a Softmax or a
ReduceMean hits it. Limiting YNNPACK to fusions of one dot or one convolution avoids the bad
fusion and keeps YNNPACK's kernels. Measured on the benchmark models: small_cnn unchanged,
tiny_transformer at batch 32 about 10-20% slower than with XLA's defaults (turning YNNPACK
fusions off altogether costs 30-40% there). Other fusion sets that were tried (adding elementwise
or dot fusions) still miscompile. The reproducer, in plain JAX, is in docs/known_issues.md.

Compiling a large model makes XLA (LLVM) allocate and free hundreds of megabytes, which glibc
keeps mapped; the first run then maps its temporaries on top. :func:`jit` therefore returns the
freed memory to the system (``malloc_trim``) right after each backend compile of half a second
or more (a few milliseconds, against seconds of compiling): ResNet-50's first call peaked at 3.3x
its weights' bytes without it and 2.6x with it (benchmarks/bench_memory.py).
JAX's compile events have no owner, so the listener is process-wide: once jonnx has compiled
anything, a user's own long compiles are trimmed after too (a few milliseconds each; glibc
only, a no-op elsewhere).

Every function jonnx compiles itself goes through :func:`jit`; a user's own ``jax.jit`` over
``Model.apply`` can use :func:`jonnx.jit` (or ``compiler_options=jonnx.compiler_options()``).
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

_YNN_FUSION_FLAG = "xla_cpu_experimental_ynn_fusion_type"
_SAFE_YNN_FUSIONS = "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT,LIBRARY_FUSION_TYPE_INDIVIDUAL_CONVOLUTION"


def compiler_options() -> dict[str, str]:
    """The XLA compiler options jonnx compiles with, as a new dict.

    Empty where the installed jaxlib does not know the option (a jaxlib without YNNPACK, or a
    newer one that renamed it): compiling with an unknown option is an error, so it is probed
    once, on a trivial function.
    """
    return dict(_probed_options())


@functools.cache
def _probed_options() -> tuple[tuple[str, str], ...]:
    options = {_YNN_FUSION_FLAG: _SAFE_YNN_FUSIONS}
    try:
        jax.jit(lambda x: x + 1, compiler_options=options).lower(jnp.zeros(())).compile()
    except Exception:  # noqa: BLE001 - any refusal means "this jaxlib has no such option"
        return ()
    return tuple(options.items())


_BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_TRIM_AFTER_SECONDS = 0.5


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(None)
        return libc.malloc_trim  # glibc only
    except (OSError, AttributeError):
        return None


def _trim_after_compile(event: str, duration: float, **_: Any) -> None:
    if event == _BACKEND_COMPILE_EVENT and duration >= _TRIM_AFTER_SECONDS:
        trim = _malloc_trim()
        if trim is not None:
            trim(0)


@functools.cache
def _listen_for_compiles() -> None:
    if _malloc_trim() is not None:
        jax.monitoring.register_event_duration_secs_listener(_trim_after_compile)


def jit(fn: Callable[..., Any], **jit_kwargs: Any) -> Callable[..., Any]:
    """``jax.jit(fn, **jit_kwargs)`` with :func:`compiler_options` added.

    >>> fast_apply = jonnx.jit(model.apply)          # doctest: +SKIP
    """
    _listen_for_compiles()
    options = {**compiler_options(), **(jit_kwargs.pop("compiler_options", None) or {})}
    return jax.jit(fn, compiler_options=options, **jit_kwargs)
