"""Fine-tune an ONNX CNN on scikit-learn's 8x8 digits with optax, and save it back to ONNX.

The script:

1. builds a small CNN with ``onnx.helper`` (Conv/BatchNormalization/Relu twice, MaxPool,
   Flatten, Gemm/Relu, Dropout, Gemm), exported in *eval* mode as PyTorch exports it
   (BatchNormalization with ``training_mode=0``, Dropout without a training input) and with
   untrained weights, standing in for a model you received;
2. loads scikit-learn's bundled digits data set (1,797 images, no download) and splits it;
3. prints the test accuracy before training;
4. fine-tunes it with ``jonnx.training``: the whole model in training mode (batch statistics,
   running averages updated by ONNX's momentum rule, Dropout driven by an explicit PRNG key),
   ``optax.adamw`` with a cosine schedule;
5. prints the test accuracy after (97-99% with the default settings);
6. saves the fine-tuned model with ``jonnx.save`` and checks that onnxruntime, running the
   saved file, agrees with jonnx's inference-mode outputs;
7. reports the median time of one training step and draws the loss curve to a PNG
   (matplotlib when installed, else Pillow).

Run: ``python examples/finetune_digits.py [--fast] [--epochs N] [--out DIR] [--bf16]``.
``--fast`` trains a few steps on a small subset: a smoke test of the whole path, not of the
accuracy.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

import jax
import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import optax

import jonnx
from jonnx import training

OPSET = 17
CLASSES = 10


def build_cnn(seed: int = 0) -> onnx.ModelProto:
    """An untrained digits CNN, exported in eval mode: image [N, 1, 8, 8] -> logits [N, 10]."""
    rng = np.random.default_rng(seed)
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def init(name: str, value: np.ndarray) -> str:
        inits.append(onh.from_array(np.asarray(value, np.float32), name))
        return name

    def he(shape: tuple[int, ...], fan_in: int) -> np.ndarray:
        return rng.normal(0.0, np.sqrt(2.0 / fan_in), shape)

    def conv_bn_relu(x: str, c_in: int, c_out: int, tag: str) -> str:
        w = init(f"{tag}.weight", he((c_out, c_in, 3, 3), c_in * 9))
        b = init(f"{tag}.bias", np.zeros(c_out))
        bn = [
            init(f"{tag}.bn.{n}", v)
            for n, v in (
                ("scale", np.ones(c_out)),
                ("bias", np.zeros(c_out)),
                ("running_mean", np.zeros(c_out)),
                ("running_var", np.ones(c_out)),
            )
        ]
        nodes.extend(
            [
                oh.make_node(
                    "Conv", [x, w, b], [f"{tag}.conv"], name=f"{tag}/Conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1]
                ),
                # PyTorch's BatchNorm2d(momentum=0.1) exports ONNX momentum 0.9.
                oh.make_node(
                    "BatchNormalization",
                    [f"{tag}.conv", *bn],
                    [f"{tag}.bn"],
                    name=f"{tag}/BatchNormalization",
                    epsilon=1e-5,
                    momentum=0.9,
                ),
                oh.make_node("Relu", [f"{tag}.bn"], [f"{tag}.relu"], name=f"{tag}/Relu"),
            ]
        )
        return f"{tag}.relu"

    h = conv_bn_relu("image", 1, 16, "conv1")
    h = conv_bn_relu(h, 16, 32, "conv2")
    nodes.extend(
        [
            oh.make_node("MaxPool", [h], ["pool"], name="pool/MaxPool", kernel_shape=[2, 2], strides=[2, 2]),
            oh.make_node("Flatten", ["pool"], ["flat"], name="Flatten", axis=1),
            oh.make_node(
                "Gemm",
                ["flat", init("fc1.weight", he((64, 512), 512)), init("fc1.bias", np.zeros(64))],
                ["fc1"],
                name="fc1/Gemm",
                transB=1,
            ),
            oh.make_node("Relu", ["fc1"], ["fc1.relu"], name="fc1/Relu"),
            # The ratio is a Constant node, not an initializer, so it is no trainable parameter.
            oh.make_node(
                "Constant",
                [],
                ["dropout.ratio"],
                name="dropout/ratio",
                value=onh.from_array(np.array(0.25, np.float32)),
            ),
            oh.make_node("Dropout", ["fc1.relu", "dropout.ratio"], ["dropped"], name="Dropout"),
            oh.make_node(
                "Gemm",
                ["dropped", init("fc2.weight", he((CLASSES, 64), 64) * 0.5), init("fc2.bias", np.zeros(CLASSES))],
                ["logits"],
                name="fc2/Gemm",
                transB=1,
            ),
        ]
    )
    graph = oh.make_graph(
        nodes,
        "digits_cnn",
        [oh.make_tensor_value_info("image", onnx.TensorProto.FLOAT, ["N", 1, 8, 8])],
        [oh.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, ["N", CLASSES])],
        initializer=inits,
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", OPSET)], producer_name="jonnx-example")
    model.ir_version = 8  # readable by older onnxruntime releases too
    onnx.checker.check_model(model, full_check=True)
    return model


def load_data(fast: bool, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Digits as float32 images in [0, 1], shaped [N, 1, 8, 8], split 80/20 by class."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None]
    labels = digits.target.astype(np.int32)
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=0.2, stratify=labels, random_state=seed
    )
    if fast:
        x_train, y_train, x_test, y_test = x_train[:256], y_train[:256], x_test[:128], y_test[:128]
    return x_train, y_train, x_test, y_test


def make_batches(x: np.ndarray, y: np.ndarray, batch_size: int, seed: int):
    """``epoch -> list of batches``: a fresh shuffle per epoch; the ragged tail is dropped, so
    every batch has one shape and the step compiles once."""

    def batches(epoch: int) -> list[dict[str, np.ndarray]]:
        order = np.random.default_rng((seed, epoch)).permutation(len(x))
        return [
            {"image": x[order[i : i + batch_size]], "label": y[order[i : i + batch_size]]}
            for i in range(0, len(x) - batch_size + 1, batch_size)
        ]

    return batches


def accuracy(model: jonnx.Model, train_state, x: np.ndarray, y: np.ndarray) -> float:
    (logits,) = training.predict(model, train_state, x, batch_size=256)
    return float(np.mean(np.argmax(np.asarray(logits), axis=-1) == y))


def median_step_time(step, train_state, batch, key, repeats: int) -> float:
    """Median wall time of one compiled step (the step is already compiled by training)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        train_state, metrics = step(train_state, batch, key)
        jax.block_until_ready((train_state, metrics))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def plot_loss(losses: list[float], path: pathlib.Path, title: str) -> str:
    """Draw the per-step loss (and a moving average) to ``path``; returns the library used."""
    losses = np.asarray(losses, np.float64)
    window = max(1, len(losses) // 20)
    smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        pass
    else:
        fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
        ax.plot(losses, color="#9bb7d4", lw=1, label="loss per step")
        ax.plot(np.arange(len(smooth)) + (window - 1) / 2, smooth, color="#1f4e79", lw=2, label=f"mean of {window}")
        ax.set(xlabel="step", ylabel="training loss", title=title, yscale="log")
        ax.legend()
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
        return "matplotlib"

    from PIL import Image, ImageDraw

    width, height, margin = 640, 400, 50
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    low, high = float(losses.min()), float(losses.max())
    span = high - low or 1.0

    def xy(i: float, v: float) -> tuple[float, float]:
        x = margin + (width - 2 * margin) * i / max(len(losses) - 1, 1)
        return x, height - margin - (height - 2 * margin) * (v - low) / span

    draw.rectangle([margin, margin, width - margin, height - margin], outline="black")
    draw.line([xy(i, v) for i, v in enumerate(losses)], fill=(155, 183, 212), width=1)
    if len(smooth) > 1:
        draw.line([xy(i + (window - 1) / 2, v) for i, v in enumerate(smooth)], fill=(31, 78, 121), width=2)
    draw.text((margin, 15), f"{title} (training loss per step; dark: mean of {window})", fill="black")
    draw.text((margin - 45, margin - 5), f"{high:.3f}", fill="black")
    draw.text((margin - 45, height - margin - 5), f"{low:.3f}", fill="black")
    draw.text((width // 2 - 30, height - margin + 15), f"step (0-{len(losses) - 1})", fill="black")
    image.save(path)
    return "Pillow"


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="a few steps on a small subset (a smoke test)")
    parser.add_argument("--epochs", type=int, default=None, help="training epochs (default 15, --fast 2)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--bf16", action="store_true", help="mixed precision: bfloat16 compute, float32 weights")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("finetune_digits_out"))
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    epochs = args.epochs or (2 if args.fast else 15)
    batch_size = 32 if args.fast else args.batch_size
    args.out.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()

    model = jonnx.load(build_cnn())
    print(f"model: {model}")
    x_train, y_train, x_test, y_test = load_data(args.fast)
    print(f"data: {len(x_train)} training and {len(x_test)} test images, 8x8, {CLASSES} classes")
    before = accuracy(model, None, x_test, y_test)
    print(f"test accuracy before fine-tuning: {before:.1%}")

    batches = make_batches(x_train, y_train, batch_size, seed=0)
    steps_per_epoch = len(batches(0))
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, args.lr, warmup_steps=min(20, steps_per_epoch), decay_steps=epochs * steps_per_epoch
    )
    loss_fn = training.classification_loss(model, target="label")
    step = training.make_train_step(model, loss_fn, optax.adamw(schedule, weight_decay=1e-4), mixed_precision=args.bf16)
    test_batches = [{"image": x_test[i : i + 256], "label": y_test[i : i + 256]} for i in range(0, len(x_test), 256)]

    def eval_fn(ts):
        metrics = training.evaluate(model, ts, test_batches, loss_fn)
        return {"test_loss": metrics["loss"], "test_accuracy": metrics["accuracy"]}

    key = jax.random.key(0)
    start = time.perf_counter()
    ts, history = training.fit(
        step, step.init(), batches, epochs=epochs, key=key, eval_fn=eval_fn, progress=not args.no_progress
    )
    train_time = time.perf_counter() - start
    after = accuracy(model, ts, x_test, y_test)
    print(f"test accuracy after fine-tuning: {after:.1%} ({epochs} epochs, {int(ts.step)} steps, {train_time:.1f} s)")

    # The running statistics moved with training: compare with the exported ones.
    moved = max(float(np.max(np.abs(np.asarray(ts.state[n]) - np.asarray(v)))) for n, v in model.state.items())
    print(f"BatchNormalization running statistics moved by up to {moved:.3f}")
    assert moved > 0, "training mode did not update the running statistics"

    path = args.out / "digits_finetuned.onnx"
    path.unlink(missing_ok=True)  # jonnx.save never overwrites a file
    jonnx.save(model, path, params=ts.params, state=ts.state)
    print(f"saved {path} ({path.stat().st_size / 1024:.0f} KiB)")

    (expected,) = training.predict(model, ts, x_test)
    reloaded = jonnx.load(path)
    diff_reload = float(np.max(np.abs(np.asarray(reloaded(x_test)[0]) - np.asarray(expected))))
    print(f"jonnx on the saved file vs the trained state: max |difference| = {diff_reload:.2e}")
    assert diff_reload < 1e-5, "the saved file does not hold the trained values"
    try:
        import onnxruntime as ort
    except ImportError:
        print("onnxruntime not installed: skipping its check")
        diff_ort = float("nan")
    else:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        (ort_logits,) = session.run(None, {"image": x_test})
        diff_ort = float(np.max(np.abs(ort_logits - np.asarray(expected))))
        print(f"onnxruntime on the saved file vs jonnx (eval mode): max |difference| = {diff_ort:.2e}")
        assert diff_ort < 1e-4, "onnxruntime and jonnx disagree on the saved model"
        ort_accuracy = float(np.mean(np.argmax(ort_logits, axis=-1) == y_test))
        assert abs(ort_accuracy - after) < 1e-9, "onnxruntime's accuracy differs from jonnx's"

    step_time = median_step_time(step, ts, batches(0)[0], key, repeats=10 if args.fast else 50)
    print(
        f"median train step: {step_time * 1e3:.2f} ms (batch {batch_size}, "
        f"{'bfloat16' if args.bf16 else 'float32'} compute)"
    )

    png = args.out / "loss_curve.png"
    library = plot_loss(history.loss, png, f"digits CNN fine-tuning: test accuracy {after:.1%}")
    print(f"loss curve: {png} (drawn with {library})")
    total = time.perf_counter() - began
    print(f"all checks passed in {total:.1f} s")
    return {"before": before, "after": after, "ort_diff": diff_ort, "step_time": step_time, "total_time": total}


if __name__ == "__main__":
    main(sys.argv[1:])
