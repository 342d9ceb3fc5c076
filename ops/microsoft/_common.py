"""Small helpers shared by the com.microsoft families."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jonnx._registry import OpContext

DOMAIN = "com.microsoft"


def reject_unsupported(attrs: Mapping[str, Any], defaults: Mapping[str, Any], ctx: OpContext) -> None:
    """Fail, naming the node, when an attribute jonnx does not implement leaves its default."""
    for name, default in defaults.items():
        value = attrs.get(name)
        if value is not None and value != default:
            raise ctx.error(
                f"attribute {name}={value!r} is not supported by jonnx (only {default!r}); "
                "re-export the model without it or register your own implementation"
            )


def reject_inputs(inputs: tuple, names: Mapping[int, str], ctx: OpContext) -> None:
    """Fail, naming the node, when an optional input jonnx does not implement is given."""
    for position, name in names.items():
        if position < len(inputs) and inputs[position] is not None:
            raise ctx.error(
                f"input {name!r} (position {position}) is not supported by jonnx; re-export the "
                "model without it or register your own implementation"
            )
