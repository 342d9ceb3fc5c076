"""Rewrite tests/schema_gaps.txt from the registry: ``python -m tests.write_schema_gaps``.

Keeps the reasons already written; new gaps get a placeholder for a person to fill in.
"""

from __future__ import annotations

import onnx.defs

import jonnx  # noqa: F401
from jonnx._registry import registered
from tests.test_schema_coverage import GAPS_FILE, _gaps


def main() -> None:
    old = _gaps() if GAPS_FILE.exists() else {}
    implemented = set(registered())
    keys = sorted(
        {(s.domain, s.name, s.since_version) for s in onnx.defs.get_all_schemas_with_history()} - implemented
    )
    lines = ["# Default-domain and ai.onnx.ml schemas jonnx does not implement yet: domain op since_version reason"]
    for key in keys:
        domain, op, version = key
        lines.append(f"{domain or 'ai.onnx'} {op} {version} {old.get(key, 'not implemented yet')}")
    GAPS_FILE.write_text("\n".join(lines) + "\n")
    print(f"{len(keys)} gaps written to {GAPS_FILE}")


if __name__ == "__main__":
    main()
