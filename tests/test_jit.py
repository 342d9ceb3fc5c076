"""jonnx.jit and the XLA compiler options every function jonnx compiles is built with.

The model below is the shape of the light model zoo's classifier head: a Gemm whose weight is
a ConstantOfShape fill, then Softmax. Plain ``jax.jit`` on jaxlib 0.10's CPU backend fuses
the dot (whose all-equal weight XLA holds as a broadcast) with the softmax's reductions and
returns garbage (docs/known_issues.md); everything jonnx compiles must not.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime as ort
import pytest

import jonnx
import jonnx.training


def _constant_weight_classifier() -> onnx.ModelProto:
    fill = oh.make_tensor("fill", onnx.TensorProto.FLOAT, [1], [0.02])
    nodes = [
        oh.make_node("Constant", [], ["w_shape"], value=oh.make_tensor("s", onnx.TensorProto.INT64, [2], [64, 100])),
        oh.make_node("ConstantOfShape", ["w_shape"], ["w"], value=fill),
        oh.make_node("Gemm", ["x", "w", "b"], ["logits"]),
        oh.make_node("Softmax", ["logits"], ["probs"], axis=1),
    ]
    graph = oh.make_graph(
        nodes,
        "constant_weight_classifier",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 64])],
        [oh.make_tensor_value_info("probs", onnx.TensorProto.FLOAT, ["n", 100])],
        initializer=[onnx.numpy_helper.from_array(np.linspace(-1, 1, 100, dtype=np.float32), "b")],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)


@pytest.fixture(scope="module")
def classifier():
    proto = _constant_weight_classifier()
    x = np.random.default_rng(0).random((100, 64), np.float32)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, {"x": x})
    return jonnx.load(proto), x, expected


def test_call_matches_onnxruntime(classifier):
    model, x, expected = classifier
    np.testing.assert_allclose(np.asarray(model(x)[0]), expected, rtol=1e-5, atol=1e-7)


def test_jonnx_jit_of_apply_matches_onnxruntime(classifier):
    model, x, expected = classifier
    (probs,) = jonnx.jit(model.apply)(model.params, x)
    np.testing.assert_allclose(np.asarray(probs), expected, rtol=1e-5, atol=1e-7)


def test_predict_matches_onnxruntime(classifier):
    model, x, expected = classifier
    (probs,) = jonnx.training.predict(model, None, x)
    np.testing.assert_allclose(np.asarray(probs), expected, rtol=1e-5, atol=1e-7)


def test_backend_matches_onnxruntime(classifier):
    model, x, expected = classifier
    (probs,) = jonnx.backend.run_model(_constant_weight_classifier(), [x])
    np.testing.assert_allclose(np.asarray(probs), expected, rtol=1e-5, atol=1e-7)


def test_backend_takes_inputs_by_name_even_named_like_the_calls_keywords():
    """A dict of inputs reaches the model by position: ``key`` and ``state`` are also keywords
    of ``Model(...)``."""
    info = [oh.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [2]) for n in ("key", "state", "y")]
    graph = oh.make_graph([oh.make_node("Sub", ["key", "state"], ["y"])], "g", info[:2], info[2:])
    rep = jonnx.backend.prepare(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]))
    key, state = np.array([3.0, 4.0], np.float32), np.array([1.0, 0.5], np.float32)
    (y,) = rep.run({"state": state, "key": key})
    np.testing.assert_array_equal(y, key - state)


def test_jit_passes_on_the_callers_arguments():
    scaled = jonnx.jit(lambda a, n: a * n, static_argnums=(1,), compiler_options={"xla_cpu_enable_fast_math": False})
    assert float(scaled(np.float32(2), 3)) == 6.0


def test_compiler_options_are_a_fresh_dict():
    options = jonnx.compiler_options()
    known = dict(options)
    options["something"] = "else"
    assert jonnx.compiler_options() == known
    # The YNNPACK option where the jaxlib acts on it; 512-bit vectors on AMD CPUs with AVX-512
    # and Intel ones with AMX.
    assert ("xla_cpu_experimental_ynn_fusion_type" in known) == (
        jax.default_backend() == "cpu" and jonnx._jit._knows_ynn_fusions()
    )
    assert ("xla_cpu_prefer_vector_width" in known) == jonnx._jit._takes_wide_vectors()


@pytest.mark.parametrize(
    ("info", "wide"),
    [
        ({"AuthenticAMD", "avx512f", "avx512_bf16"}, True),  # Zen 4 and 5
        ({"AuthenticAMD", "avx2"}, False),
        ({"GenuineIntel", "avx512f", "amx_tile", "amx_int8"}, True),  # Sapphire Rapids and later
        ({"GenuineIntel", "avx512f"}, False),  # older Intel: unmeasured, XLA's default
        (set(), False),  # /proc/cpuinfo unreadable
    ],
)
def test_wide_vectors_follow_the_cpu(info, wide, monkeypatch):
    monkeypatch.setattr(jonnx._cpu, "cpu_info", lambda: frozenset(info))
    jonnx._jit._takes_wide_vectors.cache_clear()
    try:
        on_cpu = jax.default_backend() == "cpu"
        assert jonnx._jit._takes_wide_vectors() == (wide and on_cpu)
        assert ("xla_cpu_prefer_vector_width" in jonnx.compiler_options()) == (wide and on_cpu)
    finally:
        jonnx._jit._takes_wide_vectors.cache_clear()


# Which library runs the dots: YNNPACK's (the default) or XLA's own, for nearly all work on many rows.


def _jaxpr(fn, *shapes, dtype=np.float32):
    return jax.make_jaxpr(fn)(*(jax.ShapeDtypeStruct(s, dtype) for s in shapes))


def _attention(q, k, v):
    return jax.nn.softmax(q @ k, axis=-1) @ v


@pytest.mark.parametrize(
    ("fn", "shapes", "library"),
    [
        (lambda a, b: a @ b, [(4096, 768), (768, 768)], False),  # BERT's projections at batch 32
        (lambda a, b: a @ b, [(128, 768), (768, 768)], True),  # ... at batch 1
        (lambda a, b: a @ b, [(1023, 64), (64, 64)], True),
        (lambda a, b: a @ b, [(1024, 64), (64, 64)], False),
        (_attention, [(32, 12, 128, 64), (32, 12, 64, 128), (32, 12, 128, 64)], False),  # batch counts
        (lambda x: x + 1, [(4096, 4096)], True),  # no dots
        (jax.jit(lambda a, b: a @ b), [(2048, 64), (64, 64)], False),  # found inside a nested jit
    ],
)
def test_library_dots_for_rows(fn, shapes, library):
    assert jonnx._jit.library_dots_for(_jaxpr(fn, *shapes)) is library


def test_library_dots_for_weighs_the_work():
    def mixed(big, small, w):
        return (big @ w).sum() + (small @ w).sum()

    # 90% of the multiply-adds on many rows is the line.
    assert jonnx._jit.library_dots_for(_jaxpr(mixed, (9 * 1024, 64), (1000, 64), (64, 64))) is False
    assert jonnx._jit.library_dots_for(_jaxpr(mixed, (8 * 1024, 64), (1000, 64), (64, 64))) is True


def test_library_dots_for_counts_a_scan_body_per_step():
    # A recurrent layer: one input projection on many rows, then a small product per step. Run
    # 100 times, the step products do most of the work, which YNNPACK runs faster.
    def recurrent(x, w, r, steps):
        def step(h, xw):
            return jax.numpy.tanh(xw + h @ r), None

        return jax.lax.scan(step, jax.numpy.zeros((32, 1024)), (x @ w).reshape(steps, 32, -1))[0]

    shapes = [(3200, 128), (128, 1024), (1024, 1024)]
    assert jonnx._jit.library_dots_for(_jaxpr(lambda x, w, r: recurrent(x, w, r, 100), *shapes)) is True
    # Counted once, the step product would leave the projection 93% of the work.
    assert jonnx._jit.library_dots_for(_jaxpr(lambda x, w, r: (x @ w).sum() + (x[:32] @ w @ r).sum(), *shapes)) is False


@pytest.mark.parametrize("dtype", [jax.numpy.bfloat16, np.int8])
def test_library_dots_for_keeps_narrow_types_in_ynnpack(dtype):
    # XLA's own 8-bit and bfloat16 dots are far slower than YNNPACK's (the int8 BERT).
    assert jonnx._jit.library_dots_for(_jaxpr(lambda a, b: a @ b, (4096, 768), (768, 768), dtype=dtype)) is True


def test_compiler_options_for_xla_dots_leave_dots_out_of_ynnpack():
    if jax.default_backend() != "cpu" or not jonnx._jit._knows_ynn_fusions():
        pytest.skip("this jaxlib has no YNNPACK fusion option")
    library, xla = jonnx.compiler_options(), jonnx.compiler_options(library_dots=False)
    assert library != xla
    a = np.ones((2048, 64), np.float32)

    def compiled_text(options):
        return jax.jit(lambda x: x @ x.T, compiler_options=options).lower(a).compile().as_text()

    assert "ynn_fusion" in compiled_text(library)
    assert "ynn_fusion" not in compiled_text(xla)


def test_compiler_options_leave_convolutions_to_xla():
    # XLA's own convolutions were the faster on the CPU measured (docs/performance.md).
    if not jonnx.compiler_options():
        pytest.skip("this jaxlib has no YNNPACK fusion option")
    x = np.ones((1, 16, 16, 32), np.float32)
    w = np.ones((3, 3, 32, 32), np.float32)

    def conv(x, w):
        return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))

    for options in (jonnx.compiler_options(), jonnx.compiler_options(library_dots=False)):
        text = jax.jit(conv, compiler_options=options).lower(x, w).compile().as_text()
        assert "convolution(" in text and "ynn_fusion" not in text


def _choices(chooser: jonnx._jit.DotChoosingJit, rows: int) -> list[bool]:
    """Whether YNNPACK runs the dots, by the choices made for calls whose inputs held a (rows, 64) float32 array (a segment's key
    ends with its inputs' signature, predict's is that signature)."""
    array = ((rows, 64), "float32")
    choices = [choice for key, choice in chooser.choices.items() if array in key or array in key[-1]]
    return [choice != jonnx._jit.XLA_DOTS for choice in choices]


@pytest.mark.parametrize("constant_weights", [False, True])
def test_call_chooses_the_dot_library_per_input_shape(constant_weights):
    proto = _constant_weight_classifier()
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    model = jonnx.load(proto, optimize={"constant_weights": constant_weights})
    chooser = model._segments_params
    # The choice is made on the CPU where the jaxlib has the YNNPACK option.
    assert chooser.chooses == (jax.default_backend() == "cpu" and jonnx._jit._knows_ynn_fusions())
    rng = np.random.default_rng(1)
    for rows, library in [(2048, False), (100, True)]:
        x = rng.random((rows, 64), np.float32)
        (expected,) = session.run(None, {"x": x})
        np.testing.assert_allclose(np.asarray(model(x)[0]), expected, rtol=1e-5, atol=1e-7)
        if not constant_weights:  # the constant-weights chooser is the same, closed over
            assert _choices(chooser, rows) == ([library] if chooser.chooses else [])
        # A params= call (weights as arguments) goes through the same choice.
        (probs,) = model(x, params=dict(model.params))
        np.testing.assert_allclose(np.asarray(probs), expected, rtol=1e-5, atol=1e-7)
        assert _choices(chooser, rows) == ([library] if chooser.chooses else [])


@pytest.mark.parametrize("precision", [None, jax.lax.Precision.HIGHEST])
def test_predict_chooses_the_dot_library_per_input_shape(precision):
    proto = _constant_weight_classifier()
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    model = jonnx.load(proto)
    x = np.random.default_rng(2).random((2048, 64), np.float32)
    (expected,) = session.run(None, {"x": x})
    for batch_size in (None, 1024):
        (probs,) = jonnx.training.predict(model, None, x, batch_size=batch_size, precision=precision)
        np.testing.assert_allclose(np.asarray(probs), expected, rtol=1e-5, atol=1e-7)
    if precision is None:  # the model's own call, its segments choosing
        chooser = model._segments_params
    else:  # apply under predict's own jit
        (chooser,) = jonnx.training._inference._COMPILED[model].values()
    # One choice per compiled shape: the whole set, then its chunks.
    assert _choices(chooser, 2048) == _choices(chooser, 1024) == ([False] if chooser.chooses else [])


# YNNPACK's reductions: taken per compiled signature where the compiled module passes the
# miscompile check (jonnx/_hlo.py), single dots where it does not.

_RECOMPILED_REPRODUCER = """\
%fused_computation (param_0.2: f32[100,64]) -> f32[] {
  %param_0.2 = f32[100,64]{1,0} parameter(0)
  %constant.2 = f32[] constant(0.02)
  %w = f32[64,64]{1,0} broadcast(%constant.2), dimensions={}
  %dot_general.0 = f32[100,64]{1,0} dot(%param_0.2, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %constant.1 = f32[] constant(0)
  ROOT %reduce_sum.0 = f32[] reduce(%dot_general.0, %constant.1), dimensions={0,1}, to_apply=%region_0.1
}

ENTRY %main.2 (x.1: f32[100,64]) -> f32[] {
  %x.1 = f32[100,64]{1,0} parameter(0), metadata={op_name="x"}
  ROOT %ynn_fusion = f32[] fusion(%x.1), kind=kCustom, calls=%fused_computation, backend_config={"fusion_config":{"kind":"__ynn_fusion"}}
}
"""


def test_fusion_check_reads_hlo_text():
    # The reproducer of docs/known_issues.md as XLA compiles it with YNNPACK's reductions.
    assert not jonnx._hlo.ynn_fusions_are_safe(_RECOMPILED_REPRODUCER)
    # The same fusion with the weight passed in, or computed from it, reads dense data.
    passed_in = _RECOMPILED_REPRODUCER.replace(
        "%w = f32[64,64]{1,0} broadcast(%constant.2), dimensions={}", "%w = f32[64,64]{1,0} parameter(1)"
    )
    assert jonnx._hlo.ynn_fusions_are_safe(passed_in)
    scaled = passed_in.replace(
        "%w = f32[64,64]{1,0} parameter(1)",
        "%v = f32[64,64]{1,0} parameter(1)\n  %s = f32[64,64]{1,0} broadcast(%constant.2), dimensions={}\n"
        "  %w = f32[64,64]{1,0} multiply(%v, %s)",
    )
    assert jonnx._hlo.ynn_fusions_are_safe(scaled)
    # A product of the fusion's own product (attention's probabilities times values), though
    # larger than what it is computed from, is dense.
    chained = passed_in.replace(
        "%w = f32[64,64]{1,0} parameter(1)",
        "%a = f32[64,1]{1,0} parameter(1)\n  %b = f32[1,64]{1,0} parameter(2)\n"
        "  %w = f32[64,64]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}",
    )
    assert jonnx._hlo.ynn_fusions_are_safe(chained)
    # A value computed from the broadcast alone (exp of an all-equal tensor) is not dense.
    exp = _RECOMPILED_REPRODUCER.replace(
        "%w = f32[64,64]{1,0} broadcast(%constant.2), dimensions={}",
        "%b = f32[64,64]{1,0} broadcast(%constant.2), dimensions={}\n  %w = f32[64,64]{1,0} exponential(%b)",
    )
    assert not jonnx._hlo.ynn_fusions_are_safe(exp)
    # A YNNPACK fusion whose computation is not in the text cannot be checked.
    assert not jonnx._hlo.ynn_fusions_are_safe(_RECOMPILED_REPRODUCER.split("\n\n")[1])
    assert jonnx._hlo.ynn_fusions_are_safe("HloModule empty\n")


def _reductions_compiled(fn, *args) -> str:
    options = {"xla_cpu_experimental_ynn_fusion_type": jonnx._jit._DOTS_AND_REDUCTIONS}
    return jax.jit(fn, compiler_options=options).lower(*args).compile().as_text()


def test_fusion_check_on_compiled_modules():
    if jax.default_backend() != "cpu" or not jonnx._jit._knows_reduce_fusions():
        pytest.skip("this jaxlib gives YNNPACK no reductions")
    rng = np.random.default_rng(0)
    x, w, s = rng.random((100, 64), np.float32), rng.random((64, 64), np.float32), np.float32(0.3)
    # Weights XLA holds as a broadcast, or computes from one: miscompiled (known_issues.md).
    full = np.full((64, 64), 0.02, np.float32)
    assert not jonnx._hlo.ynn_fusions_are_safe(_reductions_compiled(lambda x: (x @ jax.numpy.asarray(full)).mean(), x))
    all_equal = lambda x, s: (x @ jax.numpy.exp(jax.numpy.broadcast_to(s, (64, 64)))).mean(1)  # noqa: E731
    assert not jonnx._hlo.ynn_fusions_are_safe(_reductions_compiled(all_equal, x, s))
    # Weights passed in, scaled, or held as a constant that is not all-equal: computed right.
    for fn, args, expected in [
        (lambda x, w: (x @ w).mean(1), (x, w), (x @ w).mean(1)),
        (
            lambda x, w, s: (jax.numpy.maximum(x + s, 0) @ (w * s)).sum(1),
            (x, w, s),
            (np.maximum(x + s, 0) @ (w * s)).sum(1),
        ),
        (lambda x: (x @ jax.numpy.asarray(w)).mean(1), (x,), (x @ w).mean(1)),
    ]:
        assert jonnx._hlo.ynn_fusions_are_safe(_reductions_compiled(fn, *args))
        options = {"xla_cpu_experimental_ynn_fusion_type": jonnx._jit._DOTS_AND_REDUCTIONS}
        np.testing.assert_allclose(np.asarray(jax.jit(fn, compiler_options=options)(*args)), expected, rtol=1e-5)


_SLOW_FORM = """\
%fused_computation (param_0.2: f32[49,64], param_1.2: f32[32,64,1,1]) -> f32[32] {
  %param_0.2 = f32[49,64]{1,0} parameter(0)
  %param_1.2 = f32[32,64,1,1]{3,2,1,0} parameter(1)
  %bitcast.1 = f32[32,64]{1,0} bitcast(%param_1.2)
  %dot.0 = f32[49,32]{1,0} dot(%param_0.2, %bitcast.1), lhs_contracting_dims={1}, rhs_contracting_dims={1}
  %constant.1 = f32[] constant(0)
  ROOT %reduce_sum.0 = f32[32] reduce(%dot.0, %constant.1), dimensions={0}, to_apply=%region_0.1
}

ENTRY %main.2 (x.1: f32[49,64], w.1: f32[32,64,1,1]) -> f32[32] {
  %x.1 = f32[49,64]{1,0} parameter(0)
  %w.1 = f32[32,64,1,1]{3,2,1,0} parameter(1)
  ROOT %ynn_fusion = f32[32] fusion(%x.1, %w.1), kind=kCustom, calls=%fused_computation, backend_config={"fusion_config":{"kind":"__ynn_fusion"}}
}
"""


def test_slow_fusion_check_reads_hlo_text():
    # A 1x1 kernel's OI11 weights read as a matrix in a fusion with a reduction: slow.
    assert not jonnx._hlo.ynn_fusions_are_fast(_SLOW_FORM)
    # Leading unit dimensions (11IO), a matrix parameter, or no reduction in the fusion: fast.
    assert jonnx._hlo.ynn_fusions_are_fast(_SLOW_FORM.replace("f32[32,64,1,1]{3,2,1,0}", "f32[1,1,32,64]{3,2,1,0}"))
    matrix = _SLOW_FORM.replace("f32[32,64,1,1]{3,2,1,0} parameter(1)", "f32[32,64]{1,0} parameter(1)")
    assert jonnx._hlo.ynn_fusions_are_fast(matrix)
    # What the chooser asks: both checks, each able to refuse.
    assert jonnx._hlo.ynn_fusions_suit(matrix)
    assert not jonnx._hlo.ynn_fusions_suit(_SLOW_FORM)
    assert not jonnx._hlo.ynn_fusions_suit(_RECOMPILED_REPRODUCER)
    no_reduction = _SLOW_FORM.replace(
        "ROOT %reduce_sum.0 = f32[32] reduce(%dot.0, %constant.1), dimensions={0}, to_apply=%region_0.1",
        "ROOT %negate.0 = f32[49,32]{1,0} negate(%dot.0)",
    )
    assert jonnx._hlo.ynn_fusions_are_fast(no_reduction)
    assert jonnx._hlo.ynn_fusions_are_fast("HloModule empty\n")


def test_slow_fusion_check_on_compiled_modules():
    if jax.default_backend() != "cpu" or not jonnx._jit._knows_reduce_fusions():
        pytest.skip("this jaxlib gives YNNPACK no reductions")
    rng = np.random.default_rng(1)
    x = rng.random((1, 7, 7, 256), np.float32)
    w = rng.random((128, 256), np.float32)

    def pooled(x, w):  # a 1x1 convolution over channels-last x, ReLU, global average pool
        return jax.numpy.maximum(jax.numpy.einsum("nhwc,mc->nhwm", x, w.reshape(128, 256)), 0).mean((1, 2))

    assert not jonnx._hlo.ynn_fusions_are_fast(_reductions_compiled(pooled, x, w.reshape(128, 256, 1, 1)))
    assert jonnx._hlo.ynn_fusions_are_fast(_reductions_compiled(pooled, x, w))
    assert jonnx._hlo.ynn_fusions_are_fast(_reductions_compiled(pooled, x, w.reshape(1, 1, 128, 256)))


def _pooled_1x1_conv() -> onnx.ModelProto:
    """A 512 -> 512 1x1 Conv (weights read as stored by the layout pass: 2^18 of them), Relu,
    GlobalAveragePool: a ResNet-50's tail in small."""
    w = np.random.default_rng(7).standard_normal((512, 512, 1, 1)).astype(np.float32) / 23
    nodes = [
        oh.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[1, 1]),
        oh.make_node("Relu", ["c"], ["r"]),
        oh.make_node("GlobalAveragePool", ["r"], ["y"]),
    ]
    graph = oh.make_graph(
        nodes,
        "pooled_1x1_conv",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 512, 7, 7])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 512, 1, 1])],
        initializer=[onnx.numpy_helper.from_array(w, "w")],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)


