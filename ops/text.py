"""String ops (StringNormalizer, StringConcat, StringSplit, RegexFullMatch) and TfIdfVectorizer.

JAX has no string type: string tensors live on the host as numpy object arrays of ``str``, and
the ops reading them run at trace time on concrete inputs (their string inputs are declared
static, so a traced input gets a :class:`jonnx.errors.StaticValueError` naming the chain).
Their outputs are numpy arrays too. TfIdfVectorizer on integer tokens is written with jnp and
also runs on traced inputs.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jonnx._registry import Attrs, Inputs, OpContext, Outputs, register
from jonnx.ops._re2 import compile_re2
from jonnx.ops._util import as_strings, index_dtype


def strings_of(x, ctx, what: str = "input") -> np.ndarray:
    """A string op's input as an object array of ``str`` (:func:`as_strings`), refusing a
    tensor that is not of strings, or holds anything but str and bytes, with the node's name."""
    x = np.asarray(x)
    if x.dtype.kind not in "OUS":
        raise ctx.error(f"{what} must be a string tensor, got dtype {x.dtype}")
    bad = [v for v in x.flat if not isinstance(v, (str, bytes))]
    if bad:
        raise ctx.error(f"{what} holds a non-string element {bad[0]!r}")
    return as_strings(x)


def _map_strings(fn, *arrays, otype=object) -> np.ndarray:
    """``fn`` applied elementwise with broadcasting; an empty input stays empty and typed."""
    return np.asarray(np.frompyfunc(fn, len(arrays), 1)(*arrays), dtype=otype)


# -- StringNormalizer ------------------------------------------------------------------------


