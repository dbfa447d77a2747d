"""File in, file out, whole process: one converter run as a user runs it, timed from outside.

``run(tool, in, out)`` starts a fresh process -- ``python -m amp_compiler.cli IN -o OUT`` for
amp-compiler, ``benchmarks/convert_worker.py`` (imports, ``onnx.load``, convert, ``onnx.save``)
for the peers -- and measures its wall time from spawn to exit and its peak resident memory
(``ru_maxrss`` of the child, through GNU ``time`` where installed). For amp-compiler the wall time is split into
stages by the moment each progress line of the CLI reaches this process (it prints them on
stderr as it enters each stage): start-up + imports, load, import to IR, plan, emit, write
(the write stage also holds the terminal report and the interpreter's exit).
``median_runs`` interleaves the tools' runs so that load from other jobs falls on all alike; each
run writes a new output file (timing the replacement of the last run's would time its deletion),
and amp-compiler's packages are byte-compiled first, as an install leaves them.
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from .common import ROOT, WORKER, python_for

_GNU_TIME = shutil.which("time", path="/usr/bin:/bin")
STAGES = ("start-up+imports", "load", "import", "plan", "emit", "write")
PACKAGES = ("amp_compiler", "passes", "cost_model")


def run(tool: str, model: str | os.PathLike, out: str | os.PathLike, *, timeout: float = 1800.0,
        python: str | None = None) -> dict[str, Any]:
    """One whole-process conversion: ``{"ok", "wall_s", "peak_rss_kb", "stages"?, "error"?}``."""
    python = python or sys.executable
    env = dict(os.environ, PYTHONPATH=str(ROOT) if python == sys.executable else "")
    if tool == "amp-compiler":
        cmd = [python, "-m", "amp_compiler.cli", str(model), "-o", str(out)]
    else:
        cmd = [python, str(WORKER), tool, str(model), str(out), str(Path(out).with_suffix(".json"))]
    rss_file = Path(out).with_suffix(".maxrss")
    if _GNU_TIME:  # a small process forks the tool: ru_maxrss would otherwise carry over this harness's size
        cmd = [_GNU_TIME, "-f", "%M", "-o", str(rss_file), *cmd]
    marks: list[tuple[str, float]] = []
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=ROOT, text=True,
                            start_new_session=True)
    tail = []
    killer = threading.Timer(timeout, _kill_group, (proc.pid,))  # a hung tool is a failed cell
    killer.start()
    try:
        for line in proc.stderr:  # the CLI flushes one line per stage: stamp it on arrival
            marks.append((line.strip(), time.perf_counter()))
            tail = (tail + [line.strip()])[-3:]
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        killer.cancel()
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    peak = usage.ru_maxrss
    if _GNU_TIME and rss_file.is_file():
        text = rss_file.read_text().split()
        peak = int(text[-1]) if text and text[-1].isdigit() else peak
    result: dict[str, Any] = {"tool": tool, "ok": proc.returncode == 0, "wall_s": wall, "peak_rss_kb": peak}
    if proc.returncode:
        result["error"] = f"exit {proc.returncode}: {' / '.join(t for t in tail if t)[:300]}"
    elif tool == "amp-compiler":
        result["stages"] = stage_split(marks, start, start + wall)
    else:
        result["stages"] = worker_split(Path(out).with_suffix(".json"), wall)
    if wall > timeout:
        result.update(ok=False, error=f"took {wall:.0f} s, over the {timeout:.0f} s limit")
    return result


def _kill_group(pid: int) -> None:
    """SIGKILL the process group the run leads (the tool and GNU time alike)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def stage_split(marks: list[tuple[str, float]], start: float, end: float) -> dict[str, float]:
    """Seconds per stage from the CLI's progress lines ``[  1.23s] stage`` and their arrival times."""
    firsts: dict[str, float] = {}
    for text, when in marks:
        stage = text.partition("] ")[2]
        key = ("load" if stage == "load" else "import" if stage == "import" else "emit" if stage == "emit"
               else "write" if stage.startswith("write ") else "plan" if text.startswith("[") else None)
        if key is not None and key not in firsts:
            firsts[key] = when
    order = [("start-up+imports", start)] + [(k, firsts[k]) for k in STAGES[1:] if k in firsts]
    times = [t for _, t in order] + [end]
    return {name: round(t1 - t0, 3) for (name, _), t0, t1 in zip(order, times, times[1:])}


