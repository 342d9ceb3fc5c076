"""A model with some optimization passes on against the same graph with none: the same outputs,
running statistics and gradients (tests/test_optimize.py, tests/test_layout.py)."""

from __future__ import annotations

import hashlib

import jax
import jax.numpy as jnp
import numpy as np

import jonnx


def loss_of(model, feeds, train, key):
    """``params -> (loss, (outputs, state))`` for ``jax.value_and_grad(..., has_aux=True)``.

    The loss is linear in the float outputs with a fixed, uneven cotangent, so no rounding is
    amplified in the gradients."""

    def loss(params):
        outs, state = model.apply_with_state(params, **feeds, train=train, key=key)
        value = sum(
            jnp.sum(o * jnp.cos(jnp.arange(o.size).reshape(o.shape)))
            for o in outs
            if jnp.issubdtype(o.dtype, jnp.floating)
        )
        return value, (outs, state)

    return loss


def value_and_grad(model, feeds, train, key):
    """``((loss, (outputs, state)), gradients)`` at ``model.params``, compiled: an eager run
    would compile each small op (and each conv lowering's pieces) on its own, far slower."""
    return _traced(model, feeds, train, key).lower().compile()(model.params)


def _traced(model, feeds, train, key):
    """:func:`value_and_grad`'s computation traced, not yet compiled: ``.jaxpr`` to compare,
    ``.lower().compile()(model.params)`` to run it."""
    return jax.jit(jax.value_and_grad(loss_of(model, feeds, train, key), has_aux=True)).trace(model.params)


def _same(a, b) -> bool:
    """Whether two closed jaxprs are one computation: the same equations and constants."""
    return (
        str(a.jaxpr) == str(b.jaxpr)
        and len(a.consts) == len(b.consts)
        and all(np.array_equal(_host(x), _host(y)) for x, y in zip(a.consts, b.consts))
    )


def _host(x):
    if jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    return np.asarray(x)


def assert_outputs_close(got, want, tol=2e-5, err_msg=""):
    """An output within ``tol`` relative, or ``tol`` times its largest entry: where the
    outputs reach the hundreds, an entry near zero is a difference of large float32 sums,
    and summing in another order (the lowerings do) moves it by their rounding."""
    want = np.asarray(want)
    scale = float(np.max(np.abs(want), initial=1.0)) if want.dtype.kind in "fc" else 1.0
    np.testing.assert_allclose(np.asarray(got), want, rtol=tol, atol=tol * scale, err_msg=err_msg)


def assert_gradients_close(got, want, tol, what=""):
    """Each parameter's gradient within ``tol`` relative, or ``tol`` times its largest entry."""
    assert set(got) == set(want)
    for name in want:
        assert_outputs_close(got[name], want[name], tol, err_msg=f"gradient of {name}{what}")


class _Unoptimized:
    """The graph loaded with no pass on, and what the comparisons read of it, each computed
    once: tests/test_optimize.py compares each pass, and all of them, against the same graph."""

    def __init__(self, proto, feeds, key):
        self.model = jonnx.load(proto, optimize=False)
        self.feeds, self.key = feeds, key
        self.outputs = self.model(**feeds, key=key)
        self._stages, self._results = {}, {}

    def _stage(self, train):
        if train not in self._stages:
            self._stages[train] = _traced(self.model, self.feeds, train, self.key)
        return self._stages[train]

    def jaxpr(self, train):
        return self._stage(train).jaxpr

    def result(self, train):
        """``((loss, (outputs, state)), gradients)`` for ``train``."""
        if train not in self._results:
            self._results[train] = self._stage(train).lower().compile()(self.model.params)
        return self._results[train]


_UNOPTIMIZED: dict[str, _Unoptimized] = {}


def _unoptimized(proto, feeds, key) -> _Unoptimized:
    digest = hashlib.sha256(proto.SerializeToString())
    for name, value in sorted(feeds.items()):
        value = np.asarray(value)
        digest.update(f"{name}{value.dtype}{value.shape}".encode() + value.tobytes())
    if digest.hexdigest() not in _UNOPTIMIZED:
        _UNOPTIMIZED[digest.hexdigest()] = _Unoptimized(proto, feeds, key)
    return _UNOPTIMIZED[digest.hexdigest()]


def compare_on_off(proto, feeds, switches, *, trains=(False, None, True), grad_tol=1e-5):
    """Load ``proto`` with ``optimize=switches`` and with ``optimize=False``; assert equal
    default-call outputs, and for each ``train`` (None: training-mode nodes as the graph says)
    equal outputs, running statistics and gradients. Returns the optimized model."""
    key = jax.random.key(3)
    on, off = jonnx.load(proto, optimize=switches), _unoptimized(proto, feeds, key)
    for a, b in zip(on(**feeds, key=key), off.outputs):
        assert_outputs_close(a, b)
    traced = []
    for train in trains:
        # Only BatchNormalization and Dropout read the flag: where it changes nothing, the
        # computation is the same as an earlier flag's, and compiling it again checks nothing new.
        stage = _traced(on, feeds, train, key)
        jaxprs = [stage.jaxpr, off.jaxpr(train)]
        if any(all(_same(a, b) for a, b in zip(jaxprs, earlier)) for earlier in traced):
            continue
        traced.append(jaxprs)
        (_, got), g_on = stage.lower().compile()(on.params)
        (_, want), g_off = off.result(train)
        got, want = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert_outputs_close(a, b)
        assert_gradients_close(g_on, g_off, grad_tol, f" (train={train})")
    return on
