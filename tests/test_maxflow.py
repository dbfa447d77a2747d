"""The min-cut solver (``passes/maxflow.py``): the Python and the scipy paths give the same cut.

The residual reach from the source is the same for every maximum flow, so the two paths
must agree node for node, on random graphs with repeated, "infinite" and tiny edges alike;
and a conversion of a small model never imports scipy.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from passes import maxflow

ROOT = Path(__file__).resolve().parents[1]


def _random_graph(rng: np.random.Generator) -> tuple[int, list[int], list[int], list[float]]:
    n = int(rng.integers(3, 40))
    m = int(rng.integers(1, 200))
    rows, cols = rng.integers(0, n, m), rng.integers(0, n, m)
    keep = rows != cols
    caps = rng.choice([-1.0, 1e-6, 0.5, 1.0, 2.0, 3.3, 7.0], m)  # -1: infinite
    return n, rows[keep].tolist(), cols[keep].tolist(), caps[keep].tolist()


@pytest.mark.parametrize("seed", range(4))
def test_python_and_scipy_cuts_agree(seed: int, monkeypatch) -> None:
    rng = np.random.default_rng(seed)
    sides = 0
    for _ in range(100):
        n, rows, cols, caps = _random_graph(rng)
        ours = maxflow.min_cut_source_side(n, rows, cols, caps, 0, 1)
        monkeypatch.setattr(maxflow, "PURE_PYTHON_EDGES", -1)
        theirs = maxflow.min_cut_source_side(n, rows, cols, caps, 0, 1)
        monkeypatch.setattr(maxflow, "PURE_PYTHON_EDGES", 20_000)
        assert np.array_equal(ours, theirs)
        assert ours[0] and not ours[1]
        sides += int(ours.sum())
    assert sides > 100  # the cuts are not all trivial


def test_a_chain_is_cut_at_its_cheapest_edge() -> None:
    # 0 -> 2 -> 3 -> 4 -> 1, the 3 -> 4 edge cheapest: 0, 2, 3 on the source side
    side = maxflow.min_cut_source_side(5, [0, 2, 3, 4], [2, 3, 4, 1], [5.0, 4.0, 1.0, -1.0], 0, 1)
    assert side.tolist() == [True, False, True, True, False]


def test_converting_a_small_model_does_not_import_scipy(tmp_path) -> None:
    code = ("import sys, numpy as np, onnx\n"
            "from onnx import helper, numpy_helper, TensorProto\n"
            "from amp_compiler import convert_onnx\n"
            "import passes.convert as c\n"
            "calls = []\n"
            "solve = c.CutNetwork.source_side\n"
            "c.CutNetwork.source_side = lambda *a: calls.append(1) or solve(*a)\n"
            "w = numpy_helper.from_array(np.ones((64, 64), np.float32), 'w')\n"
            "g = helper.make_graph([helper.make_node('MatMul', ['x', 'w'], ['y'])], 'g',\n"
            "    [helper.make_tensor_value_info('x', TensorProto.FLOAT, [64, 64])],\n"
            "    [helper.make_tensor_value_info('y', TensorProto.FLOAT, [64, 64])], [w])\n"
            "_, report = convert_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid('', 18)]))\n"
            "assert calls, 'no cut solved'\n"
            "print('scipy' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def _infinite_path(rows: list[int], cols: list[int], caps: list[float]) -> bool:
    """Whether infinite edges lead from 0 to 1 (no finite cut: any side is as good)."""
    reached, stack = {0}, [0]
    while stack:
        u = stack.pop()
        for r, c, k in zip(rows, cols, caps):
            if r == u and k < 0 and c not in reached:
                reached.add(c)
                stack.append(c)
    return 1 in reached


def _with_relays(rng: np.random.Generator) -> tuple[int, list[int], list[int], list[float]] | None:
    """A random graph plus one-in, one-out nodes (a cast term's auxiliary node with a single
    reader); None where infinite edges lead from 0 to 1."""
    n, rows, cols, caps = _random_graph(rng)
    extra = int(rng.integers(1, 20))
    for v in range(n, n + extra):
        rows += [int(rng.integers(0, n)), v]
        cols += [v, int(rng.integers(0, n))]
        caps += rng.choice([-1.0, 0.5, 1.0, 2.0], 2).tolist()
    return None if _infinite_path(rows, cols, caps) else (n + extra, rows, cols, caps)


def _no_relays(n, heads, tails, s, t):
    none = np.zeros(0, dtype=np.int64)
    return none, none, none, none, none, none.astype(bool), np.ones(heads.size, dtype=bool)


@pytest.mark.parametrize("seed", range(4))
def test_bypassing_relays_keeps_the_cut(seed: int, monkeypatch) -> None:
    rng = np.random.default_rng(seed)
    graphs = [g for g in (_with_relays(rng) for _ in range(100)) if g is not None]
    bypassed = [maxflow.min_cut_source_side(*g, 0, 1) for g in graphs]
    monkeypatch.setattr(maxflow, "_relays", _no_relays)
    assert len(graphs) > 50
    assert all(np.array_equal(side, maxflow.min_cut_source_side(*g, 0, 1)) for side, g in zip(bypassed, graphs))
