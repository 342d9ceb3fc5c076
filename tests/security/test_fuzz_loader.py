"""Fuzzing the loader: mutated, truncated, bit-flipped and field-edited models end in a
JonnxError or load.

Seeds are small valid models (from onnx.helper, covering initializers, sparse initializers,
Constant attributes, If/Loop subgraphs and model-local functions) and the bundled
examples/models/*.onnx. Every example must either load or raise
``jonnx.errors.JonnxError``: no other exception, no crash, no hang (an alarm stops any load
that runs past ``HANG_SECONDS``).

Byte-level mutations mostly exercise the protobuf parser; field edits (odd ints, names,
paths and enum values set on random fields of a parsed seed, messages dropped or duplicated)
give models that parse and reach the graph builder.

The run is reproducible (``derandomize=True``: the same 2000 examples per test on every run,
about 15 s idle). For a longer local hunt set ``JONNX_FUZZ=long`` (20,000 per test, random seeds,
no deadline), or ``JONNX_FUZZ_EXAMPLES=N`` for N examples per test.
"""

from __future__ import annotations

import os
import pathlib
import signal

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import jonnx
from jonnx import errors
from tests.security._models import branch, call, const, function, graph, if_model, model, vi

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "models"
HANG_SECONDS = 20

_LONG = os.environ.get("JONNX_FUZZ") == "long"
_PER_TEST = int(os.environ.get("JONNX_FUZZ_EXAMPLES", "0")) or (20_000 if _LONG else 2000)
FUZZ = settings(
    max_examples=_PER_TEST,
    derandomize=not _LONG,
    deadline=None if _LONG else 5000,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _seeds() -> list[bytes]:
    w = onh.from_array(np.arange(4, dtype=np.float32), "w")
    sp = oh.make_sparse_tensor(
        onh.from_array(np.ones(2, np.float32), "sp"), onh.from_array(np.array([0, 3], np.int64), "sp_idx"), [4]
    )
    plain = model(
        graph([oh.make_node("Add", ["x", "w"], ["t"]), oh.make_node("Mul", ["t", "sp"], ["y"])], inits=[w], sparse=[sp])
    )
    shapes = model(
        graph(
            [
                const("shape", np.array([2, 2], np.int64)),
                oh.make_node("Reshape", ["x", "shape"], ["r"]),
                oh.make_node("Transpose", ["r"], ["t"], perm=[1, 0]),
                const("flat", np.array([4], np.int64)),
                oh.make_node("Reshape", ["t", "flat"], ["y"]),
            ]
        )
    )
    branches = if_model(branch([oh.make_node("Neg", ["x"], ["t"])], "t", "then"))
    body = oh.make_graph(
        [oh.make_node("Identity", ["c"], ["c_out"]), oh.make_node("Add", ["acc", "x"], ["acc_out"])],
        "body",
        [vi("i", [], onnx.TensorProto.INT64), vi("c", [], onnx.TensorProto.BOOL), vi("acc")],
        [vi("c_out", [], onnx.TensorProto.BOOL), vi("acc_out")],
    )
    loop = model(
        graph(
            [
                const("n", np.array(3, np.int64)),
                const("go", np.array(True)),
                oh.make_node("Loop", ["n", "go", "x"], ["y"], body=body),
            ]
        )
    )
    leaky = oh.make_node("LeakyRelu", ["a"], ["b"])
    ref = oh.make_attribute_ref("alpha", onnx.AttributeProto.FLOAT)
    ref.ref_attr_name = "alpha"  # onnx 1.21's helper leaves it empty
    leaky.attribute.append(ref)
    functions = model(
        graph([call("Outer")]),
        functions=[
            function("Outer", [call("Inner", ["a"], ["t"]), oh.make_node("Abs", ["t"], ["b"])]),
            oh.make_function(
                "test.security",
                "Inner",
                ["a"],
                ["b"],
                [leaky],
                opset_imports=[oh.make_opsetid("", 18)],
                attributes=["alpha"],
            ),
        ],
    )
    built = [m.SerializeToString() for m in (plain, shapes, branches, loop, functions)]
    return built + [p.read_bytes() for p in sorted(EXAMPLES.glob("*.onnx"))]


SEEDS = _seeds()


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang(f"jonnx.load ran past {HANG_SECONDS} s")


def _load(data: bytes) -> None:
    """Load ``data``; anything but success or a JonnxError fails the test."""
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(HANG_SECONDS)
    try:
        jonnx.load(data)
    except errors.JonnxError as e:
        assert str(e)  # every error says something
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@st.composite
def _mutated(draw) -> bytes:
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["flip", "byte", "insert", "delete", "duplicate", "varint"]))
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        if kind == "flip":
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "byte":
            data[at] = draw(st.integers(0, 255))
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "delete":
            del data[at : at + draw(st.integers(1, 16))]
        elif kind == "duplicate":
            n = draw(st.integers(1, 64))
            data[at:at] = data[at : at + n]
        else:
            # A large varint where a length or number was: sizes and dims near 2**63.
            data[at : at + 1] = bytes([0xFF] * 8 + [0x7F])
    return bytes(data)


