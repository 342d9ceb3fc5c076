"""RE2 regular expressions run by Python's ``re``.

ONNX's RegexFullMatch and onnxruntime's Tokenizer take RE2 syntax. Python's ``re`` reads
most of it the same way (leftmost-first alternation, greedy and lazy repetition, groups,
``(?i)``), but its Perl classes are Unicode-aware where RE2's are ASCII: ``\\w`` matches
``é`` in Python and not in RE2, ``\\d`` matches Arabic-Indic digits, ``\\s`` matches
``\\v``. Python also lacks RE2's POSIX classes (``[[:alpha:]]``, which it would read as a
plain bracket expression) and its ``\\z``, and reads ``(?U)`` as a Unicode flag where RE2
makes repetition lazy. :func:`translate` rewrites those into Python of RE2's meaning and
refuses what it cannot express; the remaining RE2-only syntax (``\\pN``, ``\\C``, ``\\Q...\\E``)
Python rejects itself.
"""

from __future__ import annotations

import re

__all__ = ["compile_re2", "translate"]

# RE2's Perl classes, as the contents of a bracket expression.
_PERL = {"d": "0-9", "s": "\\t\\n\\f\\r ", "w": "0-9A-Za-z_"}
_POSIX = {
    "alnum": "0-9A-Za-z",
    "alpha": "A-Za-z",
    "ascii": "\\x00-\\x7f",
    "blank": "\\t ",
    "cntrl": "\\x00-\\x1f\\x7f",
    "digit": "0-9",
    "graph": "!-~",
    "lower": "a-z",
    "print": " -~",
    "punct": "!-/:-@\\[-`{-~",
    "space": "\\t\\n\\v\\f\\r ",
    "upper": "A-Z",
    "word": "0-9A-Za-z_",
    "xdigit": "0-9A-Fa-f",
}
_WORD = "[0-9A-Za-z_]"
_BOUNDARY = f"(?:(?<={_WORD})(?!{_WORD})|(?<!{_WORD})(?={_WORD}))"
_NOT_BOUNDARY = f"(?:(?<={_WORD})(?={_WORD})|(?<!{_WORD})(?!{_WORD}))"
_FLAGS = re.compile(r"\(\?([a-zA-Z]*)(?:-([a-zA-Z]*))?[:)]")


def translate(pattern: str) -> str:
    """``pattern``, in RE2 syntax, as a Python ``re`` pattern that matches the same strings.

    Raises:
        ValueError: RE2 syntax with no rewrite here (a negated Perl class such as ``\\W``
            inside brackets, the ``U`` flag).
    """
    for on, off in _FLAGS.findall(pattern):
        if "U" in on + off:
            raise ValueError("the U flag (RE2: lazy repetition by default) has no Python equivalent")
    out: list[str] = []
    i, n = 0, len(pattern)
    in_class = False
    while i < n:
        c = pattern[i]
        if c == "\\" and i + 1 < n:
            e = pattern[i + 1]
            i += 2
            if e.lower() in _PERL:
                if in_class and e.isupper():
                    raise ValueError(f"\\{e} inside brackets is not supported")
                body = _PERL[e.lower()]
                out.append(body if in_class else f"[{'^' if e.isupper() else ''}{body}]")
            elif e in "bB" and not in_class:
                out.append(_BOUNDARY if e == "b" else _NOT_BOUNDARY)
            elif e == "z" and not in_class:
                out.append("\\Z")
            else:
                out.append(c + e)
            continue
        if in_class:
            posix = re.match(r"\[:(\^?)([a-z]+):\]", pattern[i:])
            if posix:
                negated, name = posix.groups()
                if name not in _POSIX:
                    raise ValueError(f"unknown character class [:{name}:]")
                if negated:
                    raise ValueError(f"[:^{name}:] inside brackets is not supported")
                out.append(_POSIX[name])
                i += posix.end()
                continue
            if c == "]":
                in_class = False
            out.append(c)
            i += 1
            continue
        if c == "[":
            # A "]" right after "[" or "[^" is a literal, in RE2 as in Python.
            start = i + 1 + (pattern[i + 1 : i + 2] == "^")
            if pattern[start : start + 1] == "]" and not pattern.startswith("[:", start):
                out.append(pattern[i : start + 1])
                i = start + 1
            else:
                out.append(pattern[i:start])
                i = start
            in_class = True
            continue
        out.append(c)
        i += 1
    return "".join(out)


def compile_re2(pattern: str) -> re.Pattern:
    """:func:`translate`, compiled. Raises ValueError for a pattern it cannot run: one RE2
    construct Python cannot express, or what Python's ``re`` itself refuses."""
    try:
        return re.compile(translate(pattern))
    except re.error as e:
        raise ValueError(str(e)) from None
