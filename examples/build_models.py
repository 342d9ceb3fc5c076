"""Build the small example models bundled in examples/models/ (run it to regenerate them).

Both are written with ``onnx.helper`` in the shape PyTorch's exporter gives them, so they
exercise what real exports need:

* ``small_cnn.onnx``: Conv/BatchNormalization/Relu/MaxPool twice, GlobalAveragePool, Flatten,
  Dropout and Gemm, with a dynamic batch axis ``N``: image [N, 3, 16, 16] -> logits [N, 10].
* ``tiny_transformer.onnx``: one encoder layer. Token and position embeddings (Gather),
  LayerNormalization, multi-head attention with MatMuls and a padding mask, Softmax, an
  Erf-based Gelu feed-forward block, and head reshapes computed from ``Shape`` (Shape ->
  Gather -> Unsqueeze -> Concat -> Reshape), with dynamic batch and sequence axes:
  input_ids [B, T] (int64) and attention_mask [B, T] (int64) -> hidden [B, T, 32], logits [B, 4].

Usage: ``python examples/build_models.py [OUTPUT_DIR]``
"""

from __future__ import annotations

import pathlib
import sys

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh

OPSET = 17
MODELS = pathlib.Path(__file__).with_name("models")


def _init(name: str, value: np.ndarray) -> onnx.TensorProto:
    return onh.from_array(np.asarray(value), name)


def small_cnn(seed: int = 0) -> onnx.ModelProto:
    """A small image classifier with a dynamic batch axis."""
    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def conv_bn_relu(x: str, c_in: int, c_out: int, tag: str) -> str:
        fan_in = c_in * 9
        inits.extend(
            [
                _init(f"{tag}.weight", rng.normal(0, np.sqrt(2 / fan_in), (c_out, c_in, 3, 3)).astype(np.float32)),
                _init(f"{tag}.bias", np.zeros(c_out, np.float32)),
                _init(f"{tag}.bn.scale", rng.uniform(0.8, 1.2, c_out).astype(np.float32)),
                _init(f"{tag}.bn.bias", rng.normal(0, 0.1, c_out).astype(np.float32)),
                _init(f"{tag}.bn.running_mean", rng.normal(0, 0.1, c_out).astype(np.float32)),
                _init(f"{tag}.bn.running_var", rng.uniform(0.5, 1.5, c_out).astype(np.float32)),
            ]
        )
        nodes.extend(
            [
                oh.make_node(
                    "Conv",
                    [x, f"{tag}.weight", f"{tag}.bias"],
                    [f"{tag}.conv"],
                    name=f"{tag}/Conv",
                    kernel_shape=[3, 3],
                    pads=[1, 1, 1, 1],
                ),
                oh.make_node(
                    "BatchNormalization",
                    [
                        f"{tag}.conv",
                        f"{tag}.bn.scale",
                        f"{tag}.bn.bias",
                        f"{tag}.bn.running_mean",
                        f"{tag}.bn.running_var",
                    ],
                    [f"{tag}.bn"],
                    name=f"{tag}/BatchNormalization",
                    epsilon=1e-5,
                    momentum=0.9,
                ),
                oh.make_node("Relu", [f"{tag}.bn"], [f"{tag}.relu"], name=f"{tag}/Relu"),
            ]
        )
        return f"{tag}.relu"

    h = conv_bn_relu("image", 3, 8, "block1")
    nodes.append(oh.make_node("MaxPool", [h], ["pool1"], name="pool1/MaxPool", kernel_shape=[2, 2], strides=[2, 2]))
    h = conv_bn_relu("pool1", 8, 16, "block2")
    nodes.extend(
        [
            oh.make_node("MaxPool", [h], ["pool2"], name="pool2/MaxPool", kernel_shape=[2, 2], strides=[2, 2]),
            oh.make_node("GlobalAveragePool", ["pool2"], ["gap"], name="GlobalAveragePool"),
            oh.make_node("Flatten", ["gap"], ["flat"], name="Flatten", axis=1),
            oh.make_node("Dropout", ["flat"], ["dropped"], name="Dropout"),
            oh.make_node("Gemm", ["dropped", "fc.weight", "fc.bias"], ["logits"], name="fc/Gemm", transB=1),
        ]
    )
    inits.extend(
        [
            _init("fc.weight", rng.normal(0, 0.25, (10, 16)).astype(np.float32)),
            _init("fc.bias", np.zeros(10, np.float32)),
        ]
    )
    graph = oh.make_graph(
        nodes,
        "small_cnn",
        [oh.make_tensor_value_info("image", onnx.TensorProto.FLOAT, ["N", 3, 16, 16])],
        [oh.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, ["N", 10])],
        initializer=inits,
    )
    return _finish(graph)


