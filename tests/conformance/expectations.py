"""Reads ``expected_failures.txt``: one node case per line, ``test_name  reason``."""

from __future__ import annotations

import pathlib

FILE = pathlib.Path(__file__).with_name("expected_failures.txt")


def expected_failures() -> dict[str, str]:
    """Case name (without the ``_cpu`` suffix) -> why it is expected to fail."""
    out: dict[str, str] = {}
    for number, line in enumerate(FILE.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, reason = line.partition(" ")
        if not reason.strip():
            raise ValueError(f"{FILE.name}:{number}: {name} has no reason")
        if name in out:
            raise ValueError(f"{FILE.name}:{number}: {name} is listed twice")
        out[name] = reason.strip()
    return out
