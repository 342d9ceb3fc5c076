"""Recurrent layers: RNN, GRU, LSTM.

Each direction is one ``jax.lax.scan`` over the time axis. The input projection
``X @ W^T + Wb`` of every step is one matmul before the scan, cut into one scanned array per
gate; only ``H @ R^T`` runs inside it, and R's gradient is one product after the backward
scan (``_recurrence``; for GRU without ``linear_before_reset``, two: ``_gru_scan``).

``sequence_lens`` may be traced: steps past a sequence's length are masked (the state is
carried unchanged and ``Y`` is zero there), so ``Y_h``/``Y_c`` hold the state at each
sequence's last valid step. The reverse direction reads each sequence backwards *within its
length*, through a per-batch index permutation (the identity on the padding).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_derivatives import SymbolicZero

from jonnx._registry import Attrs, Inputs, OpContext, Outputs, register
from jonnx.ops import activation
from jonnx.ops._util import stored_transpose, widen_halves

# name (lower case) -> (function of x, alpha, beta; default alpha; default beta). The defaults
# are onnxruntime's and Keras's; an activation consumes an alpha/beta only if it takes one.
_ACTIVATIONS: dict[str, tuple[Callable, float | None, float | None]] = {
    "relu": (lambda x, a, b: activation.relu(x), None, None),
    "tanh": (lambda x, a, b: jnp.tanh(x), None, None),
    "sigmoid": (lambda x, a, b: jax.nn.sigmoid(x), None, None),
    "affine": (lambda x, a, b: a * x + b, 1.0, 0.0),
    "leakyrelu": (lambda x, a, b: jnp.where(x >= 0, x, a * x), 0.01, None),
    "thresholdedrelu": (lambda x, a, b: jnp.where(x >= a, x, jnp.zeros_like(x)), 1.0, None),
    "scaledtanh": (lambda x, a, b: a * jnp.tanh(b * x), 1.0, 1.0),
    "hardsigmoid": (lambda x, a, b: jnp.clip(a * x + b, 0, 1), 0.2, 0.5),
    # double where: the unused exp branch must not overflow into a NaN gradient
    "elu": (lambda x, a, b: jnp.where(x >= 0, x, a * jnp.expm1(jnp.where(x >= 0, 0, x))), 1.0, None),
    "softsign": (lambda x, a, b: x / (1 + jnp.abs(x)), None, None),
    "softplus": (lambda x, a, b: jax.nn.softplus(x), None, None),
}

_Act = Callable[[jax.Array], jax.Array]

# kind -> (gates per step, default activations of one direction)
_KINDS = {"RNN": (1, ("Tanh",)), "GRU": (3, ("Sigmoid", "Tanh")), "LSTM": (4, ("Sigmoid", "Tanh", "Tanh"))}


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _activations(kind: str, attrs, num_directions: int, ctx) -> list[list[_Act]]:
    """The activation functions of each direction, alpha/beta bound."""
    per_dir = len(_KINDS[kind][1])
    names = [_text(n) for n in (attrs["activations"] or _KINDS[kind][1])]
    if len(names) == per_dir and num_directions == 2:
        names = names * 2
    # RNN's schema default lists two (one per direction) even for one direction.
    if len(names) < per_dir * num_directions:
        raise ctx.error(f"needs {per_dir * num_directions} activations, got {names}")
    alphas = list(attrs["activation_alpha"] or ())
    betas = list(attrs["activation_beta"] or ())
    funcs = []
    for name in names[: per_dir * num_directions]:
        entry = _ACTIVATIONS.get(name.lower())
        if entry is None:
            raise ctx.error(f"unknown activation {name!r}; expected one of {sorted(_ACTIVATIONS)}")
        fn, alpha, beta = entry
        if alpha is not None and alphas:
            alpha = float(alphas.pop(0))
        if beta is not None and betas:
            beta = float(betas.pop(0))
        funcs.append(lambda x, fn=fn, alpha=alpha, beta=beta: fn(x, alpha, beta))
    return [funcs[d * per_dir : (d + 1) * per_dir] for d in range(num_directions)]


def _reverse_within_lengths(x: jax.Array, lengths: jax.Array | None) -> jax.Array:
    """``x`` (time, batch, ...) with each batch entry's first ``length`` steps reversed."""
    if lengths is None:
        return jnp.flip(x, 0)
    t = jnp.arange(x.shape[0])[:, None]
    idx = jnp.where(t < lengths[None, :], lengths[None, :] - 1 - t, t)
    idx = idx.reshape(idx.shape + (1,) * (x.ndim - 2))
    return jnp.take_along_axis(x, idx, axis=0)


