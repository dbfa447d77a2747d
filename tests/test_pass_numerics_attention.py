"""Numerics rule 13: unscaled attention scores of unnormalised activations stay FP32."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from benchmarks import common, torture
from passes import ClassifyPass, NumericsPass, PropagatePass

from .builders import IRBuilder

from amp_compiler.onnx_api import convert_onnx  # noqa: E402  isort: skip


def _attention(b: IRBuilder, x: str, scale: str | None = None) -> None:
    """q = x Wq, k = x Wk, softmax(q k^T [scaled]) v; ``scale``: where a 1/sqrt(d) Mul sits
    (``"scores"``, ``"query"``) or ``"div"`` on the scores."""
    w = {n: b.const(n, np.full((256, 256), 0.01, np.float32)) for n in ("wq", "wk", "wv")}
    q = b.op("MatMul", [x, w["wq"]], "q")
    if scale == "query":
        q = b.op("Mul", [q, b.const("s", [0.125])], "scale_q")
    kt = b.op("Transpose", [b.op("MatMul", [x, w["wk"]], "k")], "kt")
    scores = b.op("MatMul", [q, kt], "scores")
    if scale == "scores":
        scores = b.op("Mul", [scores, b.const("s", [0.125])], "scale")
    elif scale == "div":
        scores = b.op("Div", [scores, b.const("s", [8.0])], "scale")
    probs = b.op("Softmax", [b.op("Add", [scores, b.input("mask")], "masked")], "probs")
    b.output(b.op("MatMul", [probs, b.op("MatMul", [x, w["wv"]], "v")], "out"))


def _plan(b: IRBuilder, dtype: str = "fp16") -> dict[str, str]:
    return b.run(ClassifyPass(), NumericsPass(), PropagatePass(), dtype=dtype, planner="all")[1].output.ops


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_unscaled_scores_of_a_raw_input_stay_fp32_in_fp16_only(dtype):
    b = IRBuilder()
    _attention(b, b.input("x"))
    flagged = _plan(b, dtype)
    ops = b.graph.ops
    if dtype == "bf16":  # FP32's exponent range: the scores cannot overflow
        assert flagged == {} and ops["scores"].eligible
        return
    assert set(flagged) == {"scores", "masked", "probs"}
    assert "unscaled attention scores: scores's product of two activations reaches probs" in flagged["scores"]
    assert all(not ops[n].eligible for n in flagged)
    assert ops["q"].eligible and ops["out"].eligible  # the projections and what the softmax feeds stay free


@pytest.mark.parametrize("scale", ["scores", "div", "query"])
def test_scaled_scores_are_left_to_the_planner(scale):
    b = IRBuilder()
    _attention(b, b.input("x"), scale)
    assert _plan(b) == {}


@pytest.mark.parametrize("norm", ["LayerNormalization", "written_out_rms_norm"])
def test_scores_of_a_normalised_value_are_bounded_by_the_weights(norm):
    """Pre-LN attention with the scale folded into the weights (T5): the norm bounds q and k."""
    b = IRBuilder()
    x = b.input("x")
    if norm == "LayerNormalization":
        normed = b.op("LayerNormalization", [x, b.const("g", np.ones(256, np.float32))], "ln")
    else:
        ms = b.op("ReduceMean", [b.op("Pow", [x, b.const("two", [2.0])], "pow")], "ms", shape=(256, 1))
        root = b.op("Sqrt", [b.op("Add", [ms, b.const("eps", [1e-6])], "add_eps")], "sqrt")
        normed = b.op("Mul", [b.const("g", np.ones(256, np.float32)), b.op("Div", [x, root], "rms")], "gamma")
    _attention(b, normed)
    assert not any("unscaled attention" in why for why in _plan(b).values())


def test_torture_big_logits_hold_by_default_in_fp16_storage(tmp_path):
    """Scores ~1e5 from raw activations: full FP16 overflows; the default plan, without data,
    stays within tolerance in GPU-like FP16 storage emulation."""
    case = next(c for c in torture.build_cases() if c.name == "softmax_big_logits")
    src, ours = tmp_path / "fp32.onnx", tmp_path / "ours.onnx"
    onnx.save(case.model, src)
    converted, report = convert_onnx(case.model)
    onnx.save(converted, ours)
    assert any("unscaled attention scores" in (op.get("reason") or "") for op in report.ops)
    ref, _ = common.ort_outputs(src, case.feeds)
    emulated, _ = torture.fp16_storage_outputs(ours, case.feeds)
    assert common.max_rel_error(ref, emulated) <= torture.TOLERANCE
