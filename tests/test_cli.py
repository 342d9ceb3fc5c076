"""The ``jonnx`` command line, run through its installed console script (as a user runs it)."""

from __future__ import annotations

import json
import mmap
import os
import pathlib
import subprocess
import sys

import numpy as np
import onnx
import onnx.helper as oh
import pytest

from jonnx import _progress
from jonnx.cli import main

MODELS = pathlib.Path(__file__).parent.parent / "examples" / "models"
CNN = MODELS / "small_cnn.onnx"
TRANSFORMER = MODELS / "tiny_transformer.onnx"
SCRIPT = pathlib.Path(sys.executable).with_name("jonnx")


def jonnx_cli(*args: str, cwd: pathlib.Path | None = None) -> subprocess.CompletedProcess:
    assert SCRIPT.exists(), f"console script {SCRIPT} missing: reinstall with pip install -e ."
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run(
        [str(SCRIPT), *map(str, args)],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env=env,
    )


def as_json(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def no_traceback(result: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout, result.stderr


@pytest.fixture
def quiet_cli():
    """The command line configures the ``jonnx`` logger for its process: undo it in ours."""
    logger = _progress.logger
    saved = logger.handlers[:], logger.level, logger.propagate
    yield
    logger.handlers[:], logger.propagate = saved[0], saved[2]
    logger.setLevel(saved[1])


@pytest.fixture(scope="module")
def custom_op_model(tmp_path_factory) -> pathlib.Path:
    """A model with one supported node and two nodes of an op jonnx does not know."""
    nodes = [
        oh.make_node("Relu", ["x"], ["r"], name="relu"),
        oh.make_node("FancyNorm", ["r"], ["f"], domain="com.example", name="fancy_1"),
        oh.make_node("FancyNorm", ["f"], ["y"], domain="com.example", name="fancy_2"),
    ]
    graph = oh.make_graph(
        nodes,
        "g",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])],
    )
    model = oh.make_model(
        graph,
        opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid("com.example", 1)],
    )
    path = tmp_path_factory.mktemp("custom") / "custom.onnx"
    onnx.save(model, path)
    return path


def test_help_teaches_every_subcommand(capsys):
    result = jonnx_cli("--help")
    assert result.returncode == 0
    for text in (
        "jonnx info MODEL",
        "jonnx check MODEL",
        "--compare onnxruntime",
        "--batch 1,32",
        "--json",
    ):
        assert text in result.stdout
    for sub in ("info", "check", "run", "bench"):
        with pytest.raises(SystemExit) as exit_info:
            main([sub, "--help"])
        assert exit_info.value.code == 0 and "--json" in capsys.readouterr().out


