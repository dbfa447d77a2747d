"""Bad input through the ``amp-compile`` entry point (issue 5): each case converts correctly or is refused.

A refused case must: exit with status 2, print exactly one line on stderr (with ``-q``:
nothing else) that names the file, the node or tensor and the reason -- checked word for
word here -- with no traceback, leave no output file and no temporary file behind, and
leave every input file byte for byte as it was.

A converted case must: pass ``onnx.checker`` (``full_check``) on the written file, run on
ONNX Runtime, and match the FP32 input's outputs on the same inputs (max |err| / max |ref|
under 1e-2). The models are 512x1024x1024 GEMMs, big enough for the cost model to put
them in FP16, and each test checks that it did: a case that stays FP32 proves nothing.

Most cases run ``amp_compiler.cli.main`` in-process; a few run ``python -m
amp_compiler.cli`` in a subprocess to show the real process's exit status and stderr.
The over-2-GB path runs here on a ~50 MB model with the external-data threshold lowered
(the same code path); ``python -m benchmarks.large_model`` runs the real thing.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper
from onnx import numpy_helper as nh

from amp_compiler import cli
from amp_compiler.errors import ConversionError
from amp_compiler.metrics import max_rel_error
from amp_compiler.onnx_io import files
from amp_compiler.onnx_io import save as saving

ort = pytest.importorskip("onnxruntime")

ROWS, D = 512, 1024  # GEMMs the cost model converts on the default target
ROOT = Path(__file__).resolve().parents[1]
ONNX_VERSION, ONNX_OPSET = onnx.__version__, onnx.defs.onnx_opset_version()


# -- model builders ---------------------------------------------------------------------------------

def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def weight(name: str, rows: int = D, cols: int = D, *, seed: int = 0, dtype=np.float32) -> TP:
    values = _rng(seed).standard_normal((rows, cols)) / np.sqrt(rows)
    return nh.from_array(values.astype(dtype), name)


def vi(name: str, elem: int, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def make(nodes, inputs, outputs, inits=(), *, opset: int = 18, domains=(), functions=()) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
    m = helper.make_model(g, opset_imports=opsets, functions=list(functions))
    m.ir_version = 8
    return m


def mlp(*, shape=(ROWS, D), elem: int = TP.FLOAT, w0: TP | None = None, w1: TP | None = None,
        middle: tuple[str, str] = ("Relu", ""), opset: int = 18, **kw) -> onnx.ModelProto:
    """x -> MatMul(W0) 'mm0' -> middle op 'mid' -> MatMul(W1) 'mm1' -> y."""
    op, domain = middle
    nodes = [helper.make_node("MatMul", ["x", "W0"], ["h"], name="mm0"),
             helper.make_node(op, ["h"], ["r"], name="mid", domain=domain),
             helper.make_node("MatMul", ["r", "W1"], ["y"], name="mm1")]
    return make(nodes, [vi("x", elem, list(shape))], [vi("y", elem, list(shape))],
                [w0 if w0 is not None else weight("W0", seed=1), w1 if w1 is not None else weight("W1", seed=2)],
                opset=opset, **kw)


def x_feed(rows: int = ROWS, dtype=np.float32) -> dict[str, np.ndarray]:
    return {"x": _rng(7).standard_normal((rows, D)).astype(dtype)}


def save(model: onnx.ModelProto, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def save_external(model: onnx.ModelProto, path: Path, data_name: str = "weights.bin") -> Path:
    """Save with every initializer of 1 KiB or more in one external data file, written by hand."""
    path.parent.mkdir(parents=True, exist_ok=True)
    m = onnx.ModelProto()
    m.CopyFrom(model)
    with open(path.parent / data_name, "wb") as f:
        for t in m.graph.initializer:
            if len(t.raw_data) < 1024:
                continue
            offset = f.tell()
            f.write(t.raw_data)
            length = len(t.raw_data)
            t.ClearField("raw_data")
            t.data_location = TP.EXTERNAL
            for key, value in (("location", data_name), ("offset", str(offset)), ("length", str(length))):
                entry = t.external_data.add()
                entry.key, entry.value = key, value
    onnx.save(m, str(path))
    return path


# -- running the CLI and checking its effects ------------------------------------------------------

def snapshot(*paths: Path) -> dict[str, str]:
    """sha256 of every file under ``paths`` (files or folders)."""
    out = {}
    for p in paths:
        for f in ([p] if p.is_file() else sorted(q for q in p.rglob("*") if q.is_file())):
            out[str(f)] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def run_cli(argv: list[str], capsys) -> tuple[int, list[str]]:
    status = cli.main([str(a) for a in argv])
    err = capsys.readouterr().err
    return status, err.splitlines()


def leftovers(folder: Path) -> list[str]:
    """Temporary files the writer may have left: ``.<name>.<random>.tmp`` / ``.probe``."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".") and p.suffix in (".tmp", ".probe"))


def assert_refused(capsys, inp: Path | str, message: str, *, out: Path, extra=(), inputs=()) -> None:
    """The CLI exits 2 with ``amp-compile: error: <message>`` as its only stderr line; no output; inputs intact."""
    watched = [Path(p) for p in (inp, *inputs) if Path(p).exists()]
    before = snapshot(*watched)
    existed = out.exists()
    data_existed = out.parent.is_dir() and (out.parent / files.external_data_name(out)).exists()
    status, err = run_cli([inp, "-o", out, "-q", *extra], capsys)
    assert err == [f"amp-compile: error: {message}"], err
    assert status == 2
    assert out.exists() == existed
    if out.parent.is_dir():
        assert leftovers(out.parent) == []
        assert (out.parent / files.external_data_name(out)).exists() == data_existed
    assert snapshot(*watched) == before


