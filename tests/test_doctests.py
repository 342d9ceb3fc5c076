"""The doctests in jonnx's public modules (run through the jonnx namespace, never `ops.*`)."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["jonnx._export", "jonnx._model", "jonnx._progress", "jonnx._registry", "jonnx.ops", "jonnx.sharding"]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0, f"{name} has no doctest"
    assert result.failed == 0
