"""Make the small com.microsoft models in this folder with onnxruntime's own tools.

Run offline, in an environment with onnxruntime (and onnx_ir for the 4-bit quantizer); the
tests only read the files this writes:

    python tests/models/contrib/make_contrib_models.py

Tiny random-weight graphs in the shapes PyTorch exporters write (decomposed LayerNorm, erf
Gelu, tanh Gelu, HF-style attention with an additive mask) are rewritten by:

* onnxruntime's transformers optimizer (``optimizer.optimize_model``, model types bert and
  gpt2, opt_level 0, 1 and 2; a Llama-style RMSNorm/SiLU decoder as gpt2 and a ViT as vit,
  at 1 and 2):
  LayerNormalization, SkipLayerNormalization, BiasGelu, FastGelu, Attention,
  EmbedLayerNormalization, SimplifiedLayerNormalization, SkipSimplifiedLayerNormalization,
  QuickGelu where the patterns match;
* ``quantize_dynamic`` on the level-1 BERT, then an extended-level session: QAttention,
  DynamicQuantizeMatMul;
* ``quantize_dynamic`` followed by an onnxruntime session saved at the extended level:
  DynamicQuantizeMatMul / MatMulIntegerToFloat;
* an extended-level session on a small CNN and MLP: FusedConv, FusedGemm, FusedMatMul;
* ``quantize_static`` on a small residual CNN, QOperator and QDQ formats: QLinearConv,
  QLinearAdd, QLinearGlobalAveragePool, QGemm, and QuantizeLinear/DequantizeLinear pairs;
* ``MatMulNBitsQuantizer`` (4 bits, block 32; 8 bits, block 16): MatMulNBits.
"""

from __future__ import annotations

import pathlib
import tempfile

import numpy as np
import onnx
import onnx.helper as oh
from onnx import TensorProto, numpy_helper

HERE = pathlib.Path(__file__).resolve().parent
HIDDEN, HEADS, SEQ, VOCAB, FFN = 32, 2, 8, 50, 64


