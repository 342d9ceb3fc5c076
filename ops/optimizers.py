"""The ``ai.onnx.preview.training`` domain: optimizer steps (Adagrad, Adam, Momentum) and
Gradient.

The optimizers update several tensors at once. Their inputs are ``R`` (learning rate), ``T``
(update count), then one group per role: every ``X``, then every ``G``, then every state
tensor (``H`` for Adagrad; ``V`` then ``H`` for Adam; ``V`` for Momentum). The number of
optimized tensors is ``(len(inputs) - 2) / roles``; the outputs are grouped the same way
(every ``X_new``, then every new state). The scalar factors are computed in ``R``'s dtype and
``T > 0`` branches use ``jnp.where`` (with a safe operand in the masked branch), so one
compiled step serves every ``T`` and gradients stay finite.

``Gradient`` differentiates the *enclosing graph* between the names in its attributes: it
slices the nodes that lead from ``xs``/``zs`` to ``y``, runs them as a subgraph through
``ctx.run_graph`` at the values given as the node's inputs, and takes a VJP with JAX. It
needs ``ctx.graph`` (the graph holding the node), which the interpreter provides.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from jonnx._ir import Graph, Node, ValueInfo
from jonnx._registry import Attrs, Inputs, OpContext, Outputs, register

TRAINING = "ai.onnx.preview.training"


# -- optimizers -----------------------------------------------------------------------------


def _groups(inputs: tuple, roles: int, ctx: OpContext) -> tuple[Any, Any, list[tuple]]:
    """``R``, ``T`` and ``roles`` lists (X, G, states...) of equal length."""
    if len(inputs) < 2 + roles or (len(inputs) - 2) % roles:
        raise ctx.error(f"expects R, T and {roles} inputs per optimized tensor, got {len(inputs)} inputs")
    if any(x is None for x in inputs):
        raise ctx.error("no input may be omitted")
    r, t = inputs[0], inputs[1]
    if jnp.size(r) != 1 or jnp.size(t) != 1:
        raise ctx.error(f"R and T must be scalars, got shapes {jnp.shape(r)} and {jnp.shape(t)}")
    n = (len(inputs) - 2) // roles
    rest = inputs[2:]
    return jnp.reshape(r, ()), jnp.reshape(t, ()), [rest[i * n : (i + 1) * n] for i in range(roles)]


def _required(attrs, names: Sequence[str], ctx: OpContext) -> list[float]:
    missing = [n for n in names if attrs[n] is None]
    if missing:
        raise ctx.error(f"missing required attribute(s) {', '.join(missing)}")
    return [attrs[n] for n in names]


@register("Adagrad", since=1, domain=TRAINING)
def adagrad(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Adagrad`` (ai.onnx.preview.training), opset 1."""
    r, t, (xs, gs, hs) = _groups(inputs, 3, ctx)
    norm, decay, eps = attrs["norm_coefficient"], attrs["decay_factor"], attrs["epsilon"]
    rate = r / (1 + t.astype(r.dtype) * decay)
    x_new, h_new = [], []
    for x, g, h in zip(xs, gs, hs):
        dtype = jnp.result_type(x)
        g_reg = norm * x + g
        h2 = h + g_reg * g_reg
        x_new.append((x - rate.astype(dtype) * g_reg / (jnp.sqrt(h2) + eps)).astype(dtype))
        h_new.append(h2.astype(dtype))
    return (*x_new, *h_new)


