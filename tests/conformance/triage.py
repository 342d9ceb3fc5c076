"""Run node cases of the ONNX backend suite in-process and say why each one fails.

A developer's tool, not a test: ``python -m tests.conformance.triage [REGEX] [-v]`` prints
one line per failing case (the error's first line) and a summary, and with ``--update``
rewrites expected_failures.txt, keeping the reasons already written and marking new entries
with the error text for a person to turn into a reason.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
import traceback
import warnings

from onnx.backend.test.loader import load_node_model_tests
from onnx.backend.test.runner import Runner, _normalize_tensor

from tests.conformance._backend import X64Backend
from tests.conformance.expectations import FILE, expected_failures


def run_case(case) -> str | None:
    """None if ``case`` passes, else a one-line reason."""
    try:
        rep = X64Backend.prepare(case.model, "CPU")
        for inputs, ref_outputs in case.data_sets:
            # Cases hold TensorProtos as well as arrays: normalise them as onnx's runner does.
            outputs = rep.run([_normalize_tensor(i) for i in inputs])
            refs = [_normalize_tensor(o) for o in ref_outputs]
            Runner.assert_similar_outputs(refs, outputs, rtol=case.rtol, atol=case.atol)
    except Exception as e:  # noqa: BLE001 -- a triage tool reports every failure
        text = f"{type(e).__name__}: {e}".replace("\n", " ")
        return re.sub(r"\s+", " ", text)[:300]
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("pattern", nargs="?", default="", help="regex on the case name")
    parser.add_argument("-v", "--verbose", action="store_true", help="print passing cases too")
    parser.add_argument("--trace", action="store_true", help="print tracebacks")
    parser.add_argument("--update", action="store_true", help="rewrite expected_failures.txt")
    args = parser.parse_args()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = load_node_model_tests()
    cases = [c for c in cases if re.search(args.pattern, c.name)]
    known = expected_failures()
    failures: dict[str, str] = {}
    start = time.perf_counter()
    for case in cases:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            reason = run_case(case)
        if reason is None:
            if args.verbose:
                print(f"PASS {case.name}")
            continue
        failures[case.name] = reason
        print(f"FAIL {case.name}: {reason}")
        if args.trace:
            traceback.print_exc()
    passed = len(cases) - len(failures)
    print(f"{passed} passed, {len(failures)} failed of {len(cases)} in {time.perf_counter() - start:.0f}s")
    if args.update:
        if args.pattern:
            failures = {**{k: v for k, v in known.items() if not re.search(args.pattern, k)}, **failures}
        lines = [line for line in FILE.read_text().splitlines() if line.startswith("#")]
        for name in sorted(failures):
            lines.append(f"{name}  {known.get(name) or 'TODO ' + failures[name]}")
        FILE.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
