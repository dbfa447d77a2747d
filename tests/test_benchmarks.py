"""The benchmark harness works (no timing assertions: performance is measured by the benchmarks).

* the cost-model ruler (``amp_compiler.analysis``) reproduces the report's prediction on our
  own output, and prices unsorted peer outputs;
* a tool that fails is a cell of the peers table, not a crash;
* one small zoo model goes through the peers harness with two tools in fresh processes;
* the torture models build, and amp-compiler's outputs on them stay finite;
* the scaling and GPU commands work on this machine (the GPU suite as a clean skip).
"""

from __future__ import annotations

import io
import json
import math
import sys
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from amp_compiler.analysis import analyze_model, predicted_time, sort_nodes, topologically_sorted  # noqa: E402
from amp_compiler.onnx_api import convert_onnx  # noqa: E402
from benchmarks import common, peers, scaling, torture  # noqa: E402
from benchmarks.synthetic import transformer_graph  # noqa: E402


def _zoo_path(name: str) -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("onnxscript")
    from benchmarks import zoo

    return zoo.export_onnx(name, "small")


# --------------------------------------------------------------------------- the ruler


@pytest.mark.parametrize("planner", ["optimal", "all"])
def test_ruler_reproduces_the_report_on_our_output(planner: str) -> None:
    path = _zoo_path("bert")
    converted, report = convert_onnx(path, planner=planner)
    a = analyze_model(converted)
    s = report.summary
    assert a.predicted_time_s == pytest.approx(s["predicted_time_mixed_s"], rel=0.03)
    assert a.casts == s["casts"]
    assert a.cast_bytes == s["cast_bytes"]
    assert a.fp16_gemm_flop_fraction == pytest.approx(s["fp16_gemm_flop_fraction"], abs=1e-9)
    assert a.low_precision_ops == s["fp16_nodes"]


def test_ruler_on_a_synthetic_graph_with_casts() -> None:
    model = transformer_graph(200, hidden=256, seq=128, batch=8)
    converted, report = convert_onnx(model)
    assert report.summary["casts"] > 0  # deny ops in every block force casts
    a = analyze_model(converted)
    assert a.predicted_time_s == pytest.approx(report.summary["predicted_time_mixed_s"], rel=0.03)
    assert a.casts == report.summary["casts"]
    fp32 = analyze_model(model)
    assert fp32.casts == 0 and fp32.low_precision_ops == 0 and fp32.fp16_gemm_flop_fraction == 0.0
    assert fp32.predicted_time_s == pytest.approx(report.summary["predicted_time_fp32_s"], rel=0.03)
    assert predicted_time(converted) == pytest.approx(a.predicted_time_s)


def test_ruler_prices_a_model_whose_nodes_are_out_of_order() -> None:
    converted, _ = convert_onnx(transformer_graph(60, hidden=256, seq=128, batch=8))
    expected = analyze_model(converted)
    shuffled = onnx.ModelProto()
    shuffled.CopyFrom(converted)
    nodes = list(shuffled.graph.node)
    del shuffled.graph.node[:]
    shuffled.graph.node.extend(nodes[::-1])  # as converters that append their casts at the end leave it
    assert not topologically_sorted(shuffled.graph)
    got = analyze_model(shuffled)
    assert got.predicted_time_s == pytest.approx(expected.predicted_time_s)
    assert got.casts == expected.casts
    sort_nodes(shuffled.graph)
    assert topologically_sorted(shuffled.graph)


# --------------------------------------------------------------------------- peers harness