@FUZZ
@given(data=_mutated())
def test_mutated_models(data):
    _load(data)


@FUZZ
@given(seed=st.sampled_from(SEEDS), fraction=st.floats(0.0, 1.0))
def test_truncated_models(seed, fraction):
    _load(seed[: int(len(seed) * fraction)])


@FUZZ
@given(
    seed=st.sampled_from(SEEDS),
    flips=st.lists(st.tuples(st.floats(0.0, 1.0, exclude_max=True), st.integers(0, 7)), min_size=1, max_size=4),
)
def test_bit_flipped_models(seed, flips):
    data = bytearray(seed)
    for where, bit in flips:
        data[int(where * len(data))] ^= 1 << bit
    _load(bytes(data))


_INTS = [0, 1, -1, 2, 7, 255, 2**31 - 1, -(2**31), 2**62, 2**63 - 1, -(2**63)]
_TEXT = [
    "",
    "x",
    "y",
    "w",
    "sp",
    "..",
    "../secret.bin",
    "/etc/passwd",
    "ai.onnx",
    "If",
    "Loop",
    "Constant",
    "test.security",
    "location",
    "offset",
    "length",
    "then_branch",
    "body",
]


def _messages(message, out):
    """Every message in the tree under ``message`` (itself included)."""
    out.append(message)
    for field, value in message.ListFields():
        if field.type == field.TYPE_MESSAGE:
            for m in value if _repeated(field) else (value,):
                _messages(m, out)
    return out


def _repeated(field) -> bool:
    flag = getattr(field, "is_repeated", None)
    return bool(flag) if flag is not None else field.label == field.LABEL_REPEATED


@st.composite
def _edited(draw) -> bytes:
    """A seed with fields of its messages set to odd values: parses, so it reaches the builder."""
    m = onnx.ModelProto()
    m.ParseFromString(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 4))):
        messages = _messages(m, [])
        target = messages[draw(st.integers(0, len(messages) - 1))]
        fields = target.DESCRIPTOR.fields
        field = fields[draw(st.integers(0, len(fields) - 1))]
        if field.type == field.TYPE_MESSAGE:
            if _repeated(field) and len(getattr(target, field.name)):
                items = getattr(target, field.name)
                if draw(st.booleans()):
                    del items[draw(st.integers(0, len(items) - 1))]
                else:
                    items.add().CopyFrom(items[draw(st.integers(0, len(items) - 1))])
            continue
        if field.type in (field.TYPE_STRING, field.TYPE_BYTES):
            value = draw(st.sampled_from(_TEXT))
            value = value.encode() if field.type == field.TYPE_BYTES else value
        elif field.type in (field.TYPE_FLOAT, field.TYPE_DOUBLE):
            value = draw(st.sampled_from([0.0, -1.0, 1e30, float("nan"), float("inf")]))
        elif field.type == field.TYPE_ENUM:
            value = draw(st.integers(0, 30))
        elif field.type == field.TYPE_BOOL:
            value = draw(st.booleans())
        else:
            value = draw(st.sampled_from(_INTS))
            if field.type in (field.TYPE_UINT64, field.TYPE_UINT32, field.TYPE_FIXED64, field.TYPE_FIXED32):
                value = abs(value) % (2**32 if "32" in str(field.type) else 2**64)
            if field.type in (field.TYPE_INT32, field.TYPE_SINT32, field.TYPE_SFIXED32):
                value = max(min(value, 2**31 - 1), -(2**31))
        try:
            if _repeated(field):
                getattr(target, field.name).append(value)
            else:
                setattr(target, field.name, value)
        except (TypeError, ValueError):  # a value this field's type cannot hold
            continue
    return m.SerializeToString()


@FUZZ
@given(data=_edited())
def test_field_edited_models(data):
    _load(data)


@pytest.mark.parametrize("index", range(len(SEEDS)))
def test_seeds_load(index):
    """The unmutated seeds are valid models: the fuzz starts from models that load."""
    jonnx.load(SEEDS[index])
