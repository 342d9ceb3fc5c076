"""Load + first call time of ResNet-50 (batch 1) in a fresh process, per configuration.

Usage: ``python benchmarks/bench_load.py [default|xla|plain] [--model resnet50]``
(one configuration per process, so compile caches of one never help another). Prints the
seconds of ``jonnx.load(path)`` and of the first ``model(x)`` (trace + compile + run).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
import time

import numpy as np
import onnx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import nets

import jonnx
import jonnx.ops.conv


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", choices=["default", "xla", "plain"])
    parser.add_argument("--model", default="resnet50", choices=["resnet50", "mobilenet_v2"])
    args = parser.parse_args()
    proto = getattr(nets, args.model)()
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "model.onnx"
        onnx.save(proto, path)
        if args.config == "xla":
            jonnx.ops.conv.CONV_LOWERING = "xla"
        x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
        start = time.perf_counter()
        model = jonnx.load(path, optimize=args.config != "plain")
        loaded = time.perf_counter()
        np.asarray(model(x))
        first = time.perf_counter()
        np.asarray(model(x))
        second = time.perf_counter()
    print(
        f"{args.model} {args.config}: load {loaded - start:.2f} s, first call "
        f"{first - loaded:.2f} s, total {first - start:.2f} s, second call "
        f"{(second - first) * 1e3:.0f} ms"
    )


if __name__ == "__main__":
    main()