def test_a_failing_tool_is_a_cell_not_a_crash(tmp_path: Path) -> None:
    res = common.run_tool("amp-compiler", tmp_path / "missing.onnx", tmp_path / "out.onnx", timeout=120)
    assert res["ok"] is False
    assert "missing.onnx" in res["error"] or "not found" in res["error"]
    res = common.run_tool("no-such-tool", tmp_path / "missing.onnx", tmp_path / "out.onnx", timeout=120)
    assert res["ok"] is False and "unknown tool" in res["error"]

    ok_cell = {"ok": True, "convert_s": 1.0, "peak_rss_kb": 2048, "rss_growth_kb": 1024, "loads": True,
               "max_rel_error": 1e-3, "summary": {"predicted_time_all_fp16_s": 1e-3},
               "analysis": {"nodes": 10, "casts": 2, "cast_bytes": 2 ** 20, "fp16_gemm_flop_fraction": 1.0,
                            "predicted_time_s": 1.05e-3}}
    results = [{"model": "bert", "fp32": {"loads": True, "analysis": {**ok_cell["analysis"], "casts": 0}},
                "tools": {"amp-compiler": ok_cell,
                          "ort-float16": {**ok_cell, "convert_s": 4.0, "max_rel_error": 2e-3},
                          "occ-float16": {**ok_cell, "loads": False, "ort_error": "load failed: Type Error"},
                          "modelopt-autocast": {"ok": False, "error": "ModelOpt not installed: pip failed"}}}]
    text = peers.table(results)
    assert "failed: ModelOpt not installed: pip failed" in text
    assert "no: load failed: Type Error" in text
    assert "1050 (1.05×)" in text
    chk = peers.checks(results)
    assert chk["bert_time_ratio_vs_ort"] == pytest.approx(0.25)
    row = chk["models"]["bert"]
    assert row["error_vs_best_peer"] == pytest.approx(0.5) and row["error_ok"]
    assert row["predicted_ok"]
    assert "time_ratio_vs_modelopt-autocast" not in row
    assert "| bert" in "\n".join(peers.summary_lines(chk))


def test_peers_harness_on_a_small_zoo_model() -> None:
    path = _zoo_path("resnet")
    entry = peers.run_model("resnet", "small", ("amp-compiler", "ort-float16"), 1, target="h100", timeout=300,
                            log=lambda msg: None)
    assert entry["file"] == path.name and entry["fp32"]["loads"]
    for tool in ("amp-compiler", "ort-float16"):
        cell = entry["tools"][tool]
        assert cell["ok"], cell.get("error")
        assert cell["convert_s"] > 0 and cell["peak_rss_kb"] > 0
        assert cell["loads"] and math.isfinite(cell["max_rel_error"]) and cell["max_rel_error"] < 1e-2
        assert cell["analysis"]["nodes"] >= entry["fp32"]["analysis"]["nodes"]
    ours = entry["tools"]["amp-compiler"]
    assert ours["analysis"]["predicted_time_s"] == pytest.approx(ours["summary"]["predicted_time_mixed_s"], rel=0.03)
    assert "resnet" in peers.table([entry])


def test_modelopt_requirements_are_cpu_only() -> None:
    from benchmarks.modelopt_env import cpu_requirements

    lines = ["numpy", "torch>=2.8", 'cupy-cuda12x; extra == "onnx"', 'onnx~=1.21.0; extra == "onnx"',
             'onnxruntime-gpu~=1.24.2; platform_system != "Darwin" and extra == "onnx"',
             'pytest~=9.1.0; extra == "dev-test"']
    reqs = cpu_requirements(lines, "2.13.0+cpu")
    assert "onnxruntime~=1.24.2" in reqs and not any("gpu" in r or "cupy" in r or "pytest" in r for r in reqs)
    assert "torch==2.13.0+cpu" in reqs and "onnx~=1.21.0" in reqs
    assert "torch>=2.8" in cpu_requirements(lines, None)


# --------------------------------------------------------------------------- torture set


def test_torture_models_build_and_ours_stays_finite() -> None:
    cases = torture.build_cases()
    assert {"exp_no_max", "rms_norm", "mask_1e9", "tiny_weights", "softmax_big_logits"} <= {c.name for c in cases}
    for case in cases:
        onnx.checker.check_model(case.model, full_check=True)
        ref = ort.InferenceSession(case.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, case.feeds)
        assert all(np.isfinite(r).all() for r in ref), case.name
        converted, report = convert_onnx(case.model, calibration_inputs=case.feeds)
        got = ort.InferenceSession(converted.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, case.feeds)
        assert all(np.isfinite(g).all() for g in got), case.name


