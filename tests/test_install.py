"""The install layout: `ops` and `training` live only inside the jonnx namespace."""

from __future__ import annotations

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
