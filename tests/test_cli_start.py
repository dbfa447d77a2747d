"""What a CLI user expects before any conversion: --version, a quiet -q, our own --inputs
messages, and a --help that answers without importing numpy, onnx, onnxruntime or torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

import amp_compiler
from amp_compiler import cli

from .test_cli_parity import mlp

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("numpy", "onnx", "onnxruntime", "torch", "scipy", "networkx")


@pytest.fixture
def mlp_file(tmp_path):
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp(), path)
    return path


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"amp-compile {amp_compiler.__version__}"


def test_quiet_prints_only_errors(mlp_file, tmp_path, capfd):
    out = tmp_path / "out.onnx"
    args = [str(mlp_file), "-o", str(out), "--planner", "all", "--validate", "--calibrate"]
    assert cli.main(args) == 0
    loud = capfd.readouterr()
    assert "max rel error" in loud.err and "load" in loud.err and loud.out  # what -q must silence
    assert cli.main(args + ["-q"]) == 0
    quiet = capfd.readouterr()
    assert (quiet.out, quiet.err) == ("", "")
    assert cli.main(args + ["-q", "--tolerance", "1e-12"]) == 1  # an error still prints, alone
    failed = capfd.readouterr()
    assert failed.out == "" and failed.err.startswith("amp-compile: validation failed:")
    assert len(failed.err.splitlines()) == 1


@pytest.mark.parametrize("kind, content, expected", [
    ("model", None, "an ONNX model, not inputs"),
    ("npy", "npy", "a single .npy array"),
    ("text", b"x,y\n1,2\n", "not a numpy .npz archive"),
])
def test_inputs_of_the_wrong_kind(kind, content, expected, mlp_file, tmp_path, capsys):
    path = tmp_path / f"inputs.{kind}"
    if content is None:
        path.write_bytes(mlp_file.read_bytes())
    elif content == "npy":
        np.save(path, np.zeros((4, 64), np.float32))
        path = path.with_suffix(".npy" if not str(path).endswith(".npy") else "")
        path = next(tmp_path.glob("inputs.npy*"))
    else:
        path.write_bytes(content)
    status = cli.main([str(mlp_file), "-o", str(tmp_path / "out.onnx"), "--validate", "--inputs", str(path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1, err
    assert err[0].startswith(f"amp-compile: error: {path}: --inputs: {expected}")
    assert "pickle" not in err[0] and "numpy.savez" in err[0]
    assert not (tmp_path / "out.onnx").exists()


def heavy_after(code: str, *argv: str) -> tuple[int, str]:
    """Run ``code`` in a fresh interpreter; the exit status and the heavy modules it left imported."""
    probe = (f"import sys\ntry:\n    status = 0\n    {code}\nexcept SystemExit as exc:\n    status = exc.code\n"
             f"print('HEAVY=' + ','.join(m for m in {HEAVY!r} if m in sys.modules))\nsys.exit(status)\n")
    proc = subprocess.run([sys.executable, "-c", probe, *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    return proc.returncode, proc.stdout.rpartition("HEAVY=")[2].strip()


def test_start_imports_nothing_heavy(tmp_path):
    """--help, --version and bad options or files answer without numpy, onnx or onnxruntime
    (issue 17: start-up well under 0.4 s); those load only when there is a model to convert."""
    package = heavy_after("import amp_compiler")[1]
    if package:  # cli.py cannot be lighter than its package: amp_compiler/__init__.py is the core helper's
        pytest.xfail(f"import amp_compiler alone loads {package}: needs the lazy (PEP 562) package __init__")
    table = tmp_path / "ops.json"
    table.write_text('{"ops": [{"class": "allow"}]}')
    model = tmp_path / "m.onnx"
    model.write_bytes(b"not read")
    cases = {("--help",): 0, ("--version",): 0, ("missing.onnx", "-o", "out.onnx"): 2,
             (str(model), "-o", "out.onnx", "--dim", "x"): 2,
             (str(model), "--dry-run", "--custom-ops", str(table)): 2,
             (str(model), "--dry-run", "--target-file", str(table)): 2,
             (str(model), "--dry-run", "--exclude-nodes", "(unclosed"): 2}
    for argv, expected in cases.items():
        assert heavy_after("from amp_compiler import cli; status = cli.main(sys.argv[1:])", *argv) == (expected, ""), \
            argv


def test_the_console_entry_exits_at_once_with_everything_written(mlp_file, tmp_path):
    """``python -m amp_compiler.cli`` (``cli.run``) skips the interpreter's teardown: the status, the
    report on stdout, the error line and the model are all there."""
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    out = tmp_path / "out.onnx"
    done = subprocess.run([sys.executable, "-m", "amp_compiler.cli", str(mlp_file), "-o", str(out)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip().endswith(cli_report_tail(out, mlp_file))
    onnx.checker.check_model(onnx.load(out))
    failed = subprocess.run([sys.executable, "-m", "amp_compiler.cli", str(tmp_path / "no.onnx"), "-o", str(out)],
                            capture_output=True, text=True, env=env, timeout=120)
    assert failed.returncode == 2 and failed.stderr.strip().endswith("no.onnx: file not found")
    # a warning is one line as an error is, not Python's path, "UserWarning" and source line
    warned = subprocess.run([sys.executable, "-m", "amp_compiler.cli", str(mlp_file), "--dry-run", "--deny", "Gelu"],
                            capture_output=True, text=True, env=env, timeout=120)
    lines = [line for line in warned.stderr.splitlines() if "Gelu" in line or "Warning" in line]
    assert lines == [f"amp-compile: warning: {mlp_file}: --deny Gelu: the model has no Gelu op; the option "
                     f"changes nothing"], warned.stderr


def cli_report_tail(out: Path, model: Path) -> str:
    """The last line of the report the in-process CLI prints for the same conversion."""
    import contextlib
    import io

    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        assert cli.main([str(model), "-o", str(out.with_name("again.onnx"))]) == 0
    return text.getvalue().rstrip().splitlines()[-1]


def test_the_console_entry_runs_without_the_cyclic_collector(mlp_file, tmp_path):
    """``cli.run`` keeps the collector off from start to exit (docs/architecture.md, "Performance"),
    so no collection walks the IR while the output is written; in-process ``main`` leaves it on."""
    probe = ("import gc, sys; from amp_compiler import cli; main = cli.main\n"
             "def traced():\n"
             "    print('collector before:', gc.isenabled()); status = main(sys.argv[1:])\n"
             "    print('collector after:', gc.isenabled()); return status\n"
             "cli.main = traced; cli.run()")
    done = subprocess.run([sys.executable, "-c", probe, str(mlp_file), "-o", str(tmp_path / "out.onnx"), "-q"],
                          capture_output=True, text=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["collector", "before:", "False", "collector", "after:", "False"]
    onnx.checker.check_model(onnx.load(tmp_path / "out.onnx"))
    assert cli.main([str(mlp_file), "-o", str(tmp_path / "again.onnx"), "-q"]) == 0
    import gc

    assert gc.isenabled()
