"""PyTorch part of the GPU suite: forward and training-step time and peak memory of FP32 eager,
``torch.autocast`` (+ GradScaler), ``torch.compile`` + autocast, and ``amp_compiler.compile`` /
``compile_training`` (plain and ``backend="inductor"``), with what our cost model predicted."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

from . import common

# A compiled training step of a base model took minutes on the H100 (torch.compile and inductor
# compiling forward and backward): a cell is started only with this much of the budget left, as
# a cell is never interrupted (the 2026-11-24 run's training rows ran past the call's limit).
CELL_HEADROOM_S = 150.0


def _cuda_time(fn: Callable[[], Any], *, warmup: int = 5, iters: int = 20) -> float:
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _try(fn: Callable[[], float], deadline: float | None = None) -> dict[str, Any]:
    """One cell: median ms and the peak GPU memory allocated while it ran, or why it has none."""
    import torch

    if deadline is not None and time.monotonic() > deadline - CELL_HEADROOM_S:
        return {"skipped": "time budget of the run spent"}
    try:
        torch.cuda.reset_peak_memory_stats()
        ms = fn()
        return {"median_ms": ms, "peak_mem_mb": round(torch.cuda.max_memory_allocated() / 2 ** 20, 1)}
    except Exception as exc:  # noqa: BLE001 - one variant failing is a cell
        return {"error": f"{type(exc).__name__}: {common._one_line(exc)}"}


def part_torch(models: list[str], log: Callable[[str], None], *, deadline: float | None = None,
               sink: Callable[[list[dict[str, Any]]], None] | None = None) -> list[dict[str, Any]]:
    """Forward (no_grad) and training-step rows per model; ``deadline`` as in ``gpu_ort.part_ort``."""
    import torch

    import amp_compiler

    from . import zoo

    rows: list[dict[str, Any]] = []
    for name in models:
        model, args = zoo.build_torch_model(name, "base")
        model = model.cuda()
        args = tuple(a.cuda() for a in args)
        fwd: dict[str, Any] = {}
        row = {"model": name, "shapes": [list(a.shape) for a in args], "forward": fwd, "training_step": {}}
        rows.append(row)
        with torch.no_grad():
            model.eval()
            fwd["fp32"] = _try(lambda: _cuda_time(lambda: model(*args)), deadline)

            def autocast_fwd(m=model):
                with torch.autocast("cuda", dtype=torch.float16):
                    return m(*args)

            fwd["torch.autocast"] = _try(lambda: _cuda_time(autocast_fwd), deadline)
            compiled = torch.compile(model)
            fwd["torch.compile+autocast"] = _try(lambda: _cuda_time(lambda: autocast_fwd(compiled)), deadline)
            for label, backend in (("amp_compiler.compile", None), ("amp_compiler.compile+inductor", "inductor")):
                def ours(b=backend):
                    amp = amp_compiler.compile(model, args, backend=b)
                    row.setdefault("predicted", {})[label] = {
                        k: v for k, v in amp.report.summary.items() if k.startswith("predicted_time")
                        or k in ("fp16_gemm_flop_fraction", "runtime_profile", "casts")}
                    return _cuda_time(lambda: amp(*args))

                fwd[label] = _try(ours, deadline)
        if sink:
            sink(rows)
        row["training_step"] = _training_rows(model, args, deadline)
        log(f"  torch {name}: forward {fwd}; training {row['training_step']}")
        if sink:
            sink(rows)
        model = compiled = None
        torch.cuda.empty_cache()
    return rows


def _training_rows(model, args, deadline: float | None) -> dict[str, Any]:
    import torch

    import amp_compiler

    model.train()

    def loss_fn(out):
        return out.float().pow(2).mean()

    def fresh():
        return torch.optim.AdamW(model.parameters(), lr=1e-5)

    rows: dict[str, Any] = {}
    opt = fresh()

    def fp32_step():
        opt.zero_grad(set_to_none=True)
        loss_fn(model(*args)).backward()
        opt.step()

    rows["fp32"] = _try(lambda: _cuda_time(fp32_step), deadline)
    scaler = torch.amp.GradScaler("cuda")

    def amp_step(m=model):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = loss_fn(m(*args))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    rows["torch.autocast+GradScaler"] = _try(lambda: _cuda_time(amp_step), deadline)
    compiled = torch.compile(model)
    rows["torch.compile+autocast+GradScaler"] = _try(lambda: _cuda_time(lambda: amp_step(compiled)), deadline)
    for label, backend in (("amp_compiler.compile_training", None),
                           ("amp_compiler.compile_training+inductor", "inductor")):
        def run(b=backend):
            step = amp_compiler.compile_training(model, loss_fn, fresh(), args, backend=b, n_targets=0)
            return _cuda_time(lambda: step(*args))

        rows[label] = _try(run, deadline)
    return rows


def eager_launch_us(length: int = 64) -> dict[str, float]:
    """Wall and GPU time per op of a chain of tiny eager ops: PyTorch eager's per-kernel cost."""
    import torch

    from .cuda_trace import cuda_kernels

    x = torch.randn(64, device="cuda", dtype=torch.float16)

    def chain() -> None:
        y = x
        for _ in range(length):
            y = torch.relu(y)
        torch.cuda.synchronize()

    for _ in range(5):
        chain()
    start = time.perf_counter()
    for _ in range(20):
        chain()
    wall = (time.perf_counter() - start) / 20
    k = cuda_kernels(chain, 5)
    return {"nodes": length, "wall_us_per_op": 1e6 * wall / length,
            "gpu_us_per_op": k.get("gpu_us_per_run", float("nan")) / length}

