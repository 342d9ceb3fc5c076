"""A short, fixed run of each family of the differential fuzz (``tests/conformance/fuzz.py``):
what its longer runs found fixed stays fixed, and the tool itself keeps running as onnx,
onnxruntime and jonnx move. Longer runs with other seeds are for a developer's machine."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest

import jonnx
import jonnx._build
from jonnx.ops import activation
from tests.conformance import fuzz
from tests.ops._harness import node_model

CASES = 16
VMAP_CASES = 8
# Families that draw mostly what has nothing to batch: strings, sequences, maps, optionals, and
# detection's NonMaxSuppression, whose output shape needs its inputs on the host.
UNBATCHED = {"detection", "maps", "optional", "sequence", "text"}


# Every family; at this seed conv_pool and quantize draw cases where onnxruntime departs from
# the specification (fuzz.DEPARTURES), which the tool counts apart from findings.
@pytest.mark.parametrize("family", sorted(fuzz.FAMILIES))
def test_each_family_agrees_with_the_references(family):
    with jax.enable_x64(True):
        verdicts, findings = fuzz.run(seed=2026, cases=CASES, families=[family])
    assert not findings
    assert verdicts["ok"] >= CASES // 2  # most draws reached a reference and were compared


@pytest.mark.parametrize("family", ["elementwise", "products", "normalization", "microsoft", "loss"])
def test_derivatives_agree_with_finite_differences(family):
    with jax.enable_x64(True):
        verdicts, findings = fuzz.run(seed=2026, cases=CASES, families=[family], grad=True)
    assert not findings
    assert verdicts["ok"] >= 4


@pytest.mark.parametrize("family", sorted(fuzz.FAMILIES))
def test_each_family_batches_under_vmap(family):
    with jax.enable_x64(True):
        verdicts, findings = fuzz.run(seed=2026, cases=VMAP_CASES, families=[family], vmap=True)
    assert not findings
    assert verdicts["ok"] >= (0 if family in UNBATCHED else VMAP_CASES // 2)


def test_known_departures_are_counted_not_reported():
    # Seed 2026 draws a ConvTranspose and a MaxPool with SAME padding and dilations among its
    # conv_pool cases (checked by hand: onnxruntime's shapes and windows there are not the
    # specification's).
    with jax.enable_x64(True):
        verdicts, findings = fuzz.run(seed=2026, cases=CASES, families=["conv_pool"])
    assert not findings
    departures = [k for k in verdicts if k.startswith("known departure: ")]
    assert any("ConvTranspose" in k for k in departures) and any("MaxPool" in k for k in departures)


def test_departures_are_narrow():
    case = fuzz.Case(
        "MaxPool", {"x": np.zeros((1, 1, 4, 4), np.float32)}, {"auto_pad": "SAME_UPPER", "dilations": [2, 1]}
    )
    assert fuzz.known_departure(case) is not None
    assert fuzz.known_departure(case._replace(attrs={"auto_pad": "SAME_UPPER", "dilations": [1, 1]})) is None
    assert fuzz.known_departure(case._replace(attrs={"pads": [1, 1, 1, 1], "dilations": [2, 1]})) is None
    quantize = fuzz.Case("DynamicQuantizeLinear", {"x": np.array([1.0, 2.0], np.float32)}, {})
    assert fuzz.known_departure(quantize) is None
    assert fuzz.known_departure(quantize._replace(inputs={"x": np.ones(3, np.float32)})) is not None
    # OneHot: only version 9 with a negative index (jonnx follows that version's text there).
    inputs = {"i": np.array([-1, 2]), "depth": np.array(4), "values": np.array([0.0, 1.0], np.float32)}
    one_hot = fuzz.Case("OneHot", inputs, {"axis": -1}, opset=9)
    assert fuzz.known_departure(one_hot) is not None
    assert fuzz.known_departure(one_hot._replace(opset=11)) is None
    assert fuzz.known_departure(one_hot._replace(inputs={**inputs, "i": np.array([1, 2])})) is None
    # Pad: only mode wrap before opset 19.
    pad = fuzz.Case("Pad", {"x": np.zeros((2, 2)), "pads": np.ones(4, np.int64)}, {"mode": "wrap"}, opset=15)
    assert fuzz.known_departure(pad) is not None
    assert fuzz.known_departure(pad._replace(opset=19)) is None
    assert fuzz.known_departure(pad._replace(attrs={"mode": "edge"})) is None
    # Flatten: only a negative axis before opset 11.
    flatten = fuzz.Case("Flatten", {"x": np.zeros(3)}, {"axis": -1}, opset=9)
    assert fuzz.known_departure(flatten) is not None
    assert fuzz.known_departure(flatten._replace(opset=11)) is None
    assert fuzz.known_departure(flatten._replace(attrs={"axis": 1})) is None
    # Hardmax: only before opset 13 and in float64, where onnxruntime has no kernel.
    hardmax = fuzz.Case("Hardmax", {"x": np.zeros((1, 4, 3), np.float64)}, {"axis": 1}, opset=7)
    assert fuzz.known_departure(hardmax) is not None
    assert fuzz.known_departure(hardmax._replace(opset=13)) is None
    assert fuzz.known_departure(hardmax._replace(inputs={"x": np.zeros((1, 4, 3), np.float32)})) is None


def test_departures_added_on_2026_12_02_are_narrow():
    x = np.zeros((1, 1, 2, 2), np.float32)
    # A window longer than its padded input; with one cell of padding it fits.
    pool = fuzz.Case("MaxPool", {"x": x}, {"kernel_shape": [3, 1], "strides": [1, 1]})
    assert fuzz.known_departure(pool) is not None
    assert fuzz.known_departure(pool._replace(attrs={**pool.attrs, "pads": [1, 0, 0, 0]})) is None
    # SAME pooling whose padding would be negative: a window shorter than the stride.
    same = fuzz.Case("MaxPool", {"x": x}, {"kernel_shape": [1, 2], "strides": [2, 2], "auto_pad": "SAME_UPPER"})
    assert fuzz.known_departure(same) is not None
    assert fuzz.known_departure(same._replace(attrs={**same.attrs, "kernel_shape": [2, 2]})) is None
    # ConvTranspose, SAME, a kernel shorter than the stride.
    w = np.zeros((1, 1, 1, 2), np.float32)
    transpose = fuzz.Case("ConvTranspose", {"x": x, "w": w}, {"strides": [2, 2], "auto_pad": "SAME_LOWER"})
    assert fuzz.known_departure(transpose) is not None
    assert fuzz.known_departure(transpose._replace(attrs={"strides": [1, 2], "auto_pad": "SAME_LOWER"})) is None
    # A symmetric window of one point; periodic, or of two points, it is compared.
    window = fuzz.Case("HannWindow", {"size": np.array(1, np.int64)}, {"periodic": 0})
    assert fuzz.known_departure(window) is not None
    assert fuzz.known_departure(window._replace(attrs={"periodic": 1})) is None
    assert fuzz.known_departure(window._replace(inputs={"size": np.array(2, np.int64)})) is None
    # BRANCH_NEQ meeting a NaN that no missing-value track sends to the true branch.
    tree = {"nodes_modes": ["BRANCH_NEQ", "LEAF", "LEAF"], "nodes_missing_value_tracks_true": [0, 0, 0]}
    neq = fuzz.Case("TreeEnsembleRegressor", {"x": np.array([[np.nan]], np.float32)}, tree)
    assert fuzz.known_departure(neq) is not None
    assert fuzz.known_departure(neq._replace(inputs={"x": np.zeros((1, 1), np.float32)})) is None
    tracked = {**tree, "nodes_missing_value_tracks_true": [1, 1, 1]}
    assert fuzz.known_departure(neq._replace(attrs=tracked)) is None


def test_string_and_resize_departures_are_narrow():
    def strings(*values):
        return np.array(list(values), object)

    # StringSplit without a delimiter: only strings holding whitespace other than spaces.
    split = fuzz.Case("StringSplit", {"x": strings("a\tb", "c")}, {})
    assert fuzz.known_departure(split) is not None
    assert fuzz.known_departure(split._replace(inputs={"x": strings("a b", "c")})) is None
    # ... and an empty string split by a delimiter.
    by_comma = fuzz.Case("StringSplit", {"x": strings("", "a,b")}, {"delimiter": ","})
    assert fuzz.known_departure(by_comma) is not None
    assert fuzz.known_departure(by_comma._replace(inputs={"x": strings("a,,b")})) is None
    # StringNormalizer upper-casing a ß; lower-casing it is compared.
    upper = fuzz.Case("StringNormalizer", {"x": strings("straße")}, {"case_change_action": "UPPER"})
    assert fuzz.known_departure(upper) is not None
    assert fuzz.known_departure(upper._replace(attrs={"case_change_action": "LOWER"})) is None
    # Resize with pytorch_half_pixel down to one sample along some axis.
    x = np.zeros((1, 1, 5), np.float32)
    attrs = {"mode": "cubic", "coordinate_transformation_mode": "pytorch_half_pixel"}
    resize = fuzz.Case("Resize", {"x": x, "sizes": np.array([1, 1, 1], np.int64)}, attrs)
    assert fuzz.known_departure(resize) is not None
    assert fuzz.known_departure(resize._replace(inputs={"x": x, "sizes": np.array([1, 1, 2], np.int64)})) is None
    half_pixel = {**attrs, "coordinate_transformation_mode": "half_pixel"}
    assert fuzz.known_departure(resize._replace(attrs=half_pixel)) is None


def test_label_encoder_nan_departure_is_narrow():
    # LabelEncoder-2 compares keys by bits, so a NaN key maps the same NaN (onnxruntime and
    # the onnx reference never match it); at opset 4 onnxruntime matches it, as jonnx does.
    x = np.array([[np.nan], [-1.0]], np.float32)
    attrs = {"keys_floats": [float("nan"), -1.0], "values_int64s": [-2, 0]}
    case = fuzz.Case("LabelEncoder", {"x": x}, attrs, domain="ai.onnx.ml", opset=2)
    assert fuzz.known_departure(case) is not None
    assert fuzz.known_departure(case._replace(opset=4)) is None
    assert fuzz.known_departure(case._replace(inputs={"x": np.array([[-1.0]], np.float32)})) is None


def test_cast_map_departure_is_narrow():
    # onnxruntime writes "0.f" in a SPARSE string cast's cells that no key fills; a full map,
    # a DENSE cast or a numeric one is compared.
    x = fuzz.Map(np.int64, np.float32, {0: 1.5, 2: -1.0})
    case = fuzz.Case("CastMap", {"x": x}, {"cast_to": "TO_STRING", "map_form": "SPARSE", "max_map": 4})
    assert fuzz.known_departure(case) is not None
    assert fuzz.known_departure(case._replace(attrs={**case.attrs, "max_map": 2})) is None
    assert fuzz.known_departure(case._replace(attrs={**case.attrs, "map_form": "DENSE"})) is None
    assert fuzz.known_departure(case._replace(attrs={**case.attrs, "cast_to": "TO_FLOAT"})) is None


# The numpy formulas (fuzz.FORMULAS) are only a reference if they are right: each against
# onnxruntime on a case it runs.
FORMULA_CASES = [
    ("LRN", {"x": (2, 5, 3, 2)}, {"size": 3, "alpha": 0.01, "beta": 0.75, "bias": 2.0}, 21),
    ("MeanVarianceNormalization", {"x": (2, 3, 4, 2)}, {"axes": [0, 2]}, 21),
    ("GroupNormalization", {"x": (2, 4, 3), "scale": (2,), "bias": (2,)}, {"num_groups": 2}, 18),
    ("GroupNormalization", {"x": (2, 4, 3), "scale": (4,), "bias": (4,)}, {"num_groups": 2}, 21),
    ("RMSNormalization", {"x": (2, 3, 4), "scale": (3, 4)}, {"axis": 1, "epsilon": 1e-2}, 23),
    ("RMSNormalization", {"x": (2, 3, 4), "scale": (4,)}, {"axis": -1, "stash_type": 11}, 23),
]


@pytest.mark.parametrize(("op", "shapes", "attrs", "opset"), FORMULA_CASES, ids=lambda v: str(v)[:30])
def test_formulas_agree_with_onnxruntime(op, shapes, attrs, opset):
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    feeds = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}
    model = fuzz.node_model(op, feeds, 1, opset=opset, **attrs)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert not fuzz.differences(fuzz.formula_reference(model, feeds), want)


def test_a_case_both_references_refuse_is_checked_by_its_formula(monkeypatch):
    # LRN of a 3-D input: onnxruntime and the ReferenceEvaluator take only 4-D ones.
    x = np.random.default_rng(1).standard_normal((2, 4, 5)).astype(np.float32)
    model = fuzz.node_model("LRN", {"x": x}, 1, opset=21, size=3, alpha=0.5)
    assert fuzz.check(model, {"x": x}) == ("ok", None)
    # and a formula that disagrees with jonnx is reported, not passed over
    lrn = fuzz.FORMULAS["LRN"]
    monkeypatch.setitem(fuzz.FORMULAS, "LRN", lambda x, **attrs: lrn(x, **{**attrs, "alpha": 0.25}))
    verdict, detail = fuzz.check(model, {"x": x})
    assert verdict == "differs" and "the formula" in detail


# onnxruntime 1.32 has no kernel for int8 A with uint8 B, the case the formula stands in for
@pytest.mark.parametrize(("a_type", "b_type"), [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)])
def test_matmul_integer_to_float_formula_agrees_with_onnxruntime(a_type, b_type):
    import onnxruntime as ort

    rng = np.random.default_rng(2)
    feeds = {
        "a": rng.integers(0, 100, (2, 3, 4)).astype(a_type),
        "b": rng.integers(0, 100, (4, 5)).astype(b_type),
        "a_scale": np.array(0.03, np.float32),
        "b_scale": np.linspace(0.01, 0.05, 5, dtype=np.float32),
        "a_zero": np.array(7, a_type),
        "b_zero": rng.integers(0, 100, 5).astype(b_type),
        "bias": rng.standard_normal(5).astype(np.float32),
    }
    model = fuzz.node_model("MatMulIntegerToFloat", feeds, 1, opset=1, domain="com.microsoft")
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert not fuzz.differences(fuzz.formula_reference(model, feeds), want)


@pytest.mark.parametrize("op", ["RNN", "LSTM"])  # onnxruntime 1.32 aborts on a GRU over no steps
def test_recurrent_formula_covers_empty_sequences_only(op):
    import onnxruntime as ort

    rng = np.random.default_rng(3)
    gates = {"RNN": 1, "LSTM": 4}[op]
    x = np.zeros((0, 2, 3), np.float32)
    w, r = rng.standard_normal((1, gates * 4, 3)), rng.standard_normal((1, gates * 4, 4))
    feeds = {"x": x, "w": w.astype(np.float32), "r": r.astype(np.float32)}
    model = fuzz.node_model(op, feeds, 1, opset=14, hidden_size=4)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert not fuzz.differences(fuzz.formula_reference(model, feeds), want)  # Y: (0, 1, 2, 4)
    # with states asked for, the initial ones (zeros here: none given)
    two = fuzz.node_model(op, feeds, 2, opset=14, hidden_size=4)
    y, y_h = fuzz.formula_reference(two, feeds)
    assert y.shape == (0, 1, 2, 4) and y_h.shape == (1, 2, 4) and not y_h.any()
    # a sequence of steps is left to the references
    steps = {**feeds, "x": rng.standard_normal((2, 2, 3)).astype(np.float32)}
    assert fuzz.formula_reference(model, steps) is None


def test_finite_differences_allow_for_the_loss_rounding():
    # SkipLayerNormalization over one element with a tiny epsilon: its inverse standard
    # deviation output is 1/sqrt(epsilon), and the projected loss rounds by enough that a
    # difference quotient over 2e-6 is off by more than the check allows (seed 302's case 757
    # with epsilon 1e-12: 1.6e-4; here 1e-14).
    rng = np.random.default_rng(0)
    inputs = {
        "x": rng.standard_normal((4, 4, 1)),
        "skip": rng.standard_normal((4, 4, 1)),
        "gamma": rng.standard_normal(1),
    }
    case = fuzz.Case("SkipLayerNormalization", inputs, {"epsilon": 1e-14}, n_outputs=3, domain="com.microsoft")
    model = node_model(case.op, inputs, 3, opset=1, domain=case.domain, epsilon=1e-14)
    with jax.enable_x64(True):
        assert fuzz.check_gradient(case, model, inputs, np.random.default_rng(1)) == ("ok", None)


def test_finite_differences_see_a_wrong_derivative(monkeypatch):
    @jax.custom_jvp
    def neg_expm1(x):
        return jnp.expm1(jnp.minimum(x, 0))

    @neg_expm1.defjvp
    def _doubled(primals, tangents):
        (x,), (t,) = primals, tangents
        return neg_expm1(x), 2 * jnp.exp(jnp.minimum(x, 0)) * t  # twice the derivative

    monkeypatch.setattr(activation, "_neg_expm1", neg_expm1)  # Elu's negative side
    x = {"x": np.array([[-1.5, -0.7], [-2.0, -0.3]])}
    with jax.enable_x64(True):
        verdict, detail = fuzz.check_gradient(
            fuzz.Case("Elu", x, {"alpha": 1.0}), node_model("Elu", x, opset=6, alpha=1.0), x, np.random.default_rng(1)
        )
    assert verdict == "differs" and "finite differences" in detail


@pytest.mark.parametrize("opset", [7, 11, 16])
def test_formulas_stay_out_of_opsets_that_lack_their_op(opset):
    # A run at an old --opset draws GroupNormalization (since opset 18) into a model neither
    # reference loads: no formula stands in there (it crashed the runs at opsets 7, 11 and 16).
    x = np.zeros((0, 4, 2), np.float32)
    inputs = {"x": x, "scale": np.ones(4, np.float32), "bias": np.zeros(4, np.float32)}
    model = node_model("GroupNormalization", inputs, opset=opset, num_groups=2)
    assert fuzz.formula_reference(model, {"x": x}) is None
    with jax.enable_x64(True):
        _, findings = fuzz.run(seed=304, cases=CASES, families=["normalization"], opset=opset)
    assert not findings


def test_refusing_an_invalid_model_is_not_a_finding():
    # Resize's antialias attribute arrived in opset 18: at opset 16 the model is invalid, the
    # ReferenceEvaluator runs it anyway, and jonnx's refusal is right.
    x = np.arange(8, dtype=np.float32).reshape(1, 1, 2, 4)
    scales = np.array([1, 1, 2, 2], np.float32)
    inputs = {"x": x, "roi": None, "scales": scales}
    model = node_model("Resize", inputs, opset=16, mode="linear", antialias=1, initializers=["scales"])
    assert fuzz.check(model, {"x": x}) == ("invalid model", None)
    model = node_model("Resize", inputs, opset=18, mode="linear", antialias=1, initializers=["scales"])
    assert fuzz.check(model, {"x": x}) == ("ok", None)


def test_gradient_and_vmap_checks_count_invalid_models():
    # At an old --opset a later version's form is drawn; jonnx refuses it, and the gradient and
    # vmap checks call that an invalid model, not a model jonnx does not run.
    x = np.arange(8, dtype=np.float32).reshape(1, 1, 2, 4)
    scales = np.array([1, 1, 2, 2], np.float32)
    inputs = {"x": x, "roi": None, "scales": scales}
    rng = np.random.default_rng(0)
    model = node_model("Resize", inputs, opset=16, mode="linear", antialias=1, initializers=["scales"])
    case = fuzz.Case("Resize", inputs, {"mode": "linear", "antialias": 1})
    assert fuzz.check_gradient(case, model, {"x": x}, rng) == ("invalid model", None)
    assert fuzz.check_vmap(model, {"x": x}, rng) == ("invalid model", None)
    # A valid model jonnx does not run (here: an input of the wrong rank) is still that.
    model = node_model("Resize", inputs, opset=18, mode="linear", antialias=1, initializers=["scales"])
    assert fuzz.check_gradient(case, model, {"x": x[0]}, rng) == ("does not run", None)


def test_an_error_on_a_valid_model_is_a_finding(monkeypatch):
    # The fuzzers' models leave their outputs untyped, which onnx.checker.check_model refuses in
    # every one: asking it whether a model is invalid made every error "invalid model".
    x = np.ones((2, 3), np.float32)
    model = node_model("Relu", {"x": x}, opset=21)
    assert fuzz.invalid_reason(model) is None

    def refuse(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(fuzz.jonnx, "load", refuse)
    verdict, detail = fuzz.check(model, {"x": x})
    assert verdict == "raises" and "a bug" in detail


def test_running_a_model_the_checker_refuses_is_a_finding(monkeypatch):
    # ReduceSum-1 takes its axes as an attribute: with an axes input neither reference loads
    # the model, and jonnx must refuse it rather than reduce over every axis.
    x = np.ones((2, 3), np.float32)
    model = node_model("ReduceSum", {"x": x, "axes": np.array([1])}, opset=7, initializers=["axes"])
    assert "input size 2" in fuzz.invalid_reason(model)
    assert fuzz.check(model, {"x": x}) == ("invalid model", None)
    monkeypatch.setattr(jonnx._build, "_check_counts", lambda *args: None)
    verdict, detail = fuzz.check(model, {"x": x})
    assert verdict == "runs an invalid model" and "input size 2" in detail


def test_old_binary_forms_are_checked_by_their_formula(monkeypatch):
    # Before opset 7 B broadcasts from `axis` on: onnxruntime runs none of those versions and
    # the ReferenceEvaluator broadcasts as numpy does (from the last axis), so a formula decides.
    with jax.enable_x64(True):  # int64 exact, as the fuzz runs
        rng = np.random.default_rng(0)
        a, b = rng.standard_normal((2, 3, 4)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
        model = node_model("Add", {"a": a, "b": b}, opset=6, broadcast=1, axis=1)
        (want,) = fuzz.formula_reference(model, {"a": a, "b": b}, fuzz.OLD_FORMS)
        np.testing.assert_array_equal(want, a + b[:, None])
        assert fuzz.check(model, {"a": a, "b": b}) == ("ok", None)
        # Integer Div of version 6 rounds toward zero, as C does.
        ints = {"a": np.array([-7, 7, 6], np.int64), "b": np.array([2, -2, 4], np.int64)}
        div = node_model("Div", ints, opset=6)
        np.testing.assert_array_equal(fuzz.formula_reference(div, ints, fuzz.OLD_FORMS)[0], [-3, -3, 1])
        assert fuzz.check(div, ints) == ("ok", None)
        # Shapes the version does not take (no broadcast=1): an invalid model, which jonnx refuses.
        bare = node_model("Add", {"a": a, "b": b[None, :, None]}, opset=6)
        assert fuzz.invalid_reason(bare) is not None
        assert fuzz.check(bare, {"a": a, "b": b[None, :, None]}) == ("invalid model", None)
        # A formula that disagrees with jonnx is reported.
        monkeypatch.setitem(fuzz.OLD_FORMS, "Add", functools.partial(fuzz._legacy_binary_formula, np.subtract))
        verdict, detail = fuzz.check(model, {"a": a, "b": b})
        assert verdict == "differs" and "OLD_FORMS" in detail


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize(("trans_a", "trans_b", "c_shape"), [(0, 0, (3,)), (1, 0, ()), (0, 1, (2, 3)), (1, 1, (2, 1))])
def test_old_gemm_formula_agrees_with_onnxruntimes_gemm_7(trans_a, trans_b, c_shape, dtype):
    # Gemm-6 with broadcast=1 is Gemm-7's form; onnxruntime runs only the later one, and its
    # float16 Gemm rounds once, where the ReferenceEvaluator rounds after each step.
    import onnxruntime as ort

    rng = np.random.default_rng(6)
    a = rng.standard_normal((4, 2) if trans_a else (2, 4)).astype(dtype)
    b = rng.standard_normal((3, 4) if trans_b else (4, 3)).astype(dtype)
    feeds = {"a": a, "b": b, "c": rng.standard_normal(c_shape).astype(dtype)}
    attrs = dict(transA=trans_a, transB=trans_b, alpha=0.7, beta=1.3)
    old = node_model("Gemm", feeds, opset=6, broadcast=1, **attrs)
    later = node_model("Gemm", feeds, opset=7, **attrs)
    want = ort.InferenceSession(later.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_allclose(fuzz.formula_reference(old, feeds, fuzz.OLD_FORMS)[0], want[0], rtol=1e-6)
    with jax.enable_x64(True):
        assert fuzz.check(old, feeds) == ("ok", None)
    # without broadcast=1 only a C of the output's shape is the form's: another is an invalid
    # model (no reference runs it), which jonnx refuses
    plain = node_model("Gemm", feeds, opset=6, **attrs)
    assert (fuzz.formula_reference(plain, feeds, fuzz.OLD_FORMS) is None) == (c_shape != (2, 3))
    assert (fuzz.invalid_reason(plain) is None) == (c_shape == (2, 3))
    with jax.enable_x64(True):  # the formula, not the ReferenceEvaluator (which drops beta there)
        assert fuzz.check(plain, feeds) == (("invalid model", None) if c_shape != (2, 3) else ("ok", None))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_old_batchnorm_formula_agrees_with_onnxruntimes_version_7(dtype):
    # BatchNormalization-6 with is_test=1 computes version 7's inference; onnxruntime runs only
    # the later one (float16 in float32, rounded once; the ReferenceEvaluator rounds each step).
    import onnxruntime as ort

    rng = np.random.default_rng(7)
    feeds = {
        "x": rng.standard_normal((2, 3, 4, 5)).astype(dtype),
        **{name: rng.standard_normal(3).astype(dtype) for name in ("scale", "bias", "mean")},
        "var": np.abs(rng.standard_normal(3)).astype(dtype),
    }
    old = node_model("BatchNormalization", feeds, opset=6, is_test=1, epsilon=1e-2)
    later = node_model("BatchNormalization", feeds, opset=7, epsilon=1e-2)
    want = ort.InferenceSession(later.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    (got,) = fuzz.formula_reference(old, feeds, fuzz.OLD_FORMS)
    assert not fuzz.differences([got], want)
    with jax.enable_x64(True):
        assert fuzz.check(old, feeds) == ("ok", None)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("spatial", [1, 0])
def test_old_batchnorm_training_formula_agrees_with_onnxruntimes_version_15(spatial, dtype):
    # BatchNormalization-6 with is_test=0 trains: Y by the batch statistics and the running
    # statistics updated, as version 15's training_mode=1, which onnxruntime runs. Per
    # activation (spatial=0) is per channel with the activations as channels, which onnxruntime
    # runs too (it refuses spatial=0 in training).
    import onnxruntime as ort

    rng = np.random.default_rng(8)
    x = rng.standard_normal((4, 3, 5)).astype(dtype)
    params = (3,) if spatial else (3, 5)
    feeds = {"x": x, **{name: rng.standard_normal(params).astype(dtype) for name in ("scale", "bias", "mean")}}
    feeds["var"] = np.abs(rng.standard_normal(params)).astype(dtype)
    old = node_model("BatchNormalization", feeds, 3, opset=6, is_test=0, spatial=spatial, momentum=0.8)
    as_channels = {k: v.reshape(4, 15, 1) if k == "x" else v.reshape(-1) for k, v in feeds.items()}
    later_feeds = feeds if spatial else as_channels
    later = node_model("BatchNormalization", later_feeds, 3, opset=15, training_mode=1, momentum=0.8)
    session = ort.InferenceSession(later.SerializeToString(), providers=["CPUExecutionProvider"])
    want = [y.reshape(got.shape) for y, got in zip(session.run(None, later_feeds), feeds.values())]
    assert not fuzz.differences(fuzz.formula_reference(old, feeds, fuzz.OLD_FORMS), want)
    with jax.enable_x64(True):
        assert fuzz.check(old, feeds) == ("ok", None)


def test_old_batchnorm_training_formula_is_exact_where_float32_statistics_are_not():
    # Per activation over a batch of two whose values nearly agree (seed 801 with --long):
    # centred on plain float32 statistics the output is 4e-5 off float64 (jonnx was 1.6e-5 off
    # there, and the formula trained in float32 to pass it); jonnx's corrected batch mean
    # (ops/normalization.py ``corrected_moments``) is within 1.4e-7 of the float64 formula.
    rng = np.random.default_rng(11)
    first = rng.standard_normal((1, 4, 46)).astype(np.float32)
    x = np.concatenate([first, first + rng.uniform(-5e-3, 5e-3, first.shape).astype(np.float32)])
    feeds = {"x": x, **{name: rng.standard_normal((4, 46)).astype(np.float32) for name in ("scale", "bias", "mean")}}
    feeds["var"] = np.abs(rng.standard_normal((4, 46))).astype(np.float32)
    old = node_model("BatchNormalization", feeds, 3, opset=6, is_test=0, spatial=0)
    (y, *_) = fuzz.formula_reference(old, feeds, fuzz.OLD_FORMS)
    wide = x.astype(np.float64)
    exact = (wide - wide.mean(0)) / np.sqrt(wide.var(0) + 1e-5) * feeds["scale"] + feeds["bias"]
    np.testing.assert_array_equal(y, exact.astype(np.float32))
    plain = x - x.mean(0)
    in_float32 = plain / np.sqrt((plain * plain).mean(0) + np.float32(1e-5)) * feeds["scale"] + feeds["bias"]
    assert np.abs(in_float32 - exact).max() > 1e-5  # the case is one plain float32 statistics miss
    with jax.enable_x64(True):
        assert fuzz.check(old, feeds) == ("ok", None)


def test_gradient_and_vmap_checks_run_models_that_update_running_statistics():
    # With its running statistics as initializers, a training-mode BatchNormalization makes
    # Model.apply return (outputs, new_state): the checks take the outputs (they called every
    # such case "not differentiable" / "not batchable"); the running statistics, which carry no
    # gradient by design, are left out of the projection.
    rng = np.random.default_rng(9)
    x = rng.standard_normal((3, 2, 4))
    params = {name: rng.standard_normal(2) for name in ("scale", "bias", "mean")} | {"var": np.ones(2)}
    inputs = {"x": x, **params}
    model = node_model("BatchNormalization", inputs, 3, opset=15, training_mode=1, initializers=["mean", "var"])
    case = fuzz.Case("BatchNormalization", inputs, {"training_mode": 1}, 3)
    feeds = {k: v for k, v in inputs.items() if k not in ("mean", "var")}
    with jax.enable_x64(True):
        assert fuzz.check_gradient(case, model, feeds, rng) == ("ok", None)
        assert fuzz.check_vmap(model, feeds, rng) == ("ok", None)


def test_an_op_formula_settles_a_disagreement_with_onnxruntime():
    # MeanVarianceNormalization-13 over a unit axis: onnxruntime (its float16 kernel, from
    # opset 21) leaves out the function body's epsilon (NaN), and the ReferenceEvaluator refuses
    # float16 (the body adds a float32 epsilon); jonnx's 0 equals the formula (in float32,
    # rounded once).
    x = np.random.default_rng(10).standard_normal((1, 4, 3)).astype(np.float16)
    model = node_model("MeanVarianceNormalization", {"x": x}, opset=21, axes=[0])
    np.testing.assert_array_equal(fuzz.formula_reference(model, {"x": x})[0], np.zeros_like(x))
    with jax.enable_x64(True):
        assert fuzz.check(model, {"x": x}) == ("reference disagrees", None)


def test_the_reference_evaluator_in_float64_settles_its_own_half_precision_steps():
    # ReduceL2-1 in float16, which onnxruntime refuses: the ReferenceEvaluator squares and sums
    # in float16 (3.252), jonnx in float32 rounded once (3.25, the correctly rounded norm).
    x = np.array([[-2.652, 0.8257, 0.05646, 0.5244], [1.394, -0.3872, 0.2072, -0.6616]], np.float16)
    model = node_model("ReduceL2", {"x": x}, opset=1, keepdims=0)
    exact = np.sqrt(np.sum(x.astype(np.float64) ** 2)).astype(np.float16)
    assert fuzz.ReferenceEvaluator(model).run(None, {"x": x})[0] != exact
    assert fuzz.widened_outputs(model, {"x": x})[0].astype(np.float16) == exact
    with jax.enable_x64(True):
        assert fuzz.check(model, {"x": x}) == ("reference disagrees", None)
    cast = node_model("Cast", {"x": x}, opset=21, to=onnx.TensorProto.FLOAT)
    assert fuzz.widened_outputs(cast, {"x": x}) is None  # its output type is the attribute's


def test_near_ties_settle_only_one_unit_at_a_midpoint():
    # Exact values at 1e-4 of a float16 unit from the midpoint of two neighbours: float32
    # arithmetic may round them either way, so either neighbour stands. A result two units off,
    # or one unit off a value far from any midpoint, does not.
    lo, hi = np.float16(1.0), np.nextafter(np.float16(1.0), np.float16(2.0))
    unit = float(hi) - float(lo)
    tie = float(lo) + unit * (0.5 - 1e-4)  # rounds to lo, by a hair
    far = float(lo) + unit * 0.3
    exact = [np.array([tie, tie, far, tie]), np.array(7, np.int64)]
    two_up = np.nextafter(hi, np.float16(2.0))
    got = [np.array([hi, lo, hi, two_up], np.float16), np.array(7, np.int64)]
    settled = fuzz.settle_near_ties(got, exact)
    np.testing.assert_array_equal(settled[0], np.array([hi, lo, lo, lo], np.float16))
    assert settled[1] == 7
    assert fuzz.differences(got, settled) == ["output 0: values differ by up to 0.00195"]
    fixed = [np.array([hi, lo, lo, hi], np.float16), got[1]]
    assert not fuzz.differences(fixed, fuzz.settle_near_ties(fixed, exact))


def test_vmap_rows_of_float16_may_round_a_unit_apart():
    # Under jax.vmap XLA may sum a float16 op's float32 values in another order, so a row may
    # round a near tie the other way; one unit apart stands there, two do not, and other types
    # are compared as they are.
    want = np.array([1.0, 2.0, -0.5], np.float16)
    one_up = np.nextafter(want, np.float16(np.inf))
    np.testing.assert_array_equal(fuzz.one_unit_settled(one_up, want), one_up)
    two_up = np.nextafter(one_up, np.float16(np.inf))
    assert fuzz.difference(two_up, fuzz.one_unit_settled(two_up, want))
    wide = want.astype(np.float32)
    assert fuzz.one_unit_settled(np.nextafter(wide, np.float32(np.inf)), wide) is wide


def test_widened_outputs_fall_back_to_the_formula_in_float64():
    # MeanVarianceNormalization's function body adds a float32 epsilon, which the
    # ReferenceEvaluator refuses in float64: its formula gives the exact values instead, so a
    # float16 near tie there settles too (seed 805 with --long --half).
    x = np.random.default_rng(12).standard_normal((1, 6, 5, 4)).astype(np.float16)
    model = node_model("MeanVarianceNormalization", {"x": x}, opset=21, axes=[0, 2, 3])
    wide = x.astype(np.float64)
    mean = wide.mean((0, 2, 3), keepdims=True)
    exact = (wide - mean) / (np.sqrt((wide**2).mean((0, 2, 3), keepdims=True) - mean**2) + 1e-9)
    (got,) = fuzz.widened_outputs(model, {"x": x})
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, exact, rtol=1e-12)


def test_average_pool_1_is_checked_against_version_7():
    # AveragePool-1 divides by the cells without the pads (its text): jonnx equals version 7's
    # count_include_pad=0 in onnxruntime, where the ReferenceEvaluator counts the pads. The
    # fuzz asks onnxruntime for the later form (a known departure until 2026-12-05).
    import onnxruntime as ort
    from onnx.reference import ReferenceEvaluator

    x = np.random.default_rng(0).standard_normal((1, 2, 6, 6)).astype(np.float32)
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}
    old, new = (node_model("AveragePool", {"x": x}, opset=opset, **attrs) for opset in (1, 7))
    want = ort.InferenceSession(new.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = np.asarray(jonnx.load(old)(x)[0])
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert not np.allclose(ReferenceEvaluator(old).run(None, {"x": x})[0], want, rtol=1e-3)
    with jax.enable_x64(True):
        assert fuzz.check(old, {"x": x}) == ("ok", None)


@pytest.mark.parametrize("family", ["elementwise", "normalization", "reduce", "recurrent", "loss", "products"])
def test_half_precision_cases_agree_with_onnxruntime(family, monkeypatch):
    # The fuzz's --half: float16 wherever the family draws floats. jonnx computes those ops in
    # float32 and rounds once, as onnxruntime does (step by step, a third of such cases were
    # one to four units in the last place off). Gemm before opset 7, which onnxruntime does
    # not run, meets its formula (the ReferenceEvaluator rounds between steps).
    monkeypatch.setattr(fuzz, "FLOATS", (np.float16,))
    with jax.enable_x64(True):
        verdicts, findings = fuzz.run(seed=2026, cases=CASES, families=[family])
    assert not findings
    assert verdicts["ok"] >= CASES // 2


def _scan_model(in_axis: int, in_direction: int, out_axis: int, out_direction: int) -> onnx.ModelProto:
    """A Scan carrying ``s`` over the steps of ``x`` along ``in_axis``: s += tanh(0.7 x_t), y_t =
    s * x_t, in float32."""
    f32 = onnx.TensorProto.FLOAT
    body = oh.make_graph(
        [
            oh.make_node("Mul", ["x_t", "scale"], ["scaled"]),
            oh.make_node("Tanh", ["scaled"], ["stepped"]),
            oh.make_node("Add", ["s_in", "stepped"], ["s_out"]),
            oh.make_node("Mul", ["s_out", "x_t"], ["y_t"]),
        ],
        "body",
        [oh.make_tensor_value_info("s_in", f32, [3]), oh.make_tensor_value_info("x_t", f32, [3])],
        [oh.make_tensor_value_info("s_out", f32, [3]), oh.make_tensor_value_info("y_t", f32, [3])],
        [onh.from_array(np.array(0.7, np.float32), "scale")],
    )
    attrs = dict(
        num_scan_inputs=1,
        scan_input_axes=[in_axis],
        scan_input_directions=[in_direction],
        scan_output_axes=[out_axis],
        scan_output_directions=[out_direction],
    )
    x = np.zeros((4, 3) if in_axis == 0 else (3, 4), np.float32)
    return node_model("Scan", {"s": np.zeros(3, np.float32), "x": x}, 2, opset=16, body=body, **attrs)


@pytest.mark.parametrize("form", [(0, 0, 0, 0), (1, 0, 0, 0), (0, 1, 0, 0), (0, 0, 1, 0), (1, 1, 1, 1)])
def test_step_by_step_scan_agrees_with_onnxruntime(form):
    # The half-precision reference for Scan (fuzz.StepByStep), checked in float32, where
    # onnxruntime rounds after each node: every axis and direction the ReferenceEvaluator's own
    # Scan refuses.
    import onnxruntime as ort

    model = _scan_model(*form)
    rng = np.random.default_rng(3)
    feeds = {"s": rng.standard_normal(3).astype(np.float32), "x": rng.standard_normal((4, 3)).astype(np.float32)}
    if form[0] == 1:
        feeds["x"] = feeds["x"].T.copy()
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = fuzz.ReferenceEvaluator(model, new_ops=fuzz.STEP_BY_STEP).run(None, feeds)
    assert not fuzz.differences(got, want)
    assert fuzz.differences(got, [want[0], want[1][::-1]])  # it would see a reversed output


def test_step_by_step_loop_stacks_scan_outputs_as_onnxruntime():
    # The ReferenceEvaluator's Loop stacks a scalar scan output as (N, 1) and a matrix's rows
    # end to end; StepByStep's stacks them as onnxruntime (and the specification) do.
    import onnxruntime as ort

    f32 = onnx.TensorProto.FLOAT
    body = oh.make_graph(
        [
            oh.make_node("Identity", ["c_in"], ["c_out"]),
            oh.make_node("Mul", ["h_in", "scale"], ["h_out"]),
            oh.make_node("ReduceSum", ["h_out"], ["energy"], keepdims=0),
            oh.make_node("Identity", ["h_out"], ["h_row"]),
        ],
        "body",
        [
            oh.make_tensor_value_info("i", onnx.TensorProto.INT64, []),
            oh.make_tensor_value_info("c_in", onnx.TensorProto.BOOL, []),
            oh.make_tensor_value_info("h_in", f32, [2, 3]),
        ],
        [
            oh.make_tensor_value_info(name, elem, None)
            for name, elem in (("c_out", onnx.TensorProto.BOOL), ("h_out", f32), ("energy", f32), ("h_row", f32))
        ],
        [onh.from_array(np.array(-1.3, np.float32), "scale")],
    )
    h = np.random.default_rng(4).standard_normal((2, 3)).astype(np.float32)
    model = node_model("Loop", {"M": np.array(4, np.int64), "cond": None, "h": h}, 3, opset=16, body=body)
    feeds = {"M": np.array(4, np.int64), "h": h}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = fuzz.ReferenceEvaluator(model, new_ops=fuzz.STEP_BY_STEP).run(None, feeds)
    assert [np.shape(y) for y in want] == [(2, 3), (4,), (4, 2, 3)]
    assert not fuzz.differences(got, want)


def test_half_precision_loops_are_checked_step_by_step(monkeypatch):
    # onnxruntime computes a float16 Loop or Scan body in float32 and rounds once; the fuzz's
    # reference for those is StepByStep's, which rounds after each node as the types say. The
    # --half run of seed 702 had 52 of 300 cases "differ" from onnxruntime: all were its.
    monkeypatch.setattr(fuzz, "FLOATS", (np.float16,))
    with jax.enable_x64(True):
        verdicts, findings = fuzz.run(seed=2026, cases=CASES, families=["loop"])
    assert not findings
    assert verdicts["ok"] >= CASES // 2


def test_long_half_precision_axes_agree_with_the_references(monkeypatch):
    # --half --long: float16 over an axis of up to 64 values, where a sum rounded at each step
    # shows. At this seed a ReduceSum differed before 2026-12-05 (summed in float16).
    monkeypatch.setattr(fuzz, "FLOATS", (np.float16,))
    monkeypatch.setattr(fuzz, "LONG_AXIS", 64)
    assert max(max(fuzz.Draw(s).shape(rank=2), default=0) for s in range(20)) > 4
    with jax.enable_x64(True):
        verdicts, findings = fuzz.run(seed=2028, cases=3 * CASES, families=["reduce"])
    assert not findings
    assert verdicts["ok"] >= CASES


def test_drawn_lengths_grow_only_under_long(monkeypatch):
    # Draw.length draws what Draw.int draws without --long, so that seeds keep their cases.
    assert [fuzz.Draw(s).length(1, 4) for s in range(50)] == [fuzz.Draw(s).int(1, 4) for s in range(50)]
    monkeypatch.setattr(fuzz, "LONG_AXIS", 64)
    lengths = [fuzz.Draw(s).length(1, 4) for s in range(50)]
    assert min(lengths) >= 1 and max(lengths) > 32


def test_long_recurrences_stay_bounded_and_agree(monkeypatch):
    # --long draws sequences of up to 64 steps and states of up to 64 values. An unbounded
    # activation there grew GRU states to 1e29 (seed 802), gates below 0 doubled rounding
    # errors at each step (seed 824), and recurrent weights of gain 0.5 sqrt(hidden) made a
    # chaotic network: float32 engines parted after a few steps. Long sequences now draw
    # bounded activations and gates within [0, 1] only, long states weights of gain 0.75.
    monkeypatch.setattr(fuzz, "LONG_AXIS", 64)
    d = fuzz.Draw(2029)
    cases = [c for c in (fuzz.recurrent(d) for _ in range(200)) if c is not None]
    long = [c for c in cases if c.inputs["x"].shape[1 if c.attrs.get("layout") else 0] > 4]
    assert len(long) > 50
    for case in long:
        names = case.attrs.get("activations", [])
        assert set(names) <= set(fuzz.BOUNDED_GATES)
        if case.op != "RNN":  # each direction's first activation is the gates'
            per_direction = 2 if case.op == "GRU" else 3
            assert set(names[::per_direction]) <= {"Sigmoid", "HardSigmoid"}  # within [0, 1]
    for case in cases:
        hidden = case.attrs["hidden_size"]
        if hidden > 4:
            r = case.inputs["r"].reshape(-1, hidden, hidden)  # each direction's gate blocks
            assert max(np.linalg.norm(block, 2) for block in r) < 2.5  # 0.75 sqrt(hidden) times 2 at most
            assert case.inputs["r"].dtype == case.inputs["x"].dtype
    with jax.enable_x64(True):
        verdicts, findings = fuzz.run(seed=2029, cases=CASES, families=["recurrent"])
    assert not findings
    assert verdicts["ok"] >= CASES // 2


def test_long_own_dimensions_agree_with_the_references(monkeypatch):
    # --long lengthens what the families draw for themselves (channels, maps, classes,
    # sequences, signals); at this seed two depthwise convolutions over 30 and 32 channels
    # run as shifted multiply-adds, channels-last.
    monkeypatch.setattr(fuzz, "LONG_AXIS", 64)
    families = ["normalization", "conv_pool", "loss", "attention", "resize", "signal", "recurrent"]
    with jax.enable_x64(True):
        verdicts, findings = fuzz.run(seed=2036, cases=3 * CASES, families=families)
        # detection: NonMaxSuppression of 8 boxes, MaxRoiPool of 35 regions, RoiAlign over 37-49 cells
        findings += fuzz.run(seed=2036, cases=CASES, families=["detection"])[1]
    assert not findings
    assert verdicts["ok"] >= 2 * CASES


_X = np.arange(24, dtype=np.float32).reshape(2, 3, 4) - 7.5
_IMAGE = np.array([[[[1, 2], [3, 4]]]], np.float32)


# Each old form's later twin, run by onnxruntime (float32) or the ReferenceEvaluator, against
# the old version's text worked out in numpy.
@pytest.mark.parametrize(
    ("op", "inputs", "attrs", "opset", "want"),
    [
        # Upsample-1's own example (nearest), and bilinear from the corners
        (
            "Upsample",
            {"x": _IMAGE},
            {"height_scale": 2.0, "width_scale": 2.0},
            1,
            [np.repeat(np.repeat(_IMAGE, 2, 2), 2, 3)],
        ),
        (
            "Upsample",
            {"x": _IMAGE},
            {"height_scale": 1.0, "width_scale": 2.0, "mode": "bilinear"},
            1,
            [np.array([[[[1, 1.5, 2, 2], [3, 3.5, 4, 4]]]], np.float32)],
        ),
        ("Concat", {"a": _X, "b": _X[:, :1]}, {}, 1, [np.concatenate([_X, _X[:, :1]], axis=1)]),  # axis 1 by default
        ("Tile", {"x": _X, "tiles": np.array(2), "axis": np.array(2)}, {}, 1, [np.tile(_X, (1, 1, 2))]),
        (
            "Pad",
            {"x": _X[0]},
            {"paddings": [0, 2, 0, 1], "value": 1.5},
            1,
            [np.pad(_X[0], ((0, 0), (2, 1)), constant_values=1.5)],
        ),
        (
            "Pad",
            {"x": _X[0]},
            {"pads": [1, 0, 1, 0], "mode": "edge"},
            2,
            [np.pad(_X[0], ((1, 1), (0, 0)), mode="edge")],
        ),
        ("Slice", {"x": _X}, {"starts": [1, -3], "ends": [2, 100], "axes": [0, 2]}, 1, [_X[1:2, :, 1:]]),
        ("Reshape", {"x": _X}, {"shape": [0, -1]}, 1, [_X.reshape(2, 12)]),  # 0 keeps the input's dimension
        ("Split", {"x": _X}, {"axis": 2, "split": [1, 3]}, 2, [_X[:, :, :1], _X[:, :, 1:]]),
        ("Clip", {"x": _X}, {"min": -2.0}, 6, [np.maximum(_X, -2.0)]),
        # AveragePool-1 divides by the cells inside the input, not the pads
        (
            "AveragePool",
            {"x": _IMAGE},
            {"kernel_shape": [2, 2], "pads": [1, 1, 0, 0]},
            1,
            [np.array([[[[1, 1.5], [2, 2.5]]]], np.float32)],
        ),
        ("LpPool", {"x": _IMAGE}, {"kernel_shape": [1, 2], "p": 1.0}, 1, [np.array([[[[3], [7]]]], np.float32)]),
        ("GlobalLpPool", {"x": _IMAGE}, {"p": 2.0}, 1, [np.array([[[[np.sqrt(30)]]]], np.float32)]),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_old_forms_are_checked_against_their_later_twins(op, inputs, attrs, opset, want):
    constants = [k for k in inputs if k in ("tiles", "axis")]
    model = node_model(op, inputs, len(want), opset=opset, initializers=constants, **attrs)
    feeds = {k: v for k, v in inputs.items() if k not in constants}
    twin = fuzz.later_twin(model, feeds)
    assert twin is not None
    got = fuzz.onnxruntime_outputs(model, feeds) or fuzz.formula_reference(model, feeds)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6)
    with jax.enable_x64(True):
        assert fuzz.check(model, feeds) == ("ok", None)
    assert (
        fuzz.later_twin(node_model(op, inputs, len(want), opset=13 if op != "Upsample" else 9, **attrs), feeds) is None
    )
