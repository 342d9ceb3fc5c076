"""If, Loop and Scan over hand-built subgraphs, against the ReferenceEvaluator and numpy.

Each model runs through ``Model.__call__`` (prefer-static inputs become static arguments),
eagerly through ``Model.apply`` and under ``jax.jit(model.apply)`` (every input traced), and
the jaxpr is checked where the lowering path (static choice, ``cond``, ``scan``,
``while``, unrolled) is the point of the test.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnx.helper as oh
import pytest
from jax.test_util import check_grads
from onnx import TensorProto, numpy_helper
from onnx.reference import ReferenceEvaluator

import jonnx
from jonnx import errors

F, D, I64, B = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT64, TensorProto.BOOL
RNG = np.random.default_rng(0)


# -- building and running models ---------------------------------------------------------


def vi(name, elem=F, shape=None):
    return oh.make_tensor_value_info(name, elem, shape)


def const(name, value):
    return oh.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value), name))


def graph(nodes, inputs, outputs, name="body", inits=None):
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()]
    return oh.make_graph(nodes, name, inputs, outputs, initializer=inits)


def model(nodes, inputs, outputs, *, opset=17, inits=None):
    m = oh.make_model(graph(nodes, inputs, outputs, "main", inits), opset_imports=[oh.make_opsetid("", opset)])
    m.ir_version = 8 if opset < 21 else 10
    return m


def _explicit_loop_conditions(proto):
    """A copy of ``proto`` whose Loops without a condition read a constant true one.

    The ReferenceEvaluator runs a Loop with an omitted condition zero times (it tests
    ``while cond``), while ONNX means "no condition": always true.
    """
    proto = onnx.ModelProto.FromString(proto.SerializeToString())

    def fix(g):
        for node in g.node:
            if node.op_type == "Loop" and node.input[1] == "":
                node.input[1] = "__always_true"
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    fix(attr.g)

    fix(proto.graph)
    proto.graph.initializer.append(numpy_helper.from_array(np.array(True), "__always_true"))
    return proto


def reference(proto, feeds):
    proto = _explicit_loop_conditions(proto)
    names = [i.name for i in proto.graph.input if i.name not in {t.name for t in proto.graph.initializer}]
    return ReferenceEvaluator(proto).run(None, dict(zip(names, feeds)))


def _numpy(value):
    if isinstance(value, (list, tuple)):
        return [_numpy(v) for v in value]
    return None if value is None else np.asarray(value)


def run(proto, feeds, mode="call"):
    """jonnx's outputs with x64 on: ``call`` (Model.__call__), ``apply`` or ``jit`` (jit(apply))."""
    with jax.enable_x64(True):
        m = jonnx.load(proto)
        if mode == "call":
            out = m(*feeds)
        elif mode == "apply":
            out = m.apply(m.params, *feeds)
        else:
            out = jax.jit(m.apply)(m.params, *feeds)
        return _numpy(out)


def assert_same(got, want, rtol=1e-6, atol=1e-6):
    if isinstance(want, (list, tuple)):
        assert isinstance(got, list) and len(got) == len(want), (got, want)
        for g, w in zip(got, want):
            assert_same(g, w, rtol, atol)
        return
    want = np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def check(proto, feeds, modes=("call", "apply", "jit"), expected=None):
    want = reference(proto, feeds) if expected is None else expected
    for mode in modes:
        assert_same(run(proto, feeds, mode), want)


def jaxpr(proto, feeds, traced=None) -> str:
    """The jaxpr of ``apply`` with the inputs at positions ``traced`` (default: all) traced."""
    with jax.enable_x64(True):
        m = jonnx.load(proto)
        traced = range(len(feeds)) if traced is None else traced

        def f(*dyn):
            values = list(feeds)
            for i, v in zip(traced, dyn):
                values[i] = v
            return m.apply(m.params, *values)

        return str(jax.make_jaxpr(f)(*[feeds[i] for i in traced]))


def primitives(text: str) -> set[str]:
    return {p for p in ("cond[", "scan[", "while[") if p in text}


# -- If ----------------------------------------------------------------------------------


def _if_node(then_nodes, then_out, else_nodes, else_out, cond="c", outs=("y",), name="if"):
    return oh.make_node(
        "If",
        [cond],
        list(outs),
        name=name,
        then_branch=graph(then_nodes, [], then_out, "then"),
        else_branch=graph(else_nodes, [], else_out, "else"),
    )


@pytest.mark.parametrize("opset", [11, 13, 16, 19, 21])
@pytest.mark.parametrize("flag", [True, False])
def test_if_static_condition_branches_may_differ_in_shape(opset, flag):
    node = _if_node(
        [oh.make_node("Add", ["x", "x"], ["t"])],
        [vi("t", F, [3])],
        [oh.make_node("Concat", ["x", "x"], ["e"], axis=0)],
        [vi("e", F, [6])],
    )
    proto = model([node], [vi("c", B, []), vi("x", F, [3])], [vi("y", F, None)], opset=opset)
    feeds = [np.array(flag), RNG.standard_normal(3).astype(np.float32)]
    with jax.enable_x64(True):
        assert jonnx.load(proto).static_input_names == ("c",)
    check(proto, feeds, modes=("call", "apply"))
    assert run(proto, feeds)[0].shape == ((3,) if flag else (6,))
    # The condition is static: no lax.cond in the computation.
    assert primitives(jaxpr(proto, feeds, traced=[1])) == set()


def _data_dependent_if(then_nodes, else_nodes, then_out="t", else_out="e", elem=F):
    """y = If(sum(x) > 0): the condition depends on x, so it is traced."""
    nodes = [
        oh.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
        const("zero", np.zeros((), onnx.helper.tensor_dtype_to_np_dtype(elem))),
        oh.make_node("Greater", ["s", "zero"], ["c"]),
        _if_node(then_nodes, [vi(then_out, elem, None)], else_nodes, [vi(else_out, elem, None)]),
    ]
    return model(nodes, [vi("x", elem, [4])], [vi("y", elem, None)])


def test_if_traced_condition_is_lax_cond():
    proto = _data_dependent_if([oh.make_node("Mul", ["x", "x"], ["t"])], [oh.make_node("Neg", ["x"], ["e"])])
    for x in (np.array([1, 2, -1, 0.5], np.float32), np.array([-1, -2, 1, 0.5], np.float32)):
        check(proto, [x])
        assert primitives(jaxpr(proto, [x])) == {"cond["}


def test_if_condition_input_traced_under_jit_apply():
    # Model.__call__ makes `c` static; jax.jit(apply) traces it, so If becomes lax.cond.
    node = _if_node(
        [oh.make_node("Sin", ["x"], ["t"])], [vi("t", F, [3])], [oh.make_node("Cos", ["x"], ["e"])], [vi("e", F, [3])]
    )
    proto = model([node], [vi("c", B, []), vi("x", F, [3])], [vi("y", F, [3])])
    x = RNG.standard_normal(3).astype(np.float32)
    for flag in (True, False):
        check(proto, [np.array(flag), x])
    assert primitives(jaxpr(proto, [np.array(True), x])) == {"cond["}


