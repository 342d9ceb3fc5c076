"""ImageDecoder: lossless formats against the source pixels, lossy ones against the reference."""

from __future__ import annotations

import io
import sys

import numpy as np
import pytest

from jonnx import errors
from tests.ops._harness import assert_matches_reference, node_model, run_jonnx

PIL_Image = pytest.importorskip("PIL.Image")

RNG = np.random.default_rng(0)
PIXELS = RNG.integers(0, 256, (12, 17, 3), dtype=np.uint8)


def _encode(pixels: np.ndarray, fmt: str, mode: str | None = None) -> np.ndarray:
    image = PIL_Image.fromarray(pixels)
    if mode is not None:
        image = image.convert(mode)
    with io.BytesIO() as f:
        image.save(f, format=fmt)
        return np.frombuffer(f.getvalue(), np.uint8).copy()


@pytest.mark.parametrize("fmt", ["PNG", "BMP", "TIFF", "PPM"])
@pytest.mark.parametrize("pixel_format", ["RGB", "BGR"])
def test_lossless_formats_give_the_source_pixels(fmt, pixel_format):
    expected = PIXELS if pixel_format == "RGB" else PIXELS[:, :, ::-1]
    assert_matches_reference(
        "ImageDecoder", {"x": _encode(PIXELS, fmt)}, opset=20, pixel_format=pixel_format, expected=[expected]
    )


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP"])
def test_grayscale_and_lossy_match_reference(fmt):
    # The reference decodes with Pillow too; lossy formats give the installed codec's pixels.
    data = {"x": _encode(PIXELS, fmt)}
    for pixel_format in ("RGB", "BGR", "Grayscale"):
        out = assert_matches_reference("ImageDecoder", data, opset=20, pixel_format=pixel_format)
        assert out[0].shape == (12, 17, 1 if pixel_format == "Grayscale" else 3)


@pytest.mark.parametrize("mode", ["RGBA", "P", "L"])
def test_other_modes_are_converted(mode):
    data = _encode(PIXELS, "PNG", mode)
    source = PIL_Image.open(io.BytesIO(data.tobytes()))
    expected_rgb = np.asarray(source.convert("RGB"))
    expected_gray = np.asarray(source.convert("L"))[:, :, None]
    assert_matches_reference("ImageDecoder", {"x": data}, opset=20, pixel_format="RGB", expected=[expected_rgb])
    assert_matches_reference("ImageDecoder", {"x": data}, opset=20, pixel_format="Grayscale", expected=[expected_gray])


def test_garbage_bytes():
    x = np.arange(50, dtype=np.uint8)
    with pytest.raises(errors.NodeError, match="cannot decode the image"):
        run_jonnx(node_model("ImageDecoder", {"x": x}, opset=20), {"x": x})


def test_bad_pixel_format():
    x = _encode(PIXELS, "PNG")
    with pytest.raises(errors.NodeError, match="pixel_format"):
        run_jonnx(node_model("ImageDecoder", {"x": x}, opset=20, pixel_format="HSV"), {"x": x})


def test_without_pillow_says_how_to_install(monkeypatch):
    x = _encode(PIXELS, "PNG")
    monkeypatch.setitem(sys.modules, "PIL", None)
    monkeypatch.setitem(sys.modules, "PIL.Image", None)
    with pytest.raises(errors.NodeError, match="pip install pillow"):
        run_jonnx(node_model("ImageDecoder", {"x": x}, opset=20), {"x": x})