def test_fp16_storage_emulator_shows_what_cpu_islands_hide(tmp_path: Path) -> None:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    case = next(c for c in torture.build_cases() if c.name == "exp_no_max")
    src, full, ours = tmp_path / "fp32.onnx", tmp_path / "full.onnx", tmp_path / "ours.onnx"
    onnx.save(case.model, src)
    onnx.save(convert_float_to_float16(onnx.load(src), keep_io_types=True), full)
    onnx.save(convert_onnx(case.model, deny_propagation=True)[0], ours)  # Div reads exp: FP32 by propagation
    ref, _ = common.ort_outputs(src, case.feeds)
    emulated_fp32, _ = torture.fp16_storage_outputs(src, case.feeds)
    assert common.max_rel_error(ref, emulated_fp32) < 1e-4  # the emulator agrees with ORT in FP32
    emulated_full, _ = torture.fp16_storage_outputs(full, case.feeds)
    assert not all(np.isfinite(o).all() for o in emulated_full)  # exp overflows once stored in FP16
    emulated_ours, _ = torture.fp16_storage_outputs(ours, case.feeds)
    assert common.max_rel_error(ref, emulated_ours) <= torture.TOLERANCE  # Exp/ReduceSum stay FP32


# --------------------------------------------------------------------------- scaling, GPU, helpers


def test_scaling_measures_one_size_in_a_fresh_process() -> None:
    row = scaling.measure(300)
    assert row["ok"], row.get("error")
    assert row["n_nodes"] >= 250 and row["convert_s"] > 0 and row["peak_rss_kb"] > 0
    assert {"import", "convert", "casts", "emit"} <= set(row["stages"])
    g = scaling.growth([{"requested": 10000, "ok": True, "n_nodes": 10000, "convert_s": 1.0, "peak_rss_kb": 100},
                        {"requested": 100000, "ok": True, "n_nodes": 100000, "convert_s": 12.0, "peak_rss_kb": 900}])
    assert g["linearity"] == pytest.approx(1.2) and g["t_100k_s"] == 12.0
    assert "f2f_linearity" not in g  # no file-to-file runs: no verdict on them


def test_scaling_states_done_when_2_from_the_file_to_file_runs() -> None:
    """The whole-process growth and the 100k ratio to ORT's tool, each against its target."""
    def row(n, ours, ort):
        return {"requested": n, "ok": True, "n_nodes": n, "convert_s": ours * 0.9, "peak_rss_kb": 100,
                "summary": {}, "stages": {},
                "file_to_file": {"amp-compiler": {"ok": True, "wall_s": ours, "peak_rss_kb": 100},
                                 "ort-float16": {"ok": True, "wall_s": ort, "peak_rss_kb": 100}}}

    rows = [row(10000, 2.0, 1.0), row(100000, 21.0, 7.0)]
    g = scaling.growth(rows)
    assert g["f2f_linearity"] == pytest.approx(1.05) and g["f2f_100k_vs_ort"] == pytest.approx(3.0)
    text = scaling.render({"rows": rows, "growth": g, "machine": {"cpu": "cpu", "cores": 2}, "command": "c",
                           "date": "d", "repeat": 1, "commit": "abc", "dirty": False})
    assert "**1.05** (target ≤ 1.10: met) of linear" in text
    assert "amp-compile / ORT's float16 tool **3.00** (target ≤ 1.00: NOT met)" in text


def test_file_to_file_times_whole_processes_with_the_stage_split(tmp_path: Path) -> None:
    """amp-compile and ORT's tool each run file to file in their own process, each split into stages."""
    from benchmarks import file_to_file

    model = tmp_path / "m.onnx"
    onnx.save(transformer_graph(300), model)
    cells = file_to_file.median_runs(model, tmp_path, ("amp-compiler", "ort-float16"), 1, log=lambda _: None)
    ours, ort_cell = cells["amp-compiler"], cells["ort-float16"]
    assert ours["ok"] and ort_cell["ok"], (ours, ort_cell)
    assert list(ours["stages"]) == list(file_to_file.STAGES)
    assert sum(ours["stages"].values()) == pytest.approx(ours["wall_s"], abs=0.01)
    assert list(ort_cell["stages"]) == ["start-up+imports+exit", "load+convert", "save"]
    assert sum(ort_cell["stages"].values()) == pytest.approx(ort_cell["wall_s"], abs=0.01)
    assert min(ort_cell["stages"].values()) > 0
    assert ours["peak_rss_kb"] > 20_000 and ort_cell["peak_rss_kb"] > 20_000
    converted = onnx.load(tmp_path / "amp-compiler-1.onnx")
    assert any(n.op_type == "Cast" for n in converted.graph.node)
    bad = file_to_file.run("amp-compiler", tmp_path / "missing.onnx", tmp_path / "x.onnx")
    assert not bad["ok"] and "file not found" in bad["error"]


