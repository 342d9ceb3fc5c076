"""Bounded memory: nodes that would create giant tensors fail with MemoryLimitError, naming
the node and the size, before anything that large is allocated.

Peak memory is measured in a subprocess (``_memory_probe.py``): ``ru_maxrss`` before and
after each giant node, once every model has run at a legal size (so compilation is in the
baseline). Each giant node asks for 1 GiB under a 16 MiB limit; the peak may grow by at
most 64 MiB. Each op runs twice: with its data input a Constant (the node is folded at
trace time, on numpy) and with it the graph input (traced under jit); Range, whose inputs
are all static, runs folded only.
"""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

import jonnx
from jonnx import errors
from tests.security._memory_probe import OPS, build, modes

ROOT = pathlib.Path(__file__).resolve().parents[2]
REQUESTED = 1 << 30
PEAK_BOUND = 64 << 20
CASES = [f"{op}-{'folded' if folded else 'traced'}" for op in OPS for folded in modes(op)]


@pytest.fixture(scope="module")
def probe() -> dict:
    args = [str(REQUESTED)]
    done = subprocess.run(
        [sys.executable, "-m", "tests.security._memory_probe", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", CASES)
def test_giant_node_raises_memory_limit_error(probe, case):
    result = probe["cases"][case]
    op = case.split("-")[0]
    assert result["error"] == "MemoryLimitError", result
    match = re.search(
        rf"node 'giant' \({op}\) would create a tensor of shape \(.*\) \(float32, ([\d,]+) bytes\)", result["message"]
    )
    assert match, result["message"]
    assert int(match.group(1).replace(",", "")) >= 0.99 * REQUESTED
    assert f"memory limit of {probe['limit']:,} bytes" in result["message"]


@pytest.mark.parametrize("case", CASES)
def test_peak_memory_stays_far_below_the_request(probe, case):
    result = probe["cases"][case]
    assert result["rss_growth"] <= PEAK_BOUND, (
        f"{case}: peak RSS grew by {result['rss_growth'] >> 20} MiB for a refused {REQUESTED >> 20} MiB tensor"
    )


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("folded", [True, False], ids=["folded", "traced"])
def test_petabyte_sizes_are_reported_exactly(op, folded):
    """Sizes past 2**50 bytes: no overflow in the size arithmetic, and the check comes first
    (allocating would raise MemoryError, not MemoryLimitError)."""
    m, args = build(op, 1 << 50, folded)
    with pytest.raises(errors.MemoryLimitError, match=rf"node 'giant' \({op}\).*float32, [\d,]{{19,}} bytes"):
        jonnx.load(m, memory_limit=1 << 30)(*args)


def test_legal_sizes_run_under_the_limit():
    m, args = build("Expand", 1 << 12, folded=False)
    (y,) = jonnx.load(m, memory_limit=1 << 20)(*args)
    np.testing.assert_allclose(np.asarray(y), 64 * 64)


def test_memory_limit_none_disables_the_check():
    m, args = build("Tile", 1 << 12, folded=True)
    (y,) = jonnx.load(m, memory_limit=None)(*args)
    np.testing.assert_allclose(np.asarray(y), 1 << 12)
