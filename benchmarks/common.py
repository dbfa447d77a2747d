"""Helpers the benchmark commands share: run a converter in a fresh process, measure its
output on ONNX Runtime and with the cost model, render markdown tables, write results.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BENCH_DIR = ROOT / "benchmarks"
RESULTS_DIR = BENCH_DIR / "results"
README = BENCH_DIR / "README.md"
WORKER = BENCH_DIR / "convert_worker.py"

#: tool id -> label in tables
TOOL_LABELS = {
    "amp-compiler": "amp-compiler",
    "ort-float16": "ORT float16",
    "occ-float16": "OCC float16",
    "modelopt-autocast": "ModelOpt AutoCast",
}
PEERS = ("ort-float16", "occ-float16", "modelopt-autocast")
ALL_TOOLS = ("amp-compiler", *PEERS)


# --------------------------------------------------------------------------- running a tool


def python_for(tool: str, log: Callable[[str], None] = print) -> tuple[str, str | None]:
    """(python executable, reason it is unavailable or None) for a tool."""
    if tool == "modelopt-autocast":
        import importlib.util

        if importlib.util.find_spec("modelopt") is not None:  # installed beside us (a lent GPU machine)
            return sys.executable, None
        from .modelopt_env import ModelOptUnavailable, ensure_modelopt_env

        try:
            py, _ = ensure_modelopt_env(log=log)
        except ModelOptUnavailable as exc:
            return "", f"ModelOpt not installed: {exc}"
        return str(py), None
    return sys.executable, None


def run_tool(tool: str, model_path: str | os.PathLike, out_path: str | os.PathLike, *,
             python: str | None = None, timeout: float = 1800.0,
             options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Convert ``model_path`` with ``tool`` in a fresh process; never raises for a tool failure.

    Returns the worker's JSON (``ok``, ``convert_s``, ``peak_rss_kb``, ``error``, ...) plus
    ``process_s`` (wall time of the whole process, imports included). ``options`` go to the
    tool (``planner`` for amp-compiler, ``calibration_data`` for ModelOpt).
    """
    python = python or sys.executable
    with tempfile.TemporaryDirectory(prefix="amp-bench-") as tmp:
        result_path = Path(tmp) / "result.json"
        log_path = Path(tmp) / "log.txt"
        env = dict(os.environ)
        inherited = env.get("PYTHONPATH", "")  # packages put on the path (a GPU machine's carried wheels)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT) if python == sys.executable else "", inherited) if p)
        start = time.perf_counter()
        with open(log_path, "w") as log:
            proc = subprocess.Popen([python, str(WORKER), tool, str(model_path), str(out_path), str(result_path),
                                     json.dumps(options or {})],
                                    stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp)
            status, polled_kb, timed_out = _wait(proc, timeout)
        elapsed = time.perf_counter() - start
        result: dict[str, Any] = {}
        if result_path.is_file():
            try:
                result = json.loads(result_path.read_text())
            except json.JSONDecodeError:
                result = {}
        result.setdefault("tool", tool)
        result["process_s"] = elapsed
        # the worker reports its own high-water mark; the polled one covers a crash
        result["peak_rss_kb"] = int(result.get("peak_rss_kb") or polled_kb)
        if not result.get("ok"):
            result["ok"] = False
            if timed_out:
                result["error"] = f"timed out after {timeout:.0f} s"
            elif "error" not in result:
                tail = [ln for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()][-1:]
                why = _signal_name(status)
                result["error"] = f"process died ({why})" + (f": {tail[0][:200]}" if tail else "")
        return result