def test_stage_split_reads_the_cli_progress_lines() -> None:
    from benchmarks.file_to_file import stage_split

    marks = [("[   0.00s] load", 1.5), ("[   0.40s] import", 2.0), ("[   0.90s] classify", 2.5),
             ("[   1.00s] convert", 2.6), ("[   1.20s] emit", 3.0), ("[   1.50s] write out.onnx", 3.25),
             ("a warning line", 3.3)]
    split = stage_split(marks, start=1.0, end=4.0)
    assert split == {"start-up+imports": 0.5, "load": 0.5, "import": 0.5, "plan": 0.5, "emit": 0.25,
                     "write": 0.75}


def test_gpu_suite_skips_cleanly_without_cuda() -> None:
    from benchmarks import gpu_suite

    present, _ = gpu_suite.cuda_available()
    if present:
        pytest.skip("a CUDA device is present: the suite would run for real")
    out = io.StringIO()
    with redirect_stdout(out):
        assert gpu_suite.main(["--no-readme"]) == 0
    assert "no CUDA device: skipped" in out.getvalue()
    assert gpu_suite.device_key("NVIDIA H100 80GB HBM3") == "h100"


def test_gpu_calibration_code_runs_on_the_cpu_provider() -> None:
    _zoo_path("bert")
    from benchmarks import gpu_suite

    result = gpu_suite.part_calibrate(["bert"], "h100", lambda msg: None, write_profile=False, size="small",
                                      provider="CPUExecutionProvider")
    assert result["entries"] > 10 and result["not_measured"] <= result["entries"] // 4, result["failures"]


def test_results_record_the_commit_and_uncommitted_changes(tmp_path: Path) -> None:
    """A table stamped with a commit says when the code that made it was not all in that commit."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path,
                              check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    git("add", "a.py")
    git("commit", "-qm", "a")
    head = git("rev-parse", "--short", "HEAD")
    assert (common.git_commit(tmp_path), common.git_dirty(tmp_path)) == (head, False)
    (tmp_path / "a.py").write_text("x = 2\n")
    assert common.git_dirty(tmp_path) is True
    git("checkout", "-q", "a.py")
    (tmp_path / "b.py").write_text("y = 1\n")  # a new module runs too
    assert common.git_dirty(tmp_path) is True
    assert common.git_dirty(tmp_path / "missing") is None
    assert common.provenance({"commit": head, "dirty": True}) == f"commit {head} plus uncommitted changes"
    assert common.provenance({"commit": head, "dirty": False}) == f"commit {head}"
    header = common.run_header("x", [], packages=())
    assert header["commit"] == common.git_commit() and header["dirty"] == common.git_dirty()


def test_markdown_table_and_readme_section(tmp_path: Path) -> None:
    text = common.md_table(["a", "b"], [["x|y", 1.5]])
    assert text.splitlines()[0].startswith("| a") and "x\\|y" in text
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- t:start -->\nold\n<!-- t:end -->\nrest\n")
    assert common.update_readme_section("t", "new table", readme)
    assert readme.read_text() == "intro\n<!-- t:start -->\nnew table\n<!-- t:end -->\nrest\n"
    assert not common.update_readme_section("missing", "x", readme)
    path = common.write_json("x.json", {"v": np.float32(1.5)}, results_dir=tmp_path)
    assert json.loads(path.read_text()) == {"v": 1.5}


def test_shapes_loops_count_captures_and_match_fp32(monkeypatch) -> None:
    """The changing-shapes benchmark on short loops: amp-compiler's serving loop holds the example's
    plan and one symbolic plan over four sizes; the padded fine-tune needs three captures for five
    lengths (the first step, one steady length, the symbolic one) and tracks eager FP32."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from benchmarks import shapes

    monkeypatch.setattr(shapes, "SERVE_CALLS", [(2, 16), (4, 20), (3, 24), (1, 9)])  # both dims vary at once
    monkeypatch.setattr(shapes, "TRAIN_LENGTHS", [16, 20, 24, 31, 17])
    served = shapes.serve("amp-compiler")
    assert served["captures"] == 2 and served["max_rel_err"] < 2e-2
    trained = shapes.train("amp-compiler")
    assert trained["captures"] == 3 and trained["max_rel_err"] < 1e-2
