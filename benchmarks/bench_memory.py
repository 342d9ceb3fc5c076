"""Peak resident memory of loading a model and of its first call, over the weights' bytes.

For each model (built here with ``onnx.helper``, weights seeded): a ResNet-50 with its 102 MB
of weights inside the ``.onnx``, a BERT-base-sized encoder (437 MB inside the ``.onnx``) and a
generated MLP of 2.1 GB in an external data file. Each is measured in a fresh process: the peak
RSS is reset after ``import jonnx`` (``/proc/self/clear_refs``), then ``jonnx.load`` and the
first ``model(x)`` (trace + compile + run) are timed, and the peak RSS each reached above the
process's resident memory before loading is divided by the weights' bytes. For the 2.1 GB
model the process also fine-tunes one step (SGD) and saves the result with ``jonnx.save``.

Linux only (reads ``/proc``). Usage:
``python benchmarks/bench_memory.py [--models resnet50 bert big] [--dir DIR] [--keep]``
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh

F = onnx.TensorProto.FLOAT
MODELS = ("resnet50", "bert", "big")


# -- models ------------------------------------------------------------------------------------


class _Builder:
    """Nodes and seeded initializers of a graph under construction."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def weight(self, name: str, shape: tuple[int, ...], scale: float | None = None) -> str:
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
        scale = (1.0 / np.sqrt(fan_in)) if scale is None else scale
        value = (self.rng.standard_normal(shape, np.float32) * scale).astype(np.float32)
        self.inits.append(onh.from_array(value, name))
        return name

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(onh.from_array(value, name))
        return name

    def op(self, op_type: str, inputs: list[str], **attrs) -> str:
        self.count += 1
        out = f"{op_type.lower()}_{self.count}"
        self.nodes.append(oh.make_node(op_type, inputs, [out], name=out, **attrs))
        return out


def resnet50() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    b = _Builder(0)

    def conv_bn(x, cin, cout, k, stride, tag, relu=True):
        w = b.weight(f"{tag}.conv.weight", (cout, cin, k, k))
        y = b.op("Conv", [x, w], kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4)
        bn = [
            b.const(f"{tag}.bn.{n}", v)
            for n, v in (
                ("scale", np.ones(cout, np.float32)),
                ("bias", np.zeros(cout, np.float32)),
                ("mean", np.zeros(cout, np.float32)),
                ("var", np.ones(cout, np.float32)),
            )
        ]
        y = b.op("BatchNormalization", [y, *bn])
        return b.op("Relu", [y]) if relu else y

    x = conv_bn("image", 3, 64, 7, 2, "stem")
    x = b.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for stage, (blocks, width) in enumerate([(3, 64), (4, 128), (6, 256), (3, 512)]):
        for i in range(blocks):
            stride = 2 if i == 0 and stage > 0 else 1
            tag = f"layer{stage + 1}.{i}"
            y = conv_bn(x, cin, width, 1, 1, f"{tag}.a")
            y = conv_bn(y, width, width, 3, stride, f"{tag}.b")
            y = conv_bn(y, width, width * 4, 1, 1, f"{tag}.c", relu=False)
            short = conv_bn(x, cin, width * 4, 1, stride, f"{tag}.down", relu=False) if i == 0 else x
            x = b.op("Relu", [b.op("Add", [y, short])])
            cin = width * 4
    x = b.op("GlobalAveragePool", [x])
    x = b.op("Flatten", [x])
    x = b.op("Gemm", [x, b.weight("fc.weight", (1000, 2048)), b.weight("fc.bias", (1000,), 0.01)], transB=1)
    graph = oh.make_graph(
        b.nodes,
        "resnet50",
        [oh.make_tensor_value_info("image", F, [1, 3, 224, 224])],
        [oh.make_tensor_value_info(x, F, [1, 1000])],
        b.inits,
    )
    inputs = {"image": np.random.default_rng(1).standard_normal((1, 3, 224, 224), np.float32)}
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]), inputs