def tiny_transformer(seed: int = 0, vocab: int = 50, d: int = 32, heads: int = 4, max_len: int = 64) -> onnx.ModelProto:
    """One transformer encoder layer with dynamic batch and sequence axes."""
    rng = np.random.default_rng(seed)
    dh = d // heads
    inits = [
        _init("tok_emb", rng.normal(0, 0.5, (vocab, d)).astype(np.float32)),
        _init("pos_emb", rng.normal(0, 0.5, (max_len, d)).astype(np.float32)),
        _init("ln1.scale", np.ones(d, np.float32)),
        _init("ln1.bias", np.zeros(d, np.float32)),
        _init("ln2.scale", np.ones(d, np.float32)),
        _init("ln2.bias", np.zeros(d, np.float32)),
        _init("head.weight", rng.normal(0, 0.2, (d, 4)).astype(np.float32)),
        _init("head.bias", np.zeros(4, np.float32)),
        _init("c_zero", np.array([0], np.int64)),
        _init("c_one", np.array([1], np.int64)),
        _init("c_heads", np.array([heads], np.int64)),
        _init("c_dh", np.array([dh], np.int64)),
        _init("c_d", np.array([d], np.int64)),
        _init("c_axis1", np.array([1], np.int64)),
        _init("c_scale", np.array(1 / np.sqrt(dh), np.float32)),
        _init("c_neg", np.array(-1e4, np.float32)),
        _init("c_onef", np.array(1.0, np.float32)),
        _init("c_half", np.array(0.5, np.float32)),
        _init("c_sqrt2", np.array(np.sqrt(2.0), np.float32)),
    ]
    for name, shape in (
        ("q", (d, d)),
        ("k", (d, d)),
        ("v", (d, d)),
        ("o", (d, d)),
        ("ff1", (d, 2 * d)),
        ("ff2", (2 * d, d)),
    ):
        inits.append(_init(f"{name}.weight", rng.normal(0, 1 / np.sqrt(shape[0]), shape).astype(np.float32)))
        inits.append(_init(f"{name}.bias", np.zeros(shape[1], np.float32)))

    n = oh.make_node
    nodes = [
        # Shape arithmetic as PyTorch exports it: B and T from Shape, used in Slice and Reshape.
        n("Shape", ["input_ids"], ["ids_shape"], name="Shape_ids"),
        n("Gather", ["ids_shape", "c_zero"], ["B"], name="Gather_B", axis=0),
        n("Gather", ["ids_shape", "c_one"], ["T"], name="Gather_T", axis=0),
        n("Gather", ["tok_emb", "input_ids"], ["tok"], name="Gather_tok", axis=0),
        n("Slice", ["pos_emb", "c_zero", "T", "c_zero"], ["pos"], name="Slice_pos"),
        n("Add", ["tok", "pos"], ["emb"], name="Add_emb"),
        n("LayerNormalization", ["emb", "ln1.scale", "ln1.bias"], ["x1"], name="ln1", axis=-1, epsilon=1e-5),
        n("Concat", ["B", "T", "c_heads", "c_dh"], ["heads_shape"], name="Concat_heads_shape", axis=0),
        n("Concat", ["B", "T", "c_d"], ["merge_shape"], name="Concat_merge_shape", axis=0),
    ]
    for name in ("q", "k", "v"):
        nodes += [
            n("MatMul", ["x1", f"{name}.weight"], [f"{name}_mm"], name=f"MatMul_{name}"),
            n("Add", [f"{name}_mm", f"{name}.bias"], [f"{name}_lin"], name=f"Add_{name}"),
            n("Reshape", [f"{name}_lin", "heads_shape"], [f"{name}_4d"], name=f"Reshape_{name}"),
            n(
                "Transpose",
                [f"{name}_4d"],
                [f"{name}_h"],
                name=f"Transpose_{name}",
                perm=[0, 2, 3, 1] if name == "k" else [0, 2, 1, 3],
            ),
        ]
    nodes += [
        n("MatMul", ["q_h", "k_h"], ["scores_raw"], name="MatMul_scores"),
        n("Mul", ["scores_raw", "c_scale"], ["scores"], name="Mul_scale"),
        # Padding mask: (1 - mask) * -1e4, broadcast over heads and query positions.
        n("Cast", ["attention_mask"], ["mask_f"], name="Cast_mask", to=onnx.TensorProto.FLOAT),
        n("Sub", ["c_onef", "mask_f"], ["mask_inv"], name="Sub_mask"),
        n("Mul", ["mask_inv", "c_neg"], ["mask_add2d"], name="Mul_mask"),
        n("Unsqueeze", ["mask_add2d", "c_axis1"], ["mask_add3d"], name="Unsqueeze_mask1"),
        n("Unsqueeze", ["mask_add3d", "c_axis1"], ["mask_add"], name="Unsqueeze_mask2"),
        n("Add", ["scores", "mask_add"], ["scores_masked"], name="Add_mask"),
        n("Softmax", ["scores_masked"], ["probs"], name="Softmax", axis=-1),
        n("MatMul", ["probs", "v_h"], ["ctx_h"], name="MatMul_ctx"),
        n("Transpose", ["ctx_h"], ["ctx_t"], name="Transpose_ctx", perm=[0, 2, 1, 3]),
        n("Reshape", ["ctx_t", "merge_shape"], ["ctx"], name="Reshape_ctx"),
        n("MatMul", ["ctx", "o.weight"], ["o_mm"], name="MatMul_o"),
        n("Add", ["o_mm", "o.bias"], ["attn_out"], name="Add_o"),
        n("Add", ["x1", "attn_out"], ["res1"], name="Add_res1"),
        n("LayerNormalization", ["res1", "ln2.scale", "ln2.bias"], ["x2"], name="ln2", axis=-1, epsilon=1e-5),
        # Feed-forward with the exact (Erf) Gelu, as PyTorch exports nn.GELU().
        n("MatMul", ["x2", "ff1.weight"], ["ff1_mm"], name="MatMul_ff1"),
        n("Add", ["ff1_mm", "ff1.bias"], ["ff1_out"], name="Add_ff1"),
        n("Div", ["ff1_out", "c_sqrt2"], ["gelu_div"], name="Div_gelu"),
        n("Erf", ["gelu_div"], ["gelu_erf"], name="Erf_gelu"),
        n("Add", ["gelu_erf", "c_onef"], ["gelu_add"], name="Add_gelu"),
        n("Mul", ["ff1_out", "gelu_add"], ["gelu_mul"], name="Mul_gelu"),
        n("Mul", ["gelu_mul", "c_half"], ["gelu"], name="Mul_gelu_half"),
        n("MatMul", ["gelu", "ff2.weight"], ["ff2_mm"], name="MatMul_ff2"),
        n("Add", ["ff2_mm", "ff2.bias"], ["ff2_out"], name="Add_ff2"),
        n("Add", ["x2", "ff2_out"], ["hidden"], name="Add_res2"),
        # Mean-pool over valid tokens, then a linear head.
        n("Unsqueeze", ["mask_f", "c_axis1"], ["mask_col"], name="Unsqueeze_pool"),
        n("Transpose", ["mask_col"], ["mask_bt1"], name="Transpose_pool", perm=[0, 2, 1]),
        n("Mul", ["hidden", "mask_bt1"], ["hidden_masked"], name="Mul_pool"),
        n("ReduceSum", ["hidden_masked", "c_axis1"], ["pooled_sum"], name="ReduceSum_pool", keepdims=0),
        n("ReduceSum", ["mask_f", "c_axis1"], ["count"], name="ReduceSum_count", keepdims=1),
        n("Div", ["pooled_sum", "count"], ["pooled"], name="Div_pool"),
        n("Gemm", ["pooled", "head.weight", "head.bias"], ["logits"], name="Gemm_head"),
    ]
    graph = oh.make_graph(
        nodes,
        "tiny_transformer",
        [
            oh.make_tensor_value_info("input_ids", onnx.TensorProto.INT64, ["B", "T"]),
            oh.make_tensor_value_info("attention_mask", onnx.TensorProto.INT64, ["B", "T"]),
        ],
        [
            oh.make_tensor_value_info("hidden", onnx.TensorProto.FLOAT, ["B", "T", d]),
            oh.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, ["B", 4]),
        ],
        initializer=inits,
    )
    return _finish(graph)


def _finish(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", OPSET)], producer_name="jonnx-examples")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def main(out_dir: str | None = None) -> None:
    out = pathlib.Path(out_dir) if out_dir else MODELS
    out.mkdir(parents=True, exist_ok=True)
    for name, build in (("small_cnn", small_cnn), ("tiny_transformer", tiny_transformer)):
        path = out / f"{name}.onnx"
        onnx.save(build(), path)
        print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main(*sys.argv[1:2])
