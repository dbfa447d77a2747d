"""How conversion time and memory grow with graph size (synthetic transformer blocks).

    python -m benchmarks.scaling                    # 1k, 10k, 100k nodes
    python -m benchmarks.scaling --sizes 1000 10000 --repeat 3

Each size is converted in a fresh process (``convert_onnx`` on the in-memory model from
``benchmarks.synthetic.transformer_graph``: pre-LN transformer blocks with attention,
FFN, residual adds and FP32-only reductions, so the planner sees allow, infer, clear and
deny ops and inserts casts). Building the graph is not timed. Reported per size: total
conversion time (median of the runs), its split by stage (copy, import, each pass,
report, emit), microseconds per node, and the peak resident memory of the process.
The growth from 10k to 100k nodes is printed as ``t(100k) / (10 x t(10k))``: 1.0 is
linear. Each size is also written to a file and converted file to file, whole process,
by ``amp-compile`` and by ORT's float16 tool (``benchmarks.file_to_file``; ``--no-peers``
skips it). Results go to ``benchmarks/results/scaling.json`` and the README.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import common

DEFAULT_SIZES = (1000, 10000, 100000)
MAX_100K_S = 30.0
MAX_LINEARITY = 1.1  # issue 17: time grows at most 1.1x linear from 10k to 100k nodes


def _one(n_nodes: int, result_path: str) -> None:
    """Worker: build the graph, convert it, write timings (runs in its own process)."""
    from amp_compiler.onnx_api import convert_onnx

    from .synthetic import transformer_graph

    model = transformer_graph(n_nodes)
    nodes = len(model.graph.node)
    marks: list[tuple[str, float]] = []
    start = time.perf_counter()
    converted, report = convert_onnx(model, progress=lambda stage: marks.append((stage, time.perf_counter())))
    end = time.perf_counter()
    stages: dict[str, float] = {}
    names = ["copy"] + [m[0] for m in marks]
    times = [start] + [m[1] for m in marks] + [end]
    for name, t0, t1 in zip(names, times, times[1:]):
        stages[name] = stages.get(name, 0.0) + (t1 - t0)
    # the stage named after the last pass also holds the report; "import" is the importer
    out = {"n_nodes": nodes, "convert_s": end - start, "stages": stages, "peak_rss_kb": _vm_hwm_kb(),
           "summary": {k: v for k, v in report.summary.items() if isinstance(v, (int, float))},
           "passes": report.passes, "output_nodes": len(converted.graph.node)}
    Path(result_path).write_text(json.dumps(out))


def _vm_hwm_kb() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def measure(n_nodes: int, timeout: float = 900.0) -> dict[str, Any]:
    """Convert one synthetic graph of about ``n_nodes`` nodes in a fresh process."""
    with tempfile.TemporaryDirectory(prefix="amp-scaling-") as tmp:
        result = Path(tmp) / "result.json"
        env = dict(os.environ, PYTHONPATH=str(common.ROOT))
        proc = subprocess.run([sys.executable, "-m", "benchmarks.scaling", "--one", str(n_nodes), str(result)],
                              cwd=common.ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode or not result.is_file():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            return {"n_nodes": n_nodes, "ok": False, "error": tail[0][:300]}
        data = json.loads(result.read_text())
        data["ok"] = True
        return data


def file_to_file(n_nodes: int, repeat: int, log) -> dict[str, Any]:
    """The synthetic graph written to a file, then amp-compile and ORT's float16 tool on it, whole processes."""
    import onnx

    from . import file_to_file as f2f
    from .synthetic import transformer_graph

    with tempfile.TemporaryDirectory(prefix="amp-scaling-f2f-") as tmp:
        path = Path(tmp) / f"synthetic-{n_nodes}.onnx"
        onnx.save(transformer_graph(n_nodes), path)
        out = Path(tmp) / "out"
        out.mkdir()
        return f2f.median_runs(path, out, ("amp-compiler", "ort-float16"), repeat, log)


