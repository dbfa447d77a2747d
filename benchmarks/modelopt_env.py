"""A private virtual environment for NVIDIA ModelOpt AutoCast, created on first use.

ModelOpt pins older onnx / onnxruntime than amp-compiler uses, so it never goes into
the main environment: ``ensure_modelopt_env()`` builds ``benchmarks/.cache/venvs/modelopt``
(git-ignored) and returns its python, or raises ``ModelOptUnavailable`` with the reason.

On Linux x86-64, ``nvidia-modelopt[onnx]`` asks for ``onnxruntime-gpu`` and ``cupy-cuda12x``.
This benchmark compares converters on the CPU and must not end up with two ONNX Runtime
builds side by side, so the extra's requirements are installed by hand from the package's
own metadata, with these substitutions:

* ``onnxruntime-gpu<spec>`` becomes ``onnxruntime<spec>`` (same version pin, CPU build);
* ``cupy-cuda*`` is left out (AutoCast does not use it; ModelOpt's INT4 code falls back to numpy);
* ``torch`` is pinned to the main environment's version when that is a CPU build (``+cpu``),
  which pip finds among local wheels when the machine has them; otherwise pip chooses.

Everything else follows ModelOpt's pins (``onnx~=1.21``, ``onnxconverter-common~=1.16``,
``polygraphy``, ``onnx-graphsurgeon``, ...). Set ``AMP_BENCH_MODELOPT_SPEC`` to install another
version (e.g. ``nvidia-modelopt==0.47.0``).

Run ``python -m benchmarks.modelopt_env`` to build it ahead of a benchmark.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

VENV_DIR = Path(__file__).resolve().parent / ".cache" / "venvs" / "modelopt"
READY = VENV_DIR / "amp-bench-ready.json"
FAILED = VENV_DIR.parent / "modelopt-install-failed.txt"
SPEC_ENV = "AMP_BENCH_MODELOPT_SPEC"
DEFAULT_SPEC = "nvidia-modelopt"

__all__ = ["ModelOptUnavailable", "ensure_modelopt_env", "venv_python", "VENV_DIR"]


class ModelOptUnavailable(RuntimeError):
    """The ModelOpt environment could not be built; the message says why."""


def venv_python(venv_dir: Path = VENV_DIR) -> Path:
    return venv_dir / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _pip(python: Path, *args: str, log) -> None:
    cmd = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", *args]
    log(f"$ {' '.join(cmd)}")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip() and "is ignored" not in ln]
        raise ModelOptUnavailable(f"pip install {' '.join(args)} failed: {' | '.join(lines[-3:])[-400:]}")


def _onnx_requirements(python: Path) -> list[str]:
    """The requirements of nvidia-modelopt (base + [onnx]) for this interpreter, CPU-only."""
    out = subprocess.run([str(python), "-c", "import importlib.metadata as m; "
                          "print('\\n'.join(m.requires('nvidia-modelopt') or []))"],
                         capture_output=True, text=True, check=True).stdout
    return cpu_requirements(out.splitlines(), _main_torch_version())


def cpu_requirements(lines: list[str], torch_version: str | None = None) -> list[str]:
    """ModelOpt's base + ``[onnx]`` requirements with the CPU substitutions of the module docstring."""
    from packaging.requirements import Requirement

    reqs = []
    for line in lines:
        if not line.strip():
            continue
        req = Requirement(line)
        if req.marker is not None and not (req.marker.evaluate({"extra": ""})
                                           or req.marker.evaluate({"extra": "onnx"})):
            continue
        name = req.name.lower()
        if name.startswith("cupy"):
            continue
        if name == "onnxruntime-gpu":
            name = "onnxruntime"
        if name == "torch" and torch_version and "+cpu" in torch_version:
            reqs.append(f"torch=={torch_version}")
            continue
        extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
        reqs.append(f"{name}{extras}{req.specifier}")
    return sorted(set(reqs))


def _main_torch_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("torch")
    except Exception:  # noqa: BLE001 - torch is optional in the main environment
        return None


def _probe(python: Path) -> dict:
    code = ("import json, importlib.metadata as m\n"
            "import modelopt.onnx.autocast, onnx, onnxruntime\n"
            "names = [d.metadata['Name'].lower() for d in m.distributions()]\n"
            "print(json.dumps({'modelopt': m.version('nvidia-modelopt'), 'onnx': onnx.__version__,\n"
            "  'onnxruntime': onnxruntime.__version__, 'providers': onnxruntime.get_available_providers(),\n"
            "  'onnxruntime_gpu_installed': 'onnxruntime-gpu' in names}))\n")
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    if proc.returncode:
        raise ModelOptUnavailable(f"modelopt venv does not import: {proc.stderr.strip().splitlines()[-1:]}")
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    if info["onnxruntime_gpu_installed"]:
        raise ModelOptUnavailable("onnxruntime-gpu ended up in the modelopt venv beside onnxruntime")
    return info


def ensure_modelopt_env(log=print, rebuild: bool = False) -> tuple[Path, dict]:
    """Python of a working ModelOpt venv and its versions; builds it on first call."""
    python = venv_python()
    if READY.is_file() and python.is_file() and not rebuild:
        return python, json.loads(READY.read_text())
    if FAILED.is_file() and not rebuild and not os.environ.get("AMP_BENCH_RETRY_MODELOPT"):
        raise ModelOptUnavailable(FAILED.read_text().strip() + " (cached; delete the file or set "
                                  "AMP_BENCH_RETRY_MODELOPT=1 to retry)")
    try:
        log(f"building the ModelOpt venv in {VENV_DIR} (first run only; several minutes)")
        VENV_DIR.parent.mkdir(parents=True, exist_ok=True)
        venv.EnvBuilder(with_pip=True, clear=True).create(VENV_DIR)
        _pip(python, "--no-deps", os.environ.get(SPEC_ENV, DEFAULT_SPEC), log=log)
        reqs = _onnx_requirements(python)
        _pip(python, *reqs, log=log)
        info = _probe(python)
    except ModelOptUnavailable as exc:
        FAILED.write_text(str(exc))
        raise
    except (OSError, subprocess.SubprocessError) as exc:
        FAILED.write_text(f"venv creation failed: {exc}")
        raise ModelOptUnavailable(f"venv creation failed: {exc}") from None
    READY.write_text(json.dumps(info, indent=1))
    FAILED.unlink(missing_ok=True)
    return python, info


if __name__ == "__main__":
    try:
        py, versions = ensure_modelopt_env(rebuild="--rebuild" in sys.argv)
    except ModelOptUnavailable as e:
        print(f"ModelOpt unavailable: {e}")
        sys.exit(1)
    print(py, json.dumps(versions))
