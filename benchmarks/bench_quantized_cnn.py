"""Statically quantized CNNs (onnxruntime's quantize_static) against onnxruntime and jonnx's float network.

Usage: ``python benchmarks/bench_quantized_cnn.py [--model resnet50] [--batch 1] [--rounds 5]``

Builds the network of benchmarks/nets.py, runs onnxruntime's ``quant_pre_process`` on it
(BatchNormalization folded) and ``quantize_static`` (uint8 activations calibrated on four
random batches, int8 weights) in the QOperator format (QLinearConv, com.microsoft QLinearAdd,
QLinearGlobalAveragePool, QGemm) and the QDQ format (QuantizeLinear/DequantizeLinear around the
float ops). Each file is loaded by jonnx (``jonnx.load(path)`` then ``model(x)``: load and first
call printed) and by onnxruntime, their outputs compared, and every engine timed in one process
in balanced orders (benchmarks/_order.py), the float network included. Prints the medians and
the ratios to onnxruntime on the same file. docs/performance.md ("Integer convolutions") has
results.
"""

from __future__ import annotations

import argparse
import logging
import pathlib
import sys
import tempfile
import time

import numpy as np
import onnx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import nets
from _order import balanced_orders

import jonnx


def quantized_files(model: onnx.ModelProto, batch: int, folder: pathlib.Path) -> dict[str, pathlib.Path]:
    """``model`` as written, and through quantize_static in each format, as files in ``folder``."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    logging.disable(logging.WARNING)  # the quantizer logs every node and asks for pre-processing
    name = model.graph.input[0].name
    shape = [batch] + [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim[1:]]

    class Batches(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(7)
            self.batches = iter([{name: rng.standard_normal(shape).astype(np.float32)} for _ in range(4)])

        def get_next(self):
            return next(self.batches, None)

    files = {"float": folder / "float.onnx"}
    onnx.save(model, files["float"])
    prepared = folder / "prepared.onnx"
    quant_pre_process(str(files["float"]), str(prepared), skip_symbolic_shape=True)
    for fmt, label in ((QuantFormat.QOperator, "QOperator"), (QuantFormat.QDQ, "QDQ")):
        files[label] = folder / f"{label}.onnx"
        quantize_static(
            prepared,
            files[label],
            Batches(),
            quant_format=fmt,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
        )
    return files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50", choices=["resnet50", "mobilenet_v2", "efficientnet_b0"])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5, help="passes over the balanced orders")
    args = parser.parse_args()

    import onnxruntime as ort

    model = getattr(nets, args.model)()
    shape = [args.batch] + [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim[1:]]
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    calls = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, path in quantized_files(model, args.batch, pathlib.Path(tmp)).items():
            start = time.perf_counter()
            jm = jonnx.load(path)
            loaded = time.perf_counter() - start
            got = np.asarray(jm(x)[0])
            first = time.perf_counter() - start - loaded
            session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            feed = {session.get_inputs()[0].name: x}
            want = session.run(None, feed)[0]
            error = np.abs(got - want).max() / max(np.abs(want).max(), 1e-30)
            print(
                f"{label}: load {loaded:.2f} s + first call {first:.2f} s; jonnx against onnxruntime {error:.1e} of the largest output"
            )
            calls[f"jonnx {label}"] = lambda jm=jm: jm(x)[0].block_until_ready()
            calls[f"onnxruntime {label}"] = lambda s=session, f=feed: s.run(None, f)
    names = list(calls)
    times = {n: [] for n in names}
    for _ in range(args.rounds):
        for order in balanced_orders(len(names)):
            for i in order:
                start = time.perf_counter()
                calls[names[i]]()
                times[names[i]].append(time.perf_counter() - start)
    median = {n: float(np.median(t)) * 1e3 for n, t in times.items()}
    print(f"\n{args.model}, batch {args.batch}, {args.rounds * len(names)} calls each")
    print("| file | jonnx ms | onnxruntime ms | jonnx / onnxruntime |")
    print("|---|---:|---:|---:|")
    for label in ("float", "QOperator", "QDQ"):
        j, o = median[f"jonnx {label}"], median[f"onnxruntime {label}"]
        print(f"| {label} | {j:.2f} | {o:.2f} | {j / o:.2f} |")


if __name__ == "__main__":
    main()
