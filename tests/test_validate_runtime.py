"""Validation on ONNX Runtime's CPU provider survives that runtime's own faults on converted graphs
(``amp_compiler/validate.py``, ``CPU_DISABLED_OPTIMIZERS``)."""

from __future__ import annotations

import subprocess
import sys

import onnx
import pytest
from onnx import helper

from tests.builders import fin, model, weight
from tests.test_bad_input import ROOT, leftovers

pytest.importorskip("onnxruntime")


def _seq_first_projection():
    """A Longformer's attention input: [seq, batch, hidden] moved to batch-first, then projected."""
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2], name="seq_first"),
             helper.make_node("MatMul", ["t", "W"], ["h"], name="query"),
             helper.make_node("Relu", ["h"], ["r"], name="act"),
             helper.make_node("MatMul", ["r", "W2"], ["y"], name="out")]
    return model(nodes, [fin("x", 64, 8, 256)], [fin("y", 8, 64, 256)], [weight("W", 256, 256), weight("W2", 256, 256)])


def test_an_fp16_batch_transpose_into_a_matmul_validates(tmp_path):
    """ONNX Runtime's CPU provider died of a segmentation fault building the session for the FP16
    Transpose -> MatMul (its MatmulTransposeFusion with the NCHWc layout pass): --validate ended
    with no message and left its staging folder. A real process, as the crash took pytest down."""
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    src.write_bytes(_seq_first_projection().SerializeToString())
    proc = subprocess.run([sys.executable, "-m", "amp_compiler.cli", str(src), "-o", str(out), "--validate", "-q"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert out.exists() and leftovers(tmp_path) == []
    converted = onnx.load(str(out))
    precision = {n.name: n.doc_string.split(";")[0] for n in converted.graph.node}
    assert precision["seq_first"] == precision["query"] == "amp_compiler: precision=float16"  # the crashing pair