class _Builder:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.count = [], [], 0

    def name(self, prefix):
        self.count += 1
        return f"{prefix}_{self.count}"

    def const(self, value, prefix="c"):
        name = self.name(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def weight(self, *shape, scale=None):
        scale = scale if scale is not None else 1 / np.sqrt(shape[0])
        return self.const((self.rng.standard_normal(shape) * scale).astype(np.float32), "w")

    def op(self, op_type, inputs, **attrs):
        out = self.name(op_type.lower())
        self.nodes.append(oh.make_node(op_type, inputs, [out], name=out, **attrs))
        return out

    def linear(self, x, k, n):
        return self.op(
            "Add",
            [self.op("MatMul", [x, self.weight(k, n)]), self.weight(n, scale=0.1)],
        )

    def layer_norm(self, x):  # the decomposed form torch.onnx exports at opset < 17
        mean = self.op("ReduceMean", [x], axes=[-1])
        centered = self.op("Sub", [x, mean])
        var = self.op(
            "ReduceMean",
            [self.op("Pow", [centered, self.const(np.float32(2))])],
            axes=[-1],
        )
        std = self.op("Sqrt", [self.op("Add", [var, self.const(np.float32(1e-5))])])
        normed = self.op("Div", [centered, std])
        gamma = self.const((1 + 0.1 * self.rng.standard_normal(HIDDEN)).astype(np.float32), "gamma")
        return self.op("Add", [self.op("Mul", [normed, gamma]), self.weight(HIDDEN, scale=0.1)])

    def gelu_erf(self, x):
        erf = self.op("Erf", [self.op("Div", [x, self.const(np.float32(1.4142135))])])
        return self.op(
            "Mul",
            [
                self.op("Mul", [x, self.op("Add", [erf, self.const(np.float32(1.0))])]),
                self.const(np.float32(0.5)),
            ],
        )

    def gelu_tanh(self, x):
        cube = self.op("Pow", [x, self.const(np.float32(3.0))])
        inner = self.op("Add", [x, self.op("Mul", [cube, self.const(np.float32(0.044715))])])
        t = self.op("Tanh", [self.op("Mul", [inner, self.const(np.float32(0.7978845608))])])
        return self.op(
            "Mul",
            [
                self.op("Mul", [x, self.const(np.float32(0.5))]),
                self.op("Add", [t, self.const(np.float32(1.0))]),
            ],
        )

    def attention(self, x, mask_bias, causal=False):
        head = HIDDEN // HEADS
        shape = self.const(np.array([0, 0, HEADS, head], np.int64), "shape")

        def heads(t, perm):
            return self.op("Transpose", [self.op("Reshape", [t, shape])], perm=perm)

        q = heads(self.linear(x, HIDDEN, HIDDEN), [0, 2, 1, 3])
        k = heads(self.linear(x, HIDDEN, HIDDEN), [0, 2, 3, 1])
        v = heads(self.linear(x, HIDDEN, HIDDEN), [0, 2, 1, 3])
        scores = self.op("Div", [self.op("MatMul", [q, k]), self.const(np.float32(np.sqrt(head)))])
        if causal:
            tri = np.triu(np.full((SEQ, SEQ), -10000.0, np.float32), 1)
            scores = self.op("Add", [scores, self.const(tri)])
        if mask_bias is not None:
            scores = self.op("Add", [scores, mask_bias])
        context = self.op("MatMul", [self.op("Softmax", [scores], axis=-1), v])
        merged = self.op(
            "Reshape",
            [
                self.op("Transpose", [context], perm=[0, 2, 1, 3]),
                self.const(np.array([0, 0, HIDDEN], np.int64), "shape"),
            ],
        )
        return self.linear(merged, HIDDEN, HIDDEN)

    def model(self, inputs, outputs, opset=14):
        graph = oh.make_graph(self.nodes, "g", inputs, outputs, initializer=self.inits)
        model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])
        model.ir_version = 8
        return model


def bert(seed=0):
    b = _Builder(seed)
    ids, segs = "input_ids", "token_type_ids"
    pos = b.const(np.arange(SEQ, dtype=np.int64)[None], "position_ids")
    emb = b.op(
        "Add",
        [
            b.op("Gather", [b.weight(VOCAB, HIDDEN, scale=0.5), ids]),
            b.op("Gather", [b.weight(SEQ, HIDDEN, scale=0.5), pos]),
        ],
    )
    emb = b.op("Add", [emb, b.op("Gather", [b.weight(2, HIDDEN, scale=0.5), segs])])
    x = b.layer_norm(emb)
    # The mask path BERT exports have (two Unsqueezes), which the attention fusion matches.
    mask = b.op("Unsqueeze", ["attention_mask", b.const(np.array([1], np.int64), "axes")])
    mask = b.op("Unsqueeze", [mask, b.const(np.array([2], np.int64), "axes")])
    mask = b.op("Cast", [mask], to=TensorProto.FLOAT)
    mask_bias = b.op(
        "Mul",
        [b.op("Sub", [b.const(np.float32(1.0)), mask]), b.const(np.float32(-10000.0))],
    )
    for _ in range(2):
        x = b.layer_norm(b.op("Add", [b.attention(x, mask_bias), x]))
        ffn = b.linear(b.gelu_erf(b.linear(x, HIDDEN, FFN)), FFN, HIDDEN)
        x = b.layer_norm(b.op("Add", [ffn, x]))
    info = oh.make_tensor_value_info
    inputs = [info(n, TensorProto.INT64, ["batch", SEQ]) for n in (ids, "attention_mask", segs)]
    graph_out = b.op("Identity", [x])
    return b.model(inputs, [info(graph_out, TensorProto.FLOAT, ["batch", SEQ, HIDDEN])])


