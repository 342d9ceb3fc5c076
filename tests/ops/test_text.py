"""String ops and TfIdfVectorizer against the ReferenceEvaluator or the spec's own examples."""

from __future__ import annotations

import numpy as np
import pytest

import jonnx.ops
from jonnx import errors
from tests.ops._harness import assert_matches_reference, node_model, ort_expected, run_jonnx


def _s(*values, shape=None) -> np.ndarray:
    out = np.empty(len(values), object)
    out[:] = values
    return out if shape is None else out.reshape(shape)


# -- StringNormalizer ------------------------------------------------------------------------
# onnxruntime needs system locales this machine lacks, and the ReferenceEvaluator removes
# stopwords inside elements and strips accents, which the spec does not say: the expected
# values are written from the spec (a stopword removes an element equal to it).

WEEK = _s("monday", "Tuesday", "MONDAY", "monday blues", "Éclair")


@pytest.mark.parametrize(
    "sensitive,action,expected",
    [
        (0, "NONE", _s("Tuesday", "monday blues", "Éclair")),
        (0, "UPPER", _s("TUESDAY", "MONDAY BLUES", "ÉCLAIR")),
        (1, "LOWER", _s("tuesday", "monday", "monday blues", "éclair")),
        (1, "NONE", _s("Tuesday", "MONDAY", "monday blues", "Éclair")),
    ],
)
def test_string_normalizer_stopwords_and_case(sensitive, action, expected):
    assert_matches_reference(
        "StringNormalizer",
        {"x": WEEK},
        opset=10,
        stopwords=["monday"],
        is_case_sensitive=sensitive,
        case_change_action=action,
        expected=[expected],
    )


def test_string_normalizer_row_input_keeps_its_rank():
    x = WEEK.reshape(1, -1)
    assert_matches_reference(
        "StringNormalizer",
        {"x": x},
        opset=10,
        case_change_action="LOWER",
        expected=[_s("monday", "tuesday", "monday", "monday blues", "éclair", shape=(1, 5))],
    )


@pytest.mark.parametrize("shape,out_shape", [((2,), (1,)), ((1, 2), (1, 1))])
def test_string_normalizer_everything_removed(shape, out_shape):
    x = _s("monday", "Monday").reshape(shape)
    assert_matches_reference(
        "StringNormalizer", {"x": x}, opset=10, stopwords=["MONDAY"], expected=[_s("", shape=out_shape)]
    )


def test_string_normalizer_rejects_several_rows():
    x = _s("a", "b", "c", "d", shape=(2, 2))
    with pytest.raises(errors.NodeError, match=r"\[C\] or \[1, C\]"):
        run_jonnx(node_model("StringNormalizer", {"x": x}, opset=10), {"x": x})


# -- StringConcat, StringSplit, RegexFullMatch -----------------------------------------------


@pytest.mark.parametrize(
    "x,y",
    [
        (_s("abc", "", "日本"), _s("def", "x", "語")),
        (_s("a", "b", "c", "d", shape=(2, 2)), _s("!", "?")),  # broadcasting
        (_s(), _s("z")),
    ],
)
def test_string_concat(x, y):
    assert_matches_reference("StringConcat", {"x": x, "y": y}, opset=20)


def test_string_concat_scalars():
    # The ReferenceEvaluator returns a 0-d numpy str ('<U2'), not a string tensor, here.
    x, y = _s("a", shape=()), _s("b", shape=())
    assert_matches_reference("StringConcat", {"x": x, "y": y}, opset=20, expected=[_s("ab", shape=())])


def test_string_concat_bad_broadcast():
    inputs = {"x": _s("a", "b"), "y": _s("a", "b", "c")}
    with pytest.raises(errors.NodeError, match="broadcast"):
        run_jonnx(node_model("StringConcat", inputs, opset=20), inputs)


@pytest.mark.parametrize(
    "x,attrs",
    [
        (_s("abc.com", "def.net", "x"), {"delimiter": "."}),
        (_s("a-b--c-", "--", ""), {"delimiter": "-"}),
        (_s("hello world  again", "  lead and trail  ", "one"), {}),
        (_s("hello world  again", " a b c ", "x y"), {"delimiter": ""}),
        (_s("1,2,3,4", "1,2", "a,b,c", "", shape=(2, 2)), {"delimiter": ",", "maxsplit": 1}),
        (_s("a b c d", "e f", "g"), {"maxsplit": 2}),
        (_s(), {"delimiter": "-"}),
    ],
)
def test_string_split(x, attrs):
    assert_matches_reference("StringSplit", {"x": x}, 2, opset=20, **attrs)


