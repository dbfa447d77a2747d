"""amp-compiler beside the converters users would otherwise pick, on the real-model zoo.

    python -m benchmarks.peers                       # all 7 base models, all 4 tools, 3 runs each
    python -m benchmarks.peers --models bert --repeat 5
    python -m benchmarks.peers --size small --tools amp-compiler ort-float16 --no-readme
    python -m benchmarks.peers --file-to-file        # BERT-base as users run it: whole processes, file to file

For each zoo model (transformers configs with random weights, exported by the dynamo
exporter and cached by ``benchmarks.zoo``) every tool converts the same file with
``keep_io_types=True``, each run in a fresh process (``benchmarks/convert_worker.py``);
the runs of one model are interleaved (tool order rotated every round) so that noise
from other jobs on the machine falls on every tool alike. Per (model, tool) the table has:

* conversion wall time (median over the runs): from the file path in -- loading
  included -- to the converted ``ModelProto`` in memory, imports excluded;
* peak resident memory of the converting process (median), and its growth during the
  conversion (peak minus the resident size once the tool's modules were imported);
* whether ONNX Runtime (CPU) loads and runs the output;
* node count, float->float Cast count and the bytes those casts move, the FP16 share of
  GEMM/conv FLOPs, and the predicted time on the target (``amp_compiler.analysis``: our
  cost model applied to every tool's output, each op at the dtype it has in the file);
  the ratio in brackets is to amp-compiler's "everything FP16" ceiling for that model;
* max relative error against the FP32 model on ONNX Runtime CPU, same seeded inputs:
  max over outputs of max|out - fp32| / max|fp32|.

A tool that fails on a model gets the failure in its cells; ModelOpt runs in its own
virtual environment (``benchmarks.modelopt_env``), built on first use. The table goes to
stdout, to ``benchmarks/README.md`` (between the ``peers-table`` markers) and, with every
run's numbers, to ``benchmarks/results/peers-<size>.json``.
"""

from __future__ import annotations

import argparse
import math
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from . import common
from .common import ALL_TOOLS, PEERS, TOOL_LABELS, fmt_err, fmt_mb, fmt_s

#: the issue's acceptance numbers
MAX_TIME_RATIO_ORT = 0.5
MAX_TIME_RATIO_MODELOPT = 0.1
MAX_ERROR_VS_BEST_PEER = 2.0
MAX_PREDICTED_VS_CEILING = 1.10


def measure_output(out_path: Path, ref, feeds, *, target: str) -> dict[str, Any]:
    """Load/run the output on ORT, its error against FP32, and the cost-model ruler."""
    from amp_compiler.analysis import analyze_model

    cell: dict[str, Any] = {}
    outputs, why = common.ort_outputs(out_path, feeds)
    cell["loads"] = outputs is not None
    if outputs is None:
        cell["ort_error"] = why
    elif ref is not None:
        cell["max_rel_error"] = common.max_rel_error(ref, outputs)
    try:
        cell["analysis"] = analyze_model(out_path, target=target).to_dict()
    except Exception as exc:  # noqa: BLE001 - a file our importer refuses is a cell too
        cell["analysis_error"] = common._one_line(exc)
    return cell


