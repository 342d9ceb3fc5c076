"""Structural rules of the code base that a linter does not check."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("jonnx", "ops", "training")


def _sources():
    for package in PACKAGES:
        yield from sorted((ROOT / package).rglob("*.py"))


def test_no_module_imports_another_modules_private_names():
    # A helper two modules share is public in the module that owns it (or moves to a shared
    # one: jonnx/_values.py, ops/_util.py); reaching into another module's underscore names
    # hides that dependency from whoever edits the owner.
    found = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                found += [
                    f"{path.relative_to(ROOT)}:{node.lineno}: from {node.module} import {alias.name}"
                    for alias in node.names
                    if alias.name.startswith("_") and not alias.name.startswith("__")
                ]
    assert not found, "imports of another module's private names:\n" + "\n".join(found)
