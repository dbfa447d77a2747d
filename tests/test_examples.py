"""Every example script the README shows runs to completion on a CPU (exit status 0)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.py"))


def test_the_readme_shows_every_example():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert EXAMPLES and all(f"examples/{name}" in readme for name in EXAMPLES)


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_runs(name):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / "examples" / name)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
