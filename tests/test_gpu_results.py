"""The GPU suite's analysis, run where no GPU is: the fit, the kernel census, the committed results.

The measurements themselves need a CUDA device (``python -m benchmarks.gpu_suite``); what is
checked here is everything done with them afterwards, on synthetic data whose answer is known and
on the results file committed from the H100 run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks import gpu_fit
from benchmarks.cuda_trace import kernel_class
from benchmarks.gpu_ort import kernel_census

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "gpu-h100-2026-11-24.json"
FITTED_DEVICE = Path(__file__).resolve().parents[1] / "cost_model" / "fitted" / "h100-ort-cuda.json"


def _synthetic(bw_gbs=3000.0, floor_us=1.5, fp16_tflops=600.0, fp16_floor_us=3.0, tf32_tflops=200.0,
               tf32_floor_us=4.0) -> dict:
    """Calibration data generated from known figures (and a whole-model row whose wall time
    holds 5 µs per kernel beyond its GPU time)."""
    casts = {str(n): {"f32->f16": {"gpu_s": (floor_us + n * 6 / (bw_gbs * 1e3)) * 1e-6}}
             for n in (512, 4096, 1 << 16, 1 << 20, 1 << 24)}
    ops = {}
    for i, nbytes in enumerate((1e4, 1e6, 1e8)):
        ops[f"add{i}"] = {"op": "add", "flops": nbytes / 12, "tensor_core": False,
                          "bytes": {"float32": nbytes, "float16": nbytes / 2},
                          "predicted_us": {"float32": 4 + nbytes / 3.35e3, "float16": 4 + nbytes / 6.7e3},
                          "measured": {"float32": {"gpu_s": (floor_us + nbytes / (bw_gbs * 1e3)) * 1e-6},
                                       "float16": {"gpu_s": (floor_us + nbytes / 2 / (bw_gbs * 1e3)) * 1e-6}}}
    for i, flops in enumerate((1e8, 1e9, 1e10, 1e11)):
        ops[f"mm{i}"] = {"op": "matmul", "flops": flops, "tensor_core": True,
                         "bytes": {"float32": 1e3, "float16": 5e2},
                         "predicted_us": {"float32": 4 + flops / 67e6, "float16": 4 + flops / 989e6},
                         "measured": {"float32": {"gpu_s": (tf32_floor_us + flops / (tf32_tflops * 1e6)) * 1e-6},
                                      "float16": {"gpu_s": (fp16_floor_us + flops / (fp16_tflops * 1e6)) * 1e-6}}}
    models = [{"model": "m", "batch": 1, "variant": "fp32", "predicted_ms": 1.0, "gpu_us": 800.0, "kernels": 100,
               "wall_ms": 1.3}]
    return {"calibrate": {"ops": ops, "casts": casts}, "ort_models": models}


def test_fit_recovers_the_figures_the_data_was_made_from():
    fitted = gpu_fit.fit(_synthetic())["fitted"]
    expected = {"mem_bandwidth_gbs": 3000.0, "kernel_floor_us": 1.5, "fp16_tflops": 600.0, "fp16_gemm_floor_us": 3.0,
                "tf32_tflops": 200.0, "tf32_gemm_floor_us": 4.0, "launch_overhead_us": 5.0}
    for key, value in expected.items():
        assert fitted[key] == pytest.approx(value, rel=1e-3), key


def test_the_fit_beats_the_datasheet_on_data_from_another_device():
    result = gpu_fit.fit(_synthetic())
    all_ops = result["ops"]["all"]
    assert all_ops["fitted"]["median_rel_error"] < 1e-3 < all_ops["datasheet"]["median_rel_error"]
    assert all_ops["fitted"]["spearman"] == pytest.approx(1.0)


def test_spearman_handles_ties_and_order():
    assert gpu_fit.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert gpu_fit.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert gpu_fit.spearman([1, 1, 2, 3], [1, 1, 2, 3]) == pytest.approx(1.0)
    assert math.isnan(gpu_fit.spearman([1, 2], [2, 1]))


def test_kernel_classes_do_not_take_broadcasts_for_casts():
    assert kernel_class("void onnxruntime::cuda::BroadcastBiasKernel<__half, int, false>(...)") != "cast"
    assert kernel_class("_BinaryElementWiseBroadcast<float>") != "cast"
    assert kernel_class("_UnaryElementWise<__half, float, onnxruntime::cuda::OP_Cast<__half, float>, 256, 4>") == "cast"
    assert kernel_class("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize64x128x32") == "gemm"
    assert kernel_class("onnxruntime::contrib::cuda::SkipLayerNormKernelSmall<__half, 96u, 8, false>") == "norm"


def test_kernel_census_reads_an_ort_trace():
    def node(name, op, dur):
        return {"cat": "Node", "name": f"{name}_kernel_time", "dur": dur,
                "args": {"op_name": op, "provider": "CUDAExecutionProvider", "input_type_shape": [],
                         "output_type_shape": []}}

    trace = [node("mm", "MatMul", d) for d in (10, 12, 11)] + [node("c", "Cast", d) for d in (3, 2, 4)]
    trace.append({"cat": "Session", "name": "model_run", "dur": 999})
    census = kernel_census(trace, runs=3)
    assert census["kernels"] == 2 and census["kernel_us"] == 11 + 3
    assert census["by_op"] == {"MatMul": {"count": 1, "us": 11}, "Cast": {"count": 1, "us": 3}}
    assert census["cpu_ops"] == []


@pytest.mark.skipif(not RESULTS.is_file(), reason="no GPU results committed")
def test_committed_gpu_results_hold_what_the_readme_says():
    data = json.loads(RESULTS.read_text())
    assert data["gpu"]["nvidia_smi"].startswith("NVIDIA H100") and data["gpu"]["onnxruntime"]
    # every zoo model at batch 1 was timed, interleaved, for FP32, ours and each peer that converted it
    batch1 = {r["model"]: r for r in data["ort"] if r["batch"] == 1}
    assert len(batch1) == 7
    for row in batch1.values():
        assert "interleaved_ms" in row["fp32"] and "interleaved_ms" in row["tools"]["amp-compiler"]
    # our outputs match FP32 on the GPU; on the zoo's transformers ORT's and ours run the same kernels
    for row in data["ort_profiled"]:
        ours = row["tools"]["amp-compiler"]
        assert ours["max_rel_error_vs_fp32"] < 1e-2
        peer = row["tools"]["ort-float16"]["gpu_kernels"]
        if row["model"] != "t5":
            assert ours["gpu_kernels"]["kernels_per_run"] == peer["kernels_per_run"]
        else:  # our T5 lets ORT fuse its RMSNorms: far fewer kernels than ORT's own float16 output
            assert ours["gpu_kernels"]["kernels_per_run"] < 0.7 * peer["kernels_per_run"]
    # the fit stored in the file is what gpu_fit computes from the file, and the device file holds it
    again = gpu_fit.fit(data)
    assert again["fitted"] == pytest.approx(data["fit"]["fitted"])
    device = json.loads(FITTED_DEVICE.read_text())
    assert device == gpu_fit.device_file(again["fitted"])
    assert again["ops"]["all"]["fitted"]["median_rel_error"] < again["ops"]["all"]["datasheet"]["median_rel_error"]


def test_fitted_device_file_plans_a_model(tmp_path):
    """The fitted figures are a ``--target-file`` device: a zoo model converts with them."""
    pytest.importorskip("transformers")
    from amp_compiler.cli import main

    from benchmarks import zoo

    src = zoo.export_onnx("bert", "small")
    out = tmp_path / "bert.fp16.onnx"
    report = tmp_path / "plan.json"
    assert main([str(src), "-o", str(out), "--target-file", str(FITTED_DEVICE), "--report", str(report), "-q"]) == 0
    summary = json.loads(report.read_text())["summary"]
    assert out.is_file() and summary["target"] == "h100-ort-cuda-fitted"


def test_torture_shows_a_cuda_table_only_for_results_from_a_gpu():
    from benchmarks import torture

    def cell(err):
        score = {"finite": True, "max_rel_error": err, "within_tolerance": err <= torture.TOLERANCE}
        return {"ok": True, "loads": True, **score, "fp16_storage": dict(score), "nodes": 3, "fp16_nodes": 2}

    results = [{"case": "c", "what": "a case", "tools": {"amp-compiler": cell(1e-3), "ort-float16": cell(0.5)}}]
    data = {"command": "x", "date": "d", "commit": "abc", "dirty": False, "versions": {"onnxruntime": "1"},
            "tools": ["amp-compiler", "ort-float16"], "results": results}
    data["verdicts"] = torture.verdicts(results)
    assert "cuda" not in data["verdicts"] and "CUDA EP" not in torture.render(data)
    results[0]["tools"]["amp-compiler"]["cuda"] = {"finite": True, "max_rel_error": 2e-3, "within_tolerance": True}
    results[0]["tools"]["ort-float16"]["cuda"] = {"finite": False, "max_rel_error": float("inf"),
                                                  "within_tolerance": False}
    data["verdicts"] = torture.verdicts(results)
    assert data["verdicts"]["cuda"]["c"] == {"full_fp16_peers_break": ["ort-float16"],
                                             "amp_compiler": {v: ({"finite": True, "within_tolerance": True}
                                                                  if v == "amp-compiler" else None)
                                                              for v in torture.OUR_VARIANTS}}
    assert "ONNX Runtime CUDA EP, on a GPU" in torture.render(data)


def test_ort_part_runs_end_to_end_on_the_cpu_provider(tmp_path):
    """The latency part's whole path (parallel preparation, sequential cells with the census,
    interleaved rounds, error against FP32, partial results) on ONNX Runtime's CPU provider."""
    pytest.importorskip("transformers")
    from benchmarks.gpu_ort import part_ort
    from benchmarks.gpu_suite import render

    seen = []
    rows = part_ort(["bert"], [1], lambda msg: None, deadline=1e18, provider="CPUExecutionProvider",
                    work_dir=tmp_path, size="small", tools=("amp-compiler",), rounds=2,
                    sink=lambda r: seen.append(len(r)))
    (row,) = rows
    ours = row["tools"]["amp-compiler"]
    assert row["convert"]["amp-compiler"]["ok"] and "predicted_time_mixed_s" in row["convert"]["amp-compiler"]["summary"]
    assert ours["max_rel_error_vs_fp32"] < 1e-2 and "_outputs" not in ours
    assert ours["census"]["kernels"] > 10 and "nodes" in ours["census"]  # kept for the fit's graphs
    assert len(ours["interleaved_ms"]["round_medians_ms"]) == 2 and row["fp32"]["interleaved_ms"]["median_ms"] > 0
    assert seen and set(row["tools"]) == {"amp-compiler"}
    table = render({"command": "c", "date": "d", "device": "cpu", "commit": "x", "dirty": False, "ort": rows})
    assert "| bert " in table and "failed" not in table


def test_ort_part_past_its_deadline_skips_rather_than_runs(tmp_path):
    pytest.importorskip("transformers")
    from benchmarks.gpu_ort import part_ort

    rows = part_ort(["bert"], [1], lambda msg: None, deadline=0.0, provider="CPUExecutionProvider",
                    work_dir=tmp_path, size="small", tools=("amp-compiler",))
    assert rows[0]["fp32"] == {"skipped": "time budget of the run spent"}
