"""Reading XLA's compiled HLO text: is every YNNPACK fusion clear of the known miscompile?

XLA CPU (jaxlib 0.10) miscompiles a YNNPACK fusion that holds a dot (or a convolution) with
the reduction after it when an operand of the dot is computed, inside the fusion, from
broadcasts alone (an all-equal constant is a broadcast; so is ``exp`` of one): docs/known_issues.md.
jonnx compiles with YNNPACK given single dots only, which cannot form that fusion. Letting
YNNPACK take reductions too (and so a dot with the reduction that follows it: attention's scores
with their softmax) is faster (docs/performance.md, "YNNPACK reductions"), and computes
correctly wherever each contraction reads data computed from at least one stored array -- a
fusion input or a literal constant, not a scalar -- as the reproducer does with its weight passed
in, scaled by a broadcast scalar, or held as a constant that is not all-equal.
:func:`ynn_fusions_are_safe` checks that on the compiled text; callers compile with the
reductions, check, and fall back to single dots where the check fails.
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

# "%name (p: f32[2]) -> f32[] {" opens a computation; "}" closes it.
_COMPUTATION = re.compile(r"^%?([\w.\-]+) \(.*\) -> .* \{$")
# "  ROOT %name = f32[2,3]{1,0} opcode(%a, %b), attributes": the opcode is the first
# lower-case word followed by "(" after the type (tuple types hold no such word).
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (.*?) ([a-z][a-z0-9\-]*)\((.*)$")
_ARRAY_TYPE = re.compile(r"[a-z]+[0-9]*\[([0-9,]*)\](?:\{.*\})?")
_CALLS = re.compile(r"calls=%?([\w.\-]+)")
_NAME = re.compile(r"%([\w.\-]+)")
# Instructions that make values from less data (a broadcast holds one value per kept index).
_GENERATED = frozenset({"broadcast", "iota", "rng", "rng-bit-generator"})
_CONTRACTIONS = frozenset({"dot", "convolution"})
# Stored values: the fusion's inputs, or literal arrays (weights XLA holds as constants; an
# all-equal one is a broadcast of a scalar literal).
_STORED = frozenset({"parameter", "constant"})
_YNN_FUSION = '"kind":"__ynn_fusion"'


def ynn_fusions_are_safe(hlo_text: str) -> bool:
    """Whether every dot and convolution inside a YNNPACK fusion of ``hlo_text`` (a compiled
    module's ``as_text()``) reads dense data: each operand must be computed, within the fusion,
    from at least one stored array -- a fusion parameter or a literal constant of more than one
    element, reached without passing through a broadcast -- rather than from broadcasts (or
    iotas) alone. Anything it cannot read counts as unsafe."""
    computations = _computations(hlo_text)
    for line in hlo_text.splitlines():
        if _YNN_FUSION not in line:
            continue
        called = _CALLS.search(line)
        body = computations.get(called.group(1)) if called else None
        if not body:
            return False
        contractions = [i for i in body.values() if i.opcode in _CONTRACTIONS]
        if not all(_reads_stored(body, name) for c in contractions for name in c.operands):
            return False
    return True


class _Instruction(NamedTuple):
    opcode: str
    operands: list[str]
    size: int | None  # elements; None for a tuple or an unreadable type


def _reads_stored(body: dict[str, _Instruction], operand: str) -> bool:
    """Whether ``operand``'s values come, through any instructions short of a broadcast, from a
    parameter or constant of more than one element (so they are not a broadcast's)."""
    pending, seen = [operand], set()
    while pending:
        name = pending.pop()
        if name in seen or name not in body:
            continue
        seen.add(name)
        opcode, operands, size = body[name]
        if opcode in _STORED and size is not None and size > 1:
            return True
        if opcode not in _GENERATED:
            pending.extend(operands)
    return False


def _computations(hlo_text: str) -> dict[str, dict[str, _Instruction]]:
    """Each computation's instructions, by name."""
    computations: dict[str, dict[str, _Instruction]] = {}
    current = None
    for line in hlo_text.splitlines():
        if opened := _COMPUTATION.match(line):
            current = computations.setdefault(opened.group(1), {})
        elif line.startswith("}"):
            current = None
        elif current is not None and (instruction := _INSTRUCTION.match(line)):
            name, type_, opcode, rest = instruction.groups()
            current[name] = _Instruction(opcode, _NAME.findall(_within_parentheses(rest)), _size(type_))
    return computations


def _size(type_: str) -> int | None:
    """Elements of an array type such as ``f32[100,64]{1,0}``; None for anything else."""
    array = _ARRAY_TYPE.fullmatch(type_)
    if array is None:
        return None
    return math.prod(int(n) for n in array.group(1).split(",") if n)


def _within_parentheses(rest: str) -> str:
    """The operand list: ``rest`` (what follows an opcode's "(") up to its matching ")"."""
    depth = 1
    for end, char in enumerate(rest):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0:
            return rest[:end]
    return rest