def test_if_branches_read_outer_values_and_initializers():
    # `w` is a float initializer of the main graph (a trainable param), `k` an int one (a
    # constant), `h` an intermediate value; the else branch has an initializer of its own.
    then_nodes = [oh.make_node("Add", ["x", "w"], ["t0"]), oh.make_node("Mul", ["t0", "h"], ["t"])]
    else_branch = graph(
        [
            oh.make_node("Cast", ["k"], ["kf"], to=F),
            oh.make_node("Mul", ["h", "kf"], ["e0"]),
            oh.make_node("Add", ["e0", "own"], ["e"]),
        ],
        [],
        [vi("e", F, [3])],
        "else",
        inits={"own": np.float32([10, 20, 30])},
    )
    nodes = [
        oh.make_node("Exp", ["x"], ["h"]),
        oh.make_node(
            "If", ["c"], ["y"], then_branch=graph(then_nodes, [], [vi("t", F, [3])], "then"), else_branch=else_branch
        ),
    ]
    proto = model(
        nodes,
        [vi("c", B, []), vi("x", F, [3])],
        [vi("y", F, [3])],
        inits={"w": np.float32([1, 2, 3]), "k": np.int64(3)},
    )
    x = RNG.standard_normal(3).astype(np.float32)
    for flag in (True, False):
        check(proto, [np.array(flag), x])
    with jax.enable_x64(True):
        assert set(jonnx.load(proto).params) == {"w"}


def test_nested_if_reads_values_two_scopes_up():
    # The inner If's condition `c2` and the data `x` come from the main graph.
    inner = oh.make_node(
        "If",
        ["c2"],
        ["t"],
        then_branch=graph([oh.make_node("Add", ["x", "x"], ["tt"])], [], [vi("tt", F, [2])], "tt"),
        else_branch=graph([oh.make_node("Mul", ["x", "x"], ["te"])], [], [vi("te", F, [2])], "te"),
    )
    outer = oh.make_node(
        "If",
        ["c1"],
        ["y"],
        then_branch=graph([inner], [], [vi("t", F, [2])], "then"),
        else_branch=graph([oh.make_node("Neg", ["x"], ["e"])], [], [vi("e", F, [2])], "else"),
    )
    proto = model([outer], [vi("c1", B, []), vi("c2", B, []), vi("x", F, [2])], [vi("y", F, [2])])
    x = np.float32([1.5, -2.0])
    for c1 in (True, False):
        for c2 in (True, False):
            check(proto, [np.array(c1), np.array(c2), x])
    assert jaxpr(proto, [np.array(True), np.array(True), x]).count("cond[") == 2


def test_if_traced_condition_with_sequence_outputs():
    seq = oh.make_tensor_sequence_value_info
    proto = _data_dependent_if(
        [oh.make_node("SequenceConstruct", ["x", "x"], ["t"])],
        [oh.make_node("Neg", ["x"], ["nx"]), oh.make_node("SequenceConstruct", ["nx", "x"], ["e"])],
    )
    proto.graph.output[0].CopyFrom(seq("y", F, None))
    for x in (np.float32([1, 2, 3, -1]), np.float32([-1, -2, -3, 1])):
        check(proto, [x])


def test_if_traced_branches_differing_in_shape_run_on_the_host_only():
    # One compiled computation cannot hold either shape: apply and jit name the If;
    # Model(*inputs) runs it on the host, where the condition is known.
    proto = _data_dependent_if(
        [oh.make_node("Identity", ["x"], ["t"])],
        [oh.make_node("Concat", ["x", "x"], ["e"], axis=0)],
    )
    for x in (np.float32([1, 2, 3, 4]), np.float32([-1, -2, -3, 4])):
        for mode in ("apply", "jit"):
            with pytest.raises(errors.RuntimeShapeError, match=r"'if'.*differ in shape.*known at trace time"):
                run(proto, [x], mode)
        check(proto, [x], modes=("call",))


def test_if_branches_with_different_output_counts_fail_at_load():
    node = oh.make_node(
        "If",
        ["c"],
        ["y", "z"],
        name="if",
        then_branch=graph([oh.make_node("Neg", ["x"], ["t"])], [], [vi("t", F, [2]), vi("x", F, [2])], "then"),
        else_branch=graph([oh.make_node("Neg", ["x"], ["e"])], [], [vi("e", F, [2])], "else"),
    )
    # The checker rejects the mismatch, so the model is built without it.
    g = graph([node], [vi("c", B, []), vi("x", F, [2])], [vi("y", F, [2])], "main")
    proto = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    with pytest.raises(errors.ModelStructureError, match="'if'.*then_branch gives 2 outputs but else_branch gives 1"):
        jonnx.load(proto)


def test_grad_through_traced_if():
    # y = sum(x * x) if sum(x) > 0 else sum(sin(x) * x); the gradient follows the branch taken.
    proto = _data_dependent_if(
        [oh.make_node("Mul", ["x", "x"], ["t0"]), oh.make_node("ReduceSum", ["t0"], ["t"], keepdims=0)],
        [
            oh.make_node("Sin", ["x"], ["e0"]),
            oh.make_node("Mul", ["e0", "x"], ["e1"]),
            oh.make_node("ReduceSum", ["e1"], ["e"], keepdims=0),
        ],
        elem=D,
    )
    with jax.enable_x64(True):
        m = jonnx.load(proto)

        def f(x):
            return m.apply(m.params, x)[0]

        for x in (np.array([0.5, 1.0, -0.2, 0.3]), np.array([-0.5, -1.0, 0.2, 0.3])):
            check_grads(f, (x,), order=1, modes=("fwd", "rev"), eps=1e-5)
            want = 2 * x if x.sum() > 0 else np.cos(x) * x + np.sin(x)
            np.testing.assert_allclose(jax.grad(f)(x), want, rtol=1e-10)
            np.testing.assert_allclose(jax.jit(jax.grad(f))(x), want, rtol=1e-10)


# -- Loop --------------------------------------------------------------------------------


def _loop_model(
    body_nodes,
    body_in,
    body_out,
    loop_in,
    loop_out,
    main_in,
    main_out,
    *,
    pre=(),
    post=(),
    inits=None,
    opset=17,
    name="loop",
):
    body = graph(body_nodes, body_in, body_out, "body")
    node = oh.make_node("Loop", loop_in, loop_out, name=name, body=body)
    return model([*pre, node, *post], main_in, main_out, inits=inits, opset=opset)