def _attention_block() -> onnx.ModelProto:
    """Scores of a (n, 16, 32) input against itself through stored weights, then Softmax."""
    rng = np.random.default_rng(3)
    weights = [onnx.numpy_helper.from_array(rng.standard_normal((32, 32)).astype(np.float32) / 6, n) for n in "qk"]
    nodes = [
        oh.make_node("MatMul", ["x", "q"], ["xq"]),
        oh.make_node("MatMul", ["x", "k"], ["xk"]),
        oh.make_node("Transpose", ["xk"], ["kt"], perm=[0, 2, 1]),
        oh.make_node("MatMul", ["xq", "kt"], ["scores"]),
        oh.make_node("Softmax", ["scores"], ["probs"], axis=-1),
    ]
    graph = oh.make_graph(
        nodes,
        "attention_block",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 16, 32])],
        [oh.make_tensor_value_info("probs", onnx.TensorProto.FLOAT, ["n", 16, 16])],
        initializer=weights,
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("optimize", ["default", "constant_weights", "no_channels_last"])
def test_call_takes_ynnpack_reductions_where_the_check_passes(optimize):
    reductions = jax.default_backend() == "cpu" and jonnx._jit._knows_reduce_fusions()
    constant_weights = optimize == "constant_weights"
    rng = np.random.default_rng(4)
    for proto, x, choice in [
        (_attention_block(), rng.random((2, 16, 32), np.float32), jonnx._jit.LIBRARY_REDUCTIONS),
        # The ConstantOfShape weight reaches XLA as a broadcast: single dots.
        (_constant_weight_classifier(), rng.random((100, 64), np.float32), jonnx._jit.LIBRARY_DOTS),
        # Not the slow form in any layout: since ReLU is a select (2026-12-03), which YNNPACK's
        # fusions do not take, the product and the pool's reduction stay in separate fusions
        # (with jax.nn.relu's max, NCHW fused them, OI11 weights read as a matrix beside the
        # reduction, and took single dots).
        (_pooled_1x1_conv(), rng.random((1, 512, 7, 7), np.float32), jonnx._jit.LIBRARY_REDUCTIONS),
    ]:
        session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
        (expected,) = session.run(None, {"x": x})
        switches = {"constant_weights": constant_weights, "channels_last": optimize != "no_channels_last"}
        model = jonnx.load(proto, optimize=switches)
        np.testing.assert_allclose(np.asarray(model(x)[0]), expected, rtol=1e-5, atol=1e-6)
        if reductions:
            chooser = model._segments_params
            if constant_weights:  # the call's own chooser, whose function closes over the weights
                chooser = model._segments._chooser
            assert list(chooser.choices.values()) == [choice]