def gpt2(seed=1):
    b = _Builder(seed)
    x = b.op("Gather", [b.weight(VOCAB, HIDDEN, scale=0.5), "input_ids"])
    for _ in range(2):
        x = b.op("Add", [x, b.attention(b.layer_norm(x), None, causal=True)])
        x = b.op(
            "Add",
            [
                x,
                b.linear(b.gelu_tanh(b.linear(b.layer_norm(x), HIDDEN, FFN)), FFN, HIDDEN),
            ],
        )
    out = b.op("MatMul", [b.layer_norm(x), b.weight(HIDDEN, VOCAB)])
    info = oh.make_tensor_value_info
    return b.model(
        [info("input_ids", TensorProto.INT64, ["batch", SEQ])],
        [info(out, TensorProto.FLOAT, ["batch", SEQ, VOCAB])],
    )


def llama(seed=4):
    """RMSNorm (Pow, ReduceMean, Add, Sqrt, Div, Mul) residual blocks with a SiLU MLP."""
    b = _Builder(seed)

    def rms_norm(x):
        var = b.op("ReduceMean", [b.op("Pow", [x, b.const(np.float32(2))])], axes=[-1])
        inv = b.op(
            "Div",
            [
                b.const(np.float32(1.0)),
                b.op("Sqrt", [b.op("Add", [var, b.const(np.float32(1e-6))])]),
            ],
        )
        gamma = b.const((1 + 0.1 * b.rng.standard_normal(HIDDEN)).astype(np.float32), "gamma")
        return b.op("Mul", [gamma, b.op("Mul", [x, inv])])

    x = b.op("Gather", [b.weight(VOCAB, HIDDEN, scale=0.5), "input_ids"])
    for _ in range(2):
        x = b.op("Add", [x, b.attention(rms_norm(x), None, causal=True)])
        h = rms_norm(x)
        gate = b.op("MatMul", [h, b.weight(HIDDEN, FFN)])
        silu = b.op("Mul", [gate, b.op("Sigmoid", [gate])])
        x = b.op(
            "Add",
            [
                x,
                b.op(
                    "MatMul",
                    [
                        b.op("Mul", [silu, b.op("MatMul", [h, b.weight(HIDDEN, FFN)])]),
                        b.weight(FFN, HIDDEN),
                    ],
                ),
            ],
        )
    out = b.op("MatMul", [rms_norm(x), b.weight(HIDDEN, VOCAB)])
    info = oh.make_tensor_value_info
    return b.model(
        [info("input_ids", TensorProto.INT64, ["batch", SEQ])],
        [info(out, TensorProto.FLOAT, ["batch", SEQ, VOCAB])],
    )


def vit(seed=5):
    """Patch embedding (Conv) plus pre-LayerNorm encoder blocks with erf Gelu, as ViT exports."""
    b = _Builder(seed)
    patches = b.op(
        "Conv",
        [
            "pixel_values",
            b.weight(HIDDEN, 3, 4, 4, scale=0.2),
            b.weight(HIDDEN, scale=0.1),
        ],
        strides=[4, 4],
    )
    tokens = b.op(
        "Transpose",
        [
            b.op(
                "Reshape",
                [patches, b.const(np.array([0, HIDDEN, -1], np.int64), "shape")],
            )
        ],
        perm=[0, 2, 1],
    )
    x = b.op("Add", [tokens, b.weight(1, SEQ, HIDDEN, scale=0.1)])  # 8x16 pixels in 4x4 patches: 8 tokens
    for _ in range(2):
        x = b.op("Add", [x, b.attention(b.layer_norm(x), None)])
        x = b.op(
            "Add",
            [
                x,
                b.linear(b.gelu_erf(b.linear(b.layer_norm(x), HIDDEN, FFN)), FFN, HIDDEN),
            ],
        )
    out = b.op("Identity", [b.layer_norm(x)])
    info = oh.make_tensor_value_info
    return b.model(
        [info("pixel_values", TensorProto.FLOAT, ["batch", 3, 8, 16])],
        [info(out, TensorProto.FLOAT, ["batch", SEQ, HIDDEN])],
    )


