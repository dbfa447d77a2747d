"""GPU suite: latency on the device, PyTorch AMP side by side, and a measured cost-model profile.

    python -m benchmarks.gpu_suite                       # everything, base zoo models
    python -m benchmarks.gpu_suite --parts ort calibrate --models bert resnet --budget-s 500
    python -m benchmarks.gpu_suite --render benchmarks/results/gpu-h100-2026-11-24.json

Runs only where a CUDA device is present; elsewhere it prints ``no CUDA device: skipped``
and exits 0. Three parts:

* ``ort``      -- ONNX Runtime CUDA EP latency, kernel census and error against FP32 of the FP32
  model, amp-compiler's output and each peer's (``benchmarks/gpu_ort.py``). Needs
  ``onnxruntime-gpu``.
* ``torch``    -- forward and training-step time of FP32 eager, ``torch.autocast`` (+ GradScaler
  for training), ``torch.compile`` + autocast, and ``amp_compiler.compile`` /
  ``amp_compiler.compile_training`` (plain and ``backend="inductor"``; ``benchmarks/gpu_torch.py``).
* ``calibrate`` -- per-op FP32 and FP16 GPU kernel times (CUPTI, ``benchmarks/cuda_trace.py``) of
  one single-op model per distinct op and shape in the zoo models, casts, and the per-node
  cost of a chain of tiny nodes; written as the cost model's measured profile (keys as
  ``cost_model.timer.OpTimer.profile_key``) and fitted by ``benchmarks.gpu_fit``.

Results go to ``benchmarks/results/gpu-<device>-<date>.json`` and the README's gpu section.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from . import common

PARTS = ("ort", "torch", "calibrate")
TORCH_MODELS = ("bert", "gpt2", "resnet", "vit")


def cuda_available() -> tuple[bool, str]:
    """(present, device name). Checks torch first, then ONNX Runtime's CUDA provider."""
    try:
        import torch

        if torch.cuda.is_available():
            return True, torch.cuda.get_device_name(0)
    except ImportError:
        pass
    try:
        import onnxruntime as ort

        if "CUDAExecutionProvider" in ort.get_available_providers():
            return True, "CUDA device (name unknown without torch)"
    except ImportError:
        pass
    return False, ""


def device_key(name: str) -> str:
    """The cost model's device id for a CUDA device name ("NVIDIA H100 80GB HBM3" -> "h100")."""
    from cost_model import DEVICES

    low = name.lower().replace("-", " ")
    for key in sorted(DEVICES, key=len, reverse=True):
        if key.lower() in low.replace(" ", "") or key.lower() in low.split():
            return key
    return "".join(ch for ch in low if ch.isalnum())[:32] or "cuda"


# --------------------------------------------------------------------------- calibration


