"""Signal processing: DFT, STFT, the window generators and MelWeightMatrix.

ONNX holds complex numbers as a trailing axis of size 2 (real, imaginary); real signals have a
trailing axis of size 1. Lengths, axes and sizes are static inputs, so every output shape is
known at trace time. DFT and STFT are built on ``jnp.fft`` and are differentiable with respect
to the signal (and STFT's window); float16/bfloat16 are computed in float32 (XLA's FFT has no
half-precision kernel) and cast back.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from jonnx._registry import Attrs, Inputs, OpContext, Outputs, register
from jonnx.ops._util import compute_type, onnx_dtype, static_ints

# -- DFT -------------------------------------------------------------------------------------


def _scalar(value, ctx, what: str) -> int:
    values = static_ints(value)
    if len(values) != 1:
        raise ctx.error(f"{what} must be a scalar, got {len(values)} values")
    return values[0]


def _signal_axis(axis: int, rank: int, ctx) -> int:
    # The last axis holds (real, imag): the accepted range is [-r, -2] U [0, r-2].
    if not -rank <= axis <= rank - 2 or axis == -1:
        raise ctx.error(f"axis {axis} is out of range [-{rank}, -2] U [0, {rank - 2}] for an input of rank {rank}")
    return axis % rank


def _as_complex(x, ctx):
    """The signal without its trailing (real, imag) axis: real or complex, at FFT precision."""
    parts = jnp.shape(x)[-1] if jnp.ndim(x) else 0
    if parts not in (1, 2):
        raise ctx.error(f"the last axis must have size 1 (real) or 2 (complex), got shape {jnp.shape(x)}")
    x = jnp.asarray(x).astype(compute_type(jnp.result_type(x)))
    if parts == 1:
        return x[..., 0]
    return lax.complex(x[..., 0], x[..., 1])


def _dft(x, dft_length: int | None, axis: int, inverse: bool, onesided: bool, ctx):
    rank = jnp.ndim(x)
    if rank < 2:
        raise ctx.error(f"input must have rank >= 2 (signal dims plus the complex axis), got {jnp.shape(x)}")
    axis = _signal_axis(axis, rank, ctx)
    n = jnp.shape(x)[axis]
    if dft_length is None:
        # IRFFT reads a one-sided spectrum: its default length is the full (even) signal.
        dft_length = 2 * (n - 1) if inverse and onesided else n
    if dft_length < 1:
        raise ctx.error(f"dft_length must be positive, got {dft_length}")
    signal = _as_complex(x, ctx)
    if inverse and onesided:
        out = jnp.fft.irfft(signal, n=dft_length, axis=axis)[..., None]
        return out.astype(jnp.result_type(x))
    if inverse:
        out = jnp.fft.ifft(signal, n=dft_length, axis=axis)
    elif not jnp.iscomplexobj(signal):
        out = jnp.fft.rfft(signal, n=dft_length, axis=axis)
        if not onesided:
            # The other half by conjugate symmetry: DC and Nyquist stay exactly real, as in
            # numpy's float64 results (a complex FFT leaves ~1e-6 there in float32).
            tail = lax.slice_in_dim(out, 1, (dft_length - 1) // 2 + 1, axis=axis)
            out = jnp.concatenate([out, jnp.conj(jnp.flip(tail, axis=axis))], axis=axis)
    else:
        out = jnp.fft.fft(signal, n=dft_length, axis=axis)
        if onesided:  # complex input: the spec forbids it, the reference keeps the first half
            out = lax.slice_in_dim(out, 0, dft_length // 2 + 1, axis=axis)
    return jnp.stack([jnp.real(out), jnp.imag(out)], axis=-1).astype(jnp.result_type(x))


def _optional_length(value, ctx, what: str) -> int | None:
    if value is None or np.size(value) == 0:
        return None
    return _scalar(value, ctx, what)


@register("DFT", since=17, static_inputs=(1,))
def dft_17(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``DFT``-17: ``axis`` attribute (default 1); ``onesided`` with ``inverse`` is IRFFT."""
    x, length = inputs
    length = _optional_length(length, ctx, "dft_length")
    return (_dft(x, length, attrs["axis"], bool(attrs["inverse"]), bool(attrs["onesided"]), ctx),)