def test_python_dash_m_is_the_same_program():
    result = subprocess.run(
        [sys.executable, "-m", "jonnx", "info", str(CNN), "--json"],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["graph"] == onnx.load(CNN).graph.name


def test_info_against_the_protobuf():
    proto = onnx.load(TRANSFORMER)
    report = as_json(jonnx_cli("info", TRANSFORMER, "--json"))
    assert report["ir_version"] == proto.ir_version
    assert report["opsets"] == {o.domain or "ai.onnx": o.version for o in proto.opset_import}
    assert [i["name"] for i in report["inputs"]] == [i.name for i in proto.graph.input]
    assert report["inputs"][0]["shape"] == ["B", "T"]
    histogram = {o["op"]: o["count"] for o in report["ops"]}
    assert histogram == {op: sum(n.op_type == op for n in proto.graph.node) for op in histogram}
    assert sum(histogram.values()) == len(proto.graph.node)
    arrays = [onnx.numpy_helper.to_array(t) for t in proto.graph.initializer]
    floats = [a for a in arrays if a.dtype.kind == "f"]
    assert report["parameters"]["values"] == sum(a.size for a in floats)
    assert report["parameters"]["bytes"] == sum(a.nbytes for a in floats)
    assert report["external_data"]["tensors"] == 0
    text = jonnx_cli("info", TRANSFORMER)
    assert text.returncode == 0 and "LayerNormalization" in text.stdout and "input_ids" in text.stdout


def test_check_passes_a_bundled_model_and_traces_at_given_dims():
    report = as_json(jonnx_cli("check", TRANSFORMER, "--dim", "B=3", "--dim", "T=5", "--json"))
    assert report["ok"] and not report["unsupported"]
    shapes = {o["name"]: o["shape"] for o in report["trace"]["outputs"]}
    declared = {o.name: o.type.tensor_type.shape.dim for o in onnx.load(TRANSFORMER).graph.output}
    assert shapes["logits"] == [3, declared["logits"][1].dim_value]
    assert shapes["hidden"][:2] == [3, 5]


def test_check_names_every_unsupported_node_and_exits_1(custom_op_model):
    result = jonnx_cli("check", custom_op_model)
    assert result.returncode == 1
    no_traceback(result)
    assert "FancyNorm" in result.stdout and "fancy_1" in result.stdout and "fancy_2" in result.stdout
    report = json.loads(jonnx_cli("check", custom_op_model, "--json").stdout)
    assert [(u["node"], u["op"], u["domain"]) for u in report["unsupported"]] == [
        ("fancy_1", "FancyNorm", "com.example"),
        ("fancy_2", "FancyNorm", "com.example"),
    ]
    # info still describes it: it reads the protobuf only.
    info = as_json(jonnx_cli("info", custom_op_model, "--json"))
    assert {"domain": "com.example", "op": "FancyNorm", "count": 2} in info["ops"]


def test_check_lists_static_inputs(tmp_path):
    # `shape` feeds Reshape's shape: it must be known at trace time.
    graph = oh.make_graph(
        [oh.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")],
        "g",
        [
            oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3]),
            oh.make_tensor_value_info("shape", onnx.TensorProto.INT64, [2]),
        ],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
    )
    path = tmp_path / "reshape.onnx"
    onnx.save(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]), path)
    report = as_json(jonnx_cli("check", path, "--json"))
    assert report["static_inputs"] == [{"input": "shape", "needed_by": ["Reshape 'reshape'"]}]
    assert report["trace"]["status"] == "skipped"
    np.save(tmp_path / "shape.npy", np.array([3, 2], np.int64))
    traced = as_json(jonnx_cli("check", path, "--input", f"shape={tmp_path / 'shape.npy'}", "--json"))
    assert traced["trace"]["outputs"] == [{"name": "y", "dtype": "float32", "shape": [3, 2]}]


def test_run_compares_with_onnxruntime_and_saves_outputs(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    x = np.random.default_rng(1).standard_normal((2, 3, 16, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    report = as_json(
        jonnx_cli(
            "run",
            CNN,
            "--input",
            f"image={tmp_path / 'x.npy'}",
            "--compare",
            "onnxruntime",
            "--output",
            tmp_path / "out",
            "--json",
        )
    )
    (expected,) = ort.InferenceSession(str(CNN), providers=["CPUExecutionProvider"]).run(None, {"image": x})
    saved = np.load(tmp_path / "out" / "logits.npy")
    np.testing.assert_allclose(saved, expected, rtol=1e-4, atol=1e-5)
    (summary,) = report["outputs"]
    assert summary["shape"] == [2, 10] and summary["max"] == pytest.approx(float(saved.max()))
    (diff,) = report["compare"]["outputs"]
    assert diff["max_abs"] == pytest.approx(float(np.abs(saved.astype(np.float64) - expected).max()), abs=1e-12)
    assert diff["max_abs"] < 1e-4


def test_run_random_inputs_on_the_transformer():
    pytest.importorskip("onnxruntime")
    result = jonnx_cli("run", TRANSFORMER, "--random", "--dim", "T=6", "--compare", "onnxruntime")
    assert result.returncode == 0, result.stderr
    assert "hidden" in result.stdout and "max abs" in result.stdout


def test_run_and_bench_pass_inputs_named_like_the_calls_keywords(tmp_path, capsys, quiet_cli):
    """Inputs named ``state`` and ``train``, keywords of ``Model(...)``, reach the model by position."""
    vector = [oh.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [3]) for n in ("state", "train", "y")]
    graph = oh.make_graph([oh.make_node("Sub", ["state", "train"], ["y"])], "g", vector[:2], vector[2:])
    path = tmp_path / "named.onnx"
    onnx.save(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]), path)
    state, train = np.array([5.0, 6.0, 7.0], np.float32), np.array([1.0, 2.0, 4.0], np.float32)
    np.save(tmp_path / "state.npy", state)
    np.save(tmp_path / "train.npy", train)
    inputs = ["--input", f"state={tmp_path / 'state.npy'}", "--input", f"train={tmp_path / 'train.npy'}"]
    assert main(["run", str(path), *inputs, "--output", str(tmp_path / "out")]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "y.npy"), state - train)
    assert main(["bench", str(path), "--repeat", "2"]) == 0
    capsys.readouterr()


