"""Reading XLA's compiled HLO text: is every YNNPACK fusion clear of the known miscompile, and
of the known slow form?

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
reductions, check (:func:`ynn_fusions_suit` runs both checks), and fall back to single dots
where the check fails.

The same fusions run slowly when a contraction reads its weights through a bitcast of a
parameter whose minor dimension is a unit one: a 1x1 convolution's OI11 kernel read as a
matrix, as a ResNet's or an EfficientNet's last product before its global average pool is
(docs/performance.md, "YNNPACK reductions"). :func:`ynn_fusions_are_fast` finds that form;
callers take single dots there too.
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


def ynn_fusions_suit(hlo_text: str) -> bool:
    """Both checks at once (:func:`ynn_fusions_are_safe` and :func:`ynn_fusions_are_fast`),
    reading ``hlo_text`` once: whether a module compiled with YNNPACK's reductions may be kept."""
    bodies = _ynn_fusion_bodies(hlo_text)
    return all(_safe(body) for body in bodies) and all(_fast(body) for body in bodies)


def ynn_fusions_are_safe(hlo_text: str) -> bool:
    """Whether every dot and convolution inside a YNNPACK fusion of ``hlo_text`` (a compiled
    module's ``as_text()``) reads dense data: each operand must be computed, within the fusion,
    from at least one stored array -- a fusion parameter or a literal constant of more than one
    element, reached without passing through a broadcast -- rather than from broadcasts (or
    iotas) alone. Anything it cannot read counts as unsafe."""
    return all(_safe(body) for body in _ynn_fusion_bodies(hlo_text))


def ynn_fusions_are_fast(hlo_text: str) -> bool:
    """Whether no YNNPACK fusion of ``hlo_text`` that holds a reduction has a contraction
    reading a fusion parameter through a bitcast, where that parameter's minor dimension is of
    size 1 (an OI11 kernel read as a matrix). Such a fusion took 3.5x the time of the same
    product with its parameter already a matrix, or of single dots (a 1152 -> 320 product on
    7x7 with its ReLU and mean: 0.56-0.61 against 0.15-0.16 ms); leading unit dimensions (a
    11IO kernel) measured as fast as a matrix."""
    return all(_fast(body) for body in _ynn_fusion_bodies(hlo_text))


def _ynn_fusion_bodies(hlo_text: str) -> list[dict[str, _Instruction]]:
    """The computation each YNNPACK fusion of ``hlo_text`` calls, its instructions by name
    (empty where the text does not hold it)."""
    computations = _computations(hlo_text)
    bodies = []
    for line in hlo_text.splitlines():
        if _YNN_FUSION in line:
            called = _CALLS.search(line)
            bodies.append(computations.get(called.group(1), {}) if called else {})
    return bodies


def _safe(body: dict[str, _Instruction]) -> bool:
    """No contraction of this fusion reads data made from broadcasts alone (an unreadable
    fusion is not safe)."""
    contractions = [i for i in body.values() if i.opcode in _CONTRACTIONS]
    return bool(body) and all(_reads_stored(body, name) for c in contractions for name in c.operands)


def _fast(body: dict[str, _Instruction]) -> bool:
    """This fusion is not the slow form (see :func:`ynn_fusions_are_fast`)."""
    if not any(i.opcode == "reduce" for i in body.values()):
        return True
    for contraction in (i for i in body.values() if i.opcode in _CONTRACTIONS):
        for operand in contraction.operands:
            bitcast = body.get(operand)
            if bitcast is None or bitcast.opcode != "bitcast" or not bitcast.operands:
                continue
            source = body.get(bitcast.operands[0])
            if source is not None and source.opcode == "parameter" and source.dims[-1:] == (1,):
                return False
    return True


class _Instruction(NamedTuple):
    opcode: str
    operands: list[str]
    dims: tuple[int, ...]  # an array's dimensions; () for a scalar, a tuple or an unreadable type
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
        opcode, operands, _, size = body[name]
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
            dims = _dims(type_)
            size = None if dims is None else math.prod(dims)
            current[name] = _Instruction(opcode, _NAME.findall(_within_parentheses(rest)), dims or (), size)
    return computations


def _dims(type_: str) -> tuple[int, ...] | None:
    """Dimensions of an array type such as ``f32[100,64]{1,0}``; None for anything else."""
    array = _ARRAY_TYPE.fullmatch(type_)
    if array is None:
        return None
    return tuple(int(n) for n in array.group(1).split(",") if n)


def _within_parentheses(rest: str) -> str:
    """The operand list: ``rest`` (what follows an opcode's "(") up to its matching ")"."""
    depth = 1
    for end, char in enumerate(rest):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0:
            return rest[:end]
    return rest