def run(sizes: list[int], repeat: int, log, peers: bool = True) -> list[dict[str, Any]]:
    rows = []
    runs: dict[int, list[dict]] = {n: [] for n in sizes}
    for r in range(repeat):
        for n in sizes:
            res = measure(n)
            runs[n].append(res)
            log(f"  {n:>7} nodes run {r + 1}/{repeat}: " + (f"{res['convert_s']:.2f} s" if res["ok"]
                                                           else f"FAILED: {res['error']}"))
    for n in sizes:
        ok = [x for x in runs[n] if x.get("ok")]
        if not ok:
            rows.append({"requested": n, "ok": False, "error": runs[n][0].get("error")})
            continue
        best = sorted(ok, key=lambda x: x["convert_s"])[len(ok) // 2]  # the median run, with its stages
        rows.append({"requested": n, "ok": True, "n_nodes": best["n_nodes"],
                     "convert_s": statistics.median(x["convert_s"] for x in ok),
                     "all_convert_s": [x["convert_s"] for x in ok],
                     "peak_rss_kb": statistics.median(x["peak_rss_kb"] for x in ok),
                     "stages": best["stages"], "passes": best["passes"], "summary": best["summary"],
                     "output_nodes": best["output_nodes"]})
        if peers:
            rows[-1]["file_to_file"] = file_to_file(n, repeat, log)
    return rows


STAGE_ORDER = ("copy", "import", "classify", "numerics", "propagate", "convert", "casts", "align", "emit")


def render(data: dict[str, Any]) -> str:
    rows, f2f_rows = [], []
    for row in data["rows"]:
        if not row["ok"]:
            rows.append([row["requested"], f"failed: {row['error']}", "", "", "", ""])
            continue
        st = row["stages"]
        split = ", ".join(f"{k} {st[k]:.2f}" for k in STAGE_ORDER if k in st)
        rows.append([f"{row['n_nodes']:,}", f"{row['convert_s']:.2f}", f"{1e6 * row['convert_s'] / row['n_nodes']:.0f}",
                     f"{row['peak_rss_kb'] / 1024:.0f}", f"{row['summary'].get('casts', 0):,}", split])
        f2f = row.get("file_to_file")
        if f2f:
            ours, ort = f2f.get("amp-compiler", {}), f2f.get("ort-float16", {})
            wall = [f"{c['wall_s']:.2f} s, {c['peak_rss_kb'] / 1024:.0f} MB" if c.get("ok") else "failed"
                    for c in (ours, ort)]
            ratio = f"{ours['wall_s'] / ort['wall_s']:.2f}×" if ours.get("ok") and ort.get("ok") else "—"
            stages = ", ".join(f"{k} {v:.2f}" for k, v in ours.get("stages", {}).items())
            f2f_rows.append([f"{row['n_nodes']:,}", wall[0], wall[1], ratio, stages])
    m = data["machine"]
    lines = [f"Generated by `{data['command']}` on {data['date']} ({common.provenance(data)}); "
             f"{m['cpu']}, {m['cores']} cores, shared; medians of {data['repeat']} runs, each size in a fresh process.",
             "",
             common.md_table(["nodes", "convert s", "µs / node", "peak RSS MB", "casts", "split (s; 'align' includes the report)"],
                             rows, align="rrrrrl")]
    if f2f_rows:
        lines += ["", "File to file, whole processes (`amp-compile in.onnx -o out.onnx` against ORT's float16 tool "
                      "in its own process, `benchmarks.file_to_file`), same run:", "",
                  common.md_table(["nodes", "amp-compile", "ORT float16", "amp / ORT", "amp-compile stages (s)"],
                                  f2f_rows, align="rrrrl")]
    g = data.get("growth")
    if g:
        lines += ["", f"Growth 10k → 100k nodes: time × {g['time_ratio']:.1f} for nodes × {g['node_ratio']:.1f}, "
                      f"i.e. **{g['linearity']:.2f}** of linear (1.00 = linear); memory × {g['memory_ratio']:.1f}. "
                      f"100k nodes in {g['t_100k_s']:.1f} s (target < {MAX_100K_S:.0f} s: "
                      f"{'met' if g['t_100k_s'] < MAX_100K_S else 'NOT met'})."]
        if "f2f_linearity" in g:
            lines += ["", "Issue 17, done-when 2, file to file: growth 10k → 100k "
                          f"{_verdict(g['f2f_linearity'], MAX_LINEARITY)} of linear"
                      + (f"; at 100k, amp-compile / ORT's float16 tool {_verdict(g['f2f_100k_vs_ort'], 1.0)}"
                         if "f2f_100k_vs_ort" in g else "") + "."]
    return "\n".join(lines)


def growth(rows: list[dict[str, Any]]) -> dict[str, float] | None:
    """10k -> 100k: time, nodes and memory ratios in memory, and where both sizes ran file to file,
    the whole-process growth and the 100k ratio to ORT's float16 tool (issue 17, done-when 2)."""
    by = {r["requested"]: r for r in rows if r.get("ok")}
    if 10000 not in by or 100000 not in by:
        return None
    a, b = by[10000], by[100000]
    time_ratio = b["convert_s"] / a["convert_s"]
    node_ratio = b["n_nodes"] / a["n_nodes"]
    out = {"time_ratio": time_ratio, "node_ratio": node_ratio, "linearity": time_ratio / node_ratio,
           "memory_ratio": b["peak_rss_kb"] / a["peak_rss_kb"], "t_100k_s": b["convert_s"]}
    ours = [r.get("file_to_file", {}).get("amp-compiler", {}) for r in (a, b)]
    ort = b.get("file_to_file", {}).get("ort-float16", {})
    if all(c.get("ok") for c in ours):
        out["f2f_linearity"] = ours[1]["wall_s"] / ours[0]["wall_s"] / node_ratio
        if ort.get("ok"):
            out["f2f_100k_vs_ort"] = ours[1]["wall_s"] / ort["wall_s"]
    return out


def _verdict(value: float, target: float) -> str:
    return f"**{value:.2f}** (target ≤ {target:.2f}: {'met' if value <= target else 'NOT met'})"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--one"]:
        _one(int(argv[1]), argv[2])
        return 0
    p = argparse.ArgumentParser(prog="python -m benchmarks.scaling", description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", nargs="+", type=int, default=list(DEFAULT_SIZES))
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--no-readme", action="store_true")
    p.add_argument("--no-peers", action="store_true", help="skip the file-to-file runs against ORT's float16 tool")
    args = p.parse_args(argv)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    header = common.run_header("scaling", argv, ("onnx", "numpy", "scipy", "networkx"))  # the code that runs
    rows = run(args.sizes, max(1, args.repeat), log, peers=not args.no_peers)
    data = {**header,
            "repeat": max(1, args.repeat), "rows": rows, "growth": growth(rows)}
    common.publish("scaling.json", "scaling-table", data, render(data), not args.no_readme, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
