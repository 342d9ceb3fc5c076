"""Collect the doctests of jonnx's own modules (jonnx/, ops/, training/) with the tests.

pytest's ``--doctest-modules`` would import ``ops/shape.py`` as a top-level ``ops.shape`` (the
folder's name), a second copy of the module beside ``jonnx.ops.shape``, registering every op
twice; and pytest imports a package folder's ``__init__.py`` by the folder's name to look for
setup functions. These hooks collect the same doctests, importing each module by its installed
name, and walk the package folders as plain folders.
"""

from __future__ import annotations

import importlib
import pathlib

import pytest
from _pytest.doctest import DoctestModule

ROOT = pathlib.Path(__file__).resolve().parent
# Folder -> the package it is installed as (pyproject.toml's package-dir).
PACKAGES = {"jonnx": "jonnx", "ops": "jonnx.ops", "training": "jonnx.training"}


def installed_name(path: pathlib.Path) -> str | None:
    """``ops/ml/trees.py`` -> ``jonnx.ops.ml.trees``; None for files outside the packages."""
    try:
        parts = path.resolve().relative_to(ROOT).with_suffix("").parts
    except ValueError:
        return None
    if not parts or parts[0] not in PACKAGES:
        return None
    parts = (PACKAGES[parts[0]], *parts[1:])
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


class _InstalledDoctestModule(DoctestModule):
    def _getobj(self):
        return importlib.import_module(installed_name(self.path))


def pytest_collect_directory(path: pathlib.Path, parent: pytest.Collector) -> pytest.Collector | None:
    if installed_name(path / "__init__.py") is None:
        return None
    return pytest.Dir.from_parent(parent, path=path)


def pytest_collect_file(file_path: pathlib.Path, parent: pytest.Collector) -> pytest.Collector | None:
    if file_path.suffix != ".py" or file_path.name == "__main__.py" or installed_name(file_path) is None:
        return None
    return _InstalledDoctestModule.from_parent(parent, path=file_path)