def _clipper(clip: float | None) -> _Act:
    """The cell's ``clip`` attribute as a function: gate inputs bounded to [-clip, clip]."""
    return (lambda v: v) if clip is None else (lambda v: jnp.clip(v, -clip, clip))


def _cell(kind: str, acts: Sequence[_Act], clip, input_forget):
    """One direction's update ``(products, gate inputs_t, state, mask_t, peepholes) -> (state,
    h_t)`` of RNN, LSTM and GRU with ``linear_before_reset``: the step's one product ``h @ R^T +
    Rb`` comes in cut into one part per gate (:func:`_recurrence` computes it), as do the
    step's projected inputs.

    Each gate's input is an array of its own: XLA CPU does not vectorize a loop that reads
    several windows of one dynamic slice (docs/known_issues.md), which the cell's loop, reading
    every gate with its sigmoid and tanh, did when the gates were windows of one scanned input
    (an LSTM step over 32 x 256 states: 78 against about 5 microseconds). The peepholes come
    cut too: the derivative of a slice taken in the step pads its cotangent to the whole array
    on every step. The first ``_FOLDED[kind]`` products enter only as ``gate input + product``,
    which :func:`_recurrence`'s derivative relies on."""

    clipped = _clipper(clip)

    def update(prod, xg, state, mask, peep):
        h = state[0]
        if kind == "RNN":
            new = (acts[0](clipped(xg[0] + prod[0])),)
        elif kind == "GRU":  # linear_before_reset
            f, g = acts
            hz, hreset, hh = prod
            z = f(clipped(xg[0] + hz))
            rg = f(clipped(xg[1] + hreset))
            ht = g(clipped(xg[2] + rg * hh))
            new = ((1 - z) * ht + z * h,)
        else:  # LSTM, gates in order i, o, f, c; peepholes in order i, o, f
            f, g, hact = acts
            c = state[1]
            p_i, p_o, p_f = peep
            gi, go, gf, gc = (x + y for x, y in zip(xg, prod))
            i = f(clipped(gi + p_i * c))
            fg = 1 - i if input_forget else f(clipped(gf + p_f * c))
            c_new = fg * c + i * g(clipped(gc))
            o = f(clipped(go + p_o * c_new))
            new = (o * hact(c_new), c_new)
        return _masked(new, state, mask)

    return update


# How many leading products each update adds to its gate input and uses only in that sum.
_FOLDED = {"RNN": 1, "LSTM": 4, "GRU": 2}


def _masked(new: tuple, state: tuple, mask) -> tuple:
    """``(state, h_t)``: past a sequence's length the state stays and ``Y`` is zero."""
    if mask is None:
        return new, new[0]
    new = tuple(jnp.where(mask, n, s) for n, s in zip(new, state))
    return new, jnp.where(mask, new[0], jnp.zeros_like(new[0]))


def _products(h, r, rb, parts: int, k_axis: int = 1) -> tuple:
    """``h @ r.T + rb`` (``rb`` None: no bias) cut into ``parts`` (its derivative: one
    concatenation, not a pad per part); ``r`` is (N, K) as stored, or (K, N) with ``k_axis``
    0 (:func:`_step_weights`)."""
    product = lax.dot_general(h, r, (((1,), (k_axis,)), ((), ())))
    return tuple(jnp.split(product if rb is None else product + rb, parts, axis=-1))