def _wait(proc: subprocess.Popen, timeout: float) -> tuple[int, int, bool]:
    """Wait for the child, polling its peak RSS (KiB); kill it after ``timeout`` seconds.

    Returns (wait status, largest VmHWM seen, timed out). The kernel's ``ru_maxrss`` of a
    child is no use here: it includes the RSS of this (forking) process.
    """
    deadline = time.monotonic() + timeout
    timed_out = False
    peak = 0
    status_file = f"/proc/{proc.pid}/status"
    while True:
        peak = max(peak, _vm_hwm_kb(status_file))
        pid, status = os.waitpid(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return status, peak, timed_out
        if time.monotonic() > deadline and not timed_out:
            proc.kill()
            timed_out = True
        time.sleep(0.05)


def _vm_hwm_kb(status_file: str) -> int:
    try:
        with open(status_file) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _signal_name(status: int) -> str:
    code = os.waitstatus_to_exitcode(status) if hasattr(os, "waitstatus_to_exitcode") else status
    if code < 0:
        import signal

        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit status {code}"


# --------------------------------------------------------------------------- measuring an output


def ort_outputs(model_path: str | os.PathLike, feeds: dict[str, np.ndarray],
                provider: str = "CPUExecutionProvider") -> tuple[list[np.ndarray] | None, str]:
    """Outputs of the model on ONNX Runtime (CPU unless ``provider`` says), or (None, why it did not load or run)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    try:
        sess = ort.InferenceSession(str(model_path), opts, providers=[provider])
    except Exception as exc:  # noqa: BLE001 - any load failure is a cell
        return None, "load failed: " + _one_line(exc)
    names = {i.name for i in sess.get_inputs()}
    try:
        return sess.run(None, {k: v for k, v in feeds.items() if k in names}), ""
    except Exception as exc:  # noqa: BLE001
        return None, "run failed: " + _one_line(exc)


def max_rel_error(expected: Sequence[np.ndarray], actual: Sequence[np.ndarray]) -> float:
    """``amp_compiler.metrics.max_rel_error`` (imported late: the runner starts before amp_compiler loads)."""
    from amp_compiler.metrics import max_rel_error as measure

    return measure(expected, actual)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    text = re.sub(r"Load model from \S+ failed: ?", "", text)  # the temporary path says nothing
    # ORT messages start with "[ONNXRuntimeError] : 1 : FAIL : ..."; keep the informative tail
    if text.startswith("[ONNXRuntimeError]"):
        text = text.split(" : ", 3)[-1]
    return text[:240]


# --------------------------------------------------------------------------- environment


def machine_info() -> dict[str, Any]:
    import psutil

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "ram_gb": round(psutil.virtual_memory().total / 2 ** 30, 1),
            "os": f"{platform.system()} {platform.release()}", "python": platform.python_version()}


def versions(names: Iterable[str] = ("onnx", "onnxruntime", "onnxconverter-common", "numpy", "torch",
                                      "transformers", "onnxscript")) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    import amp_compiler

    out = {"amp-compiler": amp_compiler.__version__}
    for name in names:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


def today() -> str:
    return _dt.date.today().isoformat()


def git_commit(root: Path = ROOT) -> str:
    return _git(["rev-parse", "--short", "HEAD"], root) or "unknown"


def git_dirty(root: Path = ROOT) -> bool | None:
    """Whether the tree has uncommitted changes (tracked or new files): then the commit alone does not
    hold the code that ran. None when git cannot tell."""
    status = _git(["status", "--porcelain"], root)
    return None if status is None else bool(status.strip())


def _git(args: list[str], root: Path) -> str | None:
    try:
        proc = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def provenance(data: dict[str, Any]) -> str:
    """'commit abc1234', with 'plus uncommitted changes' when the tree was dirty, for table captions."""
    dirty = {True: " plus uncommitted changes", None: " (tree state unknown)"}.get(data.get("dirty"), "")
    return f"commit {data.get('commit', 'unknown')}{dirty}"


# --------------------------------------------------------------------------- output


def md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None) -> str:
    """A GitHub markdown table; ``align`` is one of l/r per column (default: first l, rest r)."""
    align = align or "l" + "r" * (len(headers) - 1)
    cells = [[str(c).replace("|", "\\|").replace("\n", " ") for c in row] for row in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in cells)) if cells else len(str(h)) for i, h in enumerate(headers)]
    sep = ["-" * (w - 1) + ":" if a == "r" else "-" * w for w, a in zip(widths, align)]

    def line(items):
        return "| " + " | ".join(str(x).rjust(w) if a == "r" else str(x).ljust(w)
                                 for x, w, a in zip(items, widths, align)) + " |"

    return "\n".join([line(headers), "| " + " | ".join(sep) + " |", *(line(r) for r in cells)])


def write_json(name: str, data: Any, results_dir: Path = RESULTS_DIR) -> Path:
    from amp_compiler.atomic import atomic_write

    results_dir.mkdir(parents=True, exist_ok=True)
    return atomic_write(results_dir / name, (json.dumps(data, indent=1, default=_json_default) + "\n").encode())


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (np.floating, np.integer)):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def run_header(module: str, argv: Sequence[str], packages: Iterable[str] | None = None) -> dict[str, Any]:
    """What every results file starts with: the command that reproduces it, date, commit (and whether the tree
    had uncommitted changes), machine, versions."""
    return {"command": " ".join([f"python -m benchmarks.{module}", *argv]), "date": today(), "commit": git_commit(),
            "dirty": git_dirty(),
            "machine": machine_info(), "versions": versions(*([packages] if packages is not None else []))}


def publish(json_name: str, marker: str, data: Any, md: str, readme: bool = True,
            log: Callable[[str], None] = print) -> Path:
    """Print the table, write the results JSON, and put the table in the README between its markers."""
    print(md)
    path = write_json(json_name, data)
    log(f"results: {path}")
    if readme:
        if update_readme_section(marker, md):
            log(f"table written to {README}")
        else:
            log(f"{README} has no {marker} markers; table not written there")
    return path


def update_readme_section(marker: str, body: str, readme: Path = README) -> bool:
    """Replace the text between ``<!-- marker:start -->`` and ``<!-- marker:end -->`` in the README."""
    start, end = f"<!-- {marker}:start -->", f"<!-- {marker}:end -->"
    text = readme.read_text() if readme.is_file() else ""
    if start not in text or end not in text:
        return False
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    readme.write_text(f"{head}{start}\n{body.strip()}\n{end}{tail}")
    return True


def fmt_s(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "—"
    return f"{x:.2f}" if x < 100 else f"{x:.0f}"


def fmt_err(x: float | None) -> str:
    if x is None:
        return "—"
    if not math.isfinite(x):
        return "inf/NaN"
    return f"{x:.1e}" if x else "0"


def fmt_mb(kb: float | None) -> str:
    return "—" if not kb else f"{kb / 1024:.0f}"
