"""ONNX Runtime CUDA EP part of the GPU suite: latency, memory and what ran, per model and tool.

For each zoo model at each batch size: export (FP32), convert with amp-compiler (defaults) and
each peer in its own process, then time every file on the CUDA EP with IOBinding (inputs and
outputs on the device). The first runs of each session are profiled: ORT's trace names every
node it ran after its own fusions, with shapes (its times are host-side: CUDA launches are
asynchronous), and CUPTI (``benchmarks/cuda_trace.py``) gives the GPU time of every kernel;
together they are what the cost model's ``ort-cuda`` profile is checked and fitted against.
Profiling is switched off (``end_profiling``) before the timed runs.

Preparation (export and conversion, CPU work) runs for all entries first, in parallel
processes; timing runs afterwards, one session at a time, so the CPU-side launch path of
the timed session is not shared with conversion work.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Callable

import numpy as np

from . import common

PROFILED_RUNS = 5


def _prepare_entry(name: str, batch: int, work_dir: str, size: str = "base",
                   timeout: float = 600.0, tools: tuple[str, ...] = common.ALL_TOOLS) -> dict[str, Any]:
    """Export one zoo model at one batch and convert it with every tool (runs in a worker process)."""
    import torch

    from . import zoo

    torch.set_num_threads(2)
    entry: dict[str, Any] = {"model": name, "batch": batch, "files": {}, "convert": {}}
    start = time.perf_counter()
    try:
        with zoo.at_batch(batch):
            src = zoo.export_onnx(name, size)
    except Exception as exc:  # noqa: BLE001 - one model failing to export is one row
        entry["error"] = "export failed: " + common._one_line(exc)
        return entry
    entry["export_s"] = time.perf_counter() - start
    entry["files"]["fp32"] = str(src)
    out_dir = Path(work_dir) / f"{name}-b{batch}"
    out_dir.mkdir(parents=True, exist_ok=True)
    for tool in tools:
        python, unavailable = common.python_for(tool, log=lambda msg: None)
        if unavailable:
            entry["convert"][tool] = {"ok": False, "error": unavailable}
            continue
        out = out_dir / f"{tool}.onnx"
        res = common.run_tool(tool, src, out, python=python, timeout=timeout)
        res.pop("traceback", None)
        entry["convert"][tool] = res
        if res.get("ok"):
            entry["files"][tool] = str(out)
    return entry


def prepare(models: list[str], batches: list[int], work_dir: str | Path, log: Callable[[str], None],
            workers: int | None = None, size: str = "base", timeout: float = 600.0,
            tools: tuple[str, ...] = common.ALL_TOOLS) -> list[dict[str, Any]]:
    """Every (model, batch) exported and converted, in parallel processes."""
    import multiprocessing

    jobs = [(m, b) for b in batches for m in models]
    workers = workers or max(1, min(len(jobs), (os.cpu_count() or 2) - 1))
    ctx = multiprocessing.get_context("spawn")  # no CUDA or torch state shared with the parent
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futures = [pool.submit(_prepare_entry, m, b, str(work_dir), size, timeout, tuple(tools)) for m, b in jobs]
        entries = []
        for fut in futures:
            entry = fut.result()
            log(f"  prepared {entry['model']} b{entry['batch']}: "
                + ", ".join(f"{t} {'ok' if r.get('ok') else r.get('error', '?')[:60]}"
                            for t, r in entry["convert"].items()))
            entries.append(entry)
    return entries


# --------------------------------------------------------------------------- timing


def _free_gpu_bytes() -> int | None:
    try:
        import torch

        torch.cuda.synchronize()
        return int(torch.cuda.mem_get_info()[0])
    except Exception:  # noqa: BLE001 - memory is a nicety; latency is the result
        return None


def kernel_census(trace: list[dict[str, Any]], runs: int) -> dict[str, Any]:
    """What one profiled run executed, from ORT's trace: per node its op type, shapes and host-side
    time (median over ``runs``; on CUDA the launch, not the kernel), and the totals per op type."""
    per_node: dict[str, dict[str, Any]] = {}
    for event in trace:
        if event.get("cat") != "Node" or not event.get("name", "").endswith("_kernel_time"):
            continue
        args = event.get("args", {})
        node = event["name"][: -len("_kernel_time")]
        rec = per_node.setdefault(node, {"op": args.get("op_name", "?"), "provider": args.get("provider", ""),
                                         "inputs": args.get("input_type_shape", []),
                                         "outputs": args.get("output_type_shape", []), "us": []})
        rec["us"].append(float(event.get("dur", 0)))
    nodes = []
    for node, rec in per_node.items():
        times = rec.pop("us")[-runs:]
        rec["us"] = statistics.median(times)
        rec["node"] = node
        nodes.append(rec)
    by_op: dict[str, dict[str, float]] = {}
    for rec in nodes:
        agg = by_op.setdefault(rec["op"], {"count": 0, "us": 0.0})
        agg["count"] += 1
        agg["us"] += rec["us"]
    cpu = sorted({r["op"] for r in nodes if r["provider"] and r["provider"] != "CUDAExecutionProvider"})
    return {"kernels": len(nodes), "kernel_us": sum(r["us"] for r in nodes), "by_op": by_op,
            "cpu_ops": cpu, "nodes": nodes}


class BoundSession:
    """An ONNX Runtime session with its inputs and outputs bound on the device (IOBinding):
    ``run()`` is one inference, synchronised. ``feeds`` may be a function of the session (inputs
    drawn from its declared types)."""

    def __init__(self, model: str | Path | bytes, feeds: dict[str, np.ndarray] | Callable[[Any], dict],
                 provider: str = "CUDAExecutionProvider", opts: Any = None) -> None:
        import onnxruntime as ort

        self.device = "cuda" if provider == "CUDAExecutionProvider" else "cpu"
        if opts is None:
            opts = ort.SessionOptions()
            opts.log_severity_level = 3
        self.sess = ort.InferenceSession(model if isinstance(model, bytes) else str(model), opts,
                                         providers=[provider])
        self.binding = self.sess.io_binding()
        values = feeds(self.sess) if callable(feeds) else feeds
        names = {i.name for i in self.sess.get_inputs()}
        for name, value in values.items():
            if name in names:
                self.binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value, self.device, 0))
        for out in self.sess.get_outputs():
            self.binding.bind_output(out.name, self.device)

    def run(self) -> None:
        self.sess.run_with_iobinding(self.binding)
        self.binding.synchronize_outputs()

    def times(self, iters: int, warmup: int = 0) -> list[float]:
        """Wall seconds of each of ``iters`` runs after ``warmup`` untimed ones."""
        for _ in range(warmup):
            self.run()
        out = []
        for _ in range(iters):
            start = time.perf_counter()
            self.run()
            out.append(time.perf_counter() - start)
        return out


def ort_cuda_latency(model_path: str | Path, feeds: dict[str, np.ndarray], *, warmup: int = 10, iters: int = 50,
                     census: bool = True, provider: str = "CUDAExecutionProvider") -> dict[str, Any]:
    """Median latency (IOBinding, device-resident inputs and outputs), GPU memory the session
    took, and (``census``) the kernels its first runs executed."""
    import onnxruntime as ort

    if provider not in ort.get_available_providers():
        return {"error": f"onnxruntime has no {provider} (install onnxruntime-gpu)"}
    device = "cuda" if provider == "CUDAExecutionProvider" else "cpu"
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    free_before = _free_gpu_bytes() if device == "cuda" else None
    with tempfile.TemporaryDirectory(prefix="amp-gpu-prof-") as tmp:
        if census:
            opts.enable_profiling = True
            opts.profile_file_prefix = str(Path(tmp) / "prof")
        try:
            bound = BoundSession(model_path, feeds, provider, opts)
        except Exception as exc:  # noqa: BLE001
            return {"error": "load failed: " + common._one_line(exc)}
        try:
            result: dict[str, Any] = {}
            for _ in range(max(warmup, PROFILED_RUNS)):
                bound.run()
            if census:
                trace = json.loads(Path(bound.sess.end_profiling()).read_text())
                result["census"] = kernel_census(trace, PROFILED_RUNS)
                if device == "cuda":
                    from .cuda_trace import cuda_kernels

                    result["gpu_kernels"] = cuda_kernels(bound.run, PROFILED_RUNS)
            times = bound.times(iters)
            free_after = _free_gpu_bytes() if device == "cuda" else None
            outputs = [np.asarray(o) for o in bound.binding.copy_outputs_to_cpu()]
        except Exception as exc:  # noqa: BLE001
            return {"error": "run failed: " + common._one_line(exc)}
        finally:
            bound = None  # the session frees its GPU arena before the next one
            gc.collect()
    result.update(median_ms=1e3 * statistics.median(times), min_ms=1e3 * min(times),
                  spread=(statistics.quantiles(times, n=10)[-1] - min(times)) / statistics.median(times))
    if free_before is not None and free_after is not None:
        result["gpu_mem_mb"] = round((free_before - free_after) / 2 ** 20, 1)
    result["_outputs"] = outputs  # popped by the caller: the error against FP32 on the same device
    return result


def part_ort(models: list[str], batches: list[int], log: Callable[[str], None], *, deadline: float,
             provider: str = "CUDAExecutionProvider", work_dir: str | Path | None = None,
             sink: Callable[[list[dict[str, Any]]], None] | None = None, size: str = "base",
             tools: tuple[str, ...] = common.ALL_TOOLS, census: bool = True, rounds: int = 0) -> list[dict[str, Any]]:
    """Rows of {model, batch, convert, fp32, tools}; each cell a latency dict or an error.

    ``rounds`` > 0 times all of a row's files again, interleaved (one batch of runs of each file
    per round): with the files side by side, drift in the host's speed cannot favour one of them.

    ``deadline`` (a ``time.monotonic()`` value) leaves later cells as ``skipped`` rather than
    letting the run be cut off; ``sink`` receives the rows after each cell (partial results
    survive a cut-off).
    """
    from . import zoo

    owned = work_dir is None
    tmp = tempfile.TemporaryDirectory(prefix="amp-gpu-ort-") if owned else None
    work = Path(tmp.name if tmp else work_dir)
    try:
        # a conversion may take at most a third of what is left, so timing always gets its turn
        entries = prepare(models, batches, work, log, size=size, tools=tools,
                          timeout=max(60.0, min(600.0, (deadline - time.monotonic()) / 3)))
        rows = []
        for entry in entries:
            row = {k: entry[k] for k in ("model", "batch")}
            row["convert"] = {t: {k: v for k, v in r.items() if k in ("ok", "error", "convert_s", "process_s",
                                                                    "summary", "peak_rss_kb")}
                              for t, r in entry["convert"].items()}
            row["tools"] = {}
            rows.append(row)
            if "error" in entry:
                row["fp32"] = {"error": entry["error"]}
                continue
            feeds = zoo.random_feeds(entry["files"]["fp32"], seed=0)
            reference = None
            for variant in ("fp32", *tools):
                cell: dict[str, Any]
                if time.monotonic() > deadline:
                    cell = {"skipped": "time budget of the run spent"}
                elif variant not in entry["files"]:
                    cell = {"error": "conversion failed: " + str(entry["convert"][variant].get("error", "?"))}
                else:
                    cell = ort_cuda_latency(entry["files"][variant], feeds, provider=provider, census=census)
                outputs = cell.pop("_outputs", None)
                if variant == "fp32":
                    reference = outputs
                elif outputs is not None and reference is not None:
                    cell["max_rel_error_vs_fp32"] = common.max_rel_error(reference, outputs)
                if variant not in ("fp32", "amp-compiler") and "census" in cell:
                    cell["census"].pop("nodes")  # per-node records are kept for the fit's two graphs only
                if variant == "fp32":
                    row["fp32"] = cell
                else:
                    row["tools"][variant] = cell
                log(f"  ort {entry['model']:8s} b{entry['batch']:<3d} {variant:18s} "
                    + (f"{cell['median_ms']:.3f} ms" if "median_ms" in cell else str(cell)[:120]))
                if sink:
                    sink(rows)
            if rounds and time.monotonic() < deadline:
                walls = interleaved_latency(entry["files"], feeds, rounds, provider=provider)
                for variant, ms in walls.items():
                    cell = row["fp32"] if variant == "fp32" else row["tools"].get(variant)
                    if cell is not None and "median_ms" in cell:
                        cell["interleaved_ms"] = ms
                log(f"  ort {entry['model']:8s} b{entry['batch']:<3d} interleaved: "
                    + ", ".join(f"{v} {ms['median_ms']:.3f}" for v, ms in walls.items()))
                if sink:
                    sink(rows)
        return rows
    finally:
        if tmp:
            tmp.cleanup()


def interleaved_latency(files: dict[str, str], feeds: dict[str, np.ndarray], rounds: int, *, iters: int = 30,
                        provider: str = "CUDAExecutionProvider") -> dict[str, dict[str, Any]]:
    """All files loaded at once and timed in turn, ``rounds`` times: per file the median of its
    round medians (ms) and the round medians themselves."""
    runners = {}
    for variant, path in files.items():
        try:
            runners[variant] = BoundSession(path, feeds, provider)
        except Exception:  # noqa: BLE001 - its sequential cell already says why
            continue
    medians: dict[str, list[float]] = {v: [] for v in runners}
    for _ in range(rounds):
        for variant, bound in runners.items():
            medians[variant].append(1e3 * statistics.median(bound.times(iters, warmup=3)))
    runners.clear()
    gc.collect()
    return {v: {"median_ms": statistics.median(m), "round_medians_ms": m} for v, m in medians.items()}
