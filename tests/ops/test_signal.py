"""DFT, STFT, the window generators and MelWeightMatrix against the ReferenceEvaluator / numpy."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import jonnx
from jonnx import errors
from tests.ops._harness import assert_matches_reference, check_op_grads, node_model, run_jonnx

RNG = np.random.default_rng(0)
I64 = np.int64


def _signal(shape, complex_: bool, dtype=np.float32):
    return RNG.standard_normal((*shape, 2 if complex_ else 1)).astype(dtype)


# -- DFT -------------------------------------------------------------------------------------


def _dft_inputs(opset, x, length=None, axis=None):
    inputs = {"x": x, "dft_length": None if length is None else np.array(length, I64)}
    attrs = {}
    if opset >= 20:
        inputs["axis"] = None if axis is None else np.array(axis, I64)
    elif axis is not None:
        attrs["axis"] = axis
    return inputs, attrs


@pytest.mark.parametrize("opset", [17, 20])
@pytest.mark.parametrize(
    "complex_,inverse,onesided,length,dtype",
    [
        (False, 0, 0, None, np.float32),
        (True, 0, 0, 6, np.float32),
        (False, 1, 0, 11, np.float32),
        (True, 1, 0, None, np.float64),
        (False, 0, 1, 11, np.float64),
        (True, 0, 1, 6, np.float32),
        (False, 0, 1, None, np.float32),
        (True, 0, 0, 11, np.float64),
    ],
)
def test_dft_matches_reference(opset, complex_, inverse, onesided, length, dtype):
    x = _signal((2, 8, 3), complex_, dtype)
    inputs, attrs = _dft_inputs(opset, x, length, axis=1)
    rtol = 1e-4 if dtype == np.float32 else 1e-10
    assert_matches_reference(
        "DFT",
        inputs,
        opset=opset,
        inverse=inverse,
        onesided=onesided,
        initializers=("dft_length", "axis"),
        rtol=rtol,
        atol=rtol,
        **attrs,
    )


@pytest.mark.parametrize("opset,axis", [(17, None), (17, 2), (17, -3), (20, None), (20, 0), (20, -3)])
def test_dft_axis(opset, axis):
    # Opset 17 defaults to axis 1, opset 20 to -2 (the last signal axis); numpy gives the
    # expected value (the ReferenceEvaluator fails on DFT-20 without its axis input).
    x = _signal((3, 4, 5), True)
    inputs, attrs = _dft_inputs(opset, x, axis=axis)
    signal_axis = (1 if opset == 17 else -2) if axis is None else axis % 4

    def expected(x, *_):
        y = np.fft.fft(x[..., 0] + 1j * x[..., 1].astype(np.float64), axis=signal_axis % 4)
        return [np.stack([y.real, y.imag], -1).astype(np.float32)]

    assert_matches_reference(
        "DFT", inputs, opset=opset, initializers=("axis",), expected=expected, rtol=1e-4, atol=1e-4, **attrs
    )


@pytest.mark.parametrize("n", [8, 9])
def test_irfft(n):
    # inverse=1, onesided=1 takes a one-sided spectrum and returns a real signal [..., 1].
    real = RNG.standard_normal((2, n))
    spectrum = np.fft.rfft(real, axis=1)
    x = np.stack([spectrum.real, spectrum.imag], -1).astype(np.float32)
    length = None if n % 2 == 0 else n  # the default is 2 * (bins - 1), an even length
    inputs, _ = _dft_inputs(20, x, length, axis=1)
    assert_matches_reference(
        "DFT",
        inputs,
        opset=20,
        inverse=1,
        onesided=1,
        initializers=("dft_length", "axis"),
        expected=[real[..., None].astype(np.float32)],
        rtol=1e-4,
        atol=1e-5,
    )


def test_dft_real_input_keeps_dc_and_nyquist_real():
    x = np.arange(20, dtype=np.float32).reshape(1, 10, 2)[..., :1] * 100
    out = run_jonnx(node_model("DFT", {"x": x}, opset=20), {"x": x})[0]
    assert out[0, 0, 1] == 0 and out[0, 5, 1] == 0


def test_dft_float16_computes_in_float32():
    x = _signal((2, 16), True, np.float16)
    full = x[..., 0].astype(np.float64) + 1j * x[..., 1]
    want = np.fft.fft(full, axis=1)
    out = assert_matches_reference(
        "DFT",
        {"x": x},
        opset=20,
        expected=[np.stack([want.real, want.imag], -1).astype(np.float16)],
        rtol=1e-2,
        atol=2e-2,
    )
    assert out[0].dtype == np.float16


@pytest.mark.parametrize(
    "complex_,inverse,onesided", [(False, 0, 0), (True, 0, 0), (True, 1, 0), (False, 0, 1), (True, 1, 1)]
)
def test_dft_gradients(complex_, inverse, onesided):
    x = _signal((2, 6), complex_)
    check_op_grads("DFT", {"x": x}, opset=20, inverse=inverse, onesided=onesided)


@pytest.mark.parametrize("axis", [-1, 2, -4])
def test_dft_bad_axis(axis):
    x = _signal((2, 5), False)
    inputs, _ = _dft_inputs(20, x, axis=axis)
    with pytest.raises(errors.NodeError, match="axis"):
        run_jonnx(node_model("DFT", inputs, opset=20, initializers=("axis",)), inputs)


def test_dft_bad_complex_axis():
    x = RNG.standard_normal((2, 5, 3)).astype(np.float32)
    with pytest.raises(errors.NodeError, match="size 1 .real. or 2"):
        run_jonnx(node_model("DFT", {"x": x}, opset=20), {"x": x})


def test_dft_traced_length_raises_static_value_error():
    x, length = _signal((2, 5), False), np.array(4, I64)
    m = jonnx.load(node_model("DFT", {"x": x, "n": length}, opset=20))
    with jax.enable_x64(True), pytest.raises(errors.StaticValueError, match="DFT"):
        jax.jit(lambda n: m.apply(m.params, x, n))(length)


# -- STFT ------------------------------------------------------------------------------------


@pytest.mark.parametrize("window", [None, "hann"])
@pytest.mark.parametrize("frame_length", [None, 8])
@pytest.mark.parametrize("complex_,onesided", [(False, 0), (False, 1), (True, 0)])  # onesided needs real
def test_stft_matches_reference(onesided, window, frame_length, complex_):
    if window is None and frame_length is None:
        frame_length = 16  # without both, the frame is the whole signal
    x = _signal((2, 40), complex_)
    win = None if window is None else np.hanning(frame_length or 8).astype(np.float32)
    inputs = {
        "x": x,
        "step": np.array(5, I64),
        "window": win,
        "frame_length": None if frame_length is None else np.array(frame_length, I64),
    }
    assert_matches_reference(
        "STFT", inputs, opset=17, onesided=onesided, initializers=("step", "frame_length"), rtol=1e-4, atol=1e-4
    )


def test_stft_gradients_in_signal_and_window():
    inputs = {"x": _signal((1, 20), False), "step": np.array(4, I64), "window": np.hanning(8).astype(np.float32)}
    check_op_grads("STFT", inputs, opset=17, initializers=("step",))


def test_stft_window_length_mismatch():
    inputs = {
        "x": _signal((1, 20), False),
        "step": np.array(4, I64),
        "window": np.ones(8, np.float32),
        "frame_length": np.array(6, I64),
    }
    with pytest.raises(errors.NodeError, match="window has 8 entries"):
        run_jonnx(node_model("STFT", inputs, opset=17, initializers=("step", "frame_length")), inputs)


# -- windows, MelWeightMatrix ----------------------------------------------------------------


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
@pytest.mark.parametrize("size,elem", [(2, 1), (7, 11), (10, 10)])  # float, double, float16
def test_windows_match_reference(op, periodic, size, elem):
    # jonnx computes in float64 and rounds once; the reference computes float16 windows in
    # float16, a few ulps apart.
    atol = 2e-3 if elem == 10 else 1e-6
    assert_matches_reference(
        op,
        {"size": np.array(size, I64)},
        opset=17,
        periodic=periodic,
        output_datatype=elem,
        initializers=("size",),
        rtol=1e-3,
        atol=atol,
    )


def test_symmetric_windows_match_numpy():
    size = {"size": np.array(9, np.int32)}
    assert_matches_reference("HannWindow", size, opset=17, periodic=0, expected=[np.hanning(9).astype(np.float32)])
    assert_matches_reference(
        "BlackmanWindow", size, opset=17, periodic=0, expected=[np.blackman(9).astype(np.float32)], atol=1e-6
    )


def test_one_point_symmetric_window_is_one():
    # N - 1 = 0: numpy and torch define the window as [1] (the reference divides by zero).
    assert_matches_reference(
        "HannWindow", {"size": np.array(1, I64)}, opset=17, periodic=0, expected=[np.ones(1, np.float32)]
    )


def test_window_size_must_be_static():
    m = jonnx.load(node_model("HannWindow", {"size": np.array(4, I64)}, opset=17))
    with jax.enable_x64(True), pytest.raises(errors.StaticValueError, match="HannWindow"):
        jax.jit(lambda n: m.apply(m.params, n))(np.array(4, I64))


@pytest.mark.parametrize(
    "bins,dft,rate,lo,hi", [(8, 64, 8000, 0.0, 4000.0), (12, 400, 16000, 20.0, 7600.0), (5, 31, 1000, 10.0, 400.0)]
)
@pytest.mark.parametrize("elem", [1, 11])
def test_mel_weight_matrix_matches_reference(bins, dft, rate, lo, hi, elem):
    inputs = {
        "bins": np.array(bins, I64),
        "dft": np.array(dft, I64),
        "rate": np.array(rate, I64),
        "lo": np.array(lo, np.float32),
        "hi": np.array(hi, np.float32),
    }
    assert_matches_reference("MelWeightMatrix", inputs, opset=17, output_datatype=elem, initializers=tuple(inputs))


def test_mel_weight_matrix_bad_range():
    inputs = {
        "bins": np.array(4, I64),
        "dft": np.array(16, I64),
        "rate": np.array(100, I64),
        "lo": np.array(40.0, np.float32),
        "hi": np.array(20.0, np.float32),
    }
    with pytest.raises(errors.NodeError, match="lower_edge_hertz"):
        run_jonnx(node_model("MelWeightMatrix", inputs, opset=17, initializers=tuple(inputs)), inputs)
