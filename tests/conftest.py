"""Test-wide settings. JAX's global flags are left at their defaults: tests that need 64-bit
types enable them locally with ``jax.enable_x64(True)``."""

import zlib

import jax
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


@pytest.fixture(params=["cpu", "elsewhere"])
def lowering(request, monkeypatch):
    """Ops lowered for XLA's CPU backend (``"cpu"``) and as for the others (``"elsewhere"``:
    ``jax.default_backend`` answers "gpu", so ``jonnx.ops._util.lowers_for_cpu`` is False and
    the GPU/TPU choices are traced), both run on this machine's CPU: what the device would run
    is checked where CI runs. The CPU side is skipped on a machine whose default backend is not
    the CPU (its compiler options would not apply there)."""
    if request.param == "elsewhere":
        monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    elif jax.default_backend() != "cpu":
        pytest.skip("the CPU lowerings are chosen only where the default backend is the CPU")
    return request.param