def bert(
    layers: int = 12, hidden: int = 768, heads: int = 12, ffn: int = 3072, vocab: int = 30522, seq: int = 128
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    b = _Builder(0)
    head = hidden // heads
    emb = b.weight("embeddings.word", (vocab, hidden), 0.02)
    pos = b.weight("embeddings.position", (512, hidden), 0.02)
    x = b.op("Gather", [emb, "input_ids"])
    positions = b.const("position_ids", np.arange(seq, dtype=np.int64))
    x = b.op("Add", [x, b.op("Gather", [pos, positions])])

    def layer_norm(x, tag):
        g = b.const(f"{tag}.gamma", np.ones(hidden, np.float32))
        beta = b.const(f"{tag}.beta", np.zeros(hidden, np.float32))
        return b.op("LayerNormalization", [x, g, beta], axis=-1, epsilon=1e-12)

    def dense(x, cin, cout, tag):
        y = b.op("MatMul", [x, b.weight(f"{tag}.weight", (cin, cout))])
        return b.op("Add", [y, b.weight(f"{tag}.bias", (cout,), 0.01)])

    x = layer_norm(x, "embeddings.ln")
    split = b.const("split_heads", np.array([1, seq, heads, head], np.int64))
    merge = b.const("merge_heads", np.array([1, seq, hidden], np.int64))
    scale = b.const("attention_scale", np.array(1.0 / np.sqrt(head), np.float32))
    half, one, root2 = (
        b.const(n, np.array(v, np.float32)) for n, v in (("half", 0.5), ("one", 1.0), ("sqrt2", np.sqrt(2.0)))
    )
    for i in range(layers):
        tag = f"encoder.layer{i}"

        def heads_of(t):
            return b.op("Transpose", [b.op("Reshape", [t, split])], perm=[0, 2, 1, 3])

        q = heads_of(dense(x, hidden, hidden, f"{tag}.query"))
        k = heads_of(dense(x, hidden, hidden, f"{tag}.key"))
        v = heads_of(dense(x, hidden, hidden, f"{tag}.value"))
        scores = b.op("Mul", [b.op("MatMul", [q, b.op("Transpose", [k], perm=[0, 1, 3, 2])]), scale])
        ctx = b.op("MatMul", [b.op("Softmax", [scores], axis=-1), v])
        ctx = b.op("Reshape", [b.op("Transpose", [ctx], perm=[0, 2, 1, 3]), merge])
        x = layer_norm(b.op("Add", [x, dense(ctx, hidden, hidden, f"{tag}.attention_output")]), f"{tag}.ln1")
        h = dense(x, hidden, ffn, f"{tag}.intermediate")
        h = b.op("Mul", [b.op("Mul", [h, half]), b.op("Add", [one, b.op("Erf", [b.op("Div", [h, root2])])])])
        x = layer_norm(b.op("Add", [x, dense(h, ffn, hidden, f"{tag}.output")]), f"{tag}.ln2")
    graph = oh.make_graph(
        b.nodes,
        "bert",
        [oh.make_tensor_value_info("input_ids", onnx.TensorProto.INT64, [1, seq])],
        [oh.make_tensor_value_info(x, F, [1, seq, hidden])],
        b.inits,
    )
    inputs = {"input_ids": np.random.default_rng(1).integers(0, vocab, (1, seq))}
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]), inputs


def write_big(folder: pathlib.Path, width: int = 8192, layers: int = 8) -> tuple[pathlib.Path, dict[str, np.ndarray]]:
    """An MLP of ``layers`` [width, width] float32 weights (2.1 GB at the defaults), external data.

    The weights are written to the data file one at a time, so making it needs little memory.
    """
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    data_name = "big.onnx.data"
    offset = 0
    with open(folder / data_name, "wb") as f:
        for i in range(layers):
            w = (rng.standard_normal((width, width), np.float32) / np.sqrt(width)).astype(np.float32)
            f.write(w.tobytes())
            tensor = onnx.TensorProto(name=f"w{i}", data_type=F, dims=[width, width])
            tensor.data_location = onnx.TensorProto.EXTERNAL
            for key, value in (("location", data_name), ("offset", str(offset)), ("length", str(w.nbytes))):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
            offset += w.nbytes
            inits.append(tensor)
            y = f"h{i}"
            nodes.append(oh.make_node("MatMul", [x, f"w{i}"], [y + "_mm"]))
            nodes.append(oh.make_node("Tanh", [y + "_mm"], [y]))
            x = y
    graph = oh.make_graph(
        nodes,
        "big",
        [oh.make_tensor_value_info("x", F, ["N", width])],
        [oh.make_tensor_value_info(x, F, ["N", width])],
        inits,
    )
    path = folder / "big.onnx"
    onnx.save_model(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]), path)
    inputs = {"x": np.random.default_rng(1).standard_normal((2, width), np.float32)}
    return path, inputs


