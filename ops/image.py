"""ImageDecoder: encoded image bytes -> an HWC uint8 array, decoded on the host with Pillow.

Pillow is an optional dependency (``pip install pillow``), imported only when an
ImageDecoder node runs. The encoded stream is a static input: decoding happens at trace time
and the decoded image enters the computation as a constant.
"""

from __future__ import annotations

import io

import numpy as np

from jonnx._registry import Attrs, Inputs, OpContext, Outputs, register

_MODES = {"RGB": "RGB", "BGR": "RGB", "Grayscale": "L"}


@register("ImageDecoder", since=20, static_inputs=(0,), host=True)
def image_decoder(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``ImageDecoder``-20 (any format Pillow reads; output ``[H, W, 3]`` or ``[H, W, 1]``).

    Lossless formats decode exactly; lossy ones (JPEG, WebP) give the pixels of the installed
    Pillow's decoders (libjpeg-turbo, libwebp), which other decoders (OpenCV, onnxruntime)
    may differ from by a few levels.
    """
    try:
        import PIL.Image
    except ImportError:
        raise ctx.error("decoding images needs Pillow: `pip install pillow`") from None
    fmt = attrs["pixel_format"]
    if fmt not in _MODES:
        raise ctx.error(f"pixel_format must be RGB, BGR or Grayscale, got {fmt!r}")
    stream = np.asarray(inputs[0])
    if stream.dtype != np.uint8 or stream.ndim != 1:
        raise ctx.error(f"encoded_stream must be a 1-D uint8 tensor, got {stream.dtype} {stream.shape}")
    try:
        with PIL.Image.open(io.BytesIO(stream.tobytes())) as image:
            image.load()
            decoded = np.asarray(image.convert(_MODES[fmt]) if image.mode != _MODES[fmt] else image)
    except (OSError, ValueError, SyntaxError, PIL.Image.DecompressionBombError) as e:
        raise ctx.error(f"cannot decode the image: {e}") from None
    if fmt == "Grayscale":
        decoded = decoded[:, :, None]
    elif fmt == "BGR":
        decoded = decoded[:, :, ::-1]
    return (np.ascontiguousarray(decoded, np.uint8),)