def mlp(seed=2):
    b = _Builder(seed)
    h = b.op("Relu", [b.linear("x", HIDDEN, FFN)])
    h = b.op("Relu", [b.linear(h, FFN, FFN)])
    out = b.linear(h, FFN, 16)
    info = oh.make_tensor_value_info
    return b.model(
        [info("x", TensorProto.FLOAT, ["batch", HIDDEN])],
        [info(out, TensorProto.FLOAT, ["batch", 16])],
    )


def cnn(seed=3):
    b = _Builder(seed)
    h = b.op(
        "Relu",
        [
            b.op(
                "Conv",
                ["x", b.weight(8, 3, 3, 3, scale=0.3), b.weight(8, scale=0.1)],
                pads=[1] * 4,
            )
        ],
    )
    h = b.op(
        "Conv",
        [h, b.weight(8, 8, 3, 3, scale=0.2), b.weight(8, scale=0.1)],
        pads=[1] * 4,
        strides=[2, 2],
    )
    h = b.op("Flatten", [b.op("GlobalAveragePool", [b.op("Sigmoid", [h])])])
    h = b.op("Relu", [b.op("Gemm", [h, b.weight(8, 16), b.weight(16, scale=0.1)])])
    t = b.op("Transpose", [b.weight(10, 16)], perm=[1, 0])
    out = b.op("MatMul", [h, t])
    info = oh.make_tensor_value_info
    return b.model(
        [info("x", TensorProto.FLOAT, ["batch", 3, 12, 12])],
        [info(out, TensorProto.FLOAT, ["batch", 10])],
    )


def residual_cnn(seed=6):
    """A ResNet-style CNN for quantize_static: a 3x3 stem, a max pool, a residual block of 3x3
    and 1x1 convolutions, a strided 3x3 convolution, global pooling and a classifier."""
    b = _Builder(seed)
    h = b.op("Relu", [b.op("Conv", ["x", b.weight(8, 3, 3, 3, scale=0.3), b.weight(8, scale=0.1)], pads=[1] * 4)])
    h = b.op("MaxPool", [h], kernel_shape=[2, 2], strides=[2, 2])
    branch = b.op("Relu", [b.op("Conv", [h, b.weight(8, 8, 3, 3, scale=0.15), b.weight(8, scale=0.1)], pads=[1] * 4)])
    branch = b.op("Conv", [branch, b.weight(8, 8, 1, 1, scale=0.3), b.weight(8, scale=0.1)])
    h = b.op("Relu", [b.op("Add", [h, branch])])
    h = b.op("Relu", [b.op("Conv", [h, b.weight(16, 8, 3, 3, scale=0.15), b.weight(16, scale=0.1)], strides=[2, 2])])
    h = b.op("Flatten", [b.op("GlobalAveragePool", [h])])
    out = b.op("Gemm", [h, b.weight(10, 16), b.weight(10, scale=0.1)], transB=1)
    info = oh.make_tensor_value_info
    return b.model(
        [info("x", TensorProto.FLOAT, ["batch", 3, 12, 12])],
        [info(out, TensorProto.FLOAT, ["batch", 10])],
    )