# -- measuring (in a fresh process per model) -----------------------------------------------------


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def measure(path: str, inputs_path: str, train_and_save: bool) -> dict:
    """Run in the child process: load, first call (and for the big model a step and a save)."""
    import time

    import jax

    import jonnx

    inputs = dict(np.load(inputs_path))
    jax.devices()
    jax.numpy.zeros(1).block_until_ready()
    weights = sum(
        t.dims and int(np.prod(t.dims)) * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize or 0
        for t in onnx.load(path, load_external_data=False).graph.initializer
    )
    base = _rss()
    _reset_peak()
    start = time.perf_counter()
    model = jonnx.load(path)
    load_s = time.perf_counter() - start
    after_load = _peak() - base
    start = time.perf_counter()
    jax.block_until_ready(model(**inputs))
    first_s = time.perf_counter() - start
    after_call = _peak() - base
    result = {
        "weights_mb": weights / 1e6,
        "load_s": load_s,
        "first_call_s": first_s,
        "load_x": after_load / weights,
        "first_call_x": after_call / weights,
    }
    if train_and_save:
        import optax

        from jonnx import training

        step = training.make_train_step(
            model, lambda outputs, batch: jax.numpy.mean(outputs[0] ** 2), optax.sgd(1e-3), donate=True
        )
        del model  # the step holds it; no extra reference
        start = time.perf_counter()
        ts = step.init()
        ts, metrics = step(ts, inputs)
        jax.block_until_ready(ts)
        result["step_s"] = time.perf_counter() - start
        result["step_loss"] = float(metrics["loss"])
        result["after_step_x"] = (_peak() - base) / weights
        save_to = os.path.join(os.path.dirname(path), "tuned", "big.onnx")
        os.makedirs(os.path.dirname(save_to), exist_ok=True)
        start = time.perf_counter()
        jonnx.save(step.model, save_to, params=ts.params)
        result["save_s"] = time.perf_counter() - start
        result["after_save_x"] = (_peak() - base) / weights
        saved = os.path.getsize(save_to) + os.path.getsize(save_to + ".data")
        result["saved_mb"] = saved / 1e6
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--dir", default=None, help="where to write the models (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the model files")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        path, inputs_path, train = args.child
        print(json.dumps(measure(path, inputs_path, train == "1")))
        return
    folder = pathlib.Path(args.dir or tempfile.mkdtemp(prefix="jonnx-bench-memory-"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        for name in args.models:
            sub = folder / name
            sub.mkdir(exist_ok=True)
            if name == "big":
                path, inputs = write_big(sub)
            else:
                proto, inputs = resnet50() if name == "resnet50" else bert()
                path = sub / f"{name}.onnx"
                onnx.save_model(proto, path)
                del proto
            np.savez(sub / "inputs.npz", **inputs)
            child = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    str(path),
                    str(sub / "inputs.npz"),
                    "1" if name == "big" else "0",
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            if child.returncode:
                print(f"{name}: failed\n{child.stderr[-3000:]}")
                continue
            r = json.loads(child.stdout.strip().splitlines()[-1])
            line = (
                f"{name:9s} weights {r['weights_mb']:8.1f} MB  load {r['load_s']:6.2f} s  "
                f"first call {r['first_call_s']:6.2f} s  peak RSS over weights: after load "
                f"{r['load_x']:.2f}x, after first call {r['first_call_x']:.2f}x"
            )
            if "step_s" in r:
                line += (
                    f"\n{'':9s} fine-tune step {r['step_s']:.2f} s (loss {r['step_loss']:.4f}, peak "
                    f"{r['after_step_x']:.2f}x), save {r['save_s']:.2f} s ({r['saved_mb']:.0f} MB, "
                    f"peak {r['after_save_x']:.2f}x)"
                )
            print(line, flush=True)
            if not args.keep:
                shutil.rmtree(sub)
    finally:
        if not args.keep and args.dir is None:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