@pytest.mark.parametrize("maxsplit", [0, 1])
def test_string_split_drops_trailing_whitespace_after_maxsplit(maxsplit):
    # "leading or trailing whitespace is removed in the output", also from the rest left after
    # maxsplit splits: onnxruntime agrees (Python's str.split and the onnx reference keep it).
    x = _s(" x  y ", "a b c ", "  ")
    (want, want_counts) = ort_expected("StringSplit", {"x": x}, 2, opset=20, maxsplit=maxsplit)
    got, counts = run_jonnx(node_model("StringSplit", {"x": x}, 2, opset=20, maxsplit=maxsplit), {"x": x})
    assert got.tolist() == want.tolist()
    np.testing.assert_array_equal(counts, want_counts)


@pytest.mark.parametrize(
    "pattern,x",
    [
        (r"www\.[\w.-]+\.\bcom\b", _s("www.google.com", "www.facebook.com", "www.bbc.co.uk")),
        (
            r"(\W|^)[\w.\-]{0,25}@(yahoo|gmail)\.com(\W|$)",
            _s("account@gmail.com", "x@yahoo.com", "x@y.com", shape=(3, 1)),
        ),
        ("", _s("", "a")),
        ("[a-c]+", _s()),
    ],
)
def test_regex_full_match(pattern, x):
    assert_matches_reference("RegexFullMatch", {"x": x}, opset=20, pattern=pattern)


def test_regex_full_match_invalid_pattern():
    x = _s("a")
    with pytest.raises(errors.NodeError, match="cannot run"):
        run_jonnx(node_model("RegexFullMatch", {"x": x}, opset=20, pattern="(unclosed"), {"x": x})


def test_string_ops_callable_directly():
    got = jonnx.ops.call("StringConcat", _s("a", "b"), _s("c", "d"), opset=20)
    np.testing.assert_array_equal(got, _s("ac", "bd"))


# -- TfIdfVectorizer -------------------------------------------------------------------------

INT_POOL = dict(
    ngram_counts=[0, 4], ngram_indexes=[0, 1, 2, 3, 4, 5, 6], pool_int64s=[2, 3, 5, 4, 5, 6, 7, 8, 6, 7]
)  # 4 unigrams, 3 bigrams
STR_POOL = dict(
    ngram_counts=[0, 4],
    ngram_indexes=[0, 1, 2, 3, 4, 5, 6],
    pool_strings=["two", "three", "five", "four", "five", "six", "seven", "eight", "six", "seven"],
)
TOKENS = np.array([[1, 1, 3, 3, 3, 7, 8, 6, 7, 5, 6, 8], [5, 6, 7, 8, 6, 7, 2, 3, 4, 5, 6, 7]], np.int32)
WORDS = np.array(["one", "two", "three", "four", "five", "six", "seven", "eight"], object)[TOKENS - 1]


@pytest.mark.parametrize("mode", ["TF", "IDF", "TFIDF"])
@pytest.mark.parametrize("strings", [False, True])
@pytest.mark.parametrize("grams,skip", [((1, 1), 0), ((2, 2), 0), ((1, 2), 3), ((2, 2), 5)])
def test_tfidf_matches_reference(mode, strings, grams, skip):
    x = WORDS if strings else TOKENS
    pool = STR_POOL if strings else INT_POOL
    weights = [0.5, 1, 2, 3, 4, 5, 6] if mode != "TF" else None
    assert_matches_reference(
        "TfIdfVectorizer",
        {"x": x},
        opset=9,
        mode=mode,
        min_gram_length=grams[0],
        max_gram_length=grams[1],
        max_skip_count=skip,
        weights=weights,
        **pool,
    )


@pytest.mark.parametrize("x", [TOKENS[0], TOKENS.astype(np.int64), TOKENS[:1, :3]])
def test_tfidf_int_shapes_and_dtypes(x):
    # The int tokens are traced under jit (assert_matches_reference runs jit and eager).
    assert_matches_reference(
        "TfIdfVectorizer",
        {"x": x},
        opset=9,
        mode="TF",
        min_gram_length=1,
        max_gram_length=2,
        max_skip_count=1,
        **INT_POOL,
    )