def ort_run(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"]).run(None, feeds)


def assert_converts(capsys, tmp_path: Path, inp: Path, feeds_list, *, extra=(), tolerance: float = 1e-2,
                    out: Path | None = None) -> tuple[onnx.ModelProto, dict]:
    """Converts with status 0; the output is checker-clean and matches the input on ONNX Runtime."""
    out = out or tmp_path / "out" / "model.mp.onnx"
    out.parent.mkdir(parents=True, exist_ok=True)
    report = tmp_path / "report.json"
    before = snapshot(inp.parent)
    status, err = run_cli([inp, "-o", out, "-q", "--report", report, *extra], capsys)
    assert status == 0, err
    assert err == []
    assert snapshot(inp.parent) == before
    assert leftovers(out.parent) == []
    onnx.checker.check_model(str(out), full_check=True)
    for feeds in feeds_list if isinstance(feeds_list, list) else [feeds_list]:
        assert max_rel_error(ort_run(inp, feeds), ort_run(out, feeds)) < tolerance
    ops = {o["name"]: o for o in json.loads(report.read_text())["ops"]}
    return onnx.load(str(out), load_external_data=False), ops


def init_types(m: onnx.ModelProto) -> dict[str, int]:
    return {t.name: t.data_type for t in m.graph.initializer}


# == files that are not ONNX models =================================================================

@pytest.mark.parametrize("content, reason", [
    (b"", "not an ONNX model: the file is empty"),
    (b"hello world\n", "not an ONNX model: the bytes at offset 0 are not a ModelProto field"),
    (b"ir_version: 8\ngraph { node { op_type: 'Relu' } }\n",
     "not an ONNX model: the bytes at offset 0 are not a ModelProto field"),
    (b"\x89PNG\r\n\x1a\n" + bytes(range(56)), "not an ONNX model: the bytes at offset 0 are not a ModelProto field"),
    (b"PK\x03\x04" + bytes(60), "not an ONNX model: the file is a ZIP archive (a PyTorch checkpoint?)"),
    (nh.from_array(np.ones((4, 4), np.float32), "t").SerializeToString(),  # dims read as ir_version, then...
     "not an ONNX model: the bytes at offset 4 are not a ModelProto field"),
    (onnx.ModelProto(ir_version=8, producer_name="x").SerializeToString(),
     "not an ONNX model: the file has no graph"),
], ids=["empty", "text", "prototxt", "png", "zip", "tensor-proto", "no-graph"])
def test_a_file_that_is_not_onnx_is_refused(tmp_path, capsys, content, reason):
    inp = tmp_path / "model.onnx"
    inp.write_bytes(content)
    assert_refused(capsys, inp, f"{inp}: {reason}", out=tmp_path / "out.onnx")


def test_a_folder_or_a_missing_file_is_refused(tmp_path, capsys):
    assert_refused(capsys, tmp_path, f"{tmp_path}: is a folder, not an ONNX file", out=tmp_path / "out.onnx")
    missing = tmp_path / "nope.onnx"
    assert_refused(capsys, missing, f"{missing}: file not found", out=tmp_path / "out.onnx")


def test_a_truncated_protobuf_is_refused(tmp_path, capsys):
    model = mlp()
    full = model.SerializeToString()
    tail = len(onnx.ModelProto(opset_import=model.opset_import).SerializeToString())  # fields after the graph
    graph_end = len(full) - tail
    inp = tmp_path / "model.onnx"
    inp.write_bytes(full[: len(full) // 2])
    assert_refused(capsys, inp, f"{inp}: truncated ONNX file: its graph field ends at byte {graph_end} "
                                f"but the file has {len(full) // 2} bytes", out=tmp_path / "out.onnx")
    assert full[:2] == b"\x08\x08" and full[2] == 0x3A  # ir_version 8, then the graph's tag
    inp.write_bytes(full[:3])
    assert_refused(capsys, inp, f"{inp}: truncated ONNX file: it ends inside a field header at byte 2",
                   out=tmp_path / "out.onnx")
    inp.write_bytes(full[: len(full) - tail])  # the graph is complete, the opset_import is cut off
    assert_refused(capsys, inp, f"{inp}: not a valid ONNX model: it has no opset_import", out=tmp_path / "out.onnx")


def test_a_corrupt_graph_is_refused(tmp_path, capsys):
    """The file's fields are all there, but the graph's bytes are not a GraphProto."""
    model = mlp()
    junk = b"\xff" * 64  # an endless varint where a field header should be
    graph = b"\x3a" + bytes([len(junk)]) + junk  # field 7 (graph), length-delimited
    inp = tmp_path / "model.onnx"
    inp.write_bytes(b"\x08\x08" + graph + onnx.ModelProto(opset_import=model.opset_import).SerializeToString())
    assert_refused(capsys, inp, f"{inp}: corrupt ONNX file: the protobuf does not parse", out=tmp_path / "out.onnx")


def test_subprocess_no_traceback_exit_2(tmp_path):
    """A real process: exit status 2, one stderr line even without -q's help, no traceback."""
    inp = tmp_path / "model.onnx"
    inp.write_bytes(b"hello world\n")
    out = tmp_path / "out.onnx"
    proc = subprocess.run([sys.executable, "-m", "amp_compiler.cli", str(inp), "-o", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert lines[-1] == f"amp-compile: error: {inp}: not an ONNX model: the bytes at offset 0 are not a ModelProto field"
    assert all(line.startswith("[") and "s] " in line for line in lines[:-1])  # progress lines only
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert not out.exists() and leftovers(tmp_path) == []


# == external data ==================================================================================

def test_missing_external_data_file_is_refused(tmp_path, capsys):
    inp = save_external(mlp(), tmp_path / "m" / "model.onnx")
    (inp.parent / "weights.bin").unlink()
    assert_refused(capsys, inp, f"{inp}: tensor 'W0': external data file 'weights.bin' is missing",
                   out=tmp_path / "out.onnx")


def test_short_external_data_file_is_refused(tmp_path, capsys):
    inp = save_external(mlp(), tmp_path / "m" / "model.onnx")
    data = inp.parent / "weights.bin"
    with open(data, "r+b") as f:
        f.truncate(D * D * 4 + 100)
    assert_refused(capsys, inp, f"{inp}: tensor 'W1': external data file 'weights.bin' has {D * D * 4 + 100} bytes, "
                                f"fewer than offset {D * D * 4} + length {D * D * 4}", out=tmp_path / "out.onnx")


def test_external_data_length_that_does_not_match_the_shape_is_refused(tmp_path, capsys):
    inp = save_external(mlp(), tmp_path / "m" / "model.onnx")
    m = onnx.load(str(inp), load_external_data=False)
    m.graph.initializer[0].dims[0] = 512
    save(m, inp)
    assert_refused(capsys, inp, f"{inp}: tensor 'W0': external data length {D * D * 4} does not match its shape "
                                f"[512, {D}] of float ({512 * D * 4} bytes)", out=tmp_path / "out.onnx")


_WATCHED: set[str] = set()
_OPENED: list[str] = []


def _audit(event: str, args) -> None:
    if _WATCHED and event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.fsdecode(args[0])
        if os.path.realpath(path) in _WATCHED:
            _OPENED.append(path)


sys.addaudithook(_audit)  # hooks cannot be removed; this one does nothing while _WATCHED is empty


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_external_data_outside_the_model_folder_is_refused_and_never_read(tmp_path, capsys, how):
    folder = tmp_path / "m"
    inp = save_external(mlp(), folder / "model.onnx")
    secret = tmp_path / "secret.bin"
    shutil.move(folder / "weights.bin", secret)  # the right bytes, in the wrong place
    location = {"dotdot": "../secret.bin", "absolute": str(secret), "symlink": "weights.bin"}[how]
    if how == "symlink":
        (folder / "weights.bin").symlink_to(secret)
    else:
        m = onnx.load(str(inp), load_external_data=False)
        for t in m.graph.initializer:
            for e in t.external_data:
                if e.key == "location":
                    e.value = location
        save(m, inp)
    secret_before = snapshot(secret)
    _OPENED.clear()
    _WATCHED.add(os.path.realpath(secret))
    try:
        assert_refused(capsys, inp, f"{inp}: tensor 'W0': external data location {location!r} is outside the "
                                    "model's folder; refused", out=tmp_path / "out.onnx")
    finally:
        _WATCHED.clear()
    assert _OPENED == []  # the file outside was never opened
    assert snapshot(secret) == secret_before


def test_converted_model_with_external_data_saves_with_the_documented_call(tmp_path):
    """``convert_onnx(...).save(path)`` streams the deferred casts; ``.model`` is a plain ModelProto
    that ``onnx.save`` writes correctly; both run on ONNX Runtime within tolerance of FP32."""
    from amp_compiler.onnx_api import convert_onnx

    inp = save_external(deep_mlp(4), tmp_path / "m" / "model.onnx")
    result = convert_onnx(files.load_model(inp, external_data="lazy"), source=str(inp), base_dir=inp.parent,
                          deny_nodes=["mm0"])  # W0 stays FP32, in its file; W1..W3 are deferred casts
    assert files.has_deferred(result._proto)  # the trap: casts only a streaming save resolves
    (tmp_path / "out").mkdir()
    saved = result.save(tmp_path / "out" / "streamed.onnx")
    model, report = result
    assert report is result.report and not files.has_external(model)
    plain = tmp_path / "out" / "plain.onnx"
    onnx.save(model, str(plain))
    feeds = x_feed()
    ref = ort_run(inp, feeds)
    precision = {op["name"]: op["precision"] for op in report.ops if op["op_type"] == "MatMul"}
    assert precision == {"mm0": "float32", "mm1": "float16", "mm2": "float16", "mm3": "float16"}
    for path in (saved, plain):
        assert max_rel_error(ref, ort_run(path, feeds)) < 1e-2


# == a failed run leaves nothing behind ==============================================================

def _assert_nothing_published(status: int, err: list[str], folder: Path, expected: str) -> None:
    assert status == 2 and len(err) == 1 and err[0].startswith("amp-compile: error: "), err
    assert expected in err[0], err
    assert sorted(p.name for p in folder.iterdir()) == ["model.onnx"]  # no output, report, .data or staging


@pytest.mark.parametrize("option", ["--validate", "--fallback"])
def test_evaluator_error_on_the_fp32_model_leaves_no_output(tmp_path, capsys, option):
    """--runtime reference cannot run a com.microsoft op: exit 2, and neither model nor report is left."""
    inp = save(mlp(middle=("Gelu", "com.microsoft"), domains=["com.microsoft"]), tmp_path / "model.onnx")
    status, err = run_cli([inp, "-o", tmp_path / "out.onnx", option, "--runtime", "reference", "--planner", "all",
                           "--report", tmp_path / "r.json", "-q"], capsys)
    _assert_nothing_published(status, err, tmp_path, "the FP32 model: reference evaluator: Node type 'Gelu'")


def test_calibration_failure_leaves_no_output(tmp_path, capsys):
    inp = save(mlp(middle=("NoSuchOp", "com.example"), domains=["com.example"]), tmp_path / "model.onnx")
    status, err = run_cli([inp, "-o", tmp_path / "out.onnx", "--calibrate", "--report", tmp_path / "r.html", "-q"],
                          capsys)
    _assert_nothing_published(status, err, tmp_path, "calibration run of the FP32 model: ONNX Runtime:")


def test_report_write_failure_leaves_no_model(tmp_path, capsys, monkeypatch):
    from amp_compiler.atomic import Staging

    real = Staging.write_bytes

    def full_disk(self, dest, content):
        if str(dest).endswith(".json"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, dest, content)

    monkeypatch.setattr(Staging, "write_bytes", full_disk)
    inp = save(mlp(), tmp_path / "model.onnx")
    status, err = run_cli([inp, "-o", tmp_path / "out.onnx", "--report", tmp_path / "r.txt",
                           "--report", tmp_path / "r.json", "-q"], capsys)
    _assert_nothing_published(status, err, tmp_path, "No space left on device")


def test_validation_above_tolerance_writes_the_reports_but_not_the_model(tmp_path, capsys):
    inp = save(mlp(), tmp_path / "model.onnx")
    report = tmp_path / "r.json"
    status, err = run_cli([inp, "-o", tmp_path / "out.onnx", "--validate", "--tolerance", "0", "--planner", "all",
                           "--report", report, "-q"], capsys)
    assert status == 1 and "no model written" in err[-1], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "r.json"]
    assert json.loads(report.read_text())["validation"]["passed"] is False



def _positions(rows: int) -> onnx.ModelProto:
    """A BERT's embeddings in small: token ids ``[batch, sequence]``, a position table of ``rows`` rows
    read through a slice of a position buffer as long as the table, as transformers export it."""
    mk = helper.make_node
    nodes = [mk("Gather", ["words.weight", "input_ids"], ["tok"], name="word_embeddings"),
             mk("Shape", ["input_ids"], ["shape"], name="shape"),
             mk("Gather", ["shape", "one"], ["seq"], name="seq_len", axis=0),
             mk("Slice", ["position_ids", "zero", "seq", "zero"], ["pos_ids"], name="slice"),
             mk("Gather", ["embeddings.position_embeddings.weight", "pos_ids"], ["pos"], name="position_gather"),
             mk("Add", ["tok", "pos"], ["emb"], name="add_positions"),
             mk("MatMul", ["emb", "w"], ["y"], name="proj")]
    inits = [weight("words.weight", 50, 16), weight("embeddings.position_embeddings.weight", rows, 16, seed=1),
             weight("w", 16, 16, seed=2), nh.from_array(np.arange(rows, dtype=np.int64), "position_ids"),
             nh.from_array(np.array([0], np.int64), "zero"), nh.from_array(np.array([1], np.int64), "one")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("input_ids", TP.INT64, ["batch", "sequence"])],
                              [helper.make_tensor_value_info("y", TP.FLOAT, ["batch", "sequence", 16])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("dtype, run", [("fp16", "--validate"), ("bf16", "--validate"),  # the overflow check's
                                        ("fp16", "--calibrate"), ("fp16", "--fallback")])  # runs, plain ones
def test_a_dim_past_the_position_table_is_said_to_be_refused_by_the_source_model(tmp_path, capsys, dtype, run):
    """``--validate --dim sequence=512`` on a BERT with 128 positions printed ONNX Runtime's broadcast
    error from deep inside ("... element_wise_ops.h:583 ... 128 by 512"), naming no file: the line now
    says the source model itself rejects these inputs, with which dims, and which table is too short.
    ``--calibrate`` and ``--fallback`` run the FP32 model on the same drawn inputs and say the same."""
    inp = save(_positions(rows=8), tmp_path / "model.onnx")
    args = [inp, "-o", tmp_path / "out.onnx", run, "--dtype", dtype, "--dim", "batch=2", "--report",
            tmp_path / "r.json", "-q"]
    status, err = run_cli([*args, "--dim", "sequence=12"], capsys)
    _assert_nothing_published(status, err, tmp_path, "the source model itself rejects these inputs")
    said, ort_says = err[0].split("; ONNX Runtime: ", 1)
    assert said == (f"amp-compile: error: {inp}: the FP32 model: ONNX Runtime fails running it on the "
                    "inputs (batch=2, sequence=12): the source model itself rejects these inputs, not a conversion "
                    "problem; Gather 'position_gather' reads a position table of 8 rows "
                    "('embeddings.position_embeddings.weight') while sequence is 12: pass --dim sequence=8 or less")
    assert "'add_positions'" in ort_says and "8 by 12" in ort_says, ort_says
    assert "[ONNXRuntimeError]" not in ort_says and ".h:" not in ort_says  # ORT's code and C++ source line
    assert ort_says.endswith("(on inputs drawn as input_ids [2, 12]: size the symbolic dims with --dim NAME=SIZE, "
                             "or pass --inputs FILE.npz)")
    assert run_cli([*args, "--dim", "sequence=8"], capsys)[0] == 0
    assert run_cli([inp, "--dry-run", "--dim", "sequence=12", "-q"], capsys) == (0, [])  # it only plans


def test_a_source_model_failing_on_the_inputs_without_a_position_table_says_the_dims(tmp_path):
    """No table to blame (two inputs whose ``sequence`` dims the graph requires to differ): the
    error still says the source model rejects the inputs, with the sizes, in ``validate``'s words."""
    from amp_compiler.validate import validate

    mk = helper.make_node
    graph = helper.make_graph([mk("Sub", ["a", "b"], ["d"], name="sub"), mk("MatMul", ["d", "w"], ["y"], name="mm")],
                              "g", [helper.make_tensor_value_info(n, TP.FLOAT, ["batch", s, 16])
                                    for n, s in (("a", "sequence"), ("b", "steps"))],
                              [helper.make_tensor_value_info("y", TP.FLOAT, ["batch", "sequence", 16])],
                              [weight("w", 16, 16)])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"a": np.ones((2, 3, 16), np.float32), "b": np.ones((2, 5, 16), np.float32)}
    with pytest.raises(ConversionError) as caught:
        validate(m, m, feeds, source="model.onnx")
    said, ort_says = str(caught.value).split("; ONNX Runtime: ", 1)
    assert said == ("model.onnx: the FP32 model: ONNX Runtime fails running it on the inputs (batch=2, "
                    "sequence=3, steps=5): the source model itself rejects these inputs, not a conversion problem")
    assert "'sub'" in ort_says and "3 by 5" in ort_says and "[ONNXRuntimeError]" not in ort_says

def test_published_files_get_the_mode_a_plain_open_gives(tmp_path, capsys):
    """One writer for model, external data and reports: 0666 less the umask, like open()."""
    inp = save(mlp(), tmp_path / "m" / "model.onnx")
    out, report = tmp_path / "out.onnx", tmp_path / "r.html"
    status, err = run_cli([inp, "-o", out, "--report", report, "-q"], capsys)
    assert status == 0, err
    mask = os.umask(0o022)
    os.umask(mask)
    assert {oct(p.stat().st_mode & 0o777) for p in (out, report)} == {oct(0o666 & ~mask)}


# == models over 2 GB: external data in and out, streamed ===========================================

def _threshold(monkeypatch, nbytes: int) -> None:
    monkeypatch.setenv(files.EXTERNAL_THRESHOLD_ENV, str(nbytes))


def deep_mlp(layers: int = 12) -> onnx.ModelProto:
    """``layers`` 1024x1024 GEMMs with ReLUs: 48 MiB of FP32 weights at 12 layers."""
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        nodes += [helper.make_node("MatMul", [x, f"W{i}"], [f"h{i}"], name=f"mm{i}"),
                  helper.make_node("Relu", [f"h{i}"], [f"r{i}"], name=f"relu{i}")]
        inits.append(weight(f"W{i}", seed=10 + i))
        x = f"r{i}"
    return make(nodes, [vi("x", TP.FLOAT, [ROWS, D])], [vi(x, TP.FLOAT, [ROWS, D])], inits)


def test_external_data_in_and_out_streamed(tmp_path, capsys, monkeypatch):
    """The >2 GB path on 48 MiB: external data in, threshold lowered, external data out."""
    _threshold(monkeypatch, 32 << 20)
    inp = save_external(deep_mlp(), tmp_path / "m" / "model.onnx")
    out = tmp_path / "out" / "model.mp.onnx"
    m, ops = assert_converts(capsys, tmp_path, inp, x_feed(), out=out)
    data = out.parent / "model.mp.onnx.data"
    assert data.is_file() and data.stat().st_size >= 12 * D * D * 2
    assert out.stat().st_size < 64 << 10  # the .onnx file holds no weights
    assert all(files.is_external(t) for t in m.graph.initializer)
    assert all(t.data_type == TP.FLOAT16 for t in m.graph.initializer)
    assert all(ops[f"mm{i}"]["precision"] == "float16" for i in range(12))
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.mp.onnx", "model.mp.onnx.data"]


def test_inline_model_over_the_threshold_is_written_with_external_data(tmp_path, capsys, monkeypatch):
    _threshold(monkeypatch, 16 << 20)
    inp = save(deep_mlp(), tmp_path / "m" / "model.onnx")
    out = tmp_path / "out" / "model.mp.onnx"
    m, _ = assert_converts(capsys, tmp_path, inp, x_feed(), out=out)
    assert (out.parent / "model.mp.onnx.data").is_file()
    assert all(files.is_external(t) for t in m.graph.initializer)


def test_inline_model_under_the_threshold_stays_one_file(tmp_path, capsys):
    inp = save(deep_mlp(4), tmp_path / "m" / "model.onnx")
    out = tmp_path / "out" / "model.mp.onnx"
    m, _ = assert_converts(capsys, tmp_path, inp, x_feed(), out=out)
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.mp.onnx"]
    assert not any(files.is_external(t) for t in m.graph.initializer)


def test_lazy_conversion_holds_no_weight_in_memory(tmp_path):
    """What makes the >2 GB case fit: the lazily loaded model and the converted one hold no tensor
    data (the FP16 copies are cast while saving), and the saved file has it all."""
    from amp_compiler.onnx_api import convert_onnx

    inp = save_external(deep_mlp(), tmp_path / "m" / "model.onnx")
    lazy = files.load_model(inp, external_data="lazy")
    converted = convert_onnx(lazy, source=str(inp), base_dir=inp.parent)._proto  # white box: before any save
    assert converted.ByteSize() < 64 << 10
    deferred = [t for t in converted.graph.initializer if files.is_external(t)]
    assert len(deferred) == 12 and all(t.data_type == TP.FLOAT16 for t in deferred)
    out = files.save_model(converted, tmp_path / "out.onnx", base_dir=inp.parent)
    reloaded = onnx.load(str(out))
    source = onnx.load(str(inp))
    for t in reloaded.graph.initializer:
        original = nh.to_array(next(s for s in source.graph.initializer if s.name == t.name.removesuffix("_fp16")))
        np.testing.assert_array_equal(nh.to_array(t), original.astype(np.float16))


def test_an_interrupted_write_leaves_nothing(tmp_path, capsys, monkeypatch):
    """A full disk in the middle of streaming: no output, no .data, no temporary file."""
    _threshold(monkeypatch, 1 << 20)
    inp = save_external(deep_mlp(4), tmp_path / "m" / "model.onnx")
    out = tmp_path / "out" / "model.mp.onnx"
    out.parent.mkdir()
    calls = []

    def full_disk(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(*args, **kwargs)

    real = saving._DataWriter._write_cast
    monkeypatch.setattr(saving._DataWriter, "_write_cast", full_disk)
    assert_refused(capsys, inp, f"{out}: cannot write the output: No space left on device", out=out)
    assert list(out.parent.iterdir()) == []


# == output paths ===================================================================================

def test_output_path_equal_to_the_input_is_refused(tmp_path, capsys):
    inp = save(mlp(), tmp_path / "model.onnx")
    assert_refused(capsys, inp, f"{inp}: output path is the input file; choose another path", out=inp)
    alias = tmp_path / "sub" / ".." / "model.onnx"
    (tmp_path / "sub").mkdir()
    assert_refused(capsys, inp, f"{alias}: output path is the input file; choose another path", out=alias)


def test_output_whose_data_file_is_an_input_data_file_is_refused(tmp_path, capsys):
    inp = save_external(mlp(), tmp_path / "model.onnx", data_name="out.onnx.data")
    out = tmp_path / "out.onnx"
    assert_refused(capsys, inp, f"{out}: its external data file out.onnx.data would overwrite an input file; "
                                "choose another path", out=out)


@pytest.mark.parametrize("external", [False, True])
def test_the_api_refuses_to_save_over_the_source_model_or_its_data(tmp_path, external):
    """``convert_onnx(path).save(...)`` had none of the CLI's guards: saving onto the source file,
    or onto the source's external data file, destroyed the model it was converted from."""
    from amp_compiler import convert_onnx

    inp = save_external(mlp(), tmp_path / "model.onnx") if external else save(mlp(), tmp_path / "model.onnx")
    before = {f.name: f.read_bytes() for f in tmp_path.iterdir()}
    result = convert_onnx(inp)
    for target in before:
        with pytest.raises(ConversionError, match=f"the output {target} is a file the model reads from"):
            result.save(tmp_path / target)
    assert {f.name: f.read_bytes() for f in tmp_path.iterdir()} == before
    assert result.save(tmp_path / "out.onnx").exists()


def test_output_folder_that_does_not_exist_is_refused(tmp_path, capsys):
    inp = save(mlp(), tmp_path / "model.onnx")
    out = tmp_path / "no" / "such" / "out.onnx"
    assert_refused(capsys, inp, f"{out}: output folder {out.parent} does not exist", out=out)
    assert not (tmp_path / "no").exists()


def test_output_path_that_is_a_folder_is_refused(tmp_path, capsys):
    inp = save(mlp(), tmp_path / "model.onnx")
    out = tmp_path / "folder.onnx"
    out.mkdir()
    assert_refused(capsys, inp, f"{out}: output path is a folder; give a file name", out=out)


def test_output_folder_that_cannot_be_written_is_refused(tmp_path):
    """Run in a subprocess without the capabilities that let root write anywhere (or as a normal user)."""
    inp = save(mlp(), tmp_path / "model.onnx")
    folder = tmp_path / "readonly"
    folder.mkdir()
    out = folder / "out.onnx"
    cmd = [sys.executable, "-m", "amp_compiler.cli", str(inp), "-o", str(out), "-q"]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: cannot make a folder unwritable")
        cmd = [setpriv, "--inh-caps=-dac_override,-dac_read_search",
               "--bounding-set=-dac_override,-dac_read_search", *cmd]
    before = snapshot(inp)
    folder.chmod(0o555)
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    finally:
        folder.chmod(0o755)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [f"amp-compile: error: {out}: output folder {folder} is not writable: "
                                        "Permission denied"]
    assert list(folder.iterdir()) == [] and snapshot(inp) == before


# == models the importer refuses ====================================================================

def test_custom_domain_without_an_opset_import_is_refused(tmp_path, capsys):
    inp = save(mlp(middle=("MyOp", "com.example")), tmp_path / "model.onnx")
    assert_refused(capsys, inp, f"{inp}: node 'mid' (MyOp): domain 'com.example' has no opset_import entry",
                   out=tmp_path / "out.onnx")


def test_opset_newer_than_onnx_is_refused(tmp_path, capsys):
    m = mlp()
    m.opset_import[0].version = ONNX_OPSET + 5
    inp = save(m, tmp_path / "model.onnx")
    assert_refused(capsys, inp, f"{inp}: opset_import ai.onnx: version {ONNX_OPSET + 5} is newer than onnx "
                                f"{ONNX_VERSION} supports (up to {ONNX_OPSET})", out=tmp_path / "out.onnx")


def test_dangling_input_is_refused(tmp_path, capsys):
    m = mlp()
    m.graph.node[2].input[0] = "nope"
    inp = save(m, tmp_path / "model.onnx")
    assert_refused(capsys, inp, f"{inp}: node 'mm1' (MatMul): input 'nope' is not produced by any node, graph "
                                "input or initializer", out=tmp_path / "out.onnx")


def test_duplicate_value_name_is_refused(tmp_path, capsys):
    m = mlp()
    m.graph.node[1].output[0] = "h"
    m.graph.node[2].input[0] = "h"
    inp = save(m, tmp_path / "model.onnx")
    assert_refused(capsys, inp, f"{inp}: tensor 'h': defined twice in the main graph: by node 'mm0' (MatMul) and "
                                "by node 'mid' (Relu); ONNX names must be unique (SSA)", out=tmp_path / "out.onnx")


def test_cycle_is_refused(tmp_path, capsys):
    m = mlp()
    m.graph.node[0].input[0] = "y"  # mm0 reads mm1's output
    m.graph.output[0].name = "r"
    inp = save(m, tmp_path / "model.onnx")
    assert_refused(capsys, inp, f"{inp}: node 'mm0' (MatMul): the graph has a cycle: mm0 -> mid -> mm1 -> mm0",
                   out=tmp_path / "out.onnx")


def test_nodes_out_of_topological_order_are_sorted_and_converted(tmp_path, capsys):
    m = mlp()
    nodes = list(m.graph.node)
    del m.graph.node[:]
    m.graph.node.extend(reversed(nodes))
    inp = save(m, tmp_path / "m" / "model.onnx")
    out_model, ops = assert_converts(capsys, tmp_path, inp, x_feed())
    assert [n.name for n in out_model.graph.node if n.op_type != "Cast"] == ["mm0", "mid", "mm1"]
    assert ops["mm0"]["precision"] == ops["mm1"]["precision"] == "float16"


def test_type_mismatch_is_refused(tmp_path, capsys):
    nodes = [helper.make_node("MatMul", ["x", "W0"], ["h"], name="mm0"),
             helper.make_node("Add", ["h", "bias"], ["y"], name="add")]
    m = make(nodes, [vi("x", TP.FLOAT, [ROWS, D])], [vi("y", TP.FLOAT, [ROWS, D])],
             [weight("W0"), nh.from_array(np.ones(D, np.int64), "bias")])
    inp = save(m, tmp_path / "model.onnx")
    assert_refused(capsys, inp, f"{inp}: node 'add' (Add): type inference failed: B has inconsistent type "
                                "tensor(int64)", out=tmp_path / "out.onnx")


def test_initializer_whose_data_does_not_match_its_shape_is_refused(tmp_path, capsys):
    m = mlp()
    m.graph.initializer[1].raw_data = b"\0" * 12
    inp = save(m, tmp_path / "model.onnx")
    assert_refused(capsys, inp, f"{inp}: initializer 'W1': raw_data holds 12 bytes but its shape [{D}, {D}] of "
                                f"float needs {D * D * 4}", out=tmp_path / "out.onnx")


def test_unknown_data_type_is_refused(tmp_path, capsys):
    m = mlp()
    m.graph.input[0].type.tensor_type.elem_type = 99
    inp = save(m, tmp_path / "model.onnx")
    assert_refused(capsys, inp, f"{inp}: graph input 'x': element type 99 is not an ONNX type",
                   out=tmp_path / "out.onnx")


def test_malformed_attribute_is_refused(tmp_path, capsys):
    m = mlp()
    m.graph.node[1].attribute.append(helper.make_attribute("alpha", 0.5))
    inp = save(m, tmp_path / "model.onnx")
    assert_refused(capsys, inp, f"{inp}: node 'mid' (Relu): invalid ONNX model: Unrecognized attribute: alpha for "
                                "operator Relu", out=tmp_path / "out.onnx")


def test_debug_shows_the_traceback(tmp_path, capsys):
    inp = tmp_path / "model.onnx"
    inp.write_bytes(b"hello world\n")
    status, err = run_cli([inp, "-o", tmp_path / "out.onnx", "-q", "--debug"], capsys)
    assert status == 2
    assert err[0] == "Traceback (most recent call last):" and "ConversionError" in "\n".join(err)
    assert err[-1].startswith(f"amp-compile: error: {inp}: not an ONNX model")


def test_an_unexpected_exception_is_an_internal_error_exit_3(tmp_path, capsys, monkeypatch):
    import amp_compiler.onnx_api as api

    def boom(*args, **kwargs):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(api, "run_passes", boom)
    inp = save(mlp(), tmp_path / "model.onnx")
    out = tmp_path / "out.onnx"
    status, err = run_cli([inp, "-o", out, "-q"], capsys)
    assert status == 3
    assert err == ["amp-compile: internal error: RuntimeError: boom second line (this is a bug: please report it "
                   "with the model; --debug shows the traceback)"]
    assert not out.exists() and leftovers(tmp_path) == []
    status, err = run_cli([inp, "-o", out, "-q", "--debug"], capsys)
    assert status == 3 and err[0] == "Traceback (most recent call last):"


# == models that convert ===========================================================================

def test_model_already_fp16_converts_unchanged(tmp_path, capsys):
    m = mlp(elem=TP.FLOAT16, w0=weight("W0", seed=1, dtype=np.float16), w1=weight("W1", seed=2, dtype=np.float16))
    inp = save(m, tmp_path / "m" / "model.onnx")
    out_model, ops = assert_converts(capsys, tmp_path, inp, x_feed(dtype=np.float16), tolerance=1e-6)
    assert [n.op_type for n in out_model.graph.node] == ["MatMul", "Relu", "MatMul"]
    assert init_types(out_model) == {"W0": TP.FLOAT16, "W1": TP.FLOAT16}
    assert {o["precision"] for o in ops.values()} == {"float16"}


def test_model_partly_fp16_converts_the_rest(tmp_path, capsys):
    nodes = [helper.make_node("Cast", ["x"], ["x16"], to=TP.FLOAT16, name="c0"),
             helper.make_node("MatMul", ["x16", "W0"], ["h16"], name="mm0"),
             helper.make_node("Cast", ["h16"], ["h"], to=TP.FLOAT, name="c1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "W1"], ["y"], name="mm1")]
    m = make(nodes, [vi("x", TP.FLOAT, [ROWS, D])], [vi("y", TP.FLOAT, [ROWS, D])],
             [weight("W0", seed=1, dtype=np.float16), weight("W1", seed=2)])
    inp = save(m, tmp_path / "m" / "model.onnx")
    out_model, ops = assert_converts(capsys, tmp_path, inp, x_feed())
    assert ops["mm0"]["precision"] == ops["mm1"]["precision"] == "float16"
    assert init_types(out_model) == {"W0": TP.FLOAT16, "W1_fp16": TP.FLOAT16}
    # the FP16 -> FP32 -> FP16 round trip between the GEMMs is gone: no cast in the middle
    assert [n.op_type for n in out_model.graph.node] == ["Cast", "MatMul", "Relu", "MatMul", "Cast"]


def _qdq_model() -> onnx.ModelProto:
    # 7-bit weights: x86 u8s8 integer kernels saturate on full-range int8 (reduce_range)
    wq = _rng(3).integers(-64, 64, (D, D)).astype(np.int8)
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="q"),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"], name="dq"),
             helper.make_node("DequantizeLinear", ["Wq", "ws", "wz"], ["Wd"], name="dqw"),
             helper.make_node("MatMul", ["xd", "Wd"], ["h"], name="mm0"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "W1"], ["y"], name="mm1")]
    inits = [nh.from_array(np.array(0.05, np.float32), "xs"), nh.from_array(np.array(0, np.int8), "xz"),
             nh.from_array(wq, "Wq"), nh.from_array(np.array(1 / 64 / 32, np.float32), "ws"),
             nh.from_array(np.array(0, np.int8), "wz"), weight("W1", seed=2)]
    return make(nodes, [vi("x", TP.FLOAT, [ROWS, D])], [vi("y", TP.FLOAT, [ROWS, D])], inits)


def test_quantized_qdq_model_keeps_its_quantized_units(tmp_path, capsys):
    m = _qdq_model()
    inp = save(m, tmp_path / "m" / "model.onnx")
    out_model, ops = assert_converts(capsys, tmp_path, inp, x_feed())
    by_name = {t.name: t for t in out_model.graph.initializer}
    assert by_name["Wq"].raw_data == m.graph.initializer[2].raw_data  # int8 weights untouched
    assert ops["mm0"]["precision"] == "float32" and "QDQ" in ops["mm0"]["reason"]
    assert ops["mm1"]["precision"] == "float16"
    dq = [n for n in out_model.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    assert [list(n.input) for n in dq] == [["x", "xs", "xz"], ["xq", "xs", "xz"], ["Wq", "ws", "wz"]]
    mm0 = next(n for n in out_model.graph.node if n.name == "mm0")
    assert list(mm0.input) == ["xd", "Wd"]  # no cast between DequantizeLinear and its consumer


def test_integer_ops_model_converts_around_them(tmp_path, capsys):
    wq = (_rng(4).integers(0, 128, (D, D))).astype(np.uint8)
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"], name="dql"),
             helper.make_node("MatMulInteger", ["xq", "Wq", "xz", "wz"], ["hi"], name="mmi"),
             helper.make_node("Cast", ["hi"], ["hf"], to=TP.FLOAT, name="tofloat"),
             helper.make_node("Mul", ["hf", "xs"], ["h"], name="scale"),
             helper.make_node("MatMul", ["h", "W1"], ["y"], name="mm1")]
    m = make(nodes, [vi("x", TP.FLOAT, [ROWS, D])], [vi("y", TP.FLOAT, [ROWS, D])],
             [nh.from_array(wq, "Wq"), nh.from_array(np.array(64, np.uint8), "wz"), weight("W1", seed=2)])
    inp = save(m, tmp_path / "m" / "model.onnx")
    out_model, ops = assert_converts(capsys, tmp_path, inp, x_feed())
    assert {t.name: t.raw_data for t in out_model.graph.initializer}["Wq"] == wq.tobytes()
    assert ops["mm1"]["precision"] == "float16"
    assert next(n for n in out_model.graph.node if n.name == "mmi").input[:2] == ["xq", "Wq"]


def test_custom_domain_function_stays_fp32_between_fp16_gemms(tmp_path, capsys):
    fn = helper.make_function("com.example", "Square", ["a"], ["b"], [helper.make_node("Mul", ["a", "a"], ["b"])],
                              [helper.make_opsetid("", 18)])
    m = mlp(middle=("Square", "com.example"), domains=["com.example"], functions=[fn])
    inp = save(m, tmp_path / "m" / "model.onnx")
    out_model, ops = assert_converts(capsys, tmp_path, inp, x_feed())
    assert ops["mid"]["reason"] == "unknown op com.example::Square: not in the registry, kept FP32"
    assert ops["mm0"]["precision"] == ops["mm1"]["precision"] == "float16"
    assert [n.op_type for n in out_model.graph.node] == ["Cast", "MatMul", "Cast", "Square", "Cast", "MatMul", "Cast"]


def test_unknown_custom_op_is_left_as_it_is(tmp_path, capsys):
    """ONNX Runtime cannot run com.example::MyOp: the check is structural (checker and FP32 I/O of the op).

    The exporter declares the custom op's output type (onnx cannot infer it), as exporters do."""
    m = mlp(middle=("MyOp", "com.example"), domains=["com.example"])
    m.graph.value_info.append(vi("r", TP.FLOAT, [ROWS, D]))
    inp = save(m, tmp_path / "model.onnx")
    out = tmp_path / "out.onnx"
    status, err = run_cli([inp, "-o", out, "-q"], capsys)
    assert (status, err) == (0, [])
    m = onnx.load(str(out))
    onnx.checker.check_model(m, full_check=True)
    nodes = {n.name: n for n in m.graph.node}
    producers = {o: n for n in m.graph.node for o in n.output}
    custom = nodes["mid"]
    assert (custom.domain, custom.op_type, list(custom.attribute)) == ("com.example", "MyOp", [])
    cast_in = producers[custom.input[0]]
    assert cast_in.op_type == "Cast" and cast_in.attribute[0].i == TP.FLOAT  # the op still reads FP32
    assert producers[nodes["mm1"].input[0]].op_type == "Cast"  # and mm1 reads its output cast to FP16
    assert init_types(m) == {"W0_fp16": TP.FLOAT16, "W1_fp16": TP.FLOAT16}


def _if_model() -> onnx.ModelProto:
    then_b = helper.make_graph([helper.make_node("MatMul", ["r", "W1"], ["t1"], name="then_mm")], "then", [],
                               [vi("t1", TP.FLOAT, [ROWS, D])])
    else_b = helper.make_graph([helper.make_node("MatMul", ["r", "W2"], ["e1"], name="else_mm"),
                                helper.make_node("Neg", ["e1"], ["e2"], name="else_neg")], "else", [],
                               [vi("e2", TP.FLOAT, [ROWS, D])])
    nodes = [helper.make_node("MatMul", ["x", "W0"], ["h"], name="mm0"), helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("If", ["c"], ["y"], name="if", then_branch=then_b, else_branch=else_b)]
    return make(nodes, [vi("x", TP.FLOAT, [ROWS, D]), vi("c", TP.BOOL, [])], [vi("y", TP.FLOAT, [ROWS, D])],
                [weight("W0", seed=1), weight("W1", seed=2), weight("W2", seed=3)])


def _loop_model() -> onnx.ModelProto:
    body = helper.make_graph([helper.make_node("MatMul", ["acc_in", "W1"], ["a1"], name="body_mm"),
                              helper.make_node("Relu", ["a1"], ["acc_out"], name="body_relu"),
                              helper.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond")], "body",
                             [vi("i", TP.INT64, []), vi("cond_in", TP.BOOL, []), vi("acc_in", TP.FLOAT, [ROWS, D])],
                             [vi("cond_out", TP.BOOL, []), vi("acc_out", TP.FLOAT, [ROWS, D])])
    nodes = [helper.make_node("MatMul", ["x", "W0"], ["h"], name="mm0"),
             helper.make_node("Loop", ["n", "", "h"], ["y"], name="loop", body=body)]
    return make(nodes, [vi("x", TP.FLOAT, [ROWS, D])], [vi("y", TP.FLOAT, [ROWS, D])],
                [weight("W0", seed=1), weight("W1", seed=2), nh.from_array(np.array(3, np.int64), "n")])


def _scan_model(chunk: int = ROWS, steps: int = 2) -> onnx.ModelProto:
    body = helper.make_graph([helper.make_node("MatMul", ["xi", "W1"], ["p"], name="scan_mm"),
                              helper.make_node("Relu", ["p"], ["pr"], name="scan_relu"),
                              helper.make_node("Add", ["s_in", "pr"], ["s_out"], name="scan_add"),
                              helper.make_node("Identity", ["pr"], ["o"], name="scan_id")], "sbody",
                             [vi("s_in", TP.FLOAT, [chunk, D]), vi("xi", TP.FLOAT, [chunk, D])],
                             [vi("s_out", TP.FLOAT, [chunk, D]), vi("o", TP.FLOAT, [chunk, D])])
    nodes = [helper.make_node("MatMul", ["x", "W0"], ["h"], name="mm0"),
             helper.make_node("Scan", ["s0", "h"], ["sf", "ys"], name="scan", body=body, num_scan_inputs=1)]
    return make(nodes, [vi("x", TP.FLOAT, [steps, chunk, D]), vi("s0", TP.FLOAT, [chunk, D])],
                [vi("sf", TP.FLOAT, [chunk, D]), vi("ys", TP.FLOAT, [steps, chunk, D])],
                [weight("W0", seed=1), weight("W1", seed=2)])


@pytest.mark.parametrize("kind", ["If", "Loop", "Scan"])
def test_control_flow_with_outer_scope_captures_converts(tmp_path, capsys, kind):
    rng = _rng(8)
    if kind == "If":
        m, feeds = _if_model(), [{**x_feed(), "c": np.array(flag)} for flag in (True, False)]
        inner = ["then_mm", "else_mm"]
    elif kind == "Loop":
        m, feeds, inner = _loop_model(), [x_feed()], ["body_mm"]
    else:
        m, inner = _scan_model(), ["scan_mm"]
        feeds = [{"x": rng.standard_normal((2, ROWS, D)).astype(np.float32), "s0": np.zeros((ROWS, D), np.float32)}]
    inp = save(m, tmp_path / "m" / "model.onnx")
    out_model, ops = assert_converts(capsys, tmp_path, inp, feeds)
    scoped = {name.rpartition("/")[2]: op for name, op in ops.items()}
    assert ops["mm0"]["precision"] == "float16"
    assert all(scoped[name]["precision"] == "float16" for name in inner)
    # the captured weights are stored once, in FP16, in the main graph where they were
    assert all(init_types(out_model)[f"{w}_fp16"] == TP.FLOAT16 for w in ("W0", "W1"))


def test_sibling_subgraphs_may_reuse_a_name(tmp_path, capsys):
    """Both If branches call their result ``t`` (legal ONNX); the IR needs unique names, so one is renamed."""
    m = _if_model()
    for a in m.graph.node[2].attribute:
        for n in a.g.node:
            n.output[:] = ["t" if o in ("t1", "e2") else o for o in n.output]
        for o in a.g.output:
            if o.name in ("t1", "e2"):
                o.name = "t"
    inp = save(m, tmp_path / "m" / "model.onnx")
    feeds = [{**x_feed(), "c": np.array(flag)} for flag in (True, False)]
    out_model, ops = assert_converts(capsys, tmp_path, inp, feeds)
    outputs = sorted(a.g.output[0].name for a in out_model.graph.node[-1].attribute)
    assert outputs[0] == "t" and outputs[1].startswith("t__")


def test_subgraph_value_shadowing_an_outer_one_is_refused(tmp_path, capsys):
    m = _if_model()
    then_b = next(a.g for a in m.graph.node[2].attribute if a.name == "then_branch")
    then_b.node[0].output[0] = "h"  # "h" is mm0's output in the main graph
    then_b.output[0].name = "h"
    inp = save(m, tmp_path / "model.onnx")
    assert_refused(capsys, inp, f"{inp}: tensor 'h': defined by node 'then_mm' (MatMul) in subgraph if.then_branch "
                                "shadows a value of an enclosing graph; ONNX names must be unique (SSA)",
                   out=tmp_path / "out.onnx")


def test_opset_older_than_cast_6_is_refused(tmp_path, capsys):
    inp = save(mlp(opset=5), tmp_path / "model.onnx")
    assert_refused(capsys, inp, f"{inp}: opset_import ai.onnx: version 5 is older than 6, the first whose Cast takes "
                                "a numeric type; upgrade the model with onnx.version_converter",
                   out=tmp_path / "out.onnx")


@pytest.mark.parametrize("dim, args", [("batch", ["--dim", "batch=512"]), (None, ["--default-dim", "512"])],
                         ids=["symbolic", "unknown"])
def test_dynamic_and_symbolic_shapes_convert(tmp_path, capsys, dim, args):
    inp = save(mlp(shape=(dim, D)), tmp_path / "m" / "model.onnx")
    out_model, ops = assert_converts(capsys, tmp_path, inp, [x_feed(512), x_feed(7)], extra=args)
    assert ops["mm0"]["precision"] == ops["mm1"]["precision"] == "float16"
    dims = out_model.graph.input[0].type.tensor_type.shape.dim
    assert (dims[0].dim_param, dims[0].HasField("dim_value")) == (dim or "", False)  # still dynamic


def test_weights_out_of_fp16_range_stay_fp32_and_keep_their_sign(tmp_path, capsys):
    rng = _rng(5)
    w0 = (rng.standard_normal((D, D)) / 32).astype(np.float32)
    w0[3, 5], w0[7, 9] = 1e5, -7e4  # beyond 65504: FP16 would make them inf
    w1 = (rng.standard_normal((D, D)) * 1e-9).astype(np.float32)  # below 2**-24: FP16 would make them 0
    w2 = (rng.standard_normal((D, D)) / 32).astype(np.float32)
    w2[0, :5] = [-1e-9, 1e-9, -3e-8, 2e-8, -1e-10]  # a few (< 1 %) flush to zero: stored FP16, signs kept
    nodes = [helper.make_node("MatMul", ["x", "W0"], ["h"], name="mm0"), helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "W1"], ["h1"], name="mm1"),
             helper.make_node("MatMul", ["r", "W2"], ["h2"], name="mm2"), helper.make_node("Add", ["h1", "h2"], ["y"], name="add")]
    m = make(nodes, [vi("x", TP.FLOAT, [ROWS, D])], [vi("y", TP.FLOAT, [ROWS, D])],
             [nh.from_array(w0, "W0"), nh.from_array(w1, "W1"), nh.from_array(w2, "W2")])
    inp = save(m, tmp_path / "m" / "model.onnx")
    out_model, ops = assert_converts(capsys, tmp_path, inp, x_feed())
    stored = {t.name: t for t in out_model.graph.initializer}
    assert stored["W0"].raw_data == w0.tobytes() and stored["W1"].raw_data == w1.tobytes()  # untouched FP32
    assert ops["mm0"]["precision"] == "float32"
    assert ops["mm0"]["reason"] == ("allow: initializer W0 has values beyond the FP16 range (max |w| = 1e+05); "
                                    "kept FP32 rather than clamped")
    assert ops["mm1"]["precision"] == "float32"
    assert ops["mm1"]["reason"] == (f"allow: initializer W1: {D * D} of {D * D} nonzero values are below the smallest "
                                    "FP16 subnormal and would flush to zero; kept FP32 rather than clamped")
    assert ops["mm2"]["precision"] == "float16"
    w2_16 = nh.to_array(stored["W2_fp16"])
    assert (np.signbit(w2_16) == np.signbit(w2)).all()  # flushed values keep their sign (-0.0)
    assert np.isfinite(w2_16).all()


def test_weights_out_of_range_in_external_data_are_found_without_loading_them(tmp_path, capsys, monkeypatch):
    _threshold(monkeypatch, 1 << 20)
    w1 = (_rng(6).standard_normal((D, D)) / 32).astype(np.float32)
    w1[-1, -1] = -1e6  # at the very end of the external data
    inp = save_external(mlp(w1=nh.from_array(w1, "W1")), tmp_path / "m" / "model.onnx")
    out_model, ops = assert_converts(capsys, tmp_path, inp, x_feed())
    assert ops["mm1"]["precision"] == "float32" and "max |w| = 1e+06" in ops["mm1"]["reason"]
    assert ops["mm0"]["precision"] == "float16"
    assert init_types(out_model) == {"W0_fp16": TP.FLOAT16, "W1": TP.FLOAT}


def _constant_mask_model(reader: str):
    mask = np.zeros((1, D), np.float32)
    mask[:, D // 2:] = -1e9  # half the columns masked, as a padding mask
    nodes = [helper.make_node("MatMul", ["x", "W0"], ["h"], name="mm0"),
             helper.make_node("Constant", [], ["mask"], name="mask_c", value=nh.from_array(mask)),
             helper.make_node("Add", ["h", "mask"], ["hm"], name="add_mask"),
             helper.make_node(reader, ["hm"], ["p"], name="reader"),
             helper.make_node("MatMul", ["p", "W1"], ["y"], name="mm1")]
    return make(nodes, [vi("x", TP.FLOAT, [ROWS, D])], [vi("y", TP.FLOAT, [ROWS, D])],
                [weight("W0", seed=1), weight("W1", seed=2)])


def test_attention_mask_constant_beyond_fp16_is_stored_saturated(tmp_path, capsys):
    """A Constant node's -1e9 that only masks a softmax's input (numerics rule 10) is stored at
    -32768 and the mask's Add runs FP16; the converted model validates."""
    inp = save(_constant_mask_model("Softmax"), tmp_path / "m" / "model.onnx")
    out_model, ops = assert_converts(capsys, tmp_path, inp, x_feed())
    assert ops["add_mask"]["precision"] == ops["reader"]["precision"] == "float16"
    const = next(n for n in out_model.graph.node if n.name == "mask_c")
    assert nh.to_array(const.attribute[0].t).min() == -32768.0  # saturated, not -inf


def test_a_constant_beyond_fp16_that_masks_no_softmax_keeps_its_add_fp32(tmp_path, capsys):
    inp = save(_constant_mask_model("Relu"), tmp_path / "m" / "model.onnx")
    out_model, ops = assert_converts(capsys, tmp_path, inp, x_feed())
    assert ops["add_mask"]["precision"] == "float32" and "constant mask has values beyond" in ops["add_mask"]["reason"]
    const = next(n for n in out_model.graph.node if n.name == "mask_c")
    assert const.attribute[0].t.data_type == TP.FLOAT  # not rewritten to -inf in FP16
    assert ops["mm0"]["precision"] == "float16"


def test_op_older_than_its_fp16_support_stays_fp32(tmp_path, capsys):
    """Celu accepts float16 only from opset 28: at opset 18 it stays FP32 between two FP16 GEMMs."""
    inp = save(mlp(middle=("Celu", "")), tmp_path / "m" / "model.onnx")
    out_model, ops = assert_converts(capsys, tmp_path, inp, x_feed())
    assert ops["mid"]["precision"] == "float32"
    assert ops["mid"]["reason"] == ("infer: the Celu schema (opset 12) does not accept fp16 for T "
                                    "(opset 28 does: re-export at it)")
    assert ops["mm0"]["precision"] == ops["mm1"]["precision"] == "float16"


def test_bf16_at_an_opset_without_bf16_stays_fp32(tmp_path, capsys):
    """MatMul takes bfloat16 from opset 13: at opset 12, --dtype bf16 leaves the model as it was."""
    inp = save(mlp(opset=12), tmp_path / "m" / "model.onnx")
    out_model, ops = assert_converts(capsys, tmp_path, inp, x_feed(), extra=["--dtype", "bf16"], tolerance=1e-6)
    assert ops["mm0"]["precision"] == "float32"
    assert ops["mm0"]["reason"] == ("allow: the MatMul schema (opset 9) does not accept bf16 for T "
                                    "(opset 13 does: re-export at it)")
    assert [n.op_type for n in out_model.graph.node] == ["MatMul", "Relu", "MatMul"]


def test_conversion_error_api_names_file_where_and_reason(tmp_path):
    """The same errors through the API: a ``ConversionError`` with its three parts."""
    from amp_compiler import convert_onnx

    m = mlp()
    m.graph.node[2].input[0] = "nope"
    with pytest.raises(ConversionError) as info:
        convert_onnx(m, source="m.onnx")
    err = info.value
    assert (err.source, err.where) == ("m.onnx", "node 'mm1' (MatMul)")
    assert err.reason == "input 'nope' is not produced by any node, graph input or initializer"


@pytest.mark.parametrize("extra, message", [
    (["--runtime", "reference"], "{inp}: --runtime reference applies only with --validate or --fallback"),
    (["--inputs", "{npz}"], "{npz}: --inputs is read only by --validate, --calibrate or --fallback"),
    (["--calibrate", "--inputs", "{npz}"], "{npz}: graph input 'x': has no array in the file (arrays: z)"),
])
def test_options_that_would_be_ignored_or_cannot_feed_the_model(tmp_path, capsys, extra, message):
    inp, npz = tmp_path / "m.onnx", tmp_path / "other.npz"
    onnx.save(mlp(), inp)
    np.savez(npz, z=np.ones((2, 2), np.float32))
    fill = {"inp": inp, "npz": npz}
    assert_refused(capsys, inp, message.format(**fill), out=tmp_path / "out.onnx",
                   extra=[e.format(**fill) for e in extra], inputs=[npz])


def test_a_low_dtype_the_cpu_runtime_has_no_kernels_for_validates_on_either_runtime(tmp_path, capsys):
    """ONNX Runtime's CPU provider has no BF16 GEMM: --validate there had stopped with NOT_IMPLEMENTED
    (pointing to the reference evaluator); it now runs the model with BF16 emulated
    (tests/test_validate_bf16.py), and the reference evaluator still runs it."""
    inp = save(mlp(), tmp_path / "m" / "model.onnx")
    out = tmp_path / "model.mp.onnx"
    status, err = run_cli([inp, "-o", out, "--dtype", "bf16", "--planner", "all", "--validate"], capsys)
    assert status == 0 and out.exists()
    assert any("bfloat16 emulated" in line for line in err)
    out.unlink()
    status, _ = run_cli([inp, "-o", out, "--dtype", "bf16", "--planner", "all", "--validate", "--runtime", "reference"],
                        capsys)
    assert status == 0 and out.exists()


def test_a_graph_input_without_a_shape_is_named(tmp_path, capsys):
    """ONNX Runtime loads a model whose graph input declares no shape, but onnx's checker refuses it
    with "Field 'shape' of 'type' is required but missing", which named no value."""
    m = mlp()
    m.graph.input[0].type.tensor_type.ClearField("shape")
    inp = save(m, tmp_path / "m.onnx")
    assert_refused(capsys, inp, f"{inp}: graph input 'x': has no shape: ONNX requires one on the main graph's inputs "
                                "and outputs (symbolic dims are fine: dim_param), so the model is not valid ONNX; "
                                "declare its rank and dims", out=tmp_path / "out.onnx")


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(model_or_path=123), TypeError, "convert_onnx takes an onnx.ModelProto or the path of an .onnx file, got int"),
    (dict(dim_values={"batch": "4"}), ValueError, "dim_values['batch'] must be a positive int, got '4'"),
    (dict(dim_values=[("batch", 4)]), TypeError, "dim_values must be a dict of dim name -> size, got list"),
    (dict(default_dim=0), ValueError, "default_dim must be a positive int, got 0"),
])
def test_api_arguments_of_the_wrong_kind_are_named(tmp_path, kwargs, error, message):
    """These failed deep inside (``os.fspath``, the cost model's ``+=`` on a str size)."""
    from amp_compiler import convert_onnx

    kwargs = {"model_or_path": save(mlp(), tmp_path / "m.onnx"), **kwargs}
    with pytest.raises(error) as info:
        convert_onnx(**kwargs)
    assert str(info.value) == message


@pytest.mark.parametrize("flag", ["--validate", "--calibrate", "--fallback"])
def test_runtime_options_without_onnxruntime_say_how_to_get_it(tmp_path, capsys, monkeypatch, flag):
    """An install without ONNX Runtime (``--no-deps``, a broken ``-gpu`` build) ended these in
    "internal error: ModuleNotFoundError ... this is a bug"."""
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import raises ImportError
    inp = save(mlp(), tmp_path / "m.onnx")
    assert_refused(capsys, inp, "ONNX Runtime: cannot be imported (import of onnxruntime halted; None in "
                                "sys.modules): --validate, --calibrate and --fallback run the model on it; pip "
                                "install 'amp-compiler[cpu]' ('[gpu]' for onnxruntime-gpu, never both)",
                   out=tmp_path / "out.onnx", extra=[flag])


def test_compile_without_torch_says_which_extra_installs_it(monkeypatch):
    """A plain ``pip install`` carries no torch: ``amp_compiler.compile`` raised a bare
    ``ModuleNotFoundError`` from inside the package."""
    import amp_compiler

    monkeypatch.delitem(amp_compiler.__dict__, "compile", raising=False)  # resolved afresh (PEP 562)
    monkeypatch.delitem(sys.modules, "amp_compiler.torch_api", raising=False)
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ImportError, match=r"amp_compiler.compile needs PyTorch, .*pip install 'amp-compiler\[torch\]'"):
        amp_compiler.compile