def test_train_step_takes_ynnpack_reductions_where_the_check_passes():
    import optax

    model = jonnx.load(_attention_block())
    x = np.random.default_rng(5).random((4, 16, 32), np.float32)
    target = np.full((4, 16, 16), 1 / 16, np.float32)

    def loss(outputs, batch):
        return ((outputs[0] - batch["target"]) ** 2).mean()

    step = jonnx.training.make_train_step(model, loss, optax.sgd(0.5))
    state = step.init()
    reference = jonnx._jit.plain_jit(step.fn)(state, {"x": x, "target": target}, None)  # single dots
    new_state, metrics = step(state, {"x": x, "target": target})
    np.testing.assert_allclose(float(metrics["loss"]), float(reference[1]["loss"]), rtol=1e-6)
    for name, value in new_state.params.items():
        np.testing.assert_allclose(np.asarray(value), np.asarray(reference[0].params[name]), rtol=1e-5, atol=1e-7)
    if jax.default_backend() == "cpu" and jonnx._jit._knows_reduce_fusions():
        assert list(step._jitted.choices.values()) == [jonnx._jit.LIBRARY_REDUCTIONS]


def test_jonnx_jit_chooses_per_call_signature():
    def scaled(x, n, *, offset=0.0, power=1):
        return ((x @ x.T) ** power).sum(axis=1) * n + offset

    f = jonnx.jit(scaled, static_argnames=("power",))
    x = np.random.default_rng(6).random((8, 4), np.float32)
    for n, offset, power in [(2.0, 0.0, 1), (3.0, 1.0, 1), (2.0, 0.0, 2)]:
        expected = ((x @ x.T) ** power).sum(axis=1) * n + offset
        np.testing.assert_allclose(np.asarray(f(x, n, offset=offset, power=power)), expected, rtol=1e-5)
    if f.chooses:
        # Python numbers are traced (one signature for any value); the static power is not.
        assert len(f.choices) == 2
    # A jax.jit function's attributes are the single-dot compilation's.
    assert f.__wrapped__ is scaled
    np.testing.assert_allclose(np.asarray(f.lower(x, 2.0).compile()(x, 2.0)), (x @ x.T).sum(axis=1) * 2, rtol=1e-5)