@register("DFT", since=20, static_inputs=(1, 2))
def dft_20(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``DFT``-20: ``axis`` is an optional static input (default -2)."""
    x, length, axis = inputs
    length = _optional_length(length, ctx, "dft_length")
    axis = _optional_length(axis, ctx, "axis")
    axis = -2 if axis is None else axis
    return (_dft(x, length, axis, bool(attrs["inverse"]), bool(attrs["onesided"]), ctx),)


# -- STFT ------------------------------------------------------------------------------------


@register("STFT", since=17, static_inputs=(1, 3))
def stft(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``STFT``-17: frames of ``frame_length`` every ``frame_step`` samples, windowed.

    The window, when given, must have ``frame_length`` entries (the reference evaluator pads
    or cuts frames to the window instead; the spec defines no such case).
    """
    signal, step, window, frame_length = inputs
    step = _scalar(step, ctx, "frame_step")
    frame_length = _optional_length(frame_length, ctx, "frame_length")
    if jnp.ndim(signal) < 2:
        raise ctx.error(f"signal must have shape [batch, length, 1 or 2], got {jnp.shape(signal)}")
    if window is not None:
        if jnp.ndim(window) != 1:
            raise ctx.error(f"window must have rank 1, got shape {jnp.shape(window)}")
        if frame_length is None:
            frame_length = jnp.shape(window)[0]
        elif frame_length != jnp.shape(window)[0]:
            raise ctx.error(f"window has {jnp.shape(window)[0]} entries but frame_length is {frame_length}")
    length = jnp.shape(signal)[-2]
    frame_length = length if frame_length is None else frame_length
    if step < 1 or not 1 <= frame_length <= length:
        raise ctx.error(f"need frame_step >= 1 and 1 <= frame_length <= {length}, got {step} and {frame_length}")
    n_frames = 1 + (length - frame_length) // step
    index = np.arange(n_frames)[:, None] * step + np.arange(frame_length)[None, :]
    frames = jnp.take(signal, index, axis=-2)  # [..., frames, frame_length, 1|2]
    if window is not None:
        frames = frames * jnp.asarray(window, jnp.result_type(signal))[:, None]
    return (_dft(frames, None, -2, False, bool(attrs["onesided"]), ctx),)


# -- windows ---------------------------------------------------------------------------------


def _window(size_input, attrs, ctx, coefficients: tuple[float, ...]):
    """``sum_k (-1)^k a_k cos(2 pi k n / N)``, N = size (periodic) or size - 1 (symmetric)."""
    size = _scalar(size_input, ctx, "size")
    if size < 0:
        raise ctx.error(f"size must be non-negative, got {size}")
    dtype = onnx_dtype(attrs["output_datatype"])
    denominator = size if attrs["periodic"] else size - 1
    if denominator <= 0:  # a one-point symmetric window: 1, as numpy and torch define it
        return (np.ones(size, dtype),)
    phase = 2 * np.pi * np.arange(size, dtype=np.float64) / denominator
    out = sum((-1) ** k * a * np.cos(k * phase) for k, a in enumerate(coefficients))
    return (np.asarray(out).astype(dtype),)


@register("HannWindow", since=17, static_inputs=(0,))
def hann_window(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``HannWindow``-17."""
    return _window(inputs[0], attrs, ctx, (0.5, 0.5))


@register("HammingWindow", since=17, static_inputs=(0,))
def hamming_window(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``HammingWindow``-17 (alpha = 25/46, as the spec's function body)."""
    return _window(inputs[0], attrs, ctx, (25 / 46, 21 / 46))


@register("BlackmanWindow", since=17, static_inputs=(0,))
def blackman_window(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``BlackmanWindow``-17."""
    return _window(inputs[0], attrs, ctx, (0.42, 0.5, 0.08))


# -- MelWeightMatrix -------------------------------------------------------------------------


@register("MelWeightMatrix", since=17, static_inputs=(0, 1, 2, 3, 4))
def mel_weight_matrix(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``MelWeightMatrix``-17: triangular filters of peak 1 on FFT bins.

    Band edges are rounded down to FFT bins as the spec's reference does:
    ``bin = floor((dft_length + 1) * hz / sample_rate)`` (clamped to the last bin).
    """
    num_mel_bins = _scalar(inputs[0], ctx, "num_mel_bins")
    dft_length = _scalar(inputs[1], ctx, "dft_length")
    sample_rate = _scalar(inputs[2], ctx, "sample_rate")
    lower, upper = (np.asarray(v).reshape(()) for v in inputs[3:5])
    if num_mel_bins < 1 or dft_length < 1 or sample_rate < 1:
        raise ctx.error("num_mel_bins, dft_length and sample_rate must be positive")
    if not 0 <= lower < upper <= sample_rate / 2:
        raise ctx.error(
            f"need 0 <= lower_edge_hertz < upper_edge_hertz <= sample_rate / 2, got {lower}, {upper}, {sample_rate}"
        )
    n_bins = dft_length // 2 + 1
    low_mel = 2595 * np.log1p(lower / 700) / np.log(10)
    high_mel = 2595 * np.log1p(upper / 700) / np.log(10)
    step = (high_mel - low_mel) / (num_mel_bins + 2)
    hz = 700 * np.expm1((np.arange(num_mel_bins + 2) * step + low_mel) / 2595 * np.log(10))
    edges = (((dft_length + 1) * hz) // sample_rate).astype(np.int64)
    edges = np.minimum(edges, n_bins - 1)
    out = np.zeros((n_bins, num_mel_bins), np.float64)
    for i in range(num_mel_bins):
        left, center, right = edges[i : i + 3]
        if center == left:
            out[center, i] = 1
        else:
            j = np.arange(left, center + 1)
            out[j, i] = (j - left) / (center - left)
        if right > center:
            j = np.arange(center, right)
            out[j, i] = (right - j) / (right - center)
    return (out.astype(onnx_dtype(attrs["output_datatype"])),)