def test_an_op_given_a_type_its_opset_does_not_take_says_to_export_newer(tmp_path, capsys):
    """A T5 exported with dynamo=False at opset 11 has Min on int64 position buckets (Min-8 takes
    floats only): the line said "has unsupported type" and nothing of what to do."""
    nodes = [helper.make_node("Min", ["a", "b"], ["m"], name="clamp"),
             helper.make_node("Cast", ["m"], ["y"], name="to_float", to=TP.FLOAT)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TP.INT64, [4]) for n in "ab"],
                              [helper.make_tensor_value_info("y", TP.FLOAT, [4])])
    inp = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)]), str(inp))
    assert_refused(capsys, inp, f"{inp}: node 'clamp' (Min): type inference failed: data_0 typestr: T, has unsupported "
                                "type: tensor(int64) (Min at the model's opset does not take this type; ONNX Runtime "
                                "refuses it too: export with opset_version 12 or newer)", out=tmp_path / "out.onnx")


def test_a_type_no_version_of_the_op_takes_is_not_told_to_export_newer(tmp_path, capsys):
    """A TorchScript Falcon casts its alibi slopes to complex128: no Cast at any opset takes it,
    and the line had advised a newer opset_version, which changed nothing."""
    nodes = [helper.make_node("Cast", ["x"], ["c"], name="to_complex", to=TP.COMPLEX128),
             helper.make_node("Shape", ["c"], ["y"], name="shape")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TP.INT64, [1])])
    inp = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(inp))
    status = cli.main([str(inp), "-o", str(tmp_path / "out.onnx"), "-q"])
    err = capsys.readouterr().err
    assert status == 2 and "node 'to_complex' (Cast)" in err and "tensor(complex128)" in err, err
    assert "no version of ONNX's Cast takes tensor(complex128)" in err and "opset_version" not in err


def test_a_malformed_model_under_fallback_gets_the_importers_error(tmp_path, capsys):
    """--fallback ran the FP32 model on ONNX Runtime before converting it: a value defined twice
    read "the FP32 model: ONNX Runtime: cannot load it: ... Duplicate definition", naming no file."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="a"), helper.make_node("Relu", ["x"], ["r"], name="b")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, [2])],
                              [helper.make_tensor_value_info("r", TP.FLOAT, [2])])
    inp = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    assert_refused(capsys, inp, f"{inp}: tensor 'r': defined twice in the main graph: by node 'a' (Relu) and by "
                                "node 'b' (Relu); ONNX names must be unique (SSA)", out=tmp_path / "out.onnx",
                   extra=["--fallback"])
