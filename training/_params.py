"""Choosing which parameters train: name and pattern masks, and frozen-aware optimizers."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Union

import optax

__all__ = ["ParamSelector", "mask_frozen", "trainable_mask"]

#: One selector, or an iterable of them: an exact name or glob pattern (``"fc.*"``), a compiled
#: regular expression (matched with ``search``: anchor it with ``^...$`` for a full match), or a
#: callable ``name -> bool``.
ParamSelector = Union[str, "re.Pattern[str]", Callable[[str], bool], Iterable[Any]]

TRAINABLE, FROZEN = "trainable", "frozen"


def _selectors(spec: ParamSelector) -> list[Any]:
    if isinstance(spec, (str, re.Pattern)) or callable(spec):
        return [spec]
    try:
        items = list(spec)
    except TypeError:
        raise TypeError(
            f"a parameter selector is a name, a glob pattern, a compiled regex, a callable or a "
            f"list of them, not {type(spec).__name__}"
        ) from None
    for item in items:
        if not (isinstance(item, (str, re.Pattern)) or callable(item)):
            raise TypeError(f"a parameter selector cannot be a {type(item).__name__} ({item!r})")
    return items


def _matches(selector: Any, name: str) -> bool:
    if isinstance(selector, str):
        return fnmatch.fnmatchcase(name, selector)
    if isinstance(selector, re.Pattern):
        return selector.search(name) is not None
    return bool(selector(name))


def _select(names: list[str], spec: ParamSelector, what: str) -> set[str]:
    chosen: set[str] = set()
    for selector in _selectors(spec):
        hits = {n for n in names if _matches(selector, n)}
        # A name or pattern that selects nothing is almost always a typo: say so rather than
        # silently train (or freeze) the wrong set.
        if not hits and not callable(selector):
            shown = ", ".join(repr(n) for n in names[:8]) + (", ..." if len(names) > 8 else "")
            pattern = selector.pattern if isinstance(selector, re.Pattern) else selector
            raise ValueError(f"{what} selector {pattern!r} matches no parameter; parameters: {shown}")
        chosen |= hits
    return chosen


def trainable_mask(
    params: Mapping[str, Any],
    *,
    trainable: ParamSelector | None = None,
    frozen: ParamSelector | None = None,
) -> dict[str, bool]:
    """Which parameters train: ``{name: True}`` for trainable, ``False`` for frozen.

    The result is a pytree with the structure of ``params``, usable as an ``optax.masked``
    mask directly.

    Args:
        params: the parameters by name (``Model.params``).
        trainable: the parameters that train (default: all). A name or glob pattern
            (``"fc.*"``, matched against the whole name with :func:`fnmatch.fnmatchcase`), a
            compiled regex (matched with ``re.Pattern.search``: anchor it for a full match), a
            callable ``name -> bool``, or a list of these (their union).
        frozen: parameters removed from the trainable set, in the same forms.

    Returns:
        A dict mapping every parameter name to ``True`` (trains) or ``False`` (frozen).

    Raises:
        ValueError: a name, glob or regex matches no parameter (a typo), or nothing is left to
            train.
        TypeError: a selector of an unsupported type.

    Example:
        >>> import re
        >>> params = {"conv.weight": 0, "conv.bias": 0, "fc.weight": 0, "fc.bias": 0}
        >>> trainable_mask(params, frozen="conv.*")
        {'conv.weight': False, 'conv.bias': False, 'fc.weight': True, 'fc.bias': True}
        >>> trainable_mask(params, trainable=re.compile(r"weight$"), frozen="fc.weight")
        {'conv.weight': True, 'conv.bias': False, 'fc.weight': False, 'fc.bias': False}
    """
    names = list(params)
    chosen = set(names) if trainable is None else _select(names, trainable, "trainable")
    if frozen is not None:
        chosen -= _select(names, frozen, "frozen")
    if not chosen:
        raise ValueError("no parameter is left to train: check the trainable/frozen selectors")
    return {n: n in chosen for n in names}


def mask_frozen(optimizer: optax.GradientTransformation, mask: Mapping[str, bool]) -> optax.GradientTransformation:
    """Wrap ``optimizer`` so that it updates only the parameters ``mask`` marks ``True``.

    Built with ``optax.multi_transform``: trainable parameters go through ``optimizer``,
    frozen ones through ``optax.set_to_zero()``. Frozen parameters therefore get zero updates
    and hold no optimizer state at all (``optax.masked`` stores a placeholder, not a moment
    per value), so freezing most of a large model also saves most of the optimizer's memory.

    Args:
        optimizer: any optax gradient transformation (``optax.adam(1e-3)``, a chain, ...).
        mask: ``{name: bool}`` from :func:`trainable_mask`.

    Returns:
        An optax gradient transformation over the full parameter dict; ``optimizer`` itself
        when nothing is frozen.

    Example:
        >>> import jax, jax.numpy as jnp, optax
        >>> params = {"a": jnp.ones(3), "b": jnp.ones(1000)}
        >>> opt = mask_frozen(optax.adam(0.1), {"a": True, "b": False})
        >>> state = opt.init(params)
        >>> sum(x.size for x in jax.tree.leaves(state))  # adam's mu and nu for "a", count
        7
        >>> updates, _ = opt.update({"a": jnp.ones(3), "b": jnp.ones(1000)}, state, params)
        >>> float(jnp.abs(updates["b"]).max())
        0.0
    """
    if all(mask.values()):
        return optimizer
    labels = {n: TRAINABLE if m else FROZEN for n, m in mask.items()}
    return optax.multi_transform({TRAINABLE: optimizer, FROZEN: optax.set_to_zero()}, labels)