def test_static_arguments_as_jax_jit_reads_them():
    def fn(x, n, *, mode="a"):
        return x

    static = jonnx._jit._static_arguments
    assert static(fn, {"static_argnums": -1}) == (frozenset({-1, 1}), frozenset({"n"}))
    assert static(fn, {"static_argnames": ("n", "mode")}) == (frozenset({1}), frozenset({"n", "mode"}))
    # Static values are part of the signature; traced arguments only by shape and dtype.
    x = np.zeros(3, np.float32)
    signature = jonnx._jit.call_signature(static(fn, {"static_argnums": 1}), (x, 2), {})
    assert signature == jonnx._jit.call_signature(static(fn, {"static_argnums": 1}), (x + 1, 2), {})
    assert signature != jonnx._jit.call_signature(static(fn, {"static_argnums": 1}), (x, 3), {})
    assert signature != jonnx._jit.call_signature(static(fn, {"static_argnums": 1}), (x[:2], 2), {})


def test_jonnx_jit_inside_other_transformations():
    def loss(w, x):
        return jnp.sum(jnp.tanh(x @ w))

    f = jonnx.jit(loss)
    rng = np.random.default_rng(7)
    w, x = rng.random((4, 3), np.float32), rng.random((5, 4), np.float32)
    expected = np.tanh(x.astype(np.float64) @ w).sum()
    # Inside the caller's jit (and a scan body) it is a nested jit, under the outer options.
    np.testing.assert_allclose(float(jonnx.jit(lambda w: f(w, x))(w)), expected, rtol=1e-5)
    np.testing.assert_allclose(float(jax.jit(lambda w: f(w, x))(w)), expected, rtol=1e-5)
    _, ys = jax.lax.scan(lambda c, w: (c, f(w, x)), 0.0, np.stack([w, 2 * w]))
    np.testing.assert_allclose(np.asarray(ys), [expected, np.tanh(x.astype(np.float64) @ (2 * w)).sum()], rtol=1e-5)
    # Differentiated inside a jit: against the derivative by hand, sum(x^T (1 - tanh^2)).
    want_grad = x.T.astype(np.float64) @ (1 - np.tanh(x.astype(np.float64) @ w) ** 2)
    np.testing.assert_allclose(np.asarray(jonnx.jit(jax.grad(loss))(w, x)), want_grad, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(jax.jit(jax.grad(f))(w, x)), want_grad, rtol=1e-5)
    # jax.vmap keeps it top-level.
    batched = jax.vmap(f, (None, 0))(w, x[:, None])
    np.testing.assert_allclose(np.asarray(batched), np.tanh(x.astype(np.float64) @ w).sum(axis=1), rtol=1e-5)
    # Under jax.grad outside any jit, JAX refuses compiler options (a jaxlib without the
    # YNNPACK option has none to give): the error says what to write.
    if jonnx.compiler_options():
        with pytest.raises(
            ValueError, match=r"jonnx.jit\(loss\) was called under jax.grad.*jonnx.jit\(jax.grad\(f\)\)"
        ):
            jax.grad(f)(w, x)


def test_the_xla_dots_compilation_is_traced_for_it():
    # The compilation for XLA's emitter alone is traced again, with traced_for saying so (ops
    # choose lowerings by it); the other choices share the first trace, which says nothing.
    seen = []

    def fn(x):
        seen.append(jonnx._jit.traced_for())
        return (x @ x.T).sum(axis=1)

    chooser = jonnx._jit.DotChoosingJit(fn, lambda x: jonnx._jit.signature(x))
    rng = np.random.default_rng(7)
    for rows in (16, 2048):
        x = rng.random((rows, 8), np.float32)
        np.testing.assert_allclose(np.asarray(chooser(x)), (x @ x.T).sum(axis=1), rtol=1e-5)
        xla = chooser.chooses and chooser.choices[jonnx._jit.signature(x)] == jonnx._jit.XLA_DOTS
        assert xla == (chooser.chooses and rows == 2048)
        assert seen == ([None, jonnx._jit.XLA_DOTS] if xla else [None])
        seen.clear()
    assert jonnx._jit.traced_for() is None
