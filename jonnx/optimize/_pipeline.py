"""The pass list, the ``optimize=`` option, and the driver."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from jonnx._ir import Graph
from jonnx.optimize import dead_nodes, fold_batchnorm, fuse_matmuls, layout, quantized_convs, string_labels

__all__ = ["CALL_ONLY", "CALL_OPTIONS", "PASSES", "optimize", "resolve"]

# In the order they run. Each takes the graph and the run's train flag (True, False or None:
# a pass that depends on the mode, like BatchNorm folding, only rewrites nodes whose mode that
# flag fixes) and returns a new graph.
PASSES: Mapping[str, Callable[[Graph, bool | None], Graph]] = {
    "fold_batchnorm": fold_batchnorm.run,
    "fuse_matmuls": fuse_matmuls.run,
    "quantized_convs": quantized_convs.run,
    "channels_last": layout.run,
    "dead_nodes": dead_nodes.run,
    "string_labels": string_labels.run,
}

# Switches of the same option that act on how ``Model(*inputs)`` compiles and runs, not on the
# graph, with their defaults. ``constant_weights``: the model's own weights enter the compiled
# function as constants (folded at trace time, and XLA specializes on them) instead of as
# arguments. Off by default: on the shared 2-core machine it measured within noise of weights as
# arguments, while it doubled compile time and made ResNet-50's first call hold several
# copies of the weights (docs/performance.md). ``batch_chunks``: a segment whose temporaries
# XLA would map afresh on every call runs its batch in chunks of rows where that gives the
# same values (jonnx/_chunks.py; BERT, MobileNetV2 and ResNet-50 at batch 32 0.59-0.95 of the
# time).
CALL_OPTIONS = {"constant_weights": False, "batch_chunks": True}

# Passes that pay only when the weights are constants. With the weights as arguments each
# makes a second copy of the weights it rewrites (the default call computes it once and keeps
# it) and measured no faster. Folding BatchNormalization into the Conv weights: ResNet-50's
# first call peaked at 3.2x the weights' bytes against 2.6x, no faster than BatchNormalization's
# own per-channel scale and shift. Fusing Q/K/V into one product: the 4-layer BERT-base encoder
# 46.0 against 43.6 ms at batch 1 and 1347 against 1334 ms at batch 32 (alternating, quiet
# machine), and its first call 1.41x the weights' bytes against 1.17x (docs/performance.md).
# Unless named, they are on exactly when ``constant_weights`` is (there they fold at trace time).
CONSTANT_ONLY = ("fold_batchnorm", "fuse_matmuls")

# Passes that pay only where the weight-only nodes they add run once: ``Model(*inputs)`` with
# the model's own weights (computed once and kept, or compiled in as constants). In
# ``Model.apply`` the weights are arguments of the user's function (a training step, jax.grad),
# so those nodes would run on every call: there these passes are off unless named.
# channels_last: its OIHW -> HWIO weight Transposes (ResNet-50 batch 1 with them on every call:
# 1.35-1.63x slower than NCHW; once per model: 0.76x; a ResNet-18 training step 1.10-1.34x
# slower channels-last, docs/performance.md).
CALL_ONLY: tuple[str, ...] = ("channels_last",)


def resolve(option: bool | Mapping[str, bool], *, call: bool = True) -> dict[str, bool]:
    """The ``optimize=`` option of :func:`jonnx.load` as ``{name: on}`` for every switch:
    for ``Model(*inputs)`` with its own weights (``call``), or else for ``Model.apply``.

    Raises:
        ValueError: an unknown pass name.
        TypeError: an option that is not a bool or a dict of bools.
    """
    names = (*PASSES, *CALL_OPTIONS)
    if isinstance(option, bool):
        option = {} if option else dict.fromkeys(names, False)
    if not isinstance(option, Mapping):
        raise TypeError(f"optimize must be True, False or a dict of {list(names)} to bools, not {option!r}")
    unknown = sorted(set(option) - set(names))
    if unknown:
        raise ValueError(f"unknown optimization pass(es) {unknown}; known: {list(names)}")
    for name, on in option.items():
        if not isinstance(on, bool):
            raise TypeError(f"optimize[{name!r}] must be a bool, not {on!r}")
    switches = {name: bool(option.get(name, CALL_OPTIONS.get(name, True))) for name in names}
    for name in CONSTANT_ONLY:
        switches[name] = bool(option.get(name, switches["constant_weights"]))
    if not call:
        for name in CALL_ONLY:
            switches[name] = bool(option.get(name, False))
    return switches


def optimize(graph: Graph, switches: Mapping[str, bool], train: bool | None) -> Graph:
    """``graph`` through every pass switched on, for runs with this ``train`` flag.

    Nodes keep the PRNG stream of their original position (``Node.seed_index``), so removing
    or adding nodes never changes what a random op draws.
    """
    if not any(switches.get(name) for name in PASSES):
        return graph
    nodes = tuple(
        n if n.seed_index is not None else dataclasses.replace(n, seed_index=i) for i, n in enumerate(graph.nodes)
    )
    graph = dataclasses.replace(graph, nodes=nodes)
    for name, run in PASSES.items():
        if switches.get(name):
            graph = run(graph, train)
    return graph