def worker_split(report: Path, wall: float) -> dict[str, float]:
    """A peer's seconds per stage, from the times ``convert_worker`` records: load + convert, save,
    and the rest of the process (interpreter start, imports, exit); {} without its record."""
    import json

    try:
        times = json.loads(report.read_text())
        convert, save = float(times["convert_s"]), float(times["save_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return {"start-up+imports+exit": round(wall - convert - save, 3), "load+convert": round(convert, 3),
            "save": round(save, 3)}


def median_runs(model: str | os.PathLike, out_dir: Path, tools: tuple[str, ...], repeat: int,
                log: Callable[[str], None], timeout: float = 1800.0) -> dict[str, dict[str, Any]]:
    """Each tool ``repeat`` times on ``model``, interleaved with the order rotated; the medians per tool."""
    runs: dict[str, list[dict]] = {t: [] for t in tools}
    pythons = {t: python_for(t, log=log) for t in tools}
    if "amp-compiler" in tools:
        compile_bytecode()
    for r in range(repeat):
        for tool in tools[r % len(tools):] + tools[:r % len(tools)]:
            python, unavailable = pythons[tool]
            if unavailable:
                runs[tool] = [{"tool": tool, "ok": False, "error": unavailable}]
                continue
            out = out_dir / f"{tool}-{r + 1}.onnx"  # a new file each run: replacing the last would time its deletion
            res = run(tool, model, out, timeout=timeout, python=python)
            runs[tool].append(res)
            log(f"  {Path(model).name} {tool:18s} run {r + 1}/{repeat}: "
                + (f"{res['wall_s']:.2f} s, {res['peak_rss_kb'] / 1024:.0f} MB" if res["ok"] else res["error"]))
    return {tool: summarize(rs) for tool, rs in runs.items()}


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if r.get("ok")]
    if not ok:
        return {"ok": False, "error": runs[0].get("error", "not run") if runs else "not run"}
    mid = sorted(ok, key=lambda r: r["wall_s"])[len(ok) // 2]
    cell = {"ok": True, "wall_s": statistics.median(r["wall_s"] for r in ok),
            "all_wall_s": [round(r["wall_s"], 3) for r in ok],
            "peak_rss_kb": statistics.median(r["peak_rss_kb"] for r in ok)}
    if "stages" in mid:
        cell["stages"] = mid["stages"]  # the median run's split
    return cell


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


# --------------------------------------------------------------------------- the peers table (--file-to-file)

#: the issue's target: BERT-base file to file at most this fraction of ORT's float16 tool
MAX_BERT_RATIO_ORT = 0.25


def default_tools() -> tuple[str, ...]:
    """amp-compiler and the peers installed here (ModelOpt only where its venv is already built)."""
    from .modelopt_env import READY

    tools = ["amp-compiler", "ort-float16"]
    try:
        import onnxconverter_common  # noqa: F401
        tools.append("occ-float16")
    except ImportError:
        pass
    if READY.is_file():
        tools.append("modelopt-autocast")
    return tuple(tools)


def measure_models(models: list[str], size: str, tools: tuple[str, ...], repeat: int,
                   log: Callable[[str], None], timeout: float = 1800.0) -> list[dict[str, Any]]:
    import tempfile

    from . import zoo

    results = []
    for name in models:
        path = zoo.export_onnx(name, size)
        work = Path(tempfile.mkdtemp(prefix=f"amp-f2f-{name}-"))
        try:
            load = load_average()
            cells = median_runs(path, work, tools, repeat, log, timeout)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        results.append({"model": name, "size": size, "file_mb": round(path.stat().st_size / 2 ** 20, 1),
                        "load_average_before": load, "load_average_after": load_average(), "tools": cells})
    return results


def compile_bytecode() -> None:
    """Byte-compile amp-compiler's packages, as ``pip install`` does: the peers' site-packages come
    compiled, and a checkout run with ``PYTHONDONTWRITEBYTECODE`` would compile every module each run."""
    import compileall

    for package in PACKAGES:
        compileall.compile_dir(ROOT / package, quiet=1)


def ratio(cells: dict[str, Any], tool: str, peer: str = "ort-float16") -> float | None:
    a, b = cells.get(tool, {}), cells.get(peer, {})
    return a["wall_s"] / b["wall_s"] if a.get("ok") and b.get("ok") else None


def render(data: dict[str, Any]) -> str:
    from .common import TOOL_LABELS, md_table, provenance

    rows = []
    for entry in data["results"]:
        for tool, cell in entry["tools"].items():
            if not cell.get("ok"):
                rows.append([entry["model"], TOOL_LABELS[tool], f"failed: {cell.get('error')}"[:160], "", "", ""])
                continue
            r = ratio(entry["tools"], tool)
            split = ", ".join(f"{k} {v:.2f}" for k, v in cell.get("stages", {}).items())
            rows.append([entry["model"], TOOL_LABELS[tool], f"{cell['wall_s']:.2f}", "" if r is None else f"{r:.2f}×",
                         f"{cell['peak_rss_kb'] / 1024:.0f}", split or "(one process: imports, load, convert, save)"])
    m = data["machine"]
    missing = [t for t in ("occ-float16", "modelopt-autocast") if t not in data["tools"]]
    lines = [f"Generated by `{data['command']}` on {data['date']} ({provenance(data)}); {m['cpu']}, {m['cores']} "
             f"cores, shared with other jobs; median of {data['repeat']} interleaved runs, each a whole process "
             "from spawn to exit.", "",
             md_table(["model", "tool", "file to file s", "vs ORT float16", "peak RSS MB", "stages (s)"],
                      rows, align="llrrrl"), ""]
    for entry in data["results"]:
        lines.append(f"- {entry['model']}: load average {entry['load_average_before']} before, "
                     f"{entry['load_average_after']} after (2 cores).")
    bert = next((e for e in data["results"] if e["model"] == "bert"), None)
    r = ratio(bert["tools"], "amp-compiler") if bert else None
    if r is not None:
        lines.append(f"- BERT file to file, amp-compile / ORT float16 tool: **{r:.2f}×** "
                     f"(target ≤ {MAX_BERT_RATIO_ORT}×: {'met' if r <= MAX_BERT_RATIO_ORT else 'NOT met'}).")
    if missing:
        lines.append(f"- Not installed here, so not measured: {', '.join(TOOL_LABELS[t] for t in missing)}.")
    return "\n".join(lines)