def _accumulate_loop(**kw):
    """a_{i+1} = a_i + x * i;  scan output s_i = a_{i+1} * 2;  b_{i+1} = b_i + i (int64)."""
    body = [
        oh.make_node("Identity", ["cond_in"], ["cond_out"]),
        oh.make_node("Cast", ["i"], ["fi"], to=F),
        oh.make_node("Mul", ["x", "fi"], ["xi"]),
        oh.make_node("Add", ["a_in", "xi"], ["a_out"]),
        oh.make_node("Add", ["b_in", "i"], ["b_out"]),
        const("two", np.float32(2)),
        oh.make_node("Mul", ["a_out", "two"], ["s"]),
    ]
    return _loop_model(
        body,
        [vi("i", I64, []), vi("cond_in", B, []), vi("a_in", F, [3]), vi("b_in", I64, [])],
        [vi("cond_out", B, []), vi("a_out", F, [3]), vi("b_out", I64, []), vi("s", F, [3])],
        ["M", "", "a0", "b0"],
        ["a", "b", "ss"],
        [vi("M", I64, []), vi("x", F, [3]), vi("a0", F, [3]), vi("b0", I64, [])],
        [vi("a", F, [3]), vi("b", I64, []), vi("ss", F, [None, 3])],
        **kw,
    )


@pytest.mark.parametrize("opset", [11, 13, 16, 19, 21])
def test_loop_static_trip_count_with_scan_outputs(opset):
    proto = _accumulate_loop(opset=opset)
    feeds = [
        np.int64(5),
        RNG.standard_normal(3).astype(np.float32),
        RNG.standard_normal(3).astype(np.float32),
        np.int64(7),
    ]
    with jax.enable_x64(True):
        # Scan outputs need the trip count at trace time.
        assert jonnx.load(proto).static_input_names == ("M",)
    check(proto, feeds, modes=("call", "apply"))
    assert primitives(jaxpr(proto, feeds, traced=[1, 2, 3])) == {"scan["}


def test_loop_trip_count_initializer_under_jit_apply():
    body = [
        oh.make_node("Identity", ["cond_in"], ["cond_out"]),
        oh.make_node("Mul", ["a_in", "x"], ["a_out"]),
        oh.make_node("Sin", ["a_out"], ["s"]),
    ]
    proto = _loop_model(
        body,
        [vi("i", I64, []), vi("cond_in", B, []), vi("a_in", F, [2])],
        [vi("cond_out", B, []), vi("a_out", F, [2]), vi("s", F, [2])],
        ["M", "c", "a0"],
        ["a", "ss"],
        [vi("x", F, [2]), vi("a0", F, [2])],
        [vi("a", F, [2]), vi("ss", F, [None, 2])],
        inits={"M": np.int64(4), "c": np.bool_(True)},
    )
    feeds = [np.float32([1.1, -0.9]), np.float32([0.5, 2.0])]
    check(proto, feeds)
    assert primitives(jaxpr(proto, feeds)) == {"scan["}


def test_loop_zero_iterations_keeps_initial_values():
    proto = _accumulate_loop()
    x, a0 = np.float32([1, 2, 3]), np.float32([4, 5, 6])
    # The ReferenceEvaluator cannot stack zero scan outputs; the carried values are the
    # initial ones and the scan output is empty.
    a, b, ss = run(proto, [np.int64(0), x, a0, np.int64(7)], "call")
    np.testing.assert_array_equal(a, a0)
    assert b == 7 and ss.shape == (0, 3) and ss.dtype == np.float32


def _early_exit_loop(with_scan_output=False):
    """Double a (and count) while sum(a) < limit, at most M times: carried values freeze."""
    body = [
        const("two", np.float32(2)),
        oh.make_node("Mul", ["a_in", "two"], ["a_out"]),
        const("one", np.int64(1)),
        oh.make_node("Add", ["n_in", "one"], ["n_out"]),
        oh.make_node("ReduceSum", ["a_out"], ["s"], keepdims=0),
        oh.make_node("Less", ["s", "limit"], ["cond_out"]),
    ]
    body_out = [vi("cond_out", B, []), vi("a_out", F, [2]), vi("n_out", I64, [])]
    loop_out, main_out = ["a", "n"], [vi("a", F, [2]), vi("n", I64, [])]
    if with_scan_output:
        body_out.append(vi("s", F, []))
        loop_out.append("ss")
        main_out.append(vi("ss", F, [None]))
    return _loop_model(
        body,
        [vi("i", I64, []), vi("cond_in", B, []), vi("a_in", F, [2]), vi("n_in", I64, [])],
        body_out,
        ["M", "", "a0", "n0"],
        loop_out,
        [vi("a0", F, [2]), vi("limit", F, [])],
        main_out,
        inits={"M": np.int64(10), "n0": np.int64(0)},
    )


@pytest.mark.parametrize("limit, iterations", [(10.0, 3), (1e6, 10), (-1.0, 1)])
def test_loop_early_exit_by_data_dependent_condition(limit, iterations):
    proto = _early_exit_loop()
    feeds = [np.float32([0.5, 1.0]), np.float32(limit)]
    # The body runs once more than the condition allows: the last run sets it false.
    check(proto, feeds, expected=[np.float32([0.5, 1.0]) * 2.0**iterations, np.int64(iterations)])
    check(proto, feeds)
    assert primitives(jaxpr(proto, feeds)) == {"scan["}


def test_loop_early_exit_with_scan_outputs_runs_on_the_host_only():
    # One compiled computation cannot stack a data-dependent number of rows: under jit that is
    # an error naming the loop; Model(*inputs) runs the loop on the host instead.
    proto = _early_exit_loop(with_scan_output=True)
    feeds = [np.float32([0.5, 1.0]), np.float32(10)]
    with pytest.raises(errors.RuntimeShapeError, match="'loop'.*condition depends on runtime data.*scan outputs"):
        run(proto, feeds, "jit")
    for got, want in zip(run(proto, feeds, "call"), onnxruntime_outputs(proto, feeds)):
        assert_same(got, want)


def _while_loop(trip=False):
    """a = a * 3 while a < limit (a scalar); the count is the second output."""
    body = [
        const("three", np.float32(3)),
        oh.make_node("Mul", ["a_in", "three"], ["a_out"]),
        oh.make_node("Cast", ["i"], ["i_out"], to=I64),
        oh.make_node("Less", ["a_out", "limit"], ["cond_out"]),
    ]
    main_in = [vi("c", B, []), vi("a0", F, []), vi("limit", F, [])]
    if trip:
        main_in.insert(0, vi("M", I64, []))
    return _loop_model(
        body,
        [vi("i", I64, []), vi("cond_in", B, []), vi("a_in", F, []), vi("i_in", I64, [])],
        [vi("cond_out", B, []), vi("a_out", F, []), vi("i_out", I64, [])],
        ["M" if trip else "", "c", "a0", "zero"],
        ["a", "last"],
        main_in,
        [vi("a", F, []), vi("last", I64, [])],
        inits={"zero": np.int64(-1)},
    )


@pytest.mark.parametrize("flag, a0, limit", [(True, 1.0, 100.0), (True, 5.0, 1.0), (False, 1.0, 100.0)])
def test_loop_without_trip_count_is_while_loop(flag, a0, limit):
    proto = _while_loop()
    feeds = [np.array(flag), np.float32(a0), np.float32(limit)]
    check(proto, feeds)
    assert primitives(jaxpr(proto, feeds)) == {"while["}
    # Model.__call__ makes the condition static; the loop itself still depends on data.
    assert primitives(jaxpr(proto, feeds, traced=[1, 2])) == {"while["}


