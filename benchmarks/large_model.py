"""A model over 2 GB through ``amp-compile``: external data in and out, peak memory against the weights.

Generates an MLP whose FP32 weights (``--gb`` GiB, default 2.2: over protobuf's 2 GB
limit) live in one external data file, converts it with the CLI in a child process,
and measures that process's peak resident memory two ways: ``psutil`` sampling in a
thread (every 10 ms) and the kernel's high-water mark (``ru_maxrss`` from ``wait4``).
The converter must never hold two copies of the weights -- it does not even hold one:
the model is loaded without its data, FP16 range checks read the weights in chunks,
and the FP16 copies are cast chunk by chunk while being written -- so the peak must
stay under 1.5x the weight bytes (it is far below). The last layer has one weight
beyond the FP16 range: it stays FP32 and is copied file to file (the second streaming
path). Then the output is checked (``onnx.checker`` full check on the file) and, with
``--verify``, both models run on ONNX Runtime and are compared.

Usage::

    python -m benchmarks.large_model --verify             # 2.2 GiB, 4096x4096 layers
    python -m benchmarks.large_model --gb 0.3 --no-readme # quick
    python -m benchmarks.large_model --workdir /data/tmp --keep

Prints one line per measurement, writes ``benchmarks/results/large_model.json`` and the
table in ``benchmarks/README.md`` (unless ``--no-readme``), and exits 1 if the peak is
1.5x the weights or more.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 1.5  # peak RSS / weight bytes


def generate(folder: Path, total_bytes: int, dim: int, seed: int = 0) -> tuple[Path, int, int]:
    """model.onnx + weights.bin: ``layers`` dim x dim MatMul+Relu layers; returns (path, layers, weight bytes)."""
    folder.mkdir(parents=True, exist_ok=True)
    layer_bytes = dim * dim * 4
    layers = max(2, math.ceil(total_bytes / layer_bytes))
    rng = np.random.default_rng(seed)
    inits, nodes, x = [], [], "x"
    with open(folder / "weights.bin", "wb") as f:
        for i in range(layers):
            w = rng.standard_normal((dim, dim), dtype=np.float32)
            w *= np.float32(np.sqrt(2.0 / dim))  # He scaling: activations keep their size through the ReLUs
            if i == layers - 1:
                w[-1, -1] = 1e5  # beyond FP16: this layer stays FP32 and is copied as it is
            offset = f.tell()
            f.write(w.tobytes())
            del w
            t = TensorProto(name=f"W{i}", data_type=TensorProto.FLOAT, dims=[dim, dim],
                            data_location=TensorProto.EXTERNAL)
            for key, value in (("location", "weights.bin"), ("offset", str(offset)), ("length", str(layer_bytes))):
                entry = t.external_data.add()
                entry.key, entry.value = key, value
            inits.append(t)
            nodes += [helper.make_node("MatMul", [x, f"W{i}"], [f"h{i}"], name=f"mm{i}"),
                      helper.make_node("Relu", [f"h{i}"], [f"r{i}"], name=f"relu{i}")]
            x = f"r{i}"
    graph = helper.make_graph(nodes, "large_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", dim])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["batch", dim])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    path = folder / "model.onnx"
    onnx.save(model, str(path))
    return path, layers, layers * layer_bytes


def convert(inp: Path, out: Path) -> dict:
    """Run amp-compile in a child process; peak RSS by sampling and by the kernel's high-water mark."""
    import psutil

    cmd = [sys.executable, "-m", "amp_compiler.cli", str(inp), "-o", str(out), "-q", "--dim", "batch=512"]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        try:
            p = psutil.Process(proc.pid)
            while not done.is_set():
                peak[0] = max(peak[0], p.memory_info().rss)
                time.sleep(0.01)
        except psutil.NoSuchProcess:
            pass

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout = proc.stdout.read()
    stderr = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    done.set()
    sampler.join()
    seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"returncode": proc.returncode, "seconds": seconds, "peak_rss_sampled": peak[0],
            "peak_rss_kernel": usage.ru_maxrss * 1024, "stderr": stderr.decode(errors="replace"),
            "stdout_lines": len(stdout.splitlines())}


def baseline_rss() -> int:
    """Peak RSS of a child that only imports what the CLI imports (the interpreter's fixed cost)."""
    code = "import amp_compiler.cli, amp_compiler.onnx_api, amp_compiler.onnx_io.importer, passes, cost_model"
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    _, _, usage = os.wait4(proc.pid, 0)
    return usage.ru_maxrss * 1024