def run_model(name: str, size: str, tools: tuple[str, ...], repeat: int, *, target: str, timeout: float,
              log: Callable[[str], None]) -> dict[str, Any]:
    from amp_compiler.analysis import analyze_model

    from . import zoo

    path = zoo.export_onnx(name, size)
    feeds = zoo.random_feeds(path, seed=0)
    ref, why = common.ort_outputs(path, feeds)
    entry: dict[str, Any] = {"model": name, "size": size, "file": path.name,
                             "file_mb": round(path.stat().st_size / 2 ** 20, 1),
                             "fp32": {"loads": ref is not None, "ort_error": why or None,
                                      "analysis": analyze_model(path, target=target).to_dict()},
                             "tools": {}}
    pythons = {}
    for tool in tools:
        pythons[tool] = common.python_for(tool, log=log)
    runs: dict[str, list[dict]] = {t: [] for t in tools}
    work = Path(tempfile.mkdtemp(prefix=f"amp-peers-{name}-"))
    try:
        outs = {t: work / f"{t}.onnx" for t in tools}
        for r in range(repeat):
            order = tools[r % len(tools):] + tools[:r % len(tools)]
            for tool in order:
                python, unavailable = pythons[tool]
                if unavailable:
                    if r == 0:
                        runs[tool].append({"ok": False, "error": unavailable, "tool": tool})
                    continue
                if r and not runs[tool][0].get("ok"):
                    continue  # a tool that failed once fails again: do not spend minutes on it
                res = common.run_tool(tool, path, outs[tool], python=python, timeout=timeout)
                runs[tool].append(res)
                status = f"{res['convert_s']:.2f} s" if res.get("ok") else f"FAILED: {res.get('error')}"
                log(f"  {name:9s} {TOOL_LABELS[tool]:18s} run {r + 1}/{repeat}: {status}")
        for tool in tools:
            entry["tools"][tool] = _cell(runs[tool], outs[tool], ref, feeds, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return entry


def _cell(runs: list[dict], out: Path, ref, feeds, target: str) -> dict[str, Any]:
    ok = [r for r in runs if r.get("ok")]
    cell: dict[str, Any] = {"runs": [{k: v for k, v in r.items() if k != "traceback"} for r in runs]}
    if not ok:
        cell["ok"] = False
        cell["error"] = runs[0].get("error", "failed") if runs else "not run"
        return cell
    cell["ok"] = True
    cell["convert_s"] = statistics.median(r["convert_s"] for r in ok)
    cell["peak_rss_kb"] = statistics.median(r["peak_rss_kb"] for r in ok)
    cell["rss_growth_kb"] = statistics.median(r["peak_rss_kb"] - r.get("rss_after_imports_kb", 0) for r in ok)
    cell["versions"] = ok[-1].get("versions", {})
    if "summary" in ok[-1]:
        cell["summary"] = ok[-1]["summary"]
    cell.update(measure_output(out, ref, feeds, target=target))
    return cell


# --------------------------------------------------------------------------- checks and table


def checks(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's acceptance figures, computed from the results."""
    out: dict[str, Any] = {"models": {}}
    for entry in results:
        tools = entry["tools"]
        ours = tools.get("amp-compiler", {})
        row: dict[str, Any] = {"loads": bool(ours.get("loads"))}
        errs = [tools[p]["max_rel_error"] for p in PEERS
                if p in tools and tools[p].get("loads") and math.isfinite(tools[p].get("max_rel_error", math.inf))]
        our_err = ours.get("max_rel_error")
        if errs and our_err is not None:
            best = min(errs)
            row["best_peer_error"] = best
            row["error_vs_best_peer"] = our_err / best if best else (math.inf if our_err else 1.0)
            row["error_ok"] = our_err <= MAX_ERROR_VS_BEST_PEER * best
        ceiling = ours.get("summary", {}).get("predicted_time_all_fp16_s")
        pred = ours.get("analysis", {}).get("predicted_time_s")
        if ceiling and pred:
            row["predicted_vs_ceiling"] = pred / ceiling
            row["predicted_ok"] = pred <= MAX_PREDICTED_VS_CEILING * ceiling
        for peer in ("ort-float16", "modelopt-autocast"):
            p = tools.get(peer, {})
            if ours.get("ok") and p.get("ok"):
                row[f"time_ratio_vs_{peer}"] = ours["convert_s"] / p["convert_s"]
        out["models"][entry["model"]] = row
    bert = out["models"].get("bert", {})
    if "time_ratio_vs_ort-float16" in bert:
        out["bert_time_ratio_vs_ort"] = bert["time_ratio_vs_ort-float16"]
        out["bert_time_ok_vs_ort"] = bert["time_ratio_vs_ort-float16"] <= MAX_TIME_RATIO_ORT
    if "time_ratio_vs_modelopt-autocast" in bert:
        out["bert_time_ratio_vs_modelopt"] = bert["time_ratio_vs_modelopt-autocast"]
        out["bert_time_ok_vs_modelopt"] = bert["time_ratio_vs_modelopt-autocast"] <= MAX_TIME_RATIO_MODELOPT
    return out


HEADERS = ["model", "tool", "convert s", "peak RSS MB (+conv.)", "loads in ORT", "nodes", "casts", "cast MB",
           "FP16 GEMM FLOPs", "predicted µs (vs all-FP16)", "max rel err"]


def table(results: list[dict[str, Any]]) -> str:
    rows = []
    for entry in results:
        name = entry["model"]
        fp32 = entry["fp32"]["analysis"]
        rows.append([name, "FP32 original", "", "", "yes" if entry["fp32"]["loads"] else "no", fp32["nodes"],
                     fp32["casts"], "", _pct(fp32["fp16_gemm_flop_fraction"]), _us(fp32["predicted_time_s"], None), ""])
        ceiling = entry["tools"].get("amp-compiler", {}).get("summary", {}).get("predicted_time_all_fp16_s")
        for tool, cell in entry["tools"].items():
            label = TOOL_LABELS[tool]
            if not cell.get("ok"):
                rows.append([name, label, f"failed: {cell.get('error', '?')}"[:160], *[""] * (len(HEADERS) - 3)])
                continue
            a = cell.get("analysis")
            loads = "yes" if cell.get("loads") else f"no: {cell.get('ort_error', '')}"[:160]
            mem = f"{fmt_mb(cell['peak_rss_kb'])} (+{fmt_mb(max(cell['rss_growth_kb'], 1))})"
            if a:
                counts = [a["nodes"], a["casts"], f"{a['cast_bytes'] / 2 ** 20:.1f}", _pct(a["fp16_gemm_flop_fraction"]),
                          _us(a["predicted_time_s"], ceiling)]
            else:
                counts = [f"n/a: {cell.get('analysis_error', '')}"[:120], "", "", "", ""]
            err = fmt_err(cell.get("max_rel_error")) if cell.get("loads") else "—"
            rows.append([name, label, fmt_s(cell["convert_s"]), mem, loads, *counts, err])
    return common.md_table(HEADERS, rows, align="llrrlrrrrrr")


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f} %"


def _us(seconds: float, ceiling: float | None) -> str:
    s = f"{seconds * 1e6:.0f}"
    return f"{s} ({seconds / ceiling:.2f}×)" if ceiling else s


def summary_lines(chk: dict[str, Any]) -> list[str]:
    lines = []
    if "bert_time_ratio_vs_ort" in chk:
        lines.append(f"- BERT-base conversion time, amp-compiler / ORT float16 tool: "
                     f"**{chk['bert_time_ratio_vs_ort']:.2f}×** (target ≤ {MAX_TIME_RATIO_ORT}×: "
                     f"{'met' if chk['bert_time_ok_vs_ort'] else 'NOT met'})")
    if "bert_time_ratio_vs_modelopt" in chk:
        lines.append(f"- BERT-base conversion time, amp-compiler / ModelOpt AutoCast: "
                     f"**{chk['bert_time_ratio_vs_modelopt']:.3f}×** (target ≤ {MAX_TIME_RATIO_MODELOPT}×: "
                     f"{'met' if chk['bert_time_ok_vs_modelopt'] else 'NOT met'})")
    rows = []
    for name, row in chk["models"].items():
        rows.append([name, "yes" if row["loads"] else "NO",
                     _ratio(row.get("error_vs_best_peer")) + ("" if row.get("error_ok", True) else " (over 2×)"),
                     fmt_err(row.get("best_peer_error")),
                     _ratio(row.get("predicted_vs_ceiling")) + ("" if row.get("predicted_ok", True) else " (over 1.10×)"),
                     _ratio(row.get("time_ratio_vs_ort-float16")), _ratio(row.get("time_ratio_vs_modelopt-autocast"))])
    if rows:
        lines.append("")
        lines.append(common.md_table(["model", "ours loads", "our error / best peer's (≤ 2×)", "best peer error",
                                      "our predicted / all-FP16 (≤ 1.10×)", "time / ORT float16",
                                      "time / ModelOpt"], rows, align="llrrrrr"))
    return lines


def _ratio(x: float | None) -> str:
    if x is None:
        return "—"
    return "inf" if not math.isfinite(x) else f"{x:.3f}×" if x < 0.1 else f"{x:.2f}×"


def render_markdown(data: dict[str, Any]) -> str:
    m, v = data["machine"], data["versions"]
    mo = data.get("modelopt_versions") or {}
    parts = [
        f"Generated by `{data['command']}` on {data['date']} ({common.provenance(data)}).",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['ram_gb']} GB RAM, {m['os']}, Python {m['python']}; "
        f"CPU only, shared with other jobs (times are medians of {data['repeat']} interleaved runs per tool).",
        "",
        "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items())
        + (f"; ModelOpt venv: nvidia-modelopt {mo.get('modelopt')}, onnx {mo.get('onnx')}, "
           f"onnxruntime {mo.get('onnxruntime')} (CPU)" if mo else "; ModelOpt: not installed") + ".",
        "",
        f"Models: `{data['size']}` zoo entries. Predicted times are for target `{data['target']}`.",
        "",
        table(data["results"]),
        "",
        *summary_lines(data["checks"]),
    ]
    return "\n".join(parts)


