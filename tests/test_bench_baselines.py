"""The hand-written JAX baselines of benchmarks/hand_jax.py compute the nets.py networks, the
networks without one are valid models, and the benchmarks time engines in fair orders.

bench_acceptance.py reports jonnx against these; if one drifted from its ONNX network the
ratio would compare different functions. Small instances only (seconds): a ResNet-18 at 32x32,
2-layer narrow encoders (float and through quantize_dynamic) and small recurrent stacks,
checked against onnxruntime.
"""

from __future__ import annotations

import pathlib
import sys

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))

import hand_jax  # noqa: E402
import nets  # noqa: E402
from _order import balanced_orders  # noqa: E402


@pytest.mark.parametrize("n", range(2, 8))
def test_each_engine_follows_each_other_equally_often(n):
    # A fixed rotation keeps one engine always right after onnxruntime (whose threads spin
    # after its call): the timing bias these orders exist to remove.
    orders = balanced_orders(n)
    assert all(sorted(order) == list(range(n)) for order in orders)
    follows = {}
    for order in orders:
        for before, after in zip(order, order[1:]):
            follows[before, after] = follows.get((before, after), 0) + 1
    assert set(follows) == {(a, b) for a in range(n) for b in range(n) if a != b}
    assert len(set(follows.values())) == 1


@pytest.mark.parametrize(
    ("build", "shape"),
    [
        (lambda: nets.resnet18(size=32), (3, 32, 32)),
        (lambda: nets.bert_encoder(layers=2, hidden=64, heads=4, seq=8), (8, 64)),
        # 272 wide: the FFN's down-projection contracts 1088 > 1024 terms, in two exact chunks.
        (lambda: nets.quantized(nets.bert_encoder(layers=2, hidden=272, heads=4, seq=8)), (8, 272)),
    ],
    ids=["resnet18", "bert", "bert_int8"],
)
def test_hand_written_network_matches_onnxruntime(build, shape):
    proto = build()
    x = np.random.default_rng(0).standard_normal((2, *shape)).astype(np.float32)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, {session.get_inputs()[0].name: x})[0]
    got = np.asarray(hand_jax.inference(proto)(x))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize(("kind", "bidirectional"), [("LSTM", False), ("GRU", False), ("RNN", False), ("LSTM", True)])
def test_hand_written_recurrent_layers_match_onnxruntime(kind, bidirectional):
    # bench_recurrent.py's baseline: PyTorch-style stacked layers (GRU with linear_before_reset).
    proto = nets.recurrent(kind, layers=2, inputs=6, hidden=5, seq=7, bidirectional=bidirectional)
    x = np.random.default_rng(0).standard_normal((7, 3, 6)).astype(np.float32)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, {"x": x})[0]
    got = np.asarray(hand_jax.inference(proto)(x))
    assert got.shape == want.shape == (7, 3, 10 if bidirectional else 5)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_hand_written_network_rejects_a_net_it_does_not_follow():
    proto = nets.resnet18(size=32)
    conv = [n for n in proto.graph.node if n.op_type == "Conv"][1]  # the first block's 3x3
    (strides,) = [a for a in conv.attribute if a.name == "strides"]
    strides.ints[:] = [2, 2]
    with pytest.raises(ValueError, match="expects"):
        hand_jax.inference(proto)(np.zeros((1, 3, 32, 32), np.float32))


def test_thunk_profiler_reads_each_dot_from_the_compiled_hlo():
    # profile_thunks.py divides a dot thunk's flops by its time: the flops must be the dot's
    # own (2 M K N), counted once (not again for the dot inside a fusion), whichever library
    # XLA gives the dot to.
    import jax
    import profile_thunks

    import jonnx

    a, b = np.ones((64, 48), np.float32), np.ones((48, 80), np.float32)
    for library in (True, False):
        fn = jax.jit(lambda a, b: jax.numpy.tanh(a @ b), compiler_options=jonnx.compiler_options(library_dots=library))
        info, dots = profile_thunks._hlo_index(fn.lower(a, b).compile().as_text())
        assert list(dots.values()) == [(2 * 64 * 48 * 80, [64, 80], [64, 48])]
        # jaxlib 0.8.1 takes the YNNPACK option but leaves every dot to XLA (jonnx then passes none).
        in_library = library and bool(jonnx.compiler_options(library_dots=True))
        assert info[next(iter(dots))][1] == ("fusion" if in_library else "dot")