def verify(inp: Path, out: Path, dim: int) -> float:
    import onnxruntime as ort

    feeds = {"x": np.random.default_rng(1).standard_normal((4, dim)).astype(np.float32)}
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    ref = ort.InferenceSession(str(inp), opts, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = ort.InferenceSession(str(out), opts, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    from benchmarks.common import max_rel_error

    return max_rel_error([ref], [got])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gb", type=float, default=2.2, help="GiB of FP32 weights to generate (default 2.2)")
    p.add_argument("--dim", type=int, default=4096, help="layer width: each weight is dim x dim (default 4096)")
    p.add_argument("--workdir", help="where to generate (default: a temporary folder)")
    p.add_argument("--keep", action="store_true", help="keep the generated and converted files")
    p.add_argument("--verify", action="store_true", help="also run both models on ONNX Runtime and compare")
    p.add_argument("--no-readme", action="store_true", help="do not rewrite benchmarks/README.md")
    args = p.parse_args(argv)

    work = Path(args.workdir or tempfile.mkdtemp(prefix="amp-large-"))
    try:
        t0 = time.perf_counter()
        inp, layers, weight_bytes = generate(work / "in", int(args.gb * 2 ** 30), args.dim)
        gen_s = time.perf_counter() - t0
        print(f"generated {layers} layers of {args.dim}x{args.dim}: {weight_bytes / 2 ** 30:.2f} GiB of FP32 weights "
              f"in {inp.parent / 'weights.bin'} ({gen_s:.1f} s)")
        out = work / "out" / "model.mp.onnx"
        out.parent.mkdir(parents=True, exist_ok=True)
        base = baseline_rss()
        run = convert(inp, out)
        if run["returncode"] != 0:
            print(f"amp-compile failed ({run['returncode']}):\n{run['stderr']}")
            return 1
        peak = max(run["peak_rss_sampled"], run["peak_rss_kernel"])
        ratio = peak / weight_bytes
        data = out.parent / f"{out.name}.data"
        figures = {
            "weights_bytes": weight_bytes, "layers": layers, "dim": args.dim,
            "convert_seconds": round(run["seconds"], 2),
            "peak_rss_bytes": peak, "peak_rss_sampled_bytes": run["peak_rss_sampled"],
            "peak_rss_kernel_bytes": run["peak_rss_kernel"], "baseline_rss_bytes": base,
            "peak_over_weights": round(ratio, 4), "limit": LIMIT,
            "output_onnx_bytes": out.stat().st_size, "output_data_bytes": data.stat().st_size,
        }
        print(f"converted in {run['seconds']:.1f} s: peak RSS {peak / 2 ** 20:.0f} MiB "
              f"(sampled {run['peak_rss_sampled'] / 2 ** 20:.0f} MiB, ru_maxrss {run['peak_rss_kernel'] / 2 ** 20:.0f} MiB; "
              f"an interpreter with the same imports: {base / 2 ** 20:.0f} MiB)")
        print(f"peak RSS / weight bytes = {peak / 2 ** 20:.0f} MiB / {weight_bytes / 2 ** 20:.0f} MiB = {ratio:.3f} "
              f"(limit {LIMIT})")
        print(f"output: {out.name} {out.stat().st_size / 1024:.1f} KiB + {data.name} "
              f"{data.stat().st_size / 2 ** 30:.2f} GiB")
        t1 = time.perf_counter()
        onnx.checker.check_model(str(out), full_check=True)
        kinds = {}
        for t in onnx.load(str(out), load_external_data=False).graph.initializer:
            kinds[TensorProto.DataType.Name(t.data_type)] = kinds.get(TensorProto.DataType.Name(t.data_type), 0) + 1
        figures["output_initializers"] = kinds
        print(f"onnx.checker full_check on the output: ok ({time.perf_counter() - t1:.1f} s); initializers: {kinds}")
        if args.verify:
            t2 = time.perf_counter()
            err = verify(inp, out, args.dim)
            figures["max_rel_error"] = err
            print(f"ONNX Runtime, batch 4: max |mixed - fp32| / max |fp32| = {err:.2e} ({time.perf_counter() - t2:.1f} s)")
        _record(figures, argv, args.no_readme)
        if ratio >= LIMIT:
            print(f"FAIL: peak RSS is {ratio:.2f}x the weights (limit {LIMIT}x)")
            return 1
        return 0
    finally:
        if not args.keep and not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


def _record(figures: dict, argv: list[str] | None, no_readme: bool) -> None:
    """Results JSON and the README table, with the command, date, machine and versions."""
    from benchmarks import common

    data = {**common.run_header("large_model", sys.argv[1:] if argv is None else argv,
                                ("onnx", "onnxruntime", "numpy")), **figures}
    gib, mib = 2 ** 30, 2 ** 20
    rows = [["weights (FP32, external data)", f"{figures['weights_bytes'] / gib:.2f} GiB "
             f"({figures['layers']} layers of {figures['dim']}x{figures['dim']})"],
            ["conversion (amp-compile, child process)", f"{figures['convert_seconds']:.1f} s"],
            ["peak RSS of the converter", f"{figures['peak_rss_bytes'] / mib:.0f} MiB "
             f"(an interpreter with the same imports: {figures['baseline_rss_bytes'] / mib:.0f} MiB)"],
            ["peak RSS / weight bytes", f"{figures['peak_over_weights']:.3f} (limit {figures['limit']})"],
            ["output", f"{figures['output_onnx_bytes'] / 1024:.0f} KiB .onnx + "
             f"{figures['output_data_bytes'] / gib:.2f} GiB .data; initializers {figures['output_initializers']}"]]
    if "max_rel_error" in figures:
        rows.append(["max rel. error vs FP32 (ONNX Runtime)", f"{figures['max_rel_error']:.1e}"])
    m = data["machine"]
    md = (f"{data['date']}, {common.provenance(data)}, {m['cpu']} ({m['cores']} cores, {m['ram_gb']} GB), "
          f"`{data['command']}`\n\n" + common.md_table(["", "measured"], rows, align="ll"))
    common.publish("large_model.json", "large-model-table", data, md, not no_readme)


if __name__ == "__main__":
    sys.exit(main())