def _step_weights(r, rows: int) -> tuple:
    """``(weights, k_axis)`` of the forward scan's step products: R copied to (K, N) before the
    scan for 2 or more rows. YNNPACK, which runs step products of 2 to 64 rows, otherwise
    repacks R as stored (N, K) on every step: an LSTM step's 4 x 256 x 1024 product took 21
    microseconds against 11 (inference at batch 4 0.60 of the time, a GRU's 0.29; at batch 32
    0.85-0.93; docs/performance.md "Recurrent layers"). One row is a matrix-vector product in
    XLA's own dot, which reads R as stored faster (1.04-1.06x). The tangent scan keeps R as
    stored: its transpose, the backward scan's ``cotangent @ R``, then reads it without a
    copy (with the (K, N) copy there LSTM gradient steps took 1.2-1.3x the time)."""
    one_row = isinstance(rows, int) and rows == 1  # a symbolic batch (jax.export) takes the copy
    return (r, 1) if one_row else (r.T, 0)


def _saves_activations(prim, *_, **__) -> bool:
    """:func:`_linearize`'s remat policy: which values a step's linear map keeps."""
    return prim in (lax.logistic_p, lax.tanh_p)


def _linearize(fn: Callable, *primals):
    """``jax.linearize(fn, *primals)`` keeping only the sigmoids' and tanhs' outputs (and
    ``fn``'s inputs where the map needs them) for the linear map; the rest of what it needs,
    such as the derivative factors ``s * (1 - s)``, it recomputes from them when applied.

    The recurrences' forward scans stack every saved value of every step, and then the
    backward scan reads them: as plainly linearized an LSTM step kept twelve (batch, hidden)
    arrays, with this six (a GRU nine and five, an RNN two and one; with other activations or
    ``clip`` never more than plainly). Gradient steps, one process alternating (AMD Zen 5,
    docs/performance.md "Recurrent layers"): LSTM 0.71 of the time at batch 8 and 0.91 at 32,
    GRU 0.93-0.95, RNN 0.91 and 0.52; batch 1 unchanged; the same gradients bit for bit."""
    return jax.linearize(jax.checkpoint(fn, policy=_saves_activations), *primals)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1, 2))
def _recurrence(update, parts: int, folded: int, r, rb, peep, init, xg, mask):
    """``lax.scan`` of ``update(_products(h, r, rb), xg_t, state, mask_t, peep)`` over the
    steps: the final state and the stacked ``h_t``.

    The derivative in ``r`` is taken out of the scan. Differentiated as written, each step adds
    its share of ``r``'s gradient (the outer product of the step's state and its gates'
    cotangent) into an accumulator carried through the backward scan: at batch 1 a 1024 x 256
    add per step, most of an LSTM gradient's time. Here the JVP's forward scan linearizes each
    step's update (:func:`_linearize`: the activations are saved, no product is computed
    twice) and keeps the states; ``r``'s term ``H_{t-1} @ dr^T`` of every step is then one
    product, added to the products' tangent before the tangent scan, which applies the saved
    linear maps. The first ``folded`` products enter ``update`` only as ``gate input +
    product``, so those gate inputs' tangents join that sum instead of being scanned beside it.
    Transposed, ``r``'s gradient is one product after the backward scan. Gradient steps, one
    process alternating (AMD Zen 5, docs/performance.md "Recurrent layers"): LSTM 0.85 of the
    time at batch 1, 0.64 at batch 8, 0.98 at batch 32. Forward mode, vmap and higher
    derivatives follow from plain JAX (tests/ops/test_rnn.py checks them against finite
    differences)."""

    def step(state, xs):
        return update(_products(state[0], step_r, rb, parts, k_axis), xs[0], state, xs[1], peep)

    step_r, k_axis = _step_weights(r, init[0].shape[0])
    return lax.scan(step, init, (xg, mask))


