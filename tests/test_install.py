"""The install layout: `ops` and `training` live only inside the jonnx namespace."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest


def test_jonnx_subpackages_import():
    import jonnx
    import jonnx.ops
    import jonnx.training

    assert jonnx.ops.__name__ == "jonnx.ops" and jonnx.training.__name__ == "jonnx.training"


@pytest.mark.parametrize("name", ["ops", "training"])
def test_top_level_folder_names_are_not_importable(tmp_path, name):
    # Run from an empty folder, so the repository root is not on sys.path.
    result = subprocess.run(
        [sys.executable, "-c", f"import {name}"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0
    assert "ModuleNotFoundError" in result.stderr


def test_declared_minimum_versions_are_the_pinned_ones_ci_tests():
    # .ci/min-versions installs .ci/min-versions.txt and runs a test subset: the pins must be
    # exactly pyproject's lower bounds, or the declared minimums are untested claims.
    tomllib = pytest.importorskip("tomllib")
    root = pathlib.Path(__file__).parent.parent
    declared = {}
    for requirement in tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]:
        name, _, version = requirement.partition(">=")
        declared[name.strip().lower().replace("-", "_")] = version.strip()
    pinned = {}
    for line in (root / ".ci" / "min-versions.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pinned[name.strip().lower().replace("-", "_")] = version.strip()
    assert pinned == declared