def test_thunk_profiler_credits_idle_time_to_the_last_hand_off_or_the_thunk_that_ended_last():
    # XLA's own dots and convolutions return before their work is done: a gap after one is
    # its own, even where a short thunk ran beside it and ended later. Without one the gap
    # goes to the thunk that ended last. Overlapping thunks leave no gap; time between calls
    # is nobody's, and a hand-off of an earlier call takes nothing of a later one.
    import profile_thunks

    events = [(0, 10, "a"), (5, 15, "b"), (20, 30, "c"), (22, 25, "d"), (40, 50, "e"), (100, 110, "f"), (150, 160, "g")]
    idle = profile_thunks._idle_after(events, calls=[(0, 60), (100, 200)])
    assert idle == {"b": 5, "c": 10, "f": 40}

    events = [(0, 2, "dot.3"), (1, 6, "add_fusion.1"), (9, 12, "fusion.2"), (20, 21, "dot_general"), (30, 31, "f.4")]
    idle = profile_thunks._idle_after(events + [(100, 101, "x"), (104, 105, "y")], calls=[(0, 40), (100, 110)])
    assert idle == {"dot.3": 3 + 8, "dot_general": 9, "x": 3}


def test_dot_floor_counts_each_float32_product_of_a_computation():
    # bench_dot_floor.py times each product the computation makes, as often as it makes it:
    # a product in a nested jit and a batched one included, an int32 one left out.
    import bench_dot_floor
    import jax
    import jax.numpy as jnp

    def f(x, w, q):
        h = jax.jit(lambda x, w: x @ w)(x, w)
        scores = jnp.einsum("bqd,bkd->bqk", q, q)
        return h @ w.T, scores, jnp.ones((3, 4), jnp.int32) @ jnp.ones((4, 5), jnp.int32)

    x, w, q = np.ones((6, 4), np.float32), np.ones((4, 4), np.float32), np.ones((2, 3, 8), np.float32)
    products = bench_dot_floor._products(jax.make_jaxpr(f)(x, w, q))
    # x @ w and h @ w.T are the same product (JAX transposes w first): counted twice.
    found = {bench_dot_floor._describe(p): (count, bench_dot_floor._flops(p)) for p, count in products.items()}
    assert found == {"6 x 4 x 4": (2, 2 * 6 * 4 * 4), "2 x 3 x 8 x 3": (1, 2 * 2 * 3 * 3 * 8)}


def test_dot_floor_counts_the_products_of_eight_bit_values_apart():
    # A quantized model's integer products (bfloat16 or int8 operands) are timed in every kind
    # for 8-bit values; its float32 products, and int32 ones, are not among them.
    import bench_dot_floor
    import jax
    import jax.numpy as jnp

    def f(a, b, x):
        as_bf16 = jnp.dot(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16), preferred_element_type=jnp.float32)
        as_int8 = jnp.dot(a, b, preferred_element_type=jnp.int32)
        return as_bf16, as_int8, x @ x, a.astype(jnp.int32) @ b.astype(jnp.int32)

    a, b, x = np.ones((5, 6), np.int8), np.ones((6, 7), np.int8), np.ones((3, 3), np.float32)
    jaxpr = jax.make_jaxpr(f)(a, b, x)
    eight_bit = bench_dot_floor._products(jaxpr, bench_dot_floor.EIGHT_BIT_OPERANDS)
    assert {bench_dot_floor._describe(p): n for p, n in eight_bit.items()} == {"5 x 6 x 7": 2}
    assert {bench_dot_floor._describe(p) for p in bench_dot_floor._products(jaxpr)} == {"3 x 3 x 3"}


@pytest.mark.parametrize(
    "build, x_shape",
    [(nets.efficientnet_b0, (1, 3, 224, 224)), (nets.mnist, (4, 1, 28, 28))],
    ids=["efficientnet", "mnist"],
)
def test_network_without_a_hand_written_twin_is_valid_and_jonnx_computes_it(build, x_shape):
    # bench_acceptance.py times these against onnxruntime only (no hand-written network).
    import onnx

    import jonnx

    proto = build()
    onnx.checker.check_model(proto, full_check=True)
    x = np.random.default_rng(0).standard_normal(x_shape).astype(np.float32)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, {proto.graph.input[0].name: x})[0]
    np.testing.assert_allclose(np.asarray(jonnx.load(proto)(x)[0]), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_recurrent_benchmark_rows(capsys):
    # bench_recurrent.py end to end on its smallest net, one round: a row per engine set whose
    # errors against onnxruntime are float32 rounding, and a gradient step whose jonnx and
    # hand-written losses agree.
    import bench_recurrent

    bench_recurrent.bench_inference("rnn", 2, 1)
    bench_recurrent.bench_train("rnn", 2, 1)
    inference, train = capsys.readouterr().out.strip().splitlines()
    rel_err, hand_err = map(float, inference.split()[-2:])
    assert inference.split()[:2] == ["rnn", "2"] and rel_err < 1e-5 and hand_err < 1e-5
    jonnx_loss, hand_loss = float(train.split()[-3]), float(train.split()[-1])
    assert train.split()[:2] == ["rnn", "2"] and abs(jonnx_loss - hand_loss) <= 1e-7 + 1e-6 * abs(hand_loss)