@pytest.mark.parametrize("mode", ["IDF", "TFIDF"])
def test_tfidf_weights_follow_the_pool_order(mode):
    # "The i-th element in weights is the weight of the i-th n-gram in pool", wherever
    # ngram_indexes writes it (onnxruntime agrees; the onnx reference weighs column i).
    attrs = dict(
        mode=mode,
        min_gram_length=1,
        max_gram_length=2,
        max_skip_count=0,
        ngram_counts=[0, 3],
        ngram_indexes=[3, 0, 4, 1, 2],
        pool_int64s=[5, 6, 7, 5, 6, 7, 8],
        weights=[10.0, 20.0, 30.0, 40.0, 50.0],
    )
    x = TOKENS
    (want,) = ort_expected("TfIdfVectorizer", {"x": x}, opset=9, **attrs)
    (got,) = run_jonnx(node_model("TfIdfVectorizer", {"x": x}, opset=9, **attrs), {"x": x})
    np.testing.assert_array_equal(got, want)
    # Token 5 (the pool's first n-gram) is in column 3 with the weight 10.
    assert want[0, 3] == (10.0 if mode == "IDF" else 10.0 * np.sum(TOKENS[0] == 5))


def test_tfidf_permuted_columns_and_missing_sizes():
    # Only bigrams in the pool (ngram_counts [0, 0]), written to permuted columns.
    attrs = dict(ngram_counts=[0, 0], ngram_indexes=[2, 0, 1], pool_int64s=[5, 6, 7, 8, 6, 7])
    assert_matches_reference(
        "TfIdfVectorizer",
        {"x": TOKENS},
        opset=9,
        mode="TF",
        min_gram_length=1,
        max_gram_length=2,
        max_skip_count=0,
        **attrs,
    )


def test_tfidf_needs_one_pool():
    with pytest.raises(errors.NodeError, match="exactly one of pool_int64s and pool_strings"):
        run_jonnx(
            node_model(
                "TfIdfVectorizer",
                {"x": TOKENS},
                opset=9,
                mode="TF",
                min_gram_length=1,
                max_gram_length=1,
                max_skip_count=0,
                ngram_counts=[0],
                ngram_indexes=[0],
            ),
            {"x": TOKENS},
        )


# -- RE2 patterns and com.microsoft Tokenizer, against onnxruntime ------------------------------

# Strings where Python's Unicode-aware classes and RE2's ASCII ones part: accented letters,
# Arabic-Indic digits, a vertical tab.
RE2_STRINGS = _s("abc", "éa", "a b", "١٢", "12", " x ", "a,b", "]a", "\vx", "Straße", "!?", "a.1", "AB1", "")


def _onnxruntime(model, feeds):
    ort = pytest.importorskip("onnxruntime")
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize(
    "pattern",
    [r"\w+", r"\d+", r"\s*x\s*", r"[\w,]+", r"\W+", r"\D+", r"\S+", r"[\d.]+", r"a\b.*", r".*\Bb", r"x\z"]
    + [r"[[:alpha:]]+", r"[^[:digit:]]*", r"[[:upper:][:digit:]]+", r"[[:punct:]]+", r"[]a]+", r"[^]a]+"],
)
def test_regex_full_match_reads_re2_classes_as_ascii(pattern):
    # RE2's \w, \d, \s, \b are ASCII (Python's re: Unicode); Python has no POSIX classes.
    model = node_model("RegexFullMatch", {"x": RE2_STRINGS}, opset=20, pattern=pattern)
    (want,) = _onnxruntime(model, {"x": RE2_STRINGS})
    (got,) = run_jonnx(model, {"x": RE2_STRINGS}, jit=False)
    np.testing.assert_array_equal(got, want)


def test_regex_full_match_refuses_re2_syntax_python_cannot_mean():
    x = _s("ab")
    for pattern in [r"(?U)a+", r"[\W]", r"\pL+"]:
        model = node_model("RegexFullMatch", {"x": x}, opset=20, pattern=pattern)
        with pytest.raises(errors.NodeError, match="cannot run"):
            run_jonnx(model, {"x": x}, jit=False)