@pytest.mark.parametrize("trip", [0, 2, 50])
def test_loop_traced_trip_count_without_scan_outputs_is_while_loop(trip):
    proto = _while_loop(trip=True)
    feeds = [np.int64(trip), np.array(True), np.float32(1.0), np.float32(100.0)]
    check(proto, feeds, modes=("jit",))
    assert primitives(jaxpr(proto, feeds)) == {"while["}
    # With the trip count static (Model.__call__), the loop is a scan with a dynamic exit.
    check(proto, feeds, modes=("call",))


def test_loop_body_slicing_by_iteration_number_is_unrolled():
    # s_i = x[i : i + 2]: Slice needs i at trace time, so each iteration is traced apart.
    body = [
        oh.make_node("Identity", ["cond_in"], ["cond_out"]),
        const("axes", np.int64([0])),
        oh.make_node("Unsqueeze", ["i", "axes"], ["start"]),
        const("two", np.int64([2])),
        oh.make_node("Add", ["start", "two"], ["end"]),
        oh.make_node("Slice", ["x", "start", "end"], ["s"]),
        oh.make_node("ReduceSum", ["s"], ["r"], keepdims=0),
        oh.make_node("Add", ["a_in", "r"], ["a_out"]),
    ]
    proto = _loop_model(
        body,
        [vi("i", I64, []), vi("cond_in", B, []), vi("a_in", F, [])],
        [vi("cond_out", B, []), vi("a_out", F, []), vi("s", F, [2])],
        ["M", "", "a0"],
        ["a", "ss"],
        [vi("x", F, [6]), vi("a0", F, [])],
        [vi("a", F, []), vi("ss", F, [None, 2])],
        inits={"M": np.int64(4)},
    )
    feeds = [RNG.standard_normal(6).astype(np.float32), np.float32(0.25)]
    check(proto, feeds)
    assert primitives(jaxpr(proto, feeds)) == set()


def test_loop_carrying_a_sequence_is_unrolled():
    body = [
        oh.make_node("Identity", ["cond_in"], ["cond_out"]),
        oh.make_node("Cast", ["i"], ["fi"], to=F),
        oh.make_node("Mul", ["x", "fi"], ["xi"]),
        oh.make_node("SequenceInsert", ["seq_in", "xi"], ["seq_out"]),
    ]
    seq = oh.make_tensor_sequence_value_info
    proto = _loop_model(
        body,
        [vi("i", I64, []), vi("cond_in", B, []), seq("seq_in", F, [2])],
        [vi("cond_out", B, []), seq("seq_out", F, [2])],
        ["M", "", "empty"],
        ["seq"],
        [vi("M", I64, []), vi("x", F, [2])],
        [seq("seq", F, [2]), vi("cat", F, [None, 2]), vi("n", I64, [])],
        pre=[oh.make_node("SequenceEmpty", [], ["empty"], dtype=F)],
        post=[
            oh.make_node("ConcatFromSequence", ["seq"], ["cat"], axis=0, new_axis=1),
            oh.make_node("SequenceLength", ["seq"], ["n"]),
        ],
    )
    feeds = [np.int64(3), np.float32([1.5, -2.0])]
    check(proto, feeds, modes=("call", "apply"))
    assert primitives(jaxpr(proto, feeds, traced=[1])) == set()


def test_nested_loop_reads_outer_loop_and_main_graph_values():
    # acc += x * i + j for i < 3, j < K: the inner body reads x (main graph), i (outer body)
    # and K (a main-graph initializer) drives the inner trip count.
    inner_body = graph(
        [
            oh.make_node("Identity", ["ic_in"], ["ic_out"]),
            oh.make_node("Cast", ["i"], ["fi"], to=F),
            oh.make_node("Cast", ["j"], ["fj"], to=F),
            oh.make_node("Mul", ["x", "fi"], ["xi"]),
            oh.make_node("Add", ["xi", "fj"], ["d"]),
            oh.make_node("Add", ["acc_in", "d"], ["acc_out"]),
        ],
        [vi("j", I64, []), vi("ic_in", B, []), vi("acc_in", F, [2])],
        [vi("ic_out", B, []), vi("acc_out", F, [2])],
        "inner",
    )
    outer_body = [
        oh.make_node("Identity", ["cond_in"], ["cond_out"]),
        oh.make_node("Loop", ["K", "", "a_in"], ["a_out"], name="inner", body=inner_body),
        oh.make_node("Identity", ["a_out"], ["s"]),
    ]
    proto = _loop_model(
        outer_body,
        [vi("i", I64, []), vi("cond_in", B, []), vi("a_in", F, [2])],
        [vi("cond_out", B, []), vi("a_out", F, [2]), vi("s", F, [2])],
        ["M", "", "a0"],
        ["a", "ss"],
        [vi("x", F, [2]), vi("a0", F, [2])],
        [vi("a", F, [2]), vi("ss", F, [None, 2])],
        inits={"M": np.int64(3), "K": np.int64(2)},
    )
    feeds = [np.float32([1.0, -0.5]), np.float32([0.0, 10.0])]
    check(proto, feeds)
    assert jaxpr(proto, feeds).count("scan[") == 2


def test_loop_without_x64_keeps_int64_arithmetic_silent():
    # With jax_enable_x64 off, the iteration number and int64 constants meet in the body
    # (Add of the iteration and an int64 initializer); no warnings, same numbers.
    proto = _accumulate_loop()
    feeds = [np.int64(4), np.float32([1, 2, 3]), np.float32([0, 0, 1]), np.int64(2)]
    want = reference(proto, feeds)
    m = jonnx.load(proto)
    for got in (m(*feeds), m.apply(m.params, *feeds)):
        for g, w in zip(got, want):
            np.testing.assert_allclose(np.asarray(g), w, rtol=1e-6)


def test_grad_through_loop_with_static_trip_count():
    # a_{i+1} = sin(a_i) * x + i;  output: the final a plus the sum of the scan outputs.
    body = [
        oh.make_node("Identity", ["cond_in"], ["cond_out"]),
        oh.make_node("Sin", ["a_in"], ["sa"]),
        oh.make_node("Mul", ["sa", "x"], ["m"]),
        oh.make_node("Cast", ["i"], ["fi"], to=D),
        oh.make_node("Add", ["m", "fi"], ["a_out"]),
        oh.make_node("Mul", ["a_out", "a_out"], ["s"]),
    ]
    proto = _loop_model(
        body,
        [vi("i", I64, []), vi("cond_in", B, []), vi("a_in", D, [3])],
        [vi("cond_out", B, []), vi("a_out", D, [3]), vi("s", D, [3])],
        ["M", "", "a0"],
        ["a", "ss"],
        [vi("x", D, [3]), vi("a0", D, [3])],
        [vi("y", D, [])],
        post=[
            oh.make_node("ReduceSum", ["ss"], ["t"], keepdims=0),
            oh.make_node("ReduceSum", ["a"], ["u"], keepdims=0),
            oh.make_node("Add", ["t", "u"], ["y"]),
        ],
        inits={"M": np.int64(4)},
    )
    x, a0 = np.array([0.3, -0.7, 1.1]), np.array([0.2, 0.5, -1.0])
    check(proto, [x, a0])
    with jax.enable_x64(True):
        m = jonnx.load(proto)
        check_grads(lambda x, a0: m.apply(m.params, x, a0)[0], (x, a0), order=2, modes=("fwd", "rev"), eps=1e-5)