def part_calibrate(models: list[str], device: str, log: Callable[[str], None], *, write_profile: bool = True,
                   size: str = "base", provider: str = "CUDAExecutionProvider", deadline: float | None = None,
                   profile_dir: Path | None = None) -> dict[str, Any]:
    """Time each distinct (op, shapes) of the zoo models as a one-node model in FP32 and FP16, plus
    casts of the sizes they produce and a chain of tiny ops (the per-kernel launch cost).

    Each entry keeps what the cost model predicted beside what was measured (GPU kernel time from
    CUPTI on CUDA, wall time per run everywhere), which ``benchmarks.gpu_fit`` fits the device's
    parameters to. ``provider``/``size`` exist for the tests, which run this on the CPU.
    """
    import onnx
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    from amp_compiler.onnx_io.files import load_model
    from amp_compiler.onnx_io.importer import import_model
    from amp_compiler.plan import make_context
    from cost_model import MeasuredProfile, default_profile_path
    from passes import ClassifyPass
    from passes.costs import OpTimer

    from . import zoo

    if provider not in ort.get_available_providers():
        return {"error": f"onnxruntime has no {provider} (install onnxruntime-gpu)"}
    profile = MeasuredProfile(device)
    failures: dict[str, str] = {}
    ops: dict[str, dict[str, Any]] = {}
    sizes: set[int] = set()
    ctx = make_context(target=device if _known_device(device) else "h100")
    for name in models:
        model = load_model(zoo.export_onnx(name, size))
        opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
        imp = import_model(model, source=name)
        graph = imp.graph
        graph.set_dim_sizes(8)
        ClassifyPass()(graph, ctx)
        timer = OpTimer(graph, ctx)
        for op in graph.ops.values():
            if deadline is not None and time.monotonic() > deadline:
                break
            if not op.has_unit_ports or op.scope or op.canonical in (None, "cast", "constant", "control_flow"):
                continue
            key = timer.profile_key(op)
            if key in ops or key in failures:
                continue
            node = imp.nodes[op.name]
            entry: dict[str, Any] = {"op": op.canonical, "model": name, "flops": timer.flops(op),
                                     "tensor_core": bool(op.tensor_core), "bytes": {}, "predicted_us": {},
                                     "measured": {}}
            for dtype, code, np_dtype in (("float32", onnx.TensorProto.FLOAT, np.float32),
                                          ("float16", onnx.TensorProto.FLOAT16, np.float16)):
                try:
                    single = _single_op_model(imp, op, node, code, np_dtype, opset, helper, numpy_helper)
                    measured = _kernel_seconds(single, op, graph, provider=provider)
                except Exception as exc:  # noqa: BLE001 - an op we cannot isolate keeps the roofline
                    failures[key] = common._one_line(exc)
                    break
                entry["bytes"][dtype] = timer.bytes(op, dtype)
                entry["predicted_us"][dtype] = 1e6 * timer.roofline.op_time(
                    flops=entry["flops"], bytes_moved=entry["bytes"][dtype], dtype=dtype,
                    tensor_core=op.tensor_core, aligned=timer.aligned(op, dtype) if op.tensor_core else True)
                entry["measured"][dtype] = measured
                profile.record(key, dtype, measured.get("gpu_s", measured["wall_s"]) + timer.roofline.launch_overhead)
            else:
                ops[key] = entry
                sizes.update(graph.numel(graph.tensors[o]) for o in op.outputs if o)
        log(f"  calibrate {name}: {len(ops)} op shapes measured, {len(failures)} not")
    result: dict[str, Any] = {"entries": len(ops), "not_measured": len(failures),
                              "failures": dict(list(failures.items())[:50]), "ops": ops}
    if deadline is None or time.monotonic() < deadline:
        result["casts"] = _calibrate_casts(sorted(s for s in sizes if s)[:: max(1, len(sizes) // 40)], provider)
        result["launch"] = _calibrate_launch(provider)
    if write_profile and len(profile):
        path = (Path(profile_dir) / f"profile-{device}.json" if profile_dir is not None
                else default_profile_path(device) if _known_device(device)
                else common.RESULTS_DIR / f"profile-{device}.json")
        profile.save(path)
        result["profile_path"] = path.name
    return result


def _calibrate_casts(sizes: list[int], provider: str) -> dict[str, Any]:
    """A Cast of ``n`` elements each way, timed as a one-node model."""
    from onnx import TensorProto, helper

    out: dict[str, Any] = {}
    for n in sizes:
        for label, src, dst in (("f32->f16", TensorProto.FLOAT, TensorProto.FLOAT16),
                                ("f16->f32", TensorProto.FLOAT16, TensorProto.FLOAT)):
            g = helper.make_graph([helper.make_node("Cast", ["x"], ["y"], to=dst)], "cast",
                                  [helper.make_tensor_value_info("x", src, [n])],
                                  [helper.make_tensor_value_info("y", dst, [n])])
            model = _small_model(g, 18)
            try:
                out.setdefault(str(n), {})[label] = _time_session(model.SerializeToString(), {"x": [n]}, provider)
            except Exception as exc:  # noqa: BLE001
                out.setdefault(str(n), {})[label] = {"error": common._one_line(exc)}
    return out


def _calibrate_launch(provider: str, length: int = 64) -> dict[str, Any]:
    """A chain of ``length`` tiny Relu nodes: wall time per node is the runtime's per-kernel cost."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Relu", [f"t{i}"], [f"t{i + 1}"]) for i in range(length)]
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("t0", TensorProto.FLOAT16, [64])],
                          [helper.make_tensor_value_info(f"t{length}", TensorProto.FLOAT16, [64])])
    model = _small_model(g, 18)
    res = _time_session(model.SerializeToString(), {"t0": [64]}, provider, optimize=False)
    res["nodes"] = length
    return res


def _time_session(model_bytes: bytes, shapes: dict[str, list[int]], provider: str, iters: int = 20,
                  optimize: bool = True) -> dict[str, Any]:
    """Wall seconds per run (device-resident I/O) and, on CUDA, GPU kernel seconds per run."""
    import onnxruntime as ort

    from .gpu_ort import BoundSession

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if not optimize:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    types = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
             "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(bool)": np.bool_}
    rng = np.random.default_rng(1)

    def feeds(sess) -> dict[str, np.ndarray]:  # floats N(0, 1), indices and flags zero
        out = {}
        for i in sess.get_inputs():
            dtype, shape = types.get(i.type, np.float32), shapes.get(i.name, [])
            out[i.name] = (rng.standard_normal(shape).astype(dtype) if np.issubdtype(dtype, np.floating)
                           else np.zeros(shape, dtype))
        return out

    bound = BoundSession(model_bytes, feeds, provider, opts)
    result: dict[str, Any] = {"wall_s": sum(bound.times(iters, warmup=5)) / iters}
    if bound.device == "cuda":
        from .cuda_trace import cuda_kernels

        k = cuda_kernels(bound.run, iters)
        if "error" in k:
            result["cupti_error"] = k["error"]
        else:
            result["gpu_s"] = k["gpu_us_per_run"] * 1e-6
            result["kernels"] = k["kernels_per_run"]
    return result


def _small_model(graph, opset: int):
    """A one-graph model at IR version 10: the newest onnx writes IR versions older runtimes refuse
    (ONNX Runtime 1.31 reads up to 13)."""
    from onnx import helper

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def _known_device(device: str) -> bool:
    from cost_model import DEVICES

    return device in DEVICES


def _single_op_model(imp, op, node, code, np_dtype, opset, helper, numpy_helper):
    """One node; float unit ports in the given dtype, constants with their real values (unit
    ones cast), other activations as graph inputs (random floats, zero indices)."""
    from amp_compiler.ir import UNIT
    from amp_compiler.onnx_io.dtypes import dtype_to_onnx

    graph = imp.graph
    inputs, inits = [], []
    for port, name in enumerate(op.inputs):
        if not name:
            continue
        t = graph.tensors[name]
        is_unit = bool(op.input_roles) and op.input_roles[port] == UNIT
        if name in imp.initializers:
            arr = numpy_helper.to_array(imp.initializers[name])
            with np.errstate(over="ignore"):  # a -3.4e38 mask constant becomes -inf in FP16: fine for timing
                inits.append(numpy_helper.from_array(arr.astype(np_dtype) if is_unit else arr, name))
        else:
            elem = code if is_unit else dtype_to_onnx(t.dtype)
            inputs.append(helper.make_tensor_value_info(name, elem, graph.concrete_shape(name) or []))
    outputs = []
    for port, name in enumerate(op.outputs):
        if name:
            is_unit = bool(op.output_roles) and op.output_roles[port] == UNIT
            t = graph.tensors[name]
            outputs.append(helper.make_tensor_value_info(name, code if is_unit else dtype_to_onnx(t.dtype), None))
    g = helper.make_graph([node], "single_op", inputs, outputs, inits)
    return _small_model(g, opset)


def _kernel_seconds(model, op, graph, provider: str = "CUDAExecutionProvider") -> dict[str, Any]:
    """One-node model timed by ``_time_session``, its inputs at the graph's concrete shapes."""
    shapes = {name: list(graph.concrete_shape(name) or []) for name in op.inputs if name}
    return _time_session(model.SerializeToString(), shapes, provider)


# --------------------------------------------------------------------------- command


def render(data: dict[str, Any]) -> str:
    gpu = data.get("gpu", {})
    lines = [f"Generated by `{data['command']}` on {data['date']} on **{data['device']}** "
             f"(driver/memory: {gpu.get('nvidia_smi', '?')}; ONNX Runtime {gpu.get('onnxruntime', '?')}, "
             f"CUDA {gpu.get('torch_cuda', '?')}, cuDNN {gpu.get('cudnn', '?')}; {common.provenance(data)})."]
    if data.get("note"):
        lines += ["", data["note"]]
    for run in data.get("runs", []):
        lines.append(f"- {run['part']}: `{run['command']}` at {run['commit']}")
    if data.get("ort"):
        lines += ["", "ONNX Runtime CUDA EP latency, ms (IOBinding, inputs and outputs on the GPU; "
                      "interleaved rounds where run, else median of 50 runs):", "", _latency_table(data["ort"])]
    if data.get("ort_profiled"):
        lines += ["", "GPU-busy time per run, µs, and kernels per run (CUPTI; the same graphs as ONNX Runtime "
                      "ran them after its fusions):", "", _busy_table(data["ort_profiled"])]
    if data.get("fit"):
        from .gpu_fit import render as render_fit

        lines += ["", render_fit(data["fit"])]
    if data.get("torch"):
        for part, title in (("forward", "PyTorch forward"), ("training_step", "PyTorch training step (AdamW)")):
            variants = list(dict.fromkeys(v for r in data["torch"] for v in r.get(part, {})))
            if variants:
                rows = [[r["model"], *[_ms(r.get(part, {}).get(v, {})) for v in variants]] for r in data["torch"]]
                lines += ["", f"{title} (median ms, CUDA events):", "", common.md_table(["model", *variants], rows)]
    if data.get("torch_launch"):
        t = data["torch_launch"]
        lines += ["", f"PyTorch eager, a chain of {t['nodes']} tiny ops: {t['wall_us_per_op']:.1f} µs wall and "
                      f"{t['gpu_us_per_op']:.2f} µs of GPU time per op."]
    if data.get("calibrate"):
        c = data["calibrate"]
        lines += ["", f"Calibration: {c.get('entries', 0)} op shapes measured in FP32 and FP16, "
                      f"{c.get('not_measured', 0)} not."]
    return "\n".join(lines)


def _latency_table(rows: list[dict[str, Any]]) -> str:
    headers = ["model", "batch", "FP32", *[common.TOOL_LABELS[t] for t in common.ALL_TOOLS], "ours / best peer"]
    out = []
    for r in rows:
        def ms(cell):
            return (cell.get("interleaved_ms") or {}).get("median_ms") or cell.get("median_ms")

        cells = [r["model"], r.get("batch", "?"), _ms(r.get("fp32", {}))]
        cells += [_ms(r["tools"].get(t, {})) for t in common.ALL_TOOLS]
        ours = ms(r["tools"].get("amp-compiler", {}))
        peers = [m for m in (ms(r["tools"].get(t, {})) for t in common.PEERS) if m]
        cells.append(f"{ours / min(peers):.2f}" if ours and peers else "-")
        out.append(cells)
    return common.md_table(headers, out)


def _busy_table(rows: list[dict[str, Any]]) -> str:
    variants = ("fp32", *common.ALL_TOOLS)
    headers = ["model", "batch", *[("FP32" if v == "fp32" else common.TOOL_LABELS[v]) for v in variants]]
    out = []
    for r in rows:
        cells = [r["model"], r.get("batch", "?")]
        for v in variants:
            gk = (r.get("fp32", {}) if v == "fp32" else r["tools"].get(v, {})).get("gpu_kernels", {})
            cells.append(f"{gk['gpu_us_per_run']:.0f} ({gk['kernels_per_run']:.0f})" if "gpu_us_per_run" in gk else "-")
        out.append(cells)
    return common.md_table(headers, out)


def _ms(cell: dict[str, Any]) -> str:
    if not cell:
        return "-"  # a tool this run did not include
    if "interleaved_ms" in cell:
        return f"{cell['interleaved_ms']['median_ms']:.2f}"
    if "median_ms" in cell:
        return f"{cell['median_ms']:.2f}" + (" †" if cell.get("after_profiling") else "")
    return ("skipped: " + cell["skipped"]) if "skipped" in cell else f"failed: {cell.get('error', '?')}"[:60]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from . import zoo
    from .gpu_ort import part_ort
    from .gpu_torch import part_torch

    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_suite", description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS)
    p.add_argument("--models", nargs="+", default=list(zoo.MODEL_NAMES), choices=zoo.MODEL_NAMES)
    p.add_argument("--torch-models", nargs="+", default=list(TORCH_MODELS), choices=zoo.MODEL_NAMES,
                   help="models of the PyTorch part (default: %(default)s)")
    p.add_argument("--batches", nargs="+", type=int, default=[1, 16],
                   help="batch sizes of the ORT part: latency and throughput (default: %(default)s)")
    p.add_argument("--tools", nargs="+", default=list(common.ALL_TOOLS), choices=common.ALL_TOOLS,
                   help="converters of the ORT part (default: all; FP32 is always timed)")
    p.add_argument("--rounds", type=int, default=3,
                   help="interleaved timing rounds per model after the first pass (default: %(default)s)")
    p.add_argument("--no-census", action="store_true", help="skip the profiled runs (kernel census)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="stop starting new cells after this many seconds; later cells say 'skipped'")
    p.add_argument("--results-dir", type=Path, default=common.RESULTS_DIR,
                   help="where the results JSON goes, rewritten after every cell (default: benchmarks/results)")
    p.add_argument("--results-name", default=None,
                   help="results file name (default: gpu-<device>-<date>.json)")
    p.add_argument("--render", type=Path, metavar="RESULTS_JSON",
                   help="write the README's tables from a results file made earlier (on a GPU machine); runs nothing")
    p.add_argument("--provider", default="CUDAExecutionProvider", help=argparse.SUPPRESS)  # CPU dry runs
    p.add_argument("--size", default="base", choices=zoo.SIZES, help=argparse.SUPPRESS)
    p.add_argument("--no-readme", action="store_true")
    args = p.parse_args(argv)
    if args.render:
        data = json.loads(args.render.read_text())
        common.update_readme_section("gpu-results", render(data))
        print(render(data))
        return 0
    present, name = cuda_available()
    if args.provider != "CUDAExecutionProvider":
        present, name = True, f"dry run on {args.provider}"
    if not present:
        print("no CUDA device: skipped")
        return 0

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    device = device_key(name)
    deadline = time.monotonic() + (args.budget_s if args.budget_s else 1e9)
    data: dict[str, Any] = {**common.run_header("gpu_suite", argv), "device": name, "device_key": device,
                            "gpu": gpu_info()}
    out_name = args.results_name or f"gpu-{device}-{data['date']}.json"
    # with calibration to follow, the ORT part leaves it the last quarter of the budget
    ort_deadline = deadline - 0.25 * args.budget_s if args.budget_s and "calibrate" in args.parts else deadline

    def sink(_rows=None) -> None:
        common.write_json(out_name, data, args.results_dir)

    if "ort" in args.parts:
        data["ort"] = []
        data["ort"] = part_ort(args.models, args.batches, log, deadline=ort_deadline, provider=args.provider, size=args.size,
                               tools=tuple(args.tools), census=not args.no_census, rounds=args.rounds,
                               sink=lambda rows: (data.__setitem__("ort", rows), sink()))
        sink()
    if "calibrate" in args.parts:
        with zoo.at_batch(max(args.batches)):
            data["calibrate"] = part_calibrate(args.models, device, log, provider=args.provider, deadline=deadline,
                                               profile_dir=args.results_dir, size=args.size)
        sink()
    if "torch" in args.parts and args.provider == "CUDAExecutionProvider":
        from .gpu_torch import eager_launch_us

        data["torch_launch"] = eager_launch_us()
        data["torch"] = part_torch(args.torch_models, log, deadline=deadline,
                                   sink=lambda rows: (data.__setitem__("torch", rows), sink()))
    path = args.results_dir / out_name
    if args.no_readme:
        sink()
        print(render(data))
        log(f"results: {path}")
    else:
        common.publish(out_name, "gpu-results", data, render(data), True, log)
    return 0


def gpu_info() -> dict[str, Any]:
    """The device, driver and CUDA build the numbers came from."""
    import subprocess

    info: dict[str, Any] = {}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
        info["nvidia_smi"] = out
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        import torch

        info["torch_cuda"] = torch.version.cuda
        info["cudnn"] = torch.backends.cudnn.version()
    except Exception:  # noqa: BLE001
        pass
    try:
        import onnxruntime as ort

        info["onnxruntime"] = ort.__version__
        info["ort_providers"] = ort.get_available_providers()
    except Exception:  # noqa: BLE001
        pass
    return info


if __name__ == "__main__":
    sys.exit(main())
