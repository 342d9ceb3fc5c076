"""Training steps of small models, single-device and sharded; run as a script in a subprocess.

Imported by tests/test_sharding.py and tests/test_distributed.py for the model builders; run as
``python tests/_sharded_steps.py mesh OUT.json`` (with 8 simulated CPU devices) it takes one
SGD-with-momentum step of a BERT-style encoder and of a CNN on one device and then on the mesh
as data-parallel, FSDP-style and tensor-parallel, and writes what it found; run as
``python tests/_sharded_steps.py worker ADDRESS PROCESS_ID MODEL BATCH OUT.json`` it is one of
two processes of a data-parallel step joined by ``jax.distributed``.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh

F = onnx.TensorProto.FLOAT
BATCH = 8


def encoder(layers: int = 2, hidden: int = 16, heads: int = 4, ffn: int = 32, vocab: int = 32, seq: int = 4):
    """A BERT-style encoder (embeddings, attention with heads, FFN, LayerNorms); weight names."""
    rng = np.random.default_rng(0)
    nodes, inits, names = [], [], {}

    def w(name, shape, scale=0.3):
        inits.append(onh.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name))
        return name

    def op(op_type, inputs, **attrs):
        out = f"{op_type}_{len(nodes)}"
        nodes.append(oh.make_node(op_type, inputs, [out], **attrs))
        return out

    def dense(x, cin, cout, tag):
        return op("Add", [op("MatMul", [x, w(f"{tag}.w", (cin, cout))]), w(f"{tag}.b", (cout,), 0.1)])

    def norm(x, tag):
        return op("LayerNormalization", [x, w(f"{tag}.g", (hidden,), 1.0), w(f"{tag}.b", (hidden,), 0.1)], axis=-1)

    inits.append(onh.from_array(np.array([-1, seq, heads, hidden // heads], np.int64), "split"))
    inits.append(onh.from_array(np.array([-1, seq, hidden], np.int64), "merge"))
    inits.append(onh.from_array(np.array(1 / np.sqrt(hidden // heads), np.float32), "scale"))
    x = norm(op("Gather", [w("emb", (vocab, hidden)), "ids"]), "emb_ln")
    for i in range(layers):
        t = f"l{i}"
        q, k, v = (
            op("Transpose", [op("Reshape", [dense(x, hidden, hidden, f"{t}.{n}"), "split"])], perm=[0, 2, 1, 3])
            for n in "qkv"
        )
        scores = op("Mul", [op("MatMul", [q, op("Transpose", [k], perm=[0, 1, 3, 2])]), "scale"])
        ctx = op("MatMul", [op("Softmax", [scores], axis=-1), v])
        ctx = op("Reshape", [op("Transpose", [ctx], perm=[0, 2, 1, 3]), "merge"])
        x = norm(op("Add", [x, dense(ctx, hidden, hidden, f"{t}.o")]), f"{t}.ln1")
        h = op("Relu", [dense(x, hidden, ffn, f"{t}.ffn1")])
        x = norm(op("Add", [x, dense(h, ffn, hidden, f"{t}.ffn2")]), f"{t}.ln2")
        names[t] = {n: f"{t}.{n}" for n in ("q", "k", "v", "o", "ffn1", "ffn2")}
    graph = oh.make_graph(
        nodes,
        "encoder",
        [oh.make_tensor_value_info("ids", onnx.TensorProto.INT64, ["N", seq])],
        [oh.make_tensor_value_info(x, F, ["N", seq, hidden])],
        inits,
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    batch = {
        "ids": rng.integers(0, vocab, (BATCH, seq)).astype(np.int32),
        "y": rng.standard_normal((BATCH, seq, hidden)).astype(np.float32),
    }
    return model, batch


def cnn(channels: int = 8, classes: int = 4):
    """Conv-BN-ReLU twice, global pooling, Gemm (transB=1): BatchNormalization trains."""
    rng = np.random.default_rng(1)
    inits, nodes = [], []

    def w(name, value):
        inits.append(onh.from_array(value.astype(np.float32), name))
        return name

    x, cin = "image", 3
    for i in range(2):
        nodes.append(
            oh.make_node(
                "Conv",
                [
                    x,
                    w(f"c{i}.w", rng.standard_normal((channels, cin, 3, 3)) * 0.3),
                    w(f"c{i}.b", rng.standard_normal(channels) * 0.1),
                ],
                [f"conv{i}"],
                pads=[1, 1, 1, 1],
            )
        )
        bn = [
            w(f"bn{i}.{n}", v)
            for n, v in (
                ("scale", 1 + 0.1 * rng.standard_normal(channels)),
                ("bias", 0.1 * rng.standard_normal(channels)),
                ("mean", np.zeros(channels)),
                ("var", np.ones(channels)),
            )
        ]
        nodes.append(oh.make_node("BatchNormalization", [f"conv{i}", *bn], [f"bnout{i}"]))
        nodes.append(oh.make_node("Relu", [f"bnout{i}"], [f"relu{i}"]))
        x, cin = f"relu{i}", channels
    nodes.append(oh.make_node("GlobalAveragePool", [x], ["pool"]))
    nodes.append(oh.make_node("Flatten", ["pool"], ["flat"]))
    nodes.append(
        oh.make_node(
            "Gemm",
            ["flat", w("fc.w", rng.standard_normal((classes, channels)) * 0.3), w("fc.b", np.zeros(classes))],
            ["logits"],
            transB=1,
        )
    )
    graph = oh.make_graph(
        nodes,
        "cnn",
        [oh.make_tensor_value_info("image", F, ["N", 3, 8, 8])],
        [oh.make_tensor_value_info("logits", F, ["N", classes])],
        inits,
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 15)])
    batch = {
        "image": rng.standard_normal((BATCH, 3, 8, 8)).astype(np.float32),
        "y": rng.standard_normal((BATCH, classes)).astype(np.float32),
    }
    return model, batch


def loss(outputs, batch):
    import jax.numpy as jnp

    return jnp.mean((outputs[0] - batch["y"]) ** 2)


def step(model, batch, microbatches=1):
    """One SGD-with-momentum step: (loss, train state)."""
    import jax
    import optax

    from jonnx import sharding, training

    train_step = training.make_train_step(model, loss, optax.sgd(0.1, momentum=0.9), microbatches=microbatches)
    ts = train_step.init()
    if model.mesh is not None:
        batch = sharding.shard_batch(batch, model.mesh, "data")
    ts, metrics = train_step(ts, batch)
    jax.block_until_ready(ts)
    return float(metrics["loss"]), ts


def _spec(sharding) -> list:
    spec = list(sharding.spec)
    while spec and spec[-1] is None:
        spec.pop()
    return [s if s is None or isinstance(s, str) else list(s) for s in spec]


def _compare(model, ts, single, losses) -> dict:
    """A sharded step's train state against the single-device step's, and its shardings."""
    import jax

    # Each momentum buffer is named by its parameter in the optimizer state's path.
    momentum = {
        path[-1].key: leaf
        for path, leaf in jax.tree_util.tree_flatten_with_path(ts.opt_state)[0]
        if path and isinstance(path[-1], jax.tree_util.DictKey)
    }
    return {
        "loss": losses,
        "max_param_diff": max(
            float(np.max(np.abs(np.asarray(ts.params[n]) - np.asarray(single.params[n])))) for n in ts.params
        ),
        "max_state_diff": max(
            [float(np.max(np.abs(np.asarray(ts.state[n]) - np.asarray(single.state[n])))) for n in ts.state] or [0.0]
        ),
        "params_keep_shardings": all(
            ts.params[n].sharding.is_equivalent_to(model.params[n].sharding, ts.params[n].ndim) for n in ts.params
        ),
        "opt_state_sharded_like_params": sorted(momentum) == sorted(ts.params)
        and all(momentum[n].sharding.is_equivalent_to(ts.params[n].sharding, ts.params[n].ndim) for n in ts.params),
        "specs": {n: _spec(a.sharding) for n, a in {**model.params, **model.state}.items()},
        "devices_used": len(ts.params[next(iter(ts.params))].sharding.device_set),
    }


def run_mesh(out_path: str) -> None:
    import jax
    from jax.sharding import Mesh

    import jonnx
    from jonnx import sharding

    devices = np.array(jax.devices())
    assert len(devices) == 8, devices
    meshes = {
        "data_parallel": (Mesh(devices, ("data",)), "replicated"),
        "fsdp": (Mesh(devices, ("data",)), sharding.fsdp("data", min_bytes=0)),
        "tensor_parallel": (Mesh(devices.reshape(2, 4), ("data", "model")), sharding.tensor_parallel("model")),
    }
    report: dict = {}
    for name, build in (("encoder", encoder), ("cnn", cnn)):
        proto, batch = build()
        single_loss, single = step(jonnx.load(proto), batch)
        for kind, (mesh, rules) in meshes.items():
            model = jonnx.load(proto, mesh=mesh, rules=rules)
            sharded_loss, ts = step(model, batch)
            report[f"{name}/{kind}"] = _compare(model, ts, single, [single_loss, sharded_loss])
        if name == "encoder":
            # Gradients accumulated over two parts of the sharded batch: the whole batch's
            # (a mean loss, no BatchNormalization).
            model = jonnx.load(proto, mesh=meshes["data_parallel"][0], rules="replicated")
            sharded_loss, ts = step(model, batch, microbatches=2)
            report[f"{name}/data_parallel_microbatches"] = _compare(model, ts, single, [single_loss, sharded_loss])
    with open(out_path, "w") as f:
        json.dump(report, f)


def run_worker(address: str, process_id: int, model_path: str, batch_path: str, out_path: str) -> None:
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=address, num_processes=2, process_id=process_id)
    from jax.sharding import Mesh

    import jonnx

    batch = dict(np.load(batch_path))
    half = BATCH // 2
    local = {k: v[process_id * half : (process_id + 1) * half] for k, v in batch.items()}
    mesh = Mesh(np.array(jax.devices()), ("data",))
    model = jonnx.load(model_path, mesh=mesh, rules="replicated")
    loss_value, ts = step(model, local)
    result = {
        "processes": jax.process_count(),
        "devices": len(jax.devices()),
        "loss": loss_value,
        "params": {n: np.asarray(p.addressable_data(0)).tolist() for n, p in ts.params.items()},
    }
    with open(out_path, "w") as f:
        json.dump(result, f)
    jax.distributed.shutdown()


if __name__ == "__main__":
    if sys.argv[1] == "mesh":
        run_mesh(sys.argv[2])
    else:
        run_worker(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6])