def test_grad_through_loop_with_early_exit():
    proto = _early_exit_loop()
    with jax.enable_x64(True):
        m = jonnx.load(proto)
        limit = np.float32(10)

        def f(a0):
            return jnp.sum(m.apply(m.params, a0, limit)[0])

        a0 = np.float32([0.5, 1.0])
        # Three doublings happen, so d sum(a) / d a0 = 8.
        np.testing.assert_allclose(jax.grad(f)(a0), [8.0, 8.0])


def test_loop_scan_outputs_without_static_trip_count_need_the_host():
    proto = _accumulate_loop()
    feeds = [np.int64(3), np.float32([1, 2, 3]), np.float32([0, 0, 1]), np.int64(2)]
    with pytest.raises(errors.StaticValueError, match="'loop'.*needs input 0.*'M'"):
        run(proto, feeds, "jit")
    # No trip count at all: the condition (runtime data) bounds the loop, and scan outputs
    # cannot stack.
    body = [
        const("two", np.float32(2)),
        oh.make_node("Mul", ["a_in", "two"], ["a_out"]),
        oh.make_node("Less", ["a_out", "limit"], ["cond_out"]),
        oh.make_node("Identity", ["a_out"], ["s"]),
    ]
    proto = _loop_model(
        body,
        [vi("i", I64, []), vi("cond_in", B, []), vi("a_in", F, [])],
        [vi("cond_out", B, []), vi("a_out", F, []), vi("s", F, [])],
        ["", "c", "a0"],
        ["a", "ss"],
        [vi("c", B, []), vi("a0", F, []), vi("limit", F, [])],
        [vi("a", F, []), vi("ss", F, [None])],
    )
    feeds = [np.array(True), np.float32(1), np.float32(10)]
    with pytest.raises(errors.RuntimeShapeError, match="'loop'.*condition depends on runtime data.*scan outputs"):
        run(proto, feeds, "jit")
    # Model(*inputs) runs it on the host: a, then 2, 4, 8, 16 stacked.
    for got, want in zip(run(proto, feeds, "call"), onnxruntime_outputs(proto, feeds)):
        assert_same(got, want)


def _growing_loop(trip):
    body = [
        oh.make_node("Identity", ["cond_in"], ["cond_out"]),
        oh.make_node("Concat", ["a_in", "a_in"], ["a_out"], axis=0),
    ]
    return _loop_model(
        body,
        [vi("i", I64, []), vi("cond_in", B, []), vi("a_in", I64, [None])],
        [vi("cond_out", B, []), vi("a_out", I64, [None])],
        ["M" if trip else "", "" if trip else "c", "a0"],
        ["a"],
        [vi("c" if not trip else "M", B if not trip else I64, []), vi("a0", I64, [None])],
        [vi("a", I64, [None])],
    )


def test_loop_carried_value_changing_shape_is_an_error():
    a0 = np.int64([1, 2])
    for mode in ("call", "apply", "jit"):
        if mode != "jit":  # under jit(apply) the trip count is traced: a while loop
            with pytest.raises(errors.NodeError, match=r"'loop'.*changes shape from \(2,\) to \(4,\)"):
                run(_growing_loop(True), [np.int64(3), a0], mode)
    # A condition-only loop (lax.while_loop) says the same.
    with pytest.raises(errors.NodeError, match=r"'loop'.*changes shape from \(2,\) to \(4,\)"):
        run(_growing_loop(False), [np.array(True), a0], "jit")


def test_loop_known_at_trace_time_may_change_shape():
    # Every input is a constant: the loop runs at trace time, so the shape may change.
    body = [
        oh.make_node("Identity", ["cond_in"], ["cond_out"]),
        oh.make_node("Concat", ["a_in", "a_in"], ["a_out"], axis=0),
    ]
    proto = _loop_model(
        body,
        [vi("i", I64, []), vi("cond_in", B, []), vi("a_in", I64, [None])],
        [vi("cond_out", B, []), vi("a_out", I64, [None])],
        ["M", "", "a0"],
        ["a"],
        [vi("x", F, [1])],
        [vi("a", I64, [None]), vi("y", F, [1])],
        post=[oh.make_node("Identity", ["x"], ["y"])],
        inits={"M": np.int64(3), "a0": np.int64([1, 2])},
    )
    feeds = [np.float32([1])]
    check(proto, feeds)
    assert run(proto, feeds)[0].shape == (16,)


# -- Scan --------------------------------------------------------------------------------


def _scan_body(dtype=F):
    """States (s1: [2], s2: scalar); inputs u: [2], v: [2]; outputs o1 = s1 + u, o2 = u * v."""
    return graph(
        [
            oh.make_node("Add", ["s1_in", "u"], ["s1_out"]),
            oh.make_node("Mul", ["u", "v"], ["o2"]),
            oh.make_node("ReduceSum", ["o2"], ["r"], keepdims=0),
            oh.make_node("Add", ["s2_in", "r"], ["s2_out"]),
            oh.make_node("Mul", ["s1_out", "w"], ["o1"]),
        ],
        [vi("s1_in", dtype, [2]), vi("s2_in", dtype, []), vi("u", dtype, [2]), vi("v", dtype, [2])],
        [vi("s1_out", dtype, [2]), vi("s2_out", dtype, []), vi("o1", dtype, [2]), vi("o2", dtype, [2])],
    )


def _numpy_scan(s1, s2, us, vs, w):
    """The reference loop over leading-axis slices."""
    o1, o2 = [], []
    for u, v in zip(us, vs):
        s1 = s1 + u
        s2 = s2 + np.sum(u * v)
        o1.append(s1 * w)
        o2.append(u * v)
    return s1, s2, np.stack(o1), np.stack(o2)


