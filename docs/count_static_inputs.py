"""Count the ONNX node-suite cases that still pass graph inputs as static arguments, and why.

Run from the repository root: ``python docs/count_static_inputs.py`` (docs/dynamic_shapes.md
quotes its output).
"""

from __future__ import annotations

import collections
import warnings

import numpy as np
from onnx.backend.test.case import node as node_cases

import jonnx
from jonnx._ir import Graph


def _reads_outer(node, names) -> bool:
    """Whether a node's subgraphs (If/Loop bodies) read any of ``names`` from outside."""
    for value in node.attrs.values():
        for g in value if isinstance(value, tuple) else (value,):
            if isinstance(g, Graph) and g.outer_names & names:
                return True
    return False


def main() -> None:
    warnings.simplefilter("ignore")
    static: collections.Counter[str] = collections.Counter()
    segmented: collections.Counter[str] = collections.Counter()
    cases = list(node_cases.collect_testcases(None))
    for case in cases:
        model = jonnx.load(case.model)
        stages = model.segment_plan.stages
        passed = {n for stage in stages for n in stage.static} & set(model.input_names)
        strings = any(v.dtype == np.dtype(object) for v in model.graph.inputs)
        if passed or strings:
            readers = set()
            for stage in stages:
                for position in stage.nodes:
                    node = model.graph.nodes[position]
                    if any(i in passed for i in node.inputs) or _reads_outer(node, passed):
                        readers.add(node.op_type)
            static["string input" if strings else ",".join(sorted(readers))] += 1
        if model.segment_plan.segmented:
            host = sorted({model.graph.nodes[p].op_type for p in model.segment_plan.host_nodes})
            segmented[",".join(host) or "(cut at a static value computed from data)"] += 1
    print(f"{len(cases)} node cases; {sum(static.values())} pass graph inputs as static arguments:")
    for why, n in static.most_common():
        print(f"  {n:4d}  {why}")
    print(f"{sum(segmented.values())} run in segments, with host nodes:")
    for why, n in segmented.most_common():
        print(f"  {n:4d}  {why}")


if __name__ == "__main__":
    main()
