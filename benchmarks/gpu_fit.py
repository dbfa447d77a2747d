"""Fit the cost model's device figures to what the GPU suite measured, and say how well each predicts.

    python -m benchmarks.gpu_fit benchmarks/results/gpu-h100-2026-11-24.json
    python -m benchmarks.gpu_fit RESULTS.json --write-device cost_model/profiles/h100-ort-cuda-fitted.json

Input: a results file of ``benchmarks.gpu_suite`` (its ``calibrate`` part: one-node models timed
with CUPTI kernel times, casts of many sizes, a chain of tiny nodes; its ``ort`` parts: whole
models, GPU-busy time and wall latency). Output: the fitted figures, and per op and per model the
rank correlation (Spearman) and median relative error of the datasheet roofline and of the fit.

What is fitted, each as a line t = floor + work / rate through the measured GPU times, least
squares on the *relative* error (a 2 µs kernel counts as much as a 2 ms one):

* ``mem_bandwidth_gbs`` and ``kernel_floor_us`` -- over the casts and every op that is not a
  GEMM/conv (bytes moved as the cost model counts them);
* ``fp16_tflops`` / ``tf32_tflops`` with their ``*_gemm_floor_us`` -- over the GEMMs/convs in FP16
  and in FP32 (ONNX Runtime's CUDA EP runs FP32 GEMMs as TF32: the kernel names say so);
* ``launch_overhead_us`` -- per kernel, wall latency minus GPU-busy time over the kernels a whole
  model ran (what a kernel costs beyond its own GPU time: launch and the runtime's work between).

The cost model's device figures have no floor per kernel kind, so ``--write-device`` keeps the
rates, bandwidth and launch cost; the floors are reported.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np



def spearman(a: list[float], b: list[float]) -> float:
    """Rank correlation (average ranks for ties)."""
    def ranks(x):
        x = np.asarray(x, dtype=float)
        order = x.argsort(kind="mergesort")
        r = np.empty(len(x))
        r[order] = np.arange(len(x), dtype=float)
        for v in np.unique(x):  # ties share their mean rank
            tie = x == v
            r[tie] = r[tie].mean()
        return r

    if len(a) < 3:
        return float("nan")
    ra, rb = ranks(a), ranks(b)
    return float(np.corrcoef(ra, rb)[0, 1])


def median_rel_error(pred: list[float], meas: list[float]) -> float:
    return float(statistics.median(abs(p / m - 1.0) for p, m in zip(pred, meas) if m > 0))


def _score(pred: list[float], meas: list[float]) -> dict[str, Any]:
    return {"n": len(meas), "spearman": spearman(pred, meas), "median_rel_error": median_rel_error(pred, meas)}


def _line(xs: list[float], ts: list[float]) -> tuple[float, float]:
    """(intercept, slope) of t = c + a*x minimising the squared *relative* error, so small kernels
    count as much as large ones."""
    x, t = np.asarray(xs, dtype=float), np.asarray(ts, dtype=float)
    (c, a), *_ = np.linalg.lstsq(np.stack([1.0 / t, x / t], axis=1), np.ones_like(t), rcond=None)
    return float(max(c, 0.0)), float(max(a, 1e-30))


def fit(data: dict[str, Any]) -> dict[str, Any]:
    """Fitted figures and the before/after scores; see the module docstring."""
    cal = data["calibrate"]
    casts = [(int(n), cell) for n, per in cal.get("casts", {}).items() for cell in per.values() if "gpu_s" in cell]
    mem_x = [n * 6.0 for n, _ in casts]  # a cast reads 4 bytes and writes 2, or the reverse
    mem_t = [c["gpu_s"] for _, c in casts]
    for op in cal["ops"].values():
        if not op["tensor_core"]:
            for dtype, cell in op["measured"].items():
                if "gpu_s" in cell and dtype in op["bytes"]:
                    mem_x.append(op["bytes"][dtype])
                    mem_t.append(cell["gpu_s"])
    mem_floor, inv_bw = _line(mem_x, mem_t)
    fitted: dict[str, float] = {"mem_bandwidth_gbs": 1e-9 / inv_bw, "kernel_floor_us": mem_floor * 1e6}
    for dtype, label in (("float16", "fp16"), ("float32", "tf32")):
        pts = [(op["flops"], op["measured"][dtype]["gpu_s"]) for op in cal["ops"].values()
               if op["tensor_core"] and op["flops"] > 0 and "gpu_s" in op["measured"].get(dtype, {})]
        if len(pts) >= 3:
            floor, inv_rate = _line([p[0] for p in pts], [p[1] for p in pts])
            fitted[f"{label}_tflops"] = 1e-12 / inv_rate
            fitted[f"{label}_gemm_floor_us"] = floor * 1e6
    per_kernel = [(row["wall_ms"] * 1e3 - row["gpu_us"]) / row["kernels"] for row in data.get("ort_models", [])
                  if row.get("gpu_us") and row.get("wall_ms") and row.get("kernels")]
    fitted["launch_overhead_us"] = statistics.median(per_kernel) if per_kernel else float("nan")
    return {"fitted": fitted, "ops": _op_scores(cal["ops"], fitted), "models": _model_scores(data)}


def _fitted_kernel_us(op: dict[str, Any], dtype: str, f: dict[str, float]) -> float:
    memory = f["kernel_floor_us"] + op["bytes"][dtype] / (f["mem_bandwidth_gbs"] * 1e9) * 1e6
    if not op["tensor_core"]:
        return memory  # elementwise work is memory-bound at these sizes
    label = "fp16" if dtype == "float16" else "tf32"
    return max(f[f"{label}_gemm_floor_us"] + op["flops"] / (f[f"{label}_tflops"] * 1e12) * 1e6, memory)


def _op_scores(ops: dict[str, dict[str, Any]], f: dict[str, float]) -> dict[str, Any]:
    """Per op and dtype: the datasheet roofline (its kernel part: the prediction less the launch it
    adds) and the fit, against the GPU time CUPTI measured."""
    meas, sheet, fitted, kinds = [], [], [], []
    for op in ops.values():
        for dtype, cell in op["measured"].items():
            if "gpu_s" not in cell or dtype not in op["predicted_us"]:
                continue
            meas.append(cell["gpu_s"] * 1e6)
            sheet.append(max(op["predicted_us"][dtype] - 4.0, 1e-3))
            fitted.append(_fitted_kernel_us(op, dtype, f))
            kinds.append("tensor_core" if op["tensor_core"] else "other")
    out = {"all": {"datasheet": _score(sheet, meas), "fitted": _score(fitted, meas)}}
    for kind in ("tensor_core", "other"):
        idx = [i for i, k in enumerate(kinds) if k == kind]
        if len(idx) >= 3:
            pick = lambda xs: [xs[i] for i in idx]  # noqa: E731
            out[kind] = {"datasheet": _score(pick(sheet), pick(meas)), "fitted": _score(pick(fitted), pick(meas))}
    return out


def _model_scores(data: dict[str, Any]) -> dict[str, Any]:
    """Whole models: the plan's predicted FP32 and mixed time (datasheet, ort-cuda profile) against
    GPU-busy time and wall latency."""
    pred, busy, wall = [], [], []
    for row in data.get("ort_models", []):
        if row.get("predicted_ms") and row.get("gpu_us"):
            pred.append(row["predicted_ms"])
            busy.append(row["gpu_us"] / 1e3)
            wall.append(row.get("wall_ms") or float("nan"))
    ok = [i for i, w in enumerate(wall) if w == w]
    return {"vs_gpu_busy": _score(pred, busy) if pred else {},
            "vs_wall": _score([pred[i] for i in ok], [wall[i] for i in ok]) if ok else {}}


def model_rows(profiled: list[dict[str, Any]], timed: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """One row per (model, batch, FP32 or our output): predicted time, kernels, GPU-busy time from
    the profiled run, wall latency from the interleaved run where it has the row (else none: the
    profiled run's walls include the profiler's cost)."""
    walls = {}
    for r in timed or []:
        for variant, cell in [("fp32", r.get("fp32", {})), ("amp-compiler", r["tools"].get("amp-compiler", {}))]:
            if "interleaved_ms" in cell:
                walls[(r["model"], r["batch"], variant)] = cell["interleaved_ms"]["median_ms"]
    rows = []
    for r in profiled:
        summary = r["convert"].get("amp-compiler", {}).get("summary", {})
        for variant, key in (("fp32", "predicted_time_fp32_s"), ("amp-compiler", "predicted_time_mixed_s")):
            cell = r.get("fp32", {}) if variant == "fp32" else r["tools"].get(variant, {})
            gk = cell.get("gpu_kernels", {})
            if "gpu_us_per_run" not in gk or key not in summary:
                continue
            rows.append({"model": r["model"], "batch": r["batch"], "variant": variant,
                         "predicted_ms": summary[key] * 1e3, "gpu_us": gk["gpu_us_per_run"],
                         "kernels": gk["kernels_per_run"], "wall_ms": walls.get((r["model"], r["batch"], variant))})
    return rows


def device_file(fitted: dict[str, float], base: str = "h100") -> dict[str, Any]:
    """A ``--target-file`` device: the fitted rates where measured, the datasheet elsewhere."""
    from cost_model import get_device

    spec = get_device(base)
    return {"name": f"{base}-ort-cuda-fitted", "fp32_tflops": spec.fp32_tflops,
            "tf32_tflops": round(fitted["tf32_tflops"], 1), "fp16_tflops": round(fitted["fp16_tflops"], 1),
            "bf16_tflops": round(fitted["fp16_tflops"], 1), "fp16_simt_tflops": spec.fp16_simt_tflops,
            "mem_bandwidth_gbs": round(fitted["mem_bandwidth_gbs"], 1),
            "launch_overhead_us": round(fitted["launch_overhead_us"], 2),
            "source": "fitted by benchmarks.gpu_fit to ONNX Runtime CUDA EP measurements on an H100 SXM "
                      "(benchmarks/results/gpu-h100-2026-11-24.json); bf16 assumed equal to fp16, FP32 "
                      "SIMT and FP16 SIMT rates from the datasheet"}


def render(result: dict[str, Any]) -> str:
    f = result["fitted"]
    lines = ["Fitted figures (datasheet in brackets): "
             f"memory bandwidth {f['mem_bandwidth_gbs']:.0f} GB/s [3350] after a {f['kernel_floor_us']:.2f} µs floor; "
             f"FP16 tensor cores {f['fp16_tflops']:.0f} TFLOP/s [989] after {f['fp16_gemm_floor_us']:.1f} µs; "
             f"TF32 {f['tf32_tflops']:.0f} TFLOP/s [495] after {f['tf32_gemm_floor_us']:.1f} µs; "
             f"per-kernel cost beyond GPU time {f['launch_overhead_us']:.2f} µs [4].",
             "", "| compared | n | Spearman (datasheet → fitted) | median error (datasheet → fitted) |",
             "| --- | ---: | ---: | ---: |"]
    for kind, label in (("all", "per op, all"), ("tensor_core", "per op, GEMM/conv"), ("other", "per op, other")):
        s = result["ops"].get(kind)
        if s:
            d, t = s["datasheet"], s["fitted"]
            lines.append(f"| {label} | {d['n']} | {d['spearman']:.3f} → {t['spearman']:.3f} | "
                         f"{d['median_rel_error']:.0%} → {t['median_rel_error']:.0%} |")
    for key, label in (("vs_gpu_busy", "per model, predicted vs GPU-busy"), ("vs_wall", "per model, predicted vs wall")):
        s = result["models"].get(key)
        if s:
            lines.append(f"| {label} (datasheet) | {s['n']} | {s['spearman']:.3f} | {s['median_rel_error']:.0%} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_fit", description=__doc__.split("\n\n")[0])
    p.add_argument("results", type=Path, help="a benchmarks.gpu_suite results file with a calibrate part")
    p.add_argument("--write-device", type=Path, help="write the fitted figures as a --target-file device JSON")
    args = p.parse_args(argv)
    try:
        data = json.loads(args.results.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        print(f"gpu_fit: {args.results}: cannot read the results: {exc}", file=sys.stderr)
        return 2
    if "calibrate" not in data or "ops" not in data["calibrate"]:
        print(f"gpu_fit: {args.results}: no calibration data (run the suite's calibrate part on a GPU)",
              file=sys.stderr)
        return 2
    result = fit(data)
    print(render(result))
    if args.write_device:
        args.write_device.write_text(json.dumps(device_file(result["fitted"]), indent=1) + "\n")
        print(f"device written: {args.write_device}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