@pytest.mark.parametrize("opset", [9, 11, 16, 19, 21])
@pytest.mark.parametrize("in_dirs, out_dirs", [((0, 0), (0, 0)), ((1, 0), (0, 1)), ((0, 1), (1, 1))])
def test_scan_axes_and_directions(opset, in_dirs, out_dirs):
    # u is scanned along axis 0, v along axis 1; o1 is stacked along axis 1, o2 along 0.
    # Negative axes exist from opset 11.
    in_axes, out_axes = ((0, -1), (-1, 0)) if opset >= 11 else ((0, 1), (1, 0))
    node = oh.make_node(
        "Scan",
        ["s1", "s2", "u", "v"],
        ["f1", "f2", "y1", "y2"],
        name="scan",
        body=_scan_body(),
        num_scan_inputs=2,
        scan_input_axes=in_axes,
        scan_input_directions=in_dirs,
        scan_output_axes=out_axes,
        scan_output_directions=out_dirs,
    )
    proto = model(
        [node],
        [vi("s1", F, [2]), vi("s2", F, []), vi("u", F, [5, 2]), vi("v", F, [2, 5])],
        [vi("f1", F, [2]), vi("f2", F, []), vi("y1", F, [2, 5]), vi("y2", F, [5, 2])],
        opset=opset,
        inits={"w": np.float32(0.5)},
    )
    s1, s2 = RNG.standard_normal(2).astype(np.float32), np.float32(1)
    u, v = RNG.standard_normal((5, 2)).astype(np.float32), RNG.standard_normal((2, 5)).astype(np.float32)
    us, vs = (u[::-1] if in_dirs[0] else u), (v.T[::-1] if in_dirs[1] else v.T)
    f1, f2, y1, y2 = _numpy_scan(s1, s2, us, vs, np.float32(0.5))
    y1, y2 = (y1[::-1] if out_dirs[0] else y1).T, (y2[::-1] if out_dirs[1] else y2)
    expected = [f1, np.float32(f2), np.ascontiguousarray(y1), np.ascontiguousarray(y2)]
    # numpy gives the expected values: the ReferenceEvaluator scans along axis 0 only.
    check(proto, [s1, s2, u, v], expected=expected)
    assert primitives(jaxpr(proto, [s1, s2, u, v])) == {"scan["}


def test_scan_body_reads_outer_value():
    body = graph(
        [
            oh.make_node("Mul", ["x", "k"], ["xk"]),
            oh.make_node("Add", ["s_in", "xk"], ["s_out"]),
            oh.make_node("Identity", ["s_out"], ["o"]),
        ],
        [vi("s_in", F, [3]), vi("x", F, [3])],
        [vi("s_out", F, [3]), vi("o", F, [3])],
    )
    nodes = [
        oh.make_node("Exp", ["kk"], ["k"]),
        oh.make_node("Scan", ["s0", "xs"], ["s", "ys"], body=body, num_scan_inputs=1),
    ]
    proto = model(
        nodes, [vi("kk", F, [3]), vi("s0", F, [3]), vi("xs", F, [4, 3])], [vi("s", F, [3]), vi("ys", F, [4, 3])]
    )
    feeds = [RNG.standard_normal(3).astype(np.float32) for _ in range(2)] + [
        RNG.standard_normal((4, 3)).astype(np.float32)
    ]
    check(proto, feeds)


@pytest.mark.parametrize("directions", [None, (0, 1)])
def test_scan_8_batch_axis(directions):
    # Scan-8: every input has a leading batch axis; the scan axis is 1. numpy gives the
    # expected value (the ReferenceEvaluator implements Scan-9+ only).
    attrs = {} if directions is None else {"directions": directions}
    node = oh.make_node(
        "Scan",
        ["", "s1", "s2", "u", "v"],
        ["f1", "f2", "y1", "y2"],
        name="scan",
        body=_scan_body(),
        num_scan_inputs=2,
        **attrs,
    )
    proto = model(
        [node],
        [vi("s1", F, [3, 2]), vi("s2", F, [3]), vi("u", F, [3, 4, 2]), vi("v", F, [3, 4, 2])],
        [vi("f1", F, None), vi("f2", F, None), vi("y1", F, None), vi("y2", F, None)],
        opset=8,
        inits={"w": np.float32(2)},
    )
    s1, s2 = RNG.standard_normal((3, 2)).astype(np.float32), RNG.standard_normal(3).astype(np.float32)
    u, v = RNG.standard_normal((3, 4, 2)).astype(np.float32), RNG.standard_normal((3, 4, 2)).astype(np.float32)
    flip = directions or (0, 0)
    per_batch = [
        _numpy_scan(s1[b], s2[b], u[b][::-1] if flip[0] else u[b], v[b][::-1] if flip[1] else v[b], np.float32(2))
        for b in range(3)
    ]
    expected = [np.stack([r[k] for r in per_batch]).astype(np.float32) for k in range(4)]
    check(proto, [s1, s2, u, v], expected=expected)


def _scan_8_lens_model(directions):
    """Scan-8 with sequence_lens: state s += a * b_t... over two inputs, one per direction."""
    body = graph(
        [
            oh.make_node("Mul", ["ai", "bi"], ["p"]),
            oh.make_node("Add", ["s_in", "p"], ["s_out"]),
            oh.make_node("Identity", ["s_out"], ["o1"]),
            oh.make_node("Identity", ["ai"], ["o2"]),
        ],
        [vi("s_in", F, [2]), vi("ai", F, [2]), vi("bi", F, [2])],
        [vi("s_out", F, [2]), vi("o1", F, [2]), vi("o2", F, [2])],
    )
    node = oh.make_node(
        "Scan",
        ["lens", "s", "a", "b"],
        ["f", "y1", "y2"],
        name="scan",
        num_scan_inputs=2,
        body=body,
        directions=list(directions),
    )
    proto = model(
        [node],
        [vi("lens", I64, [3]), vi("s", F, [3, 2]), vi("a", F, [3, 4, 2]), vi("b", F, [3, 4, 2])],
        [vi("f", F, [3, 2]), vi("y1", F, [3, 4, 2]), vi("y2", F, [3, 4, 2])],
        opset=8,
    )
    proto.ir_version = 8
    return proto


@pytest.mark.parametrize("directions", [(0, 0), (1, 0), (0, 1)])
@pytest.mark.parametrize("lens", [(4, 4, 4), (4, 2, 1), (1, 3, 4)])
def test_scan_8_sequence_lens_against_onnxruntime(directions, lens):
    # A short sequence keeps its state past its length, its scan outputs are zero there, and
    # a reversed input starts at its last valid element: onnxruntime implements Scan-8.
    import onnxruntime as ort

    proto = _scan_8_lens_model(directions)
    feeds = [
        np.int64(lens),
        RNG.standard_normal((3, 2)).astype(np.float32),
        RNG.standard_normal((3, 4, 2)).astype(np.float32),
        RNG.standard_normal((3, 4, 2)).astype(np.float32),
    ]
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, dict(zip(["lens", "s", "a", "b"], feeds)))
    check(proto, feeds, expected=want)
    m = jonnx.load(proto)
    traced = jax.jit(lambda *xs: m.apply(m.params, *xs))(*feeds)  # lengths known only at run time
    assert_same([np.asarray(t) for t in traced], want, rtol=1e-5, atol=1e-6)


