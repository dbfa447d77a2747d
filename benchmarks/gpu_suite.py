"""GPU suite: latency on the device, PyTorch AMP side by side, and a measured cost-model profile.

    python -m benchmarks.gpu_suite                       # everything, base zoo models
    python -m benchmarks.gpu_suite --parts ort calibrate --models bert resnet

Runs only where a CUDA device is present; elsewhere it prints ``no CUDA device: skipped``
and exits 0. Three parts:

* ``ort``      -- ONNX Runtime CUDA EP latency (IOBinding, inputs and outputs on the device,
  median of timed runs after warm-up) of the FP32 model, amp-compiler's output and each
  peer's output (ORT float16, OCC float16, ModelOpt AutoCast; converted as in
  ``benchmarks.peers``). Needs ``onnxruntime-gpu``.
* ``torch``    -- forward and training-step time of FP32 eager, ``torch.autocast`` (+ GradScaler
  for training), ``torch.compile`` + autocast, and ``amp_compiler.compile`` /
  ``amp_compiler.compile_training`` (plain and ``backend="inductor"``). Variants the
  installed amp-compiler does not offer are reported as skipped, with the reason.
* ``calibrate`` -- per-op FP32 and FP16 kernel times on this device (ORT CUDA EP profiling of
  one single-op model per distinct op and shape in the zoo models), written as the cost
  model's measured profile (``cost_model/profiles/<device>.json``, keys as
  ``passes.costs.OpTimer.profile_key``) and used by ``convert_onnx(profile=...)``.

Results go to ``benchmarks/results/gpu-<device>-<date>.json`` and the README's gpu section.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
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


# --------------------------------------------------------------------------- ORT CUDA latency


def ort_cuda_latency(model_path: str | Path, feeds: dict[str, np.ndarray], *, warmup: int = 10,
                     iters: int = 50) -> dict[str, Any]:
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return {"error": "onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu)"}
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    try:
        sess = ort.InferenceSession(str(model_path), opts, providers=["CUDAExecutionProvider"])
    except Exception as exc:  # noqa: BLE001
        return {"error": "load failed: " + common._one_line(exc)}
    binding = sess.io_binding()
    names = {i.name for i in sess.get_inputs()}
    for name, value in feeds.items():
        if name in names:
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value, "cuda", 0))
    for out in sess.get_outputs():
        binding.bind_output(out.name, "cuda")
    try:
        for _ in range(warmup):
            sess.run_with_iobinding(binding)
        times = []
        for _ in range(iters):
            start = time.perf_counter()
            sess.run_with_iobinding(binding)
            binding.synchronize_outputs()
            times.append(time.perf_counter() - start)
    except Exception as exc:  # noqa: BLE001
        return {"error": "run failed: " + common._one_line(exc)}
    return {"median_ms": 1e3 * statistics.median(times), "min_ms": 1e3 * min(times)}


def part_ort(models: list[str], log: Callable[[str], None]) -> list[dict[str, Any]]:
    from . import zoo

    rows = []
    for name in models:
        path = zoo.export_onnx(name, "base")
        feeds = zoo.random_feeds(path, seed=0)
        row: dict[str, Any] = {"model": name, "fp32": ort_cuda_latency(path, feeds), "tools": {}}
        with tempfile.TemporaryDirectory(prefix=f"amp-gpu-{name}-") as tmp:
            for tool in common.ALL_TOOLS:
                python, unavailable = common.python_for(tool, log=log)
                if unavailable:
                    row["tools"][tool] = {"error": unavailable}
                    continue
                out = Path(tmp) / f"{tool}.onnx"
                res = common.run_tool(tool, path, out, python=python)
                row["tools"][tool] = ort_cuda_latency(out, feeds) if res.get("ok") else {"error": res.get("error")}
                out.unlink(missing_ok=True)
                log(f"  ort {name:9s} {tool:18s} {row['tools'][tool]}")
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- PyTorch


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


def _try(fn: Callable[[], float]) -> dict[str, Any]:
    try:
        return {"median_ms": fn()}
    except Exception as exc:  # noqa: BLE001 - one variant failing is a cell
        return {"error": f"{type(exc).__name__}: {common._one_line(exc)}"}


def part_torch(models: list[str], log: Callable[[str], None]) -> list[dict[str, Any]]:
    import torch

    import amp_compiler

    from . import zoo

    compile_fn = getattr(amp_compiler, "compile", None)
    compile_training = getattr(amp_compiler, "compile_training", None)
    rows = []
    for name in models:
        model, args = zoo.build_torch_model(name, "base")
        model = model.cuda()
        args = tuple(a.cuda() for a in args)
        fwd: dict[str, Any] = {}
        with torch.no_grad():
            model.eval()
            fwd["fp32"] = _try(lambda: _cuda_time(lambda: model(*args)))

            def autocast_fwd(m=model):
                with torch.autocast("cuda", dtype=torch.float16):
                    return m(*args)

            fwd["torch.autocast"] = _try(lambda: _cuda_time(autocast_fwd))
            compiled = torch.compile(model)

            def compiled_autocast():
                with torch.autocast("cuda", dtype=torch.float16):
                    return compiled(*args)

            fwd["torch.compile+autocast"] = _try(lambda: _cuda_time(compiled_autocast))
            for label, backend in (("amp_compiler.compile", None), ("amp_compiler.compile+inductor", "inductor")):
                if compile_fn is None:
                    fwd[label] = {"skipped": "amp_compiler.compile is not available"}
                    continue
                fwd[label] = _try(lambda b=backend: _cuda_time(lambda m=compile_fn(model, args, backend=b): m(*args)))
        train = _training_rows(model, args, compile_training)
        rows.append({"model": name, "forward": fwd, "training_step": train})
        log(f"  torch {name}: forward {fwd}; training {train}")
        del model
        torch.cuda.empty_cache()
    return rows


def _training_rows(model, args, compile_training) -> dict[str, Any]:
    import torch

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

    rows["fp32"] = _try(lambda: _cuda_time(fp32_step))
    scaler = torch.amp.GradScaler("cuda")

    def amp_step(m=model):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = loss_fn(m(*args))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    rows["torch.autocast+GradScaler"] = _try(lambda: _cuda_time(amp_step))
    compiled = torch.compile(model)
    rows["torch.compile+autocast+GradScaler"] = _try(lambda: _cuda_time(lambda: amp_step(compiled)))
    for label, backend in (("amp_compiler.compile_training", None),
                           ("amp_compiler.compile_training+inductor", "inductor")):
        if compile_training is None:
            rows[label] = {"skipped": "amp_compiler.compile_training is not available yet"}
            continue

        def run(b=backend):
            step = compile_training(model, loss_fn, fresh(), args, backend=b, n_targets=0)
            return _cuda_time(lambda: step(*args))

        rows[label] = _try(run)
    return rows


# --------------------------------------------------------------------------- calibration


def part_calibrate(models: list[str], device: str, log: Callable[[str], None], *, write_profile: bool = True,
                   size: str = "base", provider: str = "CUDAExecutionProvider") -> dict[str, Any]:
    """Time each distinct (op, shapes) of the zoo models in FP32 and FP16 on ORT CUDA EP.

    ``provider``/``size`` exist for the tests, which exercise this on the CPU with small models.
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
            if not op.has_unit_ports or op.scope or op.canonical in (None, "cast", "constant", "control_flow"):
                continue
            key = timer.profile_key(op)
            if key in profile.entries or key in failures:
                continue
            node = imp.nodes[op.name]
            for dtype, code, np_dtype in (("float32", onnx.TensorProto.FLOAT, np.float32),
                                          ("float16", onnx.TensorProto.FLOAT16, np.float16)):
                try:
                    single = _single_op_model(imp, op, node, code, np_dtype, opset, helper, numpy_helper)
                    seconds = _kernel_seconds(single, op, graph, provider=provider)
                    profile.record(key, dtype, seconds)
                except Exception as exc:  # noqa: BLE001 - an op we cannot isolate keeps the roofline
                    failures[key] = common._one_line(exc)
                    break
        log(f"  calibrate {name}: {len(profile)} op shapes measured, {len(failures)} not")
    result: dict[str, Any] = {"entries": len(profile), "not_measured": len(failures),
                              "failures": dict(list(failures.items())[:50])}
    if write_profile and len(profile):
        path = default_profile_path(device) if _known_device(device) else common.RESULTS_DIR / f"profile-{device}.json"
        profile.save(path)
        result["profile_path"] = str(path)
    return result


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
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _kernel_seconds(model, op, graph, iters: int = 20, provider: str = "CUDAExecutionProvider") -> float:
    """Median kernel time of the node from ORT's profiler (falls back to wall time per run)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.enable_profiling = True
    with tempfile.TemporaryDirectory() as tmp:
        opts.profile_file_prefix = str(Path(tmp) / "prof")
        sess = ort.InferenceSession(model.SerializeToString(), opts, providers=[provider])
        feeds = {}
        types = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
                 "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(bool)": np.bool_}
        for i in sess.get_inputs():
            shape = graph.concrete_shape(i.name) or []
            dtype = types.get(i.type, np.float32)
            feeds[i.name] = np.random.default_rng(1).standard_normal(shape).astype(dtype) \
                if np.issubdtype(dtype, np.floating) else np.zeros(shape, dtype)
        walls = []
        for _ in range(5 + iters):
            start = time.perf_counter()
            sess.run(None, feeds)
            walls.append(time.perf_counter() - start)
        trace = json.loads(Path(sess.end_profiling()).read_text())
    kernels = [e["dur"] * 1e-6 for e in trace if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time")]
    if len(kernels) >= iters:
        return statistics.median(kernels[-iters:])
    return statistics.median(walls[5:])


# --------------------------------------------------------------------------- command


def render(data: dict[str, Any]) -> str:
    lines = [f"Generated by `{data['command']}` on {data['date']} on **{data['device']}** ({common.provenance(data)})."]
    if data.get("ort"):
        headers = ["model", "FP32 ms", *[common.TOOL_LABELS[t] + " ms" for t in common.ALL_TOOLS]]
        rows = []
        for r in data["ort"]:
            cells = [r["model"], _ms(r["fp32"])]
            cells += [_ms(r["tools"].get(t, {})) for t in common.ALL_TOOLS]
            rows.append(cells)
        lines += ["", "ONNX Runtime CUDA EP latency (median, IOBinding):", "", common.md_table(headers, rows)]
    if data.get("torch"):
        for part, title in (("forward", "PyTorch forward"), ("training_step", "PyTorch training step")):
            variants = list(data["torch"][0][part])
            rows = [[r["model"], *[_ms(r[part].get(v, {})) for v in variants]] for r in data["torch"]]
            lines += ["", f"{title} (median ms, CUDA events):", "",
                      common.md_table(["model", *variants], rows)]
    if data.get("calibrate"):
        c = data["calibrate"]
        lines += ["", f"Calibration: {c.get('entries', 0)} op shapes measured in FP32 and FP16, "
                      f"{c.get('not_measured', 0)} not; profile: `{c.get('profile_path', c.get('error'))}`."]
    return "\n".join(lines)


def _ms(cell: dict[str, Any]) -> str:
    if "median_ms" in cell:
        return f"{cell['median_ms']:.2f}"
    return ("skipped: " + cell["skipped"]) if "skipped" in cell else f"failed: {cell.get('error', '?')}"[:60]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from . import zoo

    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_suite", description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS)
    p.add_argument("--models", nargs="+", default=list(zoo.MODEL_NAMES), choices=zoo.MODEL_NAMES)
    p.add_argument("--no-readme", action="store_true")
    args = p.parse_args(argv)
    present, name = cuda_available()
    if not present:
        print("no CUDA device: skipped")
        return 0

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    device = device_key(name)
    data: dict[str, Any] = {**common.run_header("gpu_suite", argv), "device": name, "device_key": device}
    if "ort" in args.parts:
        data["ort"] = part_ort(args.models, log)
    if "torch" in args.parts:
        data["torch"] = part_torch([m for m in args.models if m in TORCH_MODELS], log)
    if "calibrate" in args.parts:
        data["calibrate"] = part_calibrate(args.models, device, log)
    common.publish(f"gpu-{device}-{data['date']}.json", "gpu-results", data, render(data), not args.no_readme, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
