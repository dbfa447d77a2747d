"""Each top-level package imports on its own, in a fresh interpreter (docs/architecture.md, "Packages")."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("module", ["passes", "cost_model", "amp_compiler", "cost_model.timer", "passes.numerics"])
def test_package_imports_alone_in_a_fresh_interpreter(module):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_import_amp_compiler_loads_no_heavy_dependency():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = ("import sys, amp_compiler; heavy = [m for m in ('torch', 'onnx', 'scipy', 'passes') if m in sys.modules];"
            "print(','.join(heavy))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == ""
    code = "import amp_compiler; print(amp_compiler.convert_onnx.__name__, amp_compiler.Report.__name__)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.stdout.split() == ["convert_onnx", "Report"], proc.stderr[-2000:]