def test_scan_8_sequence_lens_out_of_range():
    proto = _scan_8_lens_model((0, 0))
    feeds = [
        np.int64([5, 1, 1]),
        np.zeros((3, 2), np.float32),
        np.zeros((3, 4, 2), np.float32),
        np.zeros((3, 4, 2), np.float32),
    ]
    with pytest.raises(errors.NumericCheckError, match=r"'scan'.*sequence_lens must lie in \[0, 4\]"):
        jonnx.load(proto, checked=True)(*feeds)


def test_scan_errors():
    body = graph(
        [oh.make_node("Add", ["s_in", "a"], ["s_out"]), oh.make_node("Mul", ["a", "b"], ["o"])],
        [vi("s_in", F, [2]), vi("a", F, [2]), vi("b", F, [2])],
        [vi("s_out", F, [2]), vi("o", F, [2])],
    )
    node = oh.make_node("Scan", ["s", "a", "b"], ["f", "y"], name="scan", body=body, num_scan_inputs=2)
    proto = model(
        [node],
        [vi("s", F, [2]), vi("a", F, [None, 2]), vi("b", F, [None, 2])],
        [vi("f", F, [2]), vi("y", F, [None, 2])],
    )
    with pytest.raises(errors.NodeError, match=r"'scan'.*different lengths.*\[3, 4\]"):
        run(proto, [np.zeros(2, np.float32), np.zeros((3, 2), np.float32), np.zeros((4, 2), np.float32)])
    grow = graph(
        [oh.make_node("Concat", ["s_in", "a"], ["s_out"], axis=0), oh.make_node("Identity", ["a"], ["o"])],
        [vi("s_in", F, [None]), vi("a", F, [2])],
        [vi("s_out", F, [None]), vi("o", F, [2])],
    )
    node = oh.make_node("Scan", ["s", "a"], ["f", "y"], name="scan", body=grow, num_scan_inputs=1)
    proto = model([node], [vi("s", F, [None]), vi("a", F, [3, 2])], [vi("f", F, None), vi("y", F, None)])
    with pytest.raises(errors.NodeError, match=r"'scan'.*changes shape from \(2,\) to \(4,\)"):
        run(proto, [np.zeros(2, np.float32), np.zeros((3, 2), np.float32)])


def test_grad_through_scan():
    body = graph(
        [
            oh.make_node("Mul", ["s_in", "x"], ["p"]),
            oh.make_node("Tanh", ["p"], ["s_out"]),
            oh.make_node("Mul", ["s_out", "w"], ["o"]),
        ],
        [vi("s_in", D, [2]), vi("x", D, [2])],
        [vi("s_out", D, [2]), vi("o", D, [2])],
    )
    node = oh.make_node(
        "Scan", ["s0", "xs"], ["s", "ys"], body=body, num_scan_inputs=1, scan_input_directions=[1], scan_output_axes=[1]
    )
    proto = model(
        [
            node,
            oh.make_node("ReduceSum", ["ys"], ["t"], keepdims=0),
            oh.make_node("ReduceSum", ["s"], ["u"], keepdims=0),
            oh.make_node("Add", ["t", "u"], ["y"]),
        ],
        [vi("s0", D, [2]), vi("xs", D, [5, 2])],
        [vi("y", D, [])],
        inits={"w": np.array([1.5, -0.5])},
    )
    s0, xs = np.array([0.3, -0.8]), RNG.standard_normal((5, 2))
    # numpy: the ReferenceEvaluator does not implement reversed scan inputs.
    s, ys = s0, []
    for x in xs[::-1]:
        s = np.tanh(s * x)
        ys.append(s * np.array([1.5, -0.5]))
    check(proto, [s0, xs], expected=[np.array(np.sum(ys) + np.sum(s))])
    with jax.enable_x64(True):
        m = jonnx.load(proto)
        check_grads(
            lambda p, s0, xs: m.apply(p, s0, xs)[0], (m.params, s0, xs), order=2, modes=("fwd", "rev"), eps=1e-5
        )


@pytest.mark.parametrize("x64", [True, False])
def test_loop_with_int64_max_trip_count_and_a_condition(x64):
    # Exporters (torch.onnx) write "while cond" as a Loop with trip count INT64_MAX: it must
    # run as a while loop, not a scan of 2**63 steps.
    proto = _while_loop(trip=True)
    feeds = [np.int64(np.iinfo(np.int64).max), np.array(True), np.float32(1.0), np.float32(100.0)]
    want = [np.float32(243), np.int64(4)]
    with jax.enable_x64(x64):
        m = jonnx.load(proto)
        for got in (m(*feeds), m.apply(m.params, *feeds)):
            np.testing.assert_array_equal(np.asarray(got[0]), want[0])
            np.testing.assert_array_equal(np.asarray(got[1]), want[1])
        assert primitives(
            str(jax.make_jaxpr(lambda a: m.apply(m.params, feeds[0], feeds[1], a, feeds[3]))(feeds[2]))
        ) == {"while["}


def _exit_by_iteration_loop(loop_inputs, inits, **kwargs):
    """A Loop whose body stops after iteration 3 (i < 3), adds x to a carried value and
    emits its negation as a scan output."""
    body = [
        const("three", np.int64(3)),
        oh.make_node("Less", ["i", "three"], ["cond_out"]),
        oh.make_node("Add", ["a_in", "x"], ["a_out"]),
        oh.make_node("Neg", ["a_out"], ["s"]),
    ]
    return _loop_model(
        body,
        [vi("i", I64, []), vi("cond_in", B, []), vi("a_in", F, [2])],
        [vi("cond_out", B, []), vi("a_out", F, [2]), vi("s", F, [2])],
        loop_inputs,
        ["a", "ss"],
        [vi("x", F, [2]), vi("a0", F, [2])],
        [vi("a", F, [2]), vi("ss", F, [None, 2])],
        inits=inits,
        **kwargs,
    )


def test_loop_exit_by_iteration_number_with_scan_outputs():
    # The condition depends on the iteration number only (i < 3): known at trace time once
    # the loop is unrolled, so the scan outputs have a static length (4 iterations).
    proto = _exit_by_iteration_loop(["M", "", "a0"], {"M": np.int64(10)})
    feeds = [np.float32([1, 2]), np.float32([0.5, 0.25])]
    check(proto, feeds)
    assert run(proto, feeds)[1].shape == (4, 2)


def onnxruntime_outputs(proto, feeds):
    """onnxruntime's outputs, where the ReferenceEvaluator concatenates Loop scan outputs
    instead of stacking them (the specification's ``user_defined_vals[i] = ...``)."""
    import onnxruntime as ort

    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in proto.graph.input if i.name not in {t.name for t in proto.graph.initializer}]
    return session.run(None, {n: np.asarray(v) for n, v in zip(names, feeds)})


