"""GPU kernel times of any code in this process, from CUPTI through ``torch.profiler``.

ONNX Runtime's own profiler times a CUDA node on the host (the launch, not the kernel: CUDA
launches are asynchronous), so the GPU suite reads kernel durations from CUPTI instead, which
records every kernel the process runs, whichever library launched it.
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path
from typing import Any, Callable

# Kernel-name fragments -> the class the census reports them under (first match wins).
_CLASSES = (
    ("cast", re.compile(r"(?<!broad)cast", re.I)),  # not BroadcastBias/BinaryElementWiseBroadcast
    ("gemm", re.compile(r"gemm|cutlass|sm\d+_xmma|matmul|cublas|ampere_|hopper_|sm90_|nvjet", re.I)),
    ("conv", re.compile(r"conv|implicit_gemm|winograd|fft", re.I)),
    ("attention", re.compile(r"attention|fmha|flash|mha", re.I)),
    ("norm", re.compile(r"layernorm|layer_norm|skiplayernorm|rmsnorm|groupnorm|batchnorm|instancenorm", re.I)),
    ("softmax", re.compile(r"softmax", re.I)),
    ("reduce", re.compile(r"reduce|reduction", re.I)),
    ("copy", re.compile(r"transpose|copy|concat|slice|gather|pad|expand|tile|split", re.I)),
)


def kernel_class(name: str) -> str:
    for label, pattern in _CLASSES:
        if pattern.search(name):
            return label
    return "elementwise/other"


def cuda_kernels(fn: Callable[[], Any], runs: int) -> dict[str, Any]:
    """Run ``fn`` ``runs`` times under CUPTI; per run: kernel count, GPU-busy microseconds, and
    the same split by kernel class. ``{"error": ...}`` where CUPTI is not available."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(runs):
                fn()
            torch.cuda.synchronize()
        with tempfile.TemporaryDirectory(prefix="amp-cupti-") as tmp:
            path = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(path))
            trace = json.loads(path.read_text())
    except Exception as exc:  # noqa: BLE001 - kernel times are extra evidence, never the result
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"}
    kernels = [e for e in trace.get("traceEvents", []) if e.get("cat") == "kernel"]
    if not kernels:
        return {"error": "CUPTI recorded no kernels"}
    by_class: dict[str, dict[str, float]] = {}
    names: dict[str, dict[str, float]] = {}
    for event in kernels:
        dur = float(event.get("dur", 0.0))
        for table, key in ((by_class, kernel_class(event.get("name", ""))), (names, event.get("name", "?")[:160])):
            agg = table.setdefault(key, {"count": 0.0, "us": 0.0})
            agg["count"] += 1.0 / runs
            agg["us"] += dur / runs
    top = dict(sorted(names.items(), key=lambda kv: -kv[1]["us"])[:25])
    return {"kernels_per_run": len(kernels) / runs, "gpu_us_per_run": sum(float(e.get("dur", 0)) for e in kernels) / runs,
            "by_class": by_class, "top_kernels": top}
