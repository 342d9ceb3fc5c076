"""com.microsoft ``Tokenizer``: strings into padded rows of tokens (skl2onnx's text vectorizers).

Strings live on the host (see ``jonnx.ops.text``), so this is a host op. The RE2 patterns it
takes run through ``jonnx.ops._re2``.
"""

from __future__ import annotations

import re

import numpy as np

from jonnx._registry import Attrs, Inputs, OpContext, Outputs, register
from jonnx.ops._re2 import compile_re2
from jonnx.ops.microsoft._common import DOMAIN
from jonnx.ops.text import strings_of

_START, _END = "\x02", "\x03"  # the start- and end-of-text marks


@register(
    "Tokenizer",
    since=1,
    domain=DOMAIN,
    static_inputs=(0,),
    host=True,
    attributes={"mark": None, "pad_value": None, "mincharnum": None, "separators": None, "tokenexp": None},
    n_inputs=1,
)
def tokenizer(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``Tokenizer``-1: each string of ``[C]`` or ``[N, C]`` becomes a row of
    tokens along a new last axis, padded with ``pad_value`` to the longest.

    ``separators`` (RE2 patterns, tried in order at each position) split the string, or
    ``tokenexp`` (one RE2 pattern) finds the tokens, scanning left to right; where both are
    set the separators are used, as onnxruntime does. Tokens shorter than ``mincharnum``
    characters are dropped (so are empty ones). ``separators=[""]`` or ``tokenexp="."``
    gives one token per character. A separator match of no characters also drops the
    character after it, as onnxruntime's does. With ``mark``, each row is wrapped in
    ``"\\x02"`` ... ``"\\x03"`` before the padding; when no string has a token the last axis is
    empty, marks or not; an empty input gives onnxruntime's shapes (``[0]``, or ``[N, 0]``
    for ``[N, C]``).
    """
    x = strings_of(inputs[0], ctx)
    if x.ndim not in (1, 2):
        raise ctx.error(f"input must have shape [C] or [N, C], got {x.shape}")
    for name in ("mark", "pad_value", "mincharnum"):
        if attrs[name] is None:
            raise ctx.error(f"needs the `{name}` attribute")
    mincharnum, separators, tokenexp = attrs["mincharnum"], attrs["separators"], attrs["tokenexp"]
    if mincharnum < 1:
        raise ctx.error(f"mincharnum must be positive, got {mincharnum}")
    if separators is None and tokenexp is None:
        raise ctx.error("needs one of the `separators` and `tokenexp` attributes")
    by_character = list(separators or ()) == [""] or (separators is None and tokenexp == ".")
    if by_character and mincharnum > 1:
        raise ctx.error(f"mincharnum {mincharnum} leaves no token of one character (separators [''] or tokenexp '.')")
    if x.size == 0:  # onnxruntime's shapes: [0] -> [0], [N, 0] and [0, C] -> [N, 0]
        return (np.empty(x.shape[:1] + (0,) * (x.ndim - 1), object),)
    try:
        if by_character:
            split = list
        elif separators is not None:
            pattern = compile_re2("|".join(f"(?:{s})" for s in separators))
            split = lambda s: _split(pattern, s)  # noqa: E731
        else:
            pattern = compile_re2(tokenexp)
            split = lambda s: [m.group() for m in pattern.finditer(s)]  # noqa: E731
    except ValueError as e:
        raise ctx.error(f"a pattern cannot run (RE2 read by Python re): {e}") from None
    rows = [[t for t in split(s) if len(t) >= mincharnum] for s in x.reshape(-1)]
    width = max(len(r) for r in rows)
    if width and attrs["mark"]:
        rows = [[_START, *r, _END] for r in rows]
        width += 2
    out = np.full((len(rows), width), attrs["pad_value"], object)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return (out.reshape(x.shape + (width,)),)


def _split(separator: re.Pattern, s: str) -> list[str]:
    """``s`` cut at each match of ``separator``; a match of no characters swallows the
    character after it (onnxruntime's rule, which also keeps the scan moving)."""
    tokens, start = [], 0
    while start <= len(s):
        match = separator.search(s, start)
        if match is None:
            break
        tokens.append(s[start : match.start()])
        start = match.end() + (match.end() == match.start())
    tokens.append(s[start:])
    return tokens