@register("Adam", since=1, domain=TRAINING)
def adam(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Adam`` (ai.onnx.preview.training), opset 1."""
    r, t, (xs, gs, vs, hs) = _groups(inputs, 4, ctx)
    alpha, beta = attrs["alpha"], attrs["beta"]
    norm, norm_post = attrs["norm_coefficient"], attrs["norm_coefficient_post"]
    eps = attrs["epsilon"]
    # Bias correction only once T > 0; T = 0 would divide by 1 - alpha**0 = 0.
    started = t > 0
    t_safe = jnp.where(started, t, 1).astype(r.dtype)
    corrected = (
        r
        * jnp.sqrt(1 - jnp.power(jnp.asarray(beta, r.dtype), t_safe))
        / (1 - jnp.power(jnp.asarray(alpha, r.dtype), t_safe))
    )
    rate = jnp.where(started, corrected, r)
    x_new, v_new, h_new = [], [], []
    for x, g, v, h in zip(xs, gs, vs, hs):
        dtype = jnp.result_type(x)
        g_reg = norm * x + g
        v2 = alpha * v + (1 - alpha) * g_reg
        h2 = beta * h + (1 - beta) * g_reg * g_reg
        x2 = x - rate.astype(dtype) * (v2 / (jnp.sqrt(h2) + eps))
        x_new.append(((1 - norm_post) * x2).astype(dtype))
        v_new.append(v2.astype(dtype))
        h_new.append(h2.astype(dtype))
    return (*x_new, *v_new, *h_new)


@register("Momentum", since=1, domain=TRAINING)
def momentum(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Momentum`` (ai.onnx.preview.training), opset 1: ``mode`` standard or nesterov."""
    r, t, (xs, gs, vs) = _groups(inputs, 3, ctx)
    alpha, beta, norm, mode = _required(attrs, ("alpha", "beta", "norm_coefficient", "mode"), ctx)
    if mode not in ("standard", "nesterov"):
        raise ctx.error(f"mode must be 'standard' or 'nesterov', got {mode!r}")
    # The first step (T == 0) takes the whole gradient.
    beta_adj = jnp.where(t > 0, jnp.asarray(beta, r.dtype), jnp.asarray(1, r.dtype))
    x_new, v_new = [], []
    for x, g, v in zip(xs, gs, vs):
        dtype = jnp.result_type(x)
        g_reg = norm * x + g
        v2 = alpha * v + beta_adj.astype(dtype) * g_reg
        step = v2 if mode == "standard" else g_reg + alpha * v2
        x_new.append((x - r.astype(dtype) * step).astype(dtype))
        v_new.append(v2.astype(dtype))
    return (*x_new, *v_new)


# -- Gradient -------------------------------------------------------------------------------


def _is_gradient(node: Node) -> bool:
    return node.op_type == "Gradient" and node.domain == TRAINING


def _slice(graph: Graph, y: str, boundary: frozenset[str]) -> tuple[Node, ...]:
    """The nodes of ``graph`` that compute ``y`` from ``boundary`` (and leaves), in order.

    The walk stops at boundary names. A nested Gradient node in the slice recomputes its own
    slice from the graph it runs in, so that slice's nodes are kept too (second derivatives).
    """
    producers = graph.producers()
    keep: set[int] = set()
    index = {id(node): i for i, node in enumerate(graph.nodes)}
    stack = [(y, boundary)]
    seen: set[tuple[str, frozenset[str]]] = set()
    while stack:
        name, stop = stack.pop()
        if (name, stop) in seen or name in stop or name not in producers:
            continue
        seen.add((name, stop))
        node = producers[name]
        keep.add(index[id(node)])
        stack.extend((i, stop) for i in node.reads)
        if _is_gradient(node):
            inner = frozenset(node.attrs["xs"] or ()) | frozenset(node.attrs["zs"] or ())
            stack.append((node.attrs["y"], inner))
    return tuple(graph.nodes[i] for i in sorted(keep))


@register("Gradient", since=1, domain=TRAINING, reads_graph=True)
def gradient(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Gradient`` (ai.onnx.preview.training), opset 1: ``dy/dx`` for each name in ``xs``.

    The derivative is taken through the enclosing graph's nodes between ``xs``/``zs`` and
    ``y``, evaluated at the node's inputs (values for ``xs`` then ``zs``); other values the
    slice reads (initializers, graph inputs) come from the enclosing scope. ``y`` must be a
    float tensor with one element.
    """
    xs = tuple(attrs["xs"] or ())
    zs = tuple(attrs["zs"] or ())
    y = attrs["y"]
    if not xs or not y:
        raise ctx.error("attributes xs and y are required")
    if len(inputs) != len(xs) + len(zs):
        raise ctx.error(f"has {len(inputs)} inputs but xs and zs name {len(xs) + len(zs)} values ({xs + zs})")
    if any(v is None for v in inputs):
        raise ctx.error("no input may be omitted: each gives the value of a name in xs or zs")
    graph = ctx.graph
    if graph is None or ctx.run_graph is None:
        raise ctx.error(
            "Gradient differentiates the graph it belongs to and can only run inside a model "
            "whose interpreter provides the enclosing graph (OpContext.graph)"
        )
    x_vals = [jnp.asarray(v) for v in inputs[: len(xs)]]
    for name, v in zip(xs, x_vals):
        if not jnp.issubdtype(v.dtype, jnp.floating):
            raise ctx.error(f"cannot differentiate with respect to {name!r} of dtype {v.dtype}")
    z_vals = dict(zip(zs, inputs[len(xs) :]))
    sub = Graph(
        name=f"{ctx.node}/gradient",
        nodes=_slice(graph, y, frozenset(xs) | frozenset(zs)),
        inputs=tuple(ValueInfo(n) for n in xs + zs),
        outputs=(ValueInfo(y),),
        initializers={},
    )

    def forward(*x_args):
        (out,) = ctx.run_graph(sub, {**z_vals, **dict(zip(xs, x_args))})
        return jnp.asarray(out)

    out, vjp = jax.vjp(forward, *x_vals)
    if out.size != 1 or not jnp.issubdtype(out.dtype, jnp.floating):
        raise ctx.error(f"y ({y!r}) must be a float scalar, got shape {out.shape} and dtype {out.dtype}")
    return tuple(vjp(jnp.ones_like(out)))
