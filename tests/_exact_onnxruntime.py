"""onnxruntime as an exact reference for integer products with int8 weights, on every x86 CPU.

Without VNNI, onnxruntime's uint8 x int8 product kernel (AVX2) adds pairs of products in int16,
which saturates (255 * 127 * 2 > 32767): on an AVX2 AMD Zen 3, a 64 x 64 x 32 MatMulInteger of
full-range operands differed from int64 numpy in 1,438 of 2,048 outputs, by up to 44,500. Its
uint8 x uint8 kernel widens to 16 bits before multiplying and is exact. ``exact_int8_weights``
rewrites a model so onnxruntime takes that kernel: where uint8 data (or float data the op
quantizes to uint8) meets an int8 weight, the weight is stored as uint8 with 128 added to it and
to its zero point. The product reads ``w - zero_point``, so the model computes the same function,
exactly; jonnx runs the model as written.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

# (domain, op): (input index of the weight, input index of its zero point); the data is input 0.
_WEIGHT_INPUTS = {
    ("", "MatMulInteger"): (1, 3),
    ("", "QLinearConv"): (3, 5),
    ("com.microsoft", "QLinearConv"): (3, 5),
    ("com.microsoft", "QGemm"): (3, 5),
    ("com.microsoft", "DynamicQuantizeMatMul"): (1, 3),
    ("com.microsoft", "MatMulIntegerToFloat"): (1, 5),
    ("com.microsoft", "QAttention"): (1, 7),
}
_UINT8_DATA = {onnx.TensorProto.UINT8, onnx.TensorProto.FLOAT}


def exact_int8_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` as onnxruntime multiplies exactly: a copy in which uint8 data meets uint8
    weights only (``model`` itself where it has no integer product)."""
    if not any(_weight_inputs(node) for node in model.graph.node):
        return model
    try:  # the data's types; files with contrib nodes but no com.microsoft import refuse
        model = onnx.shape_inference.infer_shapes(model)
    except onnx.shape_inference.InferenceError:
        model = onnx.ModelProto.FromString(model.SerializeToString())  # types of inputs only
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    types = {v.name: v.type.tensor_type.elem_type for v in (*graph.input, *graph.value_info)}
    types.update({t.name: t.data_type for t in graph.initializer})
    for i, node in enumerate(graph.node):
        where = _weight_inputs(node)
        if where is None or len(node.input) <= where[0] or types.get(node.input[0]) not in _UINT8_DATA:
            continue
        w_index, zp_index = where
        weight = inits.get(node.input[w_index])
        zp_name = node.input[zp_index] if len(node.input) > zp_index else ""
        if weight is None or weight.data_type != onnx.TensorProto.INT8 or (zp_name and zp_name not in inits):
            continue  # not an int8 initializer, or a zero point computed in the graph
        zero_point = numpy_helper.to_array(inits[zp_name]) if zp_name else np.int8(0)
        base = f"{weight.name}__uint8_{i}"  # this node's own copies: other readers keep int8
        for index, value in ((w_index, numpy_helper.to_array(weight)), (zp_index, zero_point)):
            name = f"{base}_{index}"
            shifted = (np.asarray(value, np.int16) + 128).astype(np.uint8)
            graph.initializer.append(numpy_helper.from_array(shifted, name))
            while len(node.input) <= index:
                node.input.append("")
            node.input[index] = name
    return model


def _weight_inputs(node: onnx.NodeProto) -> tuple[int, int] | None:
    return _WEIGHT_INPUTS.get((node.domain if node.domain != "ai.onnx" else "", node.op_type))
