"""Structural rules of the code base that a linter does not check."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("jonnx", "ops", "training")


def _sources():
    for package in PACKAGES:
        yield from sorted((ROOT / package).rglob("*.py"))


def _is_module(package: str | None, name: str) -> bool:
    """Whether ``from package import name`` imports a submodule (a private module is fine)."""
    path = (package or "").replace(".", "/")
    for installed, folder_name in (("jonnx/ops", "ops"), ("jonnx/training", "training")):
        # ops/ and training/ are installed inside the jonnx namespace (pyproject.toml).
        if path == installed or path.startswith(installed + "/"):
            path = folder_name + path[len(installed) :]
    folder = ROOT / path
    return (folder / f"{name}.py").exists() or (folder / name / "__init__.py").exists()


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
                    if alias.name.startswith("_")
                    and not alias.name.startswith("__")
                    and not _is_module(node.module, alias.name)
                ]
    assert not found, "imports of another module's private names:\n" + "\n".join(found)


def test_package_folders_are_never_imported_by_their_folder_names():
    # conftest.py collects the doctests of ops/ and training/ as jonnx.ops.* / jonnx.training.*;
    # a top-level `ops` module would be a second copy registering every op again.
    import sys

    assert not [name for name in sys.modules if name.split(".")[0] in ("ops", "training")]


def test_every_op_function_is_annotated():
    # The op contract reads from the signature: (inputs: Inputs, attrs: Attrs, ctx: OpContext)
    # -> Outputs, the types of jonnx._registry.
    import inspect

    import jonnx  # noqa: F401  (registers every op)
    from jonnx._registry import registered

    bare = sorted(
        {
            f"{op.fn.__module__}.{op.fn.__qualname__}"
            for op in registered().values()
            if op.fn.__module__.startswith("jonnx.ops")
            and (
                inspect.signature(op.fn).return_annotation is inspect.Signature.empty
                or any(p.annotation is inspect.Parameter.empty for p in inspect.signature(op.fn).parameters.values())
            )
        }
    )
    assert not bare, f"op functions without annotations: {bare}"