def _recurrence_jvp(update, parts, folded, primals, tangents):
    r, rb, peep, init, xg, mask = primals
    t_r, t_rb, t_peep, t_init, t_xg, _ = tangents

    def step(state, xs):
        x, mask_t = xs

        def stepped(prod, rest, state, peep):
            return update(prod, (*x[:folded], *rest), state, mask_t, peep)

        prod = _products(state[0], step_r, rb, parts, k_axis)
        (new, y), linear = _linearize(stepped, prod, x[folded:], state, peep)
        return new, (y, None if mask_t is None else state[0], linear)

    step_r, k_axis = _step_weights(r, init[0].shape[0])
    final, (ys, hs, linears) = lax.scan(step, init, (xg, mask))
    if hs is None:
        hs = _states_before(init, ys)

    # Each product part's tangent from r and rb, for every step at once; then the folded gate
    # inputs' tangents join them.
    t_gates = [*t_xg[:folded], *[None] * (parts - folded)]
    t_prods = _stacked_tangents(t_r, t_rb, t_gates, hs, parts)
    t_rest = _dense(xg[folded:], t_xg[folded:])
    t_peep = _dense(peep, t_peep)
    t_init = _dense(init, t_init)

    def tangent_step(t_state, xs):
        linear, t_prod, t_x = xs
        t_prod = tuple(a + b for a, b in zip(_products(t_state[0], r, None, parts), t_prod))
        return linear(t_prod, t_x, t_state, t_peep)

    t_final, t_ys = lax.scan(tangent_step, t_init, (linears, tuple(t_prods), t_rest))
    return (final, ys), (t_final, t_ys)


_recurrence.defjvp(_recurrence_jvp, symbolic_zeros=True)


def _states_before(init: tuple, ys):
    """The state before each step of a scan without ``sequence_lens``: the previous step's
    output, so the JVPs' forward scans do not stack it a second time (gradient steps at batch
    1: LSTM 0.88-0.92 of the time, RNN 0.83; the same elsewhere)."""
    return jnp.concatenate([init[0][None], ys[:-1]])[: ys.shape[0]]  # [:]: no steps, no states


def _stacked_tangents(t_r, t_rb, t_gates: Sequence, hs, parts: int) -> list:
    """The tangents of a recurrence's step products ``hs_t @ r^T + rb`` at every step at once,
    cut into ``parts``, each with its gate input's tangent added (``t_gates``; None or a
    symbolic zero where there is none): ``r``'s term ``hs @ t_r^T`` of all steps is one
    product, which is what takes ``r``'s gradient out of the backward scan. ``hs`` (steps,
    batch, hidden) are the states the step products multiply; every part is as wide."""
    from_r = [None] * parts
    if not isinstance(t_r, SymbolicZero):
        # dr @ H^T copied to (rows, gates x hidden): its transpose, r's gradient, is then a plain
        # product (ops/products.py, weight_product), not XLA's dot over both operands' rows.
        rows = hs.reshape(hs.shape[0] * hs.shape[1], hs.shape[2])
        term = stored_transpose(lax.dot_general(t_r, rows, (((1,), (1,)), ((), ()))))
        from_r = jnp.split(term.reshape(*hs.shape[:2], parts * hs.shape[2]), parts, axis=-1)
    t_biases = [None] * parts if isinstance(t_rb, SymbolicZero) else jnp.split(t_rb, parts)
    t_gates = [None if isinstance(t, SymbolicZero) else t for t in t_gates]
    tangents = []
    for terms in zip(from_r, t_biases, t_gates):
        terms = [t for t in terms if t is not None]
        tangents.append(jnp.broadcast_to(functools.reduce(jnp.add, terms), hs.shape) if terms else jnp.zeros_like(hs))
    return tangents


