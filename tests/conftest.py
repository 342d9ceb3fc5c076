"""Test-wide settings. JAX's global flags are left at their defaults: tests that need 64-bit
types enable them locally with ``jax.enable_x64(True)``."""

import zlib

import numpy as np
import pytest


@pytest.fixture(autouse=True)
def _reseed_module_rng(request):
    """Give each test a module ``RNG`` seeded from its own id.

    Test modules draw inputs from a module-level ``RNG``; without this, what a test draws
    would depend on which tests ran before it in the same process, which pytest-xdist
    changes from run to run, so a rare bad draw would fail one CI run in many.
    """
    module = request.module
    if isinstance(getattr(module, "RNG", None), np.random.Generator):
        module.RNG = np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
    yield