def static_quantized(tmp: pathlib.Path) -> dict:
    """``residual_cnn`` through ``quantize_static`` (uint8 activations calibrated on 8 random
    batches, int8 weights) in both formats: QOperator (QLinearConv, com.microsoft QLinearAdd,
    QLinearGlobalAveragePool, QGemm) and QDQ (QuantizeLinear and DequantizeLinear around the
    float ops)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Batches(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(7)
            self.batches = iter([{"x": rng.standard_normal((2, 3, 12, 12)).astype(np.float32)} for _ in range(8)])

        def get_next(self):
            return next(self.batches, None)

    onnx.save(residual_cnn(), tmp / "residual_cnn.onnx")
    written = {}
    for fmt, name in ((QuantFormat.QOperator, "qoperator"), (QuantFormat.QDQ, "qdq")):
        quantize_static(
            tmp / "residual_cnn.onnx",
            tmp / f"{name}.onnx",
            Batches(),
            quant_format=fmt,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
        )
        written[f"cnn_static_{name}.onnx"] = onnx.load(tmp / f"{name}.onnx")
    return written


def _session_saved(model, level):
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        src, dst = pathlib.Path(tmp) / "in.onnx", pathlib.Path(tmp) / "out.onnx"
        onnx.save(model, src)
        options = ort.SessionOptions()
        options.graph_optimization_level = level
        options.optimized_model_filepath = str(dst)
        ort.InferenceSession(str(src), options, providers=["CPUExecutionProvider"])
        return onnx.load(dst)


def _without_torch():
    """The optimizer imports ``torch.version`` only to ask about CUDA; a stub answers "no"
    when torch is not installed (this script needs no torch)."""
    import importlib.util
    import sys
    import types

    if importlib.util.find_spec("torch") is None:
        torch = types.ModuleType("torch")
        torch.version = types.SimpleNamespace(cuda=None, hip=None)
        sys.modules["torch"] = torch
        sys.modules["torch.version"] = torch.version


def main():
    import logging

    logging.disable(logging.INFO)  # the quantizer logs every node
    _without_torch()
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    from onnxruntime.transformers import optimizer

    written = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        for name, model, kind in (
            ("bert", bert(), "bert"),
            ("gpt2", gpt2(), "gpt2"),
            ("llama", llama(), "gpt2"),
            ("vit", vit(), "vit"),
        ):
            onnx.save(model, tmp / f"{name}.onnx")
            # Level 0 fuses little in the decoder and ViT: levels 1 and 2 only.
            for level in (1, 2) if name in ("llama", "vit") else (0, 1, 2):
                opt = optimizer.optimize_model(
                    str(tmp / f"{name}.onnx"),
                    model_type=kind,
                    num_heads=HEADS,
                    hidden_size=HIDDEN,
                    opt_level=level,
                    use_gpu=False,
                )
                written[f"{name}_opt{level}.onnx"] = opt.model
        # quantize_dynamic on the optimized BERT: QAttention and DynamicQuantizeMatMul.
        onnx.save(written["bert_opt1.onnx"], tmp / "bert_opt1.onnx")
        quantize_dynamic(
            tmp / "bert_opt1.onnx",
            tmp / "bert_q.onnx",
            weight_type=QuantType.QInt8,
            extra_options={"DefaultTensorType": TensorProto.FLOAT},
        )
        written["bert_opt1_dynamic_int8.onnx"] = _session_saved(
            onnx.load(tmp / "bert_q.onnx"),
            ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        )
        onnx.save(mlp(), tmp / "mlp.onnx")
        quantize_dynamic(tmp / "mlp.onnx", tmp / "mlp_q.onnx", weight_type=QuantType.QInt8)
        written["mlp_dynamic_int8.onnx"] = _session_saved(
            onnx.load(tmp / "mlp_q.onnx"),
            ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        )
        written["cnn_extended.onnx"] = _session_saved(cnn(), ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED)
        written.update(static_quantized(tmp))
        for bits, block in ((4, 32), (8, 16)):
            quantizer = MatMulNBitsQuantizer(mlp(), bits=bits, block_size=block, is_symmetric=False)
            quantizer.process()
            written[f"mlp_nbits{bits}.onnx"] = quantizer.model.model
    for name, model in written.items():
        onnx.save(model, HERE / name)
        ops = sorted({f"{n.domain + ':' if n.domain else ''}{n.op_type}" for n in model.graph.node})
        print(f"{name}: {(HERE / name).stat().st_size} bytes, ops {ops}")


if __name__ == "__main__":
    main()