def _dense(primals: tuple, tangents: tuple) -> tuple:
    """The tangents with symbolic zeros made arrays."""
    return tuple(jnp.zeros_like(p) if isinstance(t, SymbolicZero) else t for p, t in zip(primals, tangents))


def _gru_halves(acts: Sequence[_Act], clip):
    """A GRU step without ``linear_before_reset`` in two halves around its second product
    (the candidate's, which multiplies the reset state): ``reset(gate inputs of z and r, h) ->
    (z, r * h)``, then ``blend(candidate's input, z, state, mask_t) -> (state, h_t)``. Gate
    inputs come with their products added (biases included)."""
    f, g = acts
    clipped = _clipper(clip)

    def reset(pre_zr, h):
        z = f(clipped(pre_zr[0]))
        return z, f(clipped(pre_zr[1])) * h

    def blend(pre_h, z, state, mask):
        return _masked(((1 - z) * g(clipped(pre_h)) + z * state[0],), state, mask)

    return reset, blend


def _gru_blocks(v) -> tuple:
    """``v`` (a GRU's R or its recurrent bias, or their tangents) cut along its first axis into
    the update and reset gates' block and the candidate's."""
    cut = 2 * (v.shape[0] // 3)
    return v[:cut], v[cut:]


def _gru_step(acts: Sequence[_Act], r, rb, clip, rows: int):
    """A GRU step without ``linear_before_reset``: ``(state, (gate inputs_t, mask_t)) ->
    (state, h_t)``. The blocks of R are cut before the scan (see :func:`_cell`), and copied to
    (K, N) as :func:`_step_weights` says for ``rows``."""
    (r_zr, k_zr), (r_h, k_h) = (_step_weights(block, rows) for block in _gru_blocks(r))
    rb_zr, rb_h = _gru_blocks(rb)
    reset, blend = _gru_halves(acts, clip)

    def step(state, xs):
        xg, mask = xs
        hz, hr = _products(state[0], r_zr, rb_zr, 2, k_zr)
        z, reset_h = reset((xg[0] + hz, xg[1] + hr), state[0])
        return blend(xg[2] + _products(reset_h, r_h, rb_h, 1, k_h)[0], z, state, mask)

    return step


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def _gru_scan(acts: Sequence[_Act], clip, r, rb, init, xg, mask):
    """The scan of :func:`_gru_step` (a GRU without ``linear_before_reset``): the final state
    and the stacked ``h_t``.

    Its derivative takes R out of the scan as :func:`_recurrence`'s does, in two stages per
    step, since the candidate's product multiplies the reset state ``r_t * h_{t-1}``, not the
    state: the JVP's forward scan linearizes the two halves of :func:`_gru_halves` apart and
    keeps the states and the reset states; R's terms of every step are then two products (the
    states by the gates' block, the reset states by the candidate's) before the tangent scan,
    whose step runs the first linear map, the candidate's product of its tangent with R as
    stored, and the second map. Linearizing the whole step instead would stack the
    candidate's block of R among the residuals of every step (3.2x slower at batch 1)."""
    return lax.scan(_gru_step(acts, r, rb, clip, init[0].shape[0]), init, (xg, mask))


def _gru_scan_jvp(acts, clip, primals, tangents):
    r, rb, init, xg, mask = primals
    t_r, t_rb, t_init, t_xg, _ = tangents
    reset, blend = _gru_halves(acts, clip)
    stored_zr, stored_h = _gru_blocks(r)  # the tangent scan's products read them as stored
    (r_zr, k_zr), (r_h, k_h) = (_step_weights(block, init[0].shape[0]) for block in (stored_zr, stored_h))
    rb_zr, rb_h = _gru_blocks(rb)

    def step(state, xs):
        x, mask_t = xs
        h = state[0]
        hz, hr = _products(h, r_zr, rb_zr, 2, k_zr)
        (z, reset_h), reset_linear = _linearize(reset, (x[0] + hz, x[1] + hr), h)
        pre_h = x[2] + _products(reset_h, r_h, rb_h, 1, k_h)[0]
        (new, y), blend_linear = _linearize(lambda p, z, s: blend(p, z, s, mask_t), pre_h, z, state)
        return new, (y, None if mask_t is None else h, reset_h, reset_linear, blend_linear)

    final, (ys, hs, reset_hs, reset_linears, blend_linears) = lax.scan(step, init, (xg, mask))
    if hs is None:
        hs = _states_before(init, ys)

    zero = SymbolicZero(None)
    t_r_zr, t_r_h = (zero, zero) if isinstance(t_r, SymbolicZero) else _gru_blocks(t_r)
    t_rb_zr, t_rb_h = (zero, zero) if isinstance(t_rb, SymbolicZero) else _gru_blocks(t_rb)
    t_zr = _stacked_tangents(t_r_zr, t_rb_zr, t_xg[:2], hs, 2)
    (t_pre_h,) = _stacked_tangents(t_r_h, t_rb_h, t_xg[2:], reset_hs, 1)

    def tangent_step(t_state, xs):
        reset_linear, blend_linear, t_zr, t_pre_h = xs
        t_hz, t_hr = _products(t_state[0], stored_zr, None, 2)
        t_z, t_reset_h = reset_linear((t_zr[0] + t_hz, t_zr[1] + t_hr), t_state[0])
        t_pre_h = t_pre_h + _products(t_reset_h, stored_h, None, 1)[0]
        return blend_linear(t_pre_h, t_z, t_state)

    xs = (reset_linears, blend_linears, tuple(t_zr), t_pre_h)
    t_final, t_ys = lax.scan(tangent_step, _dense(init, t_init), xs)
    return (final, ys), (t_final, t_ys)


_gru_scan.defjvp(_gru_scan_jvp, symbolic_zeros=True)


def _recurrent(kind: str, inputs, attrs, ctx, quantized: _Quantized | None = None):
    """The ONNX recurrent layers; with ``quantized``, DynamicQuantizeLSTM's 8-bit W (input,
    4 x hidden) and R (hidden, 4 x hidden) per direction and their scales and zero points."""
    # RNN and GRU stop at initial_h; LSTM adds initial_c and the peepholes P.
    x, w, r, b, lens, h0, c0, p = (*inputs, None, None) if kind != "LSTM" else inputs
    w_shape, r_shape = tuple(w.shape), tuple(r.shape)
    if quantized is not None:  # stored (num_directions, K, gates x hidden): as the float layer's
        w_shape, r_shape = (w_shape[0], *w_shape[:0:-1]), (r_shape[0], *r_shape[:0:-1])
    layout = attrs.get("layout") or 0
    direction = _text(attrs["direction"])
    if direction == "foward":  # opset 1's schema default has this typo
        direction = "forward"
    if direction not in ("forward", "reverse", "bidirectional"):
        raise ctx.error(f"direction must be forward, reverse or bidirectional, got {direction!r}")
    num_dir = 2 if direction == "bidirectional" else 1
    gates = _KINDS[kind][0]
    hidden = r_shape[-1]
    if attrs["hidden_size"] is not None and attrs["hidden_size"] != hidden:
        raise ctx.error(f"hidden_size={attrs['hidden_size']} but R has shape {tuple(r.shape)}")
    if w_shape[:2] != (num_dir, gates * hidden) or r_shape != (num_dir, gates * hidden, hidden):
        raise ctx.error(
            f"W {tuple(w.shape)} / R {tuple(r.shape)} do not fit direction={direction!r} with "
            f"hidden size {hidden} ({gates} gate(s))"
        )
    dtype = x.dtype
    # Half types compute in float32, the states carried in it too, and the outputs round once,
    # as onnxruntime does (step by step in float16 GRU and LSTM outputs were a unit off).
    x, w, r, b, h0, c0, p = widen_halves(x, w, r, b, h0, c0, p)
    if layout:
        x = jnp.swapaxes(x, 0, 1)
        h0 = None if h0 is None else jnp.swapaxes(h0, 0, 1)
        c0 = None if c0 is None else jnp.swapaxes(c0, 0, 1)
    seq, batch = x.shape[0], x.shape[1]
    if b is None:
        b = jnp.zeros((num_dir, 2 * gates * hidden), x.dtype)
    if h0 is None:
        h0 = jnp.zeros((num_dir, batch, hidden), x.dtype)
    if kind == "LSTM":
        c0 = jnp.zeros((num_dir, batch, hidden), x.dtype) if c0 is None else c0
        p = jnp.zeros((num_dir, 3 * hidden), x.dtype) if p is None else p
    clip = attrs["clip"]
    acts = _activations(kind, attrs, num_dir, ctx)
    if lens is not None:
        lens = jnp.asarray(lens).astype(jnp.int32)
        mask = (jnp.arange(seq)[:, None] < lens[None, :])[..., None]
    else:
        mask = None

    ys, hs, cs = [], [], []
    for d in range(num_dir):
        reverse = direction == "reverse" or d == 1
        xd = _reverse_within_lengths(x, lens) if reverse else x
        if quantized is None:
            xw = jnp.einsum("tbi,gi->tbg", xd, w[d]) + b[d, : gates * hidden]
        else:
            xw = quantized.project(d, xd, lens) + b[d, : gates * hidden]
        init = (h0[d], c0[d]) if kind == "LSTM" else (h0[d],)
        xg = tuple(jnp.split(xw, gates, axis=-1))
        rb_d = b[d, gates * hidden :]
        if kind == "GRU" and not attrs.get("linear_before_reset"):
            state, y = _gru_scan(acts[d], clip, r[d], rb_d, init, xg, mask)
        else:
            peep = tuple(jnp.split(p[d], 3)) if kind == "LSTM" else ()
            update = _cell(kind, acts[d], clip, attrs.get("input_forget"))
            if quantized is None:
                state, y = _recurrence(update, gates, _FOLDED[kind], r[d], rb_d, peep, init, xg, mask)
            else:
                state, y = quantized.scan(d, update, rb_d, peep, init, xg, mask)
        ys.append(_reverse_within_lengths(y, lens) if reverse else y)
        hs.append(state[0])
        if kind == "LSTM":
            cs.append(state[1])
    y = jnp.stack(ys, 1).astype(dtype)  # (seq, num_dir, batch, hidden)
    finals = [jnp.stack(hs, 0).astype(dtype)] + ([jnp.stack(cs, 0).astype(dtype)] if cs else [])
    if layout:
        y = jnp.transpose(y, (2, 0, 1, 3))
        finals = [jnp.swapaxes(f, 0, 1) for f in finals]
    return (y, *finals)


class _Quantized:
    """DynamicQuantizeLSTM's products, as onnxruntime computes them (its uni_directional_lstm
    with 8-bit weights): every product's float left operand is quantized to uint8 over the whole
    operand as DynamicQuantizeLinear does (range widened to hold 0, scale and zero point
    rounded the same way), multiplied by the weights in int32 and scaled back by the operand's
    scale times the weights' (per column or per direction). The input projection quantizes
    the first ``max(sequence_lens)`` steps of every sequence at once; each step the state, with
    rows past their sequence's length as zeros (the outputs onnxruntime multiplies there).

    As one onnxruntime thread does: with more, onnxruntime quantizes the state per chunk of
    the batch its threads split it into, so its result depends on its thread count (up to
    2e-3 apart with two threads on a batch of 3, tests/ops/test_microsoft.py). Where the node
    does not ask for Y, onnxruntime multiplies ended sequences' last states instead of zeros
    (jonnx multiplies zeros either way), and after a sequence of length 0 its Y_h and Y_c are
    zeros (jonnx's are the initial states, as its float LSTM's)."""

    def __init__(self, w, r, w_scale, w_zero, r_scale, r_zero, matmul: Callable):
        self._matmul = matmul
        self.w, self.r = w, r
        self.w_scale, self.w_zero, self.r_scale, self.r_zero = w_scale, w_zero, r_scale, r_zero

    def project(self, d: int, x, lens):
        """``x`` (steps, batch, input) times direction ``d``'s W, quantized as one operand."""
        steps, batch, size = x.shape
        if lens is not None:  # steps past the longest sequence are not quantized (zeros do not count)
            x = jnp.where((jnp.arange(steps) < jnp.max(lens))[:, None, None], x, jnp.zeros((), x.dtype))
        rows = self._matmul(x.reshape(steps * batch, size), self.w[d], self.w_scale[d], _zero(self.w_zero, d))
        return rows.reshape(steps, batch, -1)

    def scan(self, d: int, update, rb, peep, init, xg, mask):
        """The LSTM's scan with each step's product quantized (see the class)."""
        r, scale, zero = self.r[d], self.r_scale[d], _zero(self.r_zero, d)

        def step(state, xs):
            xg_t, mask_t, mask_before = xs
            h = state[0] if mask_before is None else jnp.where(mask_before, state[0], jnp.zeros((), state[0].dtype))
            prod = tuple(jnp.split(self._matmul(h, r, scale, zero) + rb, 4, axis=-1))
            return update(prod, xg_t, state, mask_t, peep)

        # The state a step multiplies is the previous step's output: zero past a sequence's end.
        before = None if mask is None else jnp.concatenate([jnp.ones_like(mask[:1]), mask[:-1]])
        return lax.scan(step, init, (xg, mask, before))


def _zero(zero_point, d: int):
    return None if zero_point is None else zero_point[d]


def quantized_lstm(inputs: Inputs, attrs: Attrs, ctx: OpContext, matmul: Callable) -> Outputs:
    """com.microsoft ``DynamicQuantizeLSTM`` (ops/microsoft/quantize.py registers it): the
    LSTM with 8-bit W (num_directions, input, 4 x hidden) and R (num_directions, hidden, 4 x
    hidden), scales and zero points per direction or per column, every product as
    :class:`_Quantized` says. ``matmul(a, b, b_scale, b_zero)`` is DynamicQuantizeMatMul's."""
    x, w, r, b, lens, h0, c0, p, w_scale, w_zero, r_scale, r_zero = inputs
    dirs, gates_hidden = r.shape[0], r.shape[-1]
    for name, value in (("W_scale", w_scale), ("W_zero_point", w_zero), ("R_scale", r_scale), ("R_zero_point", r_zero)):
        if value is not None and tuple(jnp.shape(value)) not in ((dirs,), (dirs, gates_hidden)):
            raise ctx.error(
                f"{name} must have shape ({dirs},) (per direction) or ({dirs}, {gates_hidden}) (per column), "
                f"got {tuple(jnp.shape(value))}"
            )
    quantized = _Quantized(w, r, w_scale, w_zero, r_scale, r_zero, matmul)
    return _recurrent("LSTM", (x, w, r, b, lens, h0, c0, p), attrs, ctx, quantized)


@register("RNN", since=(1, 7, 14, 22))
def rnn(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``RNN``, all opsets (``layout`` from 14; opset 1's ``output_sequence`` is moot:
    ``Y`` is produced whenever the node asks for it)."""
    return _recurrent("RNN", inputs, attrs, ctx)


@register("GRU", since=(1, 3, 7, 14, 22))
def gru(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``GRU``, all opsets (``linear_before_reset`` from 3, ``layout`` from 14)."""
    return _recurrent("GRU", inputs, attrs, ctx)


@register("LSTM", since=(1, 7, 14, 22))
def lstm(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``LSTM``, all opsets (``layout`` from 14)."""
    return _recurrent("LSTM", inputs, attrs, ctx)