def _tokenizer(x, **attrs):
    attrs = {"mark": 0, "pad_value": "#", "mincharnum": 1, **attrs}
    return node_model("Tokenizer", {"x": x}, opset=1, domain="com.microsoft", **attrs)


TOKENIZER_CASES = [
    (_s("Hello World", "I love  computer science !"), {"separators": [" "]}),
    (_s("a  b", " a b ", ""), {"separators": [" "], "mark": 1}),
    (_s("", ""), {"separators": [" "], "mark": 1}),  # no token anywhere: no marks either
    (_s("ab cde f"), {"separators": [" "], "mincharnum": 2}),
    (_s("é ab ßß"), {"separators": [" "], "mincharnum": 2}),  # characters, not bytes
    (_s("a,b;c", "x"), {"separators": [",", ";"]}),
    (_s("ab ba"), {"separators": ["a", "ab"]}),  # tried in order at each position
    (_s("ab cd"), {"separators": [" ", r"\b"]}),  # an empty match swallows a character
    (_s("abc"), {"separators": ["(?:b|$)"]}),
    (_s("a\tb\nc", "a\vb"), {"separators": [r"\s"]}),
    (_s("abc", "é ß"), {"separators": [""]}),
    (_s("abc", "é ß"), {"tokenexp": "."}),
    (_s("abc def", "x1 y22", "éa bé"), {"tokenexp": r"[a-z]+"}),
    (_s("the cat", "éa bé"), {"tokenexp": r"\w\w+"}),
    (_s("hello", "ab12cd3"), {"tokenexp": "l*|[a-z]+"}),
    (_s("u.s.a. is"), {"tokenexp": r"(?:[a-z]\.)+|\w+"}),
    (_s("a b"), {"separators": [" "], "tokenexp": "a"}),  # both: the separators
    (_s("a b", "c", "d e f", "", shape=(2, 2)), {"separators": [" "], "mark": 1, "pad_value": ""}),
    (np.zeros((0,), object), {"separators": [" "]}),
    (np.zeros((2, 0), object), {"separators": [" "]}),
    (np.zeros((0, 3), object), {"tokenexp": r"\w+"}),
]


@pytest.mark.parametrize("x,attrs", TOKENIZER_CASES)
def test_tokenizer_matches_onnxruntime(x, attrs):
    model = _tokenizer(x, **attrs)
    (want,) = _onnxruntime(model, {"x": x})
    (got,) = run_jonnx(model, {"x": x}, jit=False)
    assert got.shape == want.shape
    assert got.tolist() == want.tolist()


@pytest.mark.parametrize(
    "x,attrs,message",
    [
        (_s("ab"), {"separators": [" "], "mincharnum": 0}, "mincharnum must be positive"),
        (_s("ab"), {"separators": [""], "mincharnum": 2}, "no token of one character"),
        (_s("ab"), {}, "one of the `separators` and `tokenexp`"),
        (np.array("a b", object), {"separators": [" "]}, r"shape \[C\] or \[N, C\]"),
    ],
)
def test_tokenizer_refuses_what_onnxruntime_refuses(x, attrs, message):
    model = _tokenizer(x, **attrs)
    with pytest.raises(Exception):  # noqa: B017, PT011 -- onnxruntime's own error types
        _onnxruntime(model, {"x": x})
    with pytest.raises(errors.NodeError, match=message):
        run_jonnx(model, {"x": x}, jit=False)


# -- string tensors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values,expected",
    [
        (_s("a", "b", shape=(1, 2)), [["a", "b"]]),  # all str: passed through
        (_s("a", b"\xc3\xa9", 3, None), ["a", "é", "3", "None"]),  # one bytes among them: decoded
        (_s(b"\xff"), ["\udcff"]),  # not UTF-8: kept as a surrogate
        (np.array(["x", "yz"]), ["x", "yz"]),  # numpy's fixed-width strings
        (_s(*["s"] * 5000, b"t"), ["s"] * 5000 + ["t"]),  # the bytes past the first join
    ],
)
def test_as_strings(values, expected):
    from jonnx.ops._util import as_strings

    got = as_strings(values)
    assert got.dtype == object and got.shape == np.shape(values)
    assert got.tolist() == expected
    assert all(isinstance(v, str) for v in got.reshape(-1))
    assert got is not values  # a new array: callers may write into it