# --------------------------------------------------------------------------- command


def main(argv: list[str] | None = None) -> int:
    from . import zoo

    p = argparse.ArgumentParser(prog="python -m benchmarks.peers", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(zoo.MODEL_NAMES), choices=zoo.MODEL_NAMES)
    p.add_argument("--tools", nargs="+", default=list(ALL_TOOLS), choices=ALL_TOOLS)
    p.add_argument("--size", default="base", choices=zoo.SIZES)
    p.add_argument("--repeat", type=int, default=3, help="runs per (model, tool), interleaved (default 3)")
    p.add_argument("--target", default="h100", help="device the predicted times are for (default h100)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds before a conversion is killed")
    p.add_argument("--no-readme", action="store_true", help="do not rewrite benchmarks/README.md")
    p.add_argument("--json", default=None, help="results file name under benchmarks/results/")
    p.add_argument("--file-to-file", action="store_true",
                   help="whole processes, file in and file out (amp-compile's CLI; benchmarks.file_to_file)")
    args = p.parse_args(argv)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    if args.file_to_file:
        return _file_to_file(args, argv, log)

    tools = tuple(args.tools)
    modelopt_versions = None
    if "modelopt-autocast" in tools:
        from .modelopt_env import ModelOptUnavailable, ensure_modelopt_env

        try:
            modelopt_versions = ensure_modelopt_env(log=log)[1]
        except ModelOptUnavailable as exc:
            log(f"ModelOpt unavailable, its cells will say why: {exc}")
    header = common.run_header("peers", argv if argv is not None else sys.argv[1:])  # the code that runs
    started = time.time()
    results = []
    for name in args.models:
        log(f"[{time.time() - started:6.0f}s] {name} ({args.size})")
        results.append(run_model(name, args.size, tools, max(1, args.repeat), target=args.target,
                                 timeout=args.timeout, log=log))
    data = {
        **header,
        "modelopt_versions": modelopt_versions, "size": args.size,
        "repeat": max(1, args.repeat), "target": args.target, "tools": list(tools),
        "elapsed_s": time.time() - started, "results": results,
    }
    data["checks"] = checks(results)
    common.publish(args.json or f"peers-{args.size}.json", "peers-table", data, render_markdown(data),
                   not args.no_readme, log)
    return 0


def _file_to_file(args: argparse.Namespace, argv: list[str] | None, log: Callable[[str], None]) -> int:
    """``--file-to-file``: each tool as a user runs it, wall time and peak RSS of the whole process."""
    from . import file_to_file

    given = argv if argv is not None else sys.argv[1:]
    tools = tuple(args.tools) if "--tools" in given else file_to_file.default_tools()
    models = args.models if "--models" in given else ["bert"]
    header = common.run_header("peers", given)
    started = time.time()
    results = file_to_file.measure_models(models, args.size, tools, max(1, args.repeat), log, args.timeout)
    data = {**header, "size": args.size, "repeat": max(1, args.repeat), "tools": list(tools),
            "elapsed_s": time.time() - started, "results": results}
    common.publish(args.json or f"peers-file-to-file-{args.size}.json", "file-to-file-table", data,
                   file_to_file.render(data), not args.no_readme, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