@pytest.mark.parametrize("opset", [11, 13, 16, 19, 21])
@pytest.mark.parametrize("flag", [True, False])
def test_loop_without_trip_count_with_scan_outputs_ends_by_iteration_number(opset, flag):
    # No trip count, but a constant first condition and a body condition on the iteration
    # number (i < 3): unrolled, the scan outputs have a static length (4 rows, or 0 when the
    # condition is false from the start).
    proto = _exit_by_iteration_loop(["", "c", "a0"], {"c": np.bool_(flag)}, opset=opset)
    feeds = [np.float32([1, 2]), np.float32([0.5, 0.25])]
    check(proto, feeds, expected=onnxruntime_outputs(proto, feeds))
    assert run(proto, feeds)[1].shape == ((4, 2) if flag else (0, 2))


def test_loop_known_at_trace_time_running_zero_times_has_empty_scan_outputs():
    body = [
        oh.make_node("Identity", ["cond_in"], ["cond_out"]),
        oh.make_node("Identity", ["a_in"], ["a_out"]),
        oh.make_node("Cast", ["a_in"], ["s"], to=F),
    ]
    proto = _loop_model(
        body,
        [vi("i", I64, []), vi("cond_in", B, []), vi("a_in", I64, [3])],
        [vi("cond_out", B, []), vi("a_out", I64, [3]), vi("s", F, [3])],
        ["M", "", "a0"],
        ["a", "ss"],
        [vi("M", I64, [])],
        [vi("a", I64, [3]), vi("ss", F, [None, 3])],
        inits={"a0": np.int64([1, 2, 3])},
    )
    a, ss = run(proto, [np.int64(0)])
    np.testing.assert_array_equal(a, [1, 2, 3])
    assert ss.shape == (0, 3) and ss.dtype == np.float32
    check(proto, [np.int64(2)], modes=("call", "apply"))


def test_loop_with_int64_max_trip_count_and_scan_outputs_ends_by_its_condition():
    # A huge trip count with scan outputs: the condition (on the iteration number) ends it.
    body = [
        const("two", np.int64(2)),
        oh.make_node("Less", ["i", "two"], ["cond_out"]),
        oh.make_node("Add", ["a_in", "x"], ["a_out"]),
        oh.make_node("Identity", ["a_out"], ["s"]),
    ]
    proto = _loop_model(
        body,
        [vi("i", I64, []), vi("cond_in", B, []), vi("a_in", F, [])],
        [vi("cond_out", B, []), vi("a_out", F, []), vi("s", F, [])],
        ["M", "", "a0"],
        ["a", "ss"],
        [vi("x", F, []), vi("a0", F, [])],
        [vi("a", F, []), vi("ss", F, [None])],
        inits={"M": np.int64(np.iinfo(np.int64).max)},
    )
    # By hand: the ReferenceEvaluator stacks scalar scan outputs with np.vstack, as (n, 1).
    check(proto, [np.float32(1.5), np.float32(0)], expected=[np.float32(4.5), np.float32([1.5, 3, 4.5])])


def _random_loop(trip_static: bool):
    """A Loop whose body draws RandomUniformLike([64]) each iteration, as a scan output; with a
    runtime trip count the draws are summed into a carried value instead."""
    body_nodes = [
        oh.make_node("Identity", ["cond_in"], ["cond_out"]),
        oh.make_node("RandomUniformLike", ["x"], ["r"]),
        oh.make_node("Add", ["acc_in", "r"], ["acc_out"]),
    ]
    body_out = [vi("cond_out", B, []), vi("acc_out", F, [64])]
    loop_out, main_out = ["acc"], [vi("acc", F, [64])]
    if trip_static:
        body_nodes.append(oh.make_node("Identity", ["r"], ["draw"]))
        body_out.append(vi("draw", F, [64]))
        loop_out, main_out = ["acc", "draws"], [vi("acc", F, [64]), vi("draws", F, [None, 64])]
    return _loop_model(
        body_nodes,
        [vi("i", I64, []), vi("cond_in", B, []), vi("acc_in", F, [64])],
        body_out,
        ["M", "", "acc0"],
        loop_out,
        [vi("M", I64, []), vi("x", F, [64]), vi("acc0", F, [64])],
        main_out,
    )


def test_random_ops_in_a_loop_body_draw_afresh_each_iteration():
    x, acc0 = np.zeros(64, np.float32), np.zeros(64, np.float32)
    m = jonnx.load(_random_loop(trip_static=True))
    acc, draws = (np.asarray(v) for v in m(np.int64(4), x, acc0, key=jax.random.key(0)))
    assert draws.shape == (4, 64)
    assert len({d.tobytes() for d in draws}) == 4  # no two iterations share a draw
    np.testing.assert_allclose(acc, draws.sum(0), rtol=1e-6)
    assert abs(draws.mean() - 0.5) < 0.1  # uniform on [0, 1)

    # A runtime trip count runs lax.while_loop: the sum of 4 fresh draws, not 4 x one draw.
    m = jonnx.load(_random_loop(trip_static=False))
    (acc,) = jax.jit(lambda n: m.apply(m.params, n, x, acc0, key=jax.random.key(0)))(np.int64(4))
    first = jax.jit(lambda n: m.apply(m.params, n, x, acc0, key=jax.random.key(0)))(np.int64(1))[0]
    assert not np.allclose(np.asarray(acc), 4 * np.asarray(first))


def test_random_ops_in_a_scan_body_draw_afresh_each_step():
    body = graph(
        [
            oh.make_node("RandomNormalLike", ["u"], ["r"]),
            oh.make_node("Add", ["s_in", "r"], ["s_out"]),
            oh.make_node("Identity", ["r"], ["o"]),
        ],
        [vi("s_in", F, [32]), vi("u", F, [32])],
        [vi("s_out", F, [32]), vi("o", F, [32])],
    )
    node = oh.make_node("Scan", ["s0", "us"], ["s", "os"], num_scan_inputs=1, body=body)
    proto = model([node], [vi("s0", F, [32]), vi("us", F, [5, 32])], [vi("s", F, [32]), vi("os", F, [5, 32])])
    s, draws = (
        np.asarray(v)
        for v in jonnx.load(proto)(np.zeros(32, np.float32), np.zeros((5, 32), np.float32), key=jax.random.key(1))
    )
    assert len({d.tobytes() for d in draws}) == 5
    np.testing.assert_allclose(s, draws.sum(0), rtol=1e-5, atol=1e-6)


def test_loop_iteration_number_passed_straight_out_stacks_each_iteration():
    # The specification stacks each iteration's value; onnxruntime 1.32 stacks the last count
    # when the body output is the iteration-number input itself (tests/conformance/fuzz.py).
    body = [oh.make_node("Identity", ["cond_in"], ["cond_out"])]
    proto = _loop_model(
        body,
        [vi("i", I64, []), vi("cond_in", B, [])],
        [vi("cond_out", B, []), vi("i", I64, [])],
        ["M", ""],
        ["iters"],
        [vi("M", I64, [])],
        [vi("iters", I64, [None])],
    )
    # Scan outputs need the trip count at trace time: under jit it is a static argument.
    for mode in ("call", "apply"):
        assert_same(run(proto, [np.int64(4)], mode)[0], np.arange(4, dtype=np.int64))