@register("StringNormalizer", since=10, static_inputs=(0,), host=True)
def string_normalizer(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``StringNormalizer``-10: drop stopword elements, then change case.

    As the spec and onnxruntime define it, a stopword removes a whole element equal to it
    (the onnx ReferenceEvaluator removes words inside elements and strips accents instead).
    Case changes use Python's locale-independent Unicode ``str.lower``/``str.upper``;
    ``locale`` is accepted and not applied. Case-insensitive stopwords compare casefolded.
    """
    x = strings_of(inputs[0], ctx)
    shape = x.shape
    if len(shape) == 2 and shape[0] != 1 or len(shape) not in (1, 2):
        raise ctx.error(f"input must have shape [C] or [1, C], got {shape}")
    action = attrs["case_change_action"]
    if action not in ("NONE", "LOWER", "UPPER"):
        raise ctx.error(f"case_change_action must be NONE, LOWER or UPPER, got {action!r}")
    words = list(x.reshape(-1))
    stopwords = attrs["stopwords"] or ()
    if attrs["is_case_sensitive"]:
        stops = set(stopwords)
        words = [w for w in words if w not in stops]
    else:
        stops = {s.casefold() for s in stopwords}
        words = [w for w in words if w.casefold() not in stops]
    if action == "LOWER":
        words = [w.lower() for w in words]
    elif action == "UPPER":
        words = [w.upper() for w in words]
    if not words:  # everything was a stopword: one empty string, as the spec says
        words = [""]
    out = np.empty(len(words), object)
    out[:] = words
    return (out.reshape(shape[:-1] + (len(words),)),)


# -- StringConcat, StringSplit, RegexFullMatch -----------------------------------------------


@register("StringConcat", since=20, static_inputs=(0, 1), host=True)
def string_concat(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``StringConcat``-20 (numpy broadcasting)."""
    x, y = strings_of(inputs[0], ctx, "X"), strings_of(inputs[1], ctx, "Y")
    try:
        shape = np.broadcast_shapes(x.shape, y.shape)
    except ValueError:
        raise ctx.error(f"cannot broadcast shapes {x.shape} and {y.shape}") from None
    return (_map_strings(str.__add__, x, y).reshape(shape),)


@register("StringSplit", since=20, static_inputs=(0,), host=True)
def string_split(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``StringSplit``-20: substrings padded with "" to the longest split, and counts.

    Without a delimiter (or with ""), runs of whitespace separate and leading and trailing
    whitespace is dropped, also from what is left after ``maxsplit`` splits (as onnxruntime;
    Python's ``str.split`` and the onnx reference keep it there). Whitespace is Unicode's,
    tabs included, as the specification says; onnxruntime splits at spaces only.
    """
    x = strings_of(inputs[0], ctx)
    delimiter = attrs["delimiter"] or None
    maxsplit = attrs["maxsplit"]
    if maxsplit is not None and maxsplit < 0:
        raise ctx.error(f"maxsplit must be non-negative, got {maxsplit}")
    maxsplit = -1 if maxsplit is None else maxsplit
    parts = [(s if delimiter else s.strip()).split(delimiter, maxsplit) for s in x.reshape(-1)]
    width = max((len(p) for p in parts), default=0)
    out = np.full((len(parts), width), "", object)
    for row, p in enumerate(parts):
        out[row, : len(p)] = p
    counts = np.array([len(p) for p in parts], index_dtype()).reshape(x.shape)
    return out.reshape(x.shape + (width,)), counts


@register("RegexFullMatch", since=20, static_inputs=(0,), host=True)
def regex_full_match(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``RegexFullMatch``-20, with Python's ``re.fullmatch`` of the RE2 pattern.

    The spec names RE2 syntax: ``jonnx.ops._re2`` gives Python RE2's ASCII Perl classes
    (``\\w``, ``\\d``, ``\\s``, ``\\b``), POSIX classes and ``\\z``. RE2-only syntax Python
    cannot read (``\\pN``, ``\\p{Greek}``, ``\\C``, ``(?U)``) is an error naming the node;
    what RE2 rejects and Python accepts (backreferences, lookaround) runs; and Python
    backtracks, so a pathological pattern can take exponential time.
    """
    x = strings_of(inputs[0], ctx)
    pattern = attrs["pattern"]
    if pattern is None:
        raise ctx.error("needs the `pattern` attribute")
    try:
        regex = compile_re2(pattern)
    except ValueError as e:
        raise ctx.error(f"pattern {pattern!r} cannot run (RE2 read by Python re): {e}") from None
    return (_map_strings(lambda s: regex.fullmatch(s) is not None, x, otype=bool).reshape(x.shape),)


# -- TfIdfVectorizer -------------------------------------------------------------------------


def _pool_ngrams(attrs, ctx) -> dict[int, tuple[list[tuple], list[int]]]:
    """The pool's n-grams by length: ``{n: (grams, output columns)}`` within the length range."""
    pool_ints, pool_strings = attrs["pool_int64s"], attrs["pool_strings"]
    if (pool_ints is None) == (pool_strings is None):
        raise ctx.error("needs exactly one of pool_int64s and pool_strings")
    pool = list(pool_ints if pool_ints is not None else pool_strings)
    counts = list(attrs["ngram_counts"] or ())
    indexes = list(attrs["ngram_indexes"] or ())
    lo, hi = attrs["min_gram_length"], attrs["max_gram_length"]
    if lo is None or hi is None or not 1 <= lo <= hi:
        raise ctx.error(f"need 1 <= min_gram_length <= max_gram_length, got {lo} and {hi}")
    if not counts or counts[0] != 0 or any(b < a for a, b in zip(counts, counts[1:])) or counts[-1] > len(pool):
        raise ctx.error(f"ngram_counts {tuple(counts)} must start at 0 and rise within the pool ({len(pool)})")
    grams: dict[int, dict[tuple, int]] = {}
    gram_id = 0
    for size, start in enumerate(counts, start=1):
        end = counts[size] if size < len(counts) else len(pool)
        if (end - start) % size:
            raise ctx.error(f"the {size}-grams of the pool ({end - start} entries) are not a multiple of {size}")
        for first in range(start, end, size):
            if gram_id >= len(indexes):
                raise ctx.error(f"ngram_indexes has {len(indexes)} entries, fewer than the pool's n-grams")
            if lo <= size <= hi:
                # A repeated n-gram counts in the column of its last entry (as onnxruntime).
                grams.setdefault(size, {})[tuple(pool[first : first + size])] = indexes[gram_id]
            gram_id += 1
    return {n: (list(g), list(g.values())) for n, g in grams.items()}


def _ngram_counts(tokens, grams: dict, max_skip: int, n_columns: int):
    """Counts ``[..., n_columns]`` of each pool n-gram over ``tokens`` ``[..., C]``.

    An n-gram of n >= 2 matches tokens ``d`` apart for every ``d`` in ``1..max_skip + 1``,
    each match counted; unigrams are counted once.
    """
    length = jnp.shape(tokens)[-1]
    total = jnp.zeros(jnp.shape(tokens)[:-1] + (n_columns,), jnp.float32)
    for n, (pool, columns) in grams.items():
        pool = np.asarray(pool)  # [K, n]
        for d in range(1, (max_skip + 1 if n > 1 else 1) + 1):
            starts = length - (n - 1) * d
            if starts <= 0:
                break
            match = True
            for j in range(n):
                window = tokens[..., j * d : j * d + starts, None]  # [..., starts, 1]
                match = match & (window == pool[:, j])  # [..., starts, K]
            # Several n-grams may share a column: .add accumulates repeated indices.
            total = total.at[..., np.asarray(columns)].add(jnp.sum(match, axis=-2, dtype=jnp.float32))
    return total


def _string_token_ids(x, grams: dict, ctx):
    """String tokens as ids of the pool's strings (-1 for the rest), and the pools as ids."""
    x = strings_of(x, ctx)
    vocab: dict[str, int] = {}
    id_grams = {}
    for n, (pool, columns) in grams.items():
        id_grams[n] = ([tuple(vocab.setdefault(s, len(vocab)) for s in g) for g in pool], columns)
    ids = np.vectorize(lambda s: vocab.get(s, -1), otypes=[np.int32])(x) if x.size else np.zeros(x.shape, np.int32)
    return ids, id_grams


def _int_grams(grams: dict, dtype) -> dict:
    """Integer pools in the tokens' dtype; values the dtype cannot hold can never match."""
    info = np.iinfo(dtype)
    out = {}
    for n, (pool, columns) in grams.items():
        kept = [(g, c) for g, c in zip(pool, columns) if all(info.min <= v <= info.max for v in g)]
        if kept:
            out[n] = ([g for g, _ in kept], [c for _, c in kept])
    return out


@register("TfIdfVectorizer", since=9)
def tfidf_vectorizer(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``TfIdfVectorizer``-9 (TF, IDF, TFIDF over n-grams with skips).

    ``weights[i]`` weighs the pool's ``i``-th n-gram, in the output column
    ``ngram_indexes[i]``, as the specification says and onnxruntime does (the onnx reference
    weighs column ``i``). Integer tokens may be traced; string tokens are host values.
    """
    x = inputs[0]
    mode = attrs["mode"]
    if mode not in ("TF", "IDF", "TFIDF"):
        raise ctx.error(f"mode must be TF, IDF or TFIDF, got {mode!r}")
    shape = tuple(jnp.shape(x))
    if len(shape) not in (0, 1, 2) or len(shape) == 2 and shape[0] < 1:
        raise ctx.error(f"input must have shape [C] or [B, C] with B > 0, got {shape}")
    grams = _pool_ngrams(attrs, ctx)
    n_columns = max(attrs["ngram_indexes"]) + 1
    if min(attrs["ngram_indexes"]) < 0:
        raise ctx.error("ngram_indexes must be non-negative")
    max_skip = attrs["max_skip_count"] or 0
    if max_skip < 0:
        raise ctx.error(f"max_skip_count must be non-negative, got {max_skip}")
    tokens = jnp.reshape(x, (-1,)) if len(shape) == 0 else x
    if attrs["pool_strings"] is not None:
        tokens, grams = _string_token_ids(tokens, grams, ctx)
    else:
        dtype = jnp.result_type(x)
        if not jnp.issubdtype(dtype, jnp.integer):
            raise ctx.error(f"with pool_int64s the input must hold integers, got {dtype}")
        grams = _int_grams(grams, dtype)
    counts = _ngram_counts(tokens, grams, max_skip, n_columns)
    weights = attrs["weights"]
    indexes = attrs["ngram_indexes"]
    if weights is not None and len(weights) < len(indexes):
        raise ctx.error(f"weights has {len(weights)} entries for the pool's {len(indexes)} n-grams")
    w = None
    if weights:
        # weights[i] is the i-th pool n-gram's (the specification, onnxruntime), whichever
        # output column ngram_indexes gives it; the onnx reference reads it by column.
        w = np.ones(n_columns, np.float32)
        w[np.asarray(indexes)] = np.asarray(weights[: len(indexes)], np.float32)
    if mode == "IDF":
        counts = (counts > 0).astype(jnp.float32)
    if mode != "TF" and w is not None:
        counts = counts * w
    return (counts,)