def test_bench_reports_both_runtimes_per_batch():
    pytest.importorskip("onnxruntime")
    report = as_json(
        jonnx_cli(
            "bench",
            CNN,
            "--batch",
            "1,4",
            "--repeat",
            "3",
            "--compare",
            "onnxruntime",
            "--json",
        )
    )
    assert [b["batch"] for b in report["batches"]] == [1, 4]
    assert report["batches"][1]["shapes"] == {"image": [4, 3, 16, 16]}
    for b in report["batches"]:
        assert set(b["steady"]) == {"jonnx", "onnxruntime"} and b["steady"]["jonnx"]["calls"] == 3
        assert b["first_call"]["jonnx"] > 0 and b["steady"]["onnxruntime"]["median"] > 0
        if sys.platform == "linux":
            assert all(isinstance(s["page_faults"], int) for s in b["steady"].values())
    assert set(report["load"]) == {"jonnx", "onnxruntime"}


@pytest.mark.skipif(sys.platform != "linux", reason="counts glibc's fresh mappings")
def test_bench_counts_the_page_faults_of_each_call():
    from jonnx.cli import _bench

    def fresh_memory():  # as XLA's large temporaries are: 16 MiB mapped anew, each page touched
        with mmap.mmap(-1, 16 << 20) as pages:
            pages.madvise(mmap.MADV_NOHUGEPAGE)  # 4 KiB pages, whatever the kernel's THP mode
            np.frombuffer(pages, np.uint8)[:: mmap.PAGESIZE] = 1

    steady = _bench._steady({"fresh": fresh_memory, "reused": lambda: None}, repeat=3)
    assert steady["fresh"]["page_faults"] >= (16 << 20) // mmap.PAGESIZE
    assert steady["reused"]["page_faults"] < 64


def test_bench_advises_the_tunable_only_where_calls_fault(monkeypatch):
    from jonnx.cli import _bench

    def report(faults):
        steady = {"jonnx": {"median": 0.1, "page_faults": faults}, "onnxruntime": {"median": 0.05, "page_faults": 0}}
        return {"batches": [{"batch": 32, "shapes": {}, "first_call": {}, "steady": steady}]}

    monkeypatch.setattr(_bench, "_tunable_applies", lambda: True)
    assert "GLIBC_TUNABLES=glibc.malloc.hugetlb=1" in _bench._fault_hint(report(48_403))
    assert _bench._fault_hint(report(_bench.FAULT_HINT_MIN - 1)) == ""
    assert _bench._fault_hint(report(None)) == ""  # not counted (Windows)
    monkeypatch.setattr(_bench, "_tunable_applies", lambda: False)  # set already, or not glibc
    assert _bench._fault_hint(report(48_403)) == ""

    monkeypatch.undo()
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1")
    assert not _bench._tunable_applies()


@pytest.mark.parametrize(
    "args, message",
    [
        (["info", "no/such/model.onnx"], "does not exist"),
        (["run", str(CNN), "--input", "image"], "expected NAME=FILE.npy"),
        (["run", str(CNN), "--input", "nope=x.npy"], "has no input 'nope'"),
        (["run", str(CNN), "--input", "image=missing.npy"], "does not exist"),
        (["run", str(CNN)], "--random"),
        (["bench", str(CNN), "--batch", "one"], "--batch"),
    ],
)
def test_bad_command_lines_exit_2_without_traceback(args, message, capsys, quiet_cli):
    # In-process (each case fails before any model runs): argparse's exit 2 is a SystemExit.
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_bad_command_line_through_the_script():
    result = jonnx_cli("run", CNN, "--input", "image=missing.npy")
    assert result.returncode == 2
    no_traceback(result)
    assert "missing.npy" in result.stderr and "does not exist" in result.stderr


def test_bad_model_file_exits_1(tmp_path, capsys, quiet_cli):
    path = tmp_path / "garbage.onnx"
    path.write_bytes(b"\x00not a model")
    assert main(["check", str(path)]) == 1
    assert "garbage.onnx" in capsys.readouterr().err


def test_input_of_the_wrong_shape_is_named(tmp_path, capsys, quiet_cli):
    np.save(tmp_path / "x.npy", np.zeros((1, 3, 8, 8), np.float32))
    with pytest.raises(SystemExit) as exit_info:
        main(["run", str(CNN), "--input", f"image={tmp_path / 'x.npy'}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "'image'" in err and "16" in err
