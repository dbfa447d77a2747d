"""The numerics pass on hand-built IR: each rule reads the target dtype (FP16 and BF16)."""

from __future__ import annotations

import numpy as np
import pytest

from passes import ClassifyPass, NumericsPass, PropagatePass
from passes.numerics import QDQ_KEEP

from .builders import IRBuilder


def _numerics(b: IRBuilder, dtype: str = "fp16", **options):
    return b.run(ClassifyPass(), NumericsPass(), PropagatePass(), dtype=dtype, **options)[1]


def _weight_graph(values):
    b = IRBuilder()
    w = b.const("w", values)
    b.output(b.op("MatMul", [b.input("x"), w], "mm"))
    return b


@pytest.mark.parametrize("dtype, flagged", [("fp16", True), ("bf16", False)])
def test_weight_beyond_fp16_range_is_flagged_for_fp16_only(dtype, flagged):
    b = _weight_graph(np.full((4, 4), 1e6))
    result = _numerics(b, dtype)
    assert ("w" in result.output.tensors) is flagged
    mm = b.graph.ops["mm"]
    assert (mm.precision == "float32" and "beyond the FP16 range" in mm.reason) is flagged
    assert mm.eligible is not flagged


def test_weight_beyond_bf16_range_is_flagged_for_bf16():
    b = _weight_graph(np.full((4, 4), 3.4e38))
    assert "beyond the BF16 range" in _numerics(b, "bf16").output.tensors["w"]


@pytest.mark.parametrize("dtype, flagged", [("fp16", True), ("bf16", False)])
def test_weights_that_flush_to_zero_are_flagged_per_dtype(dtype, flagged):
    values = np.full((4, 4), 1e-9)  # below FP16's smallest subnormal (6e-8), well inside BF16's range
    result = _numerics(_weight_graph(values), dtype)
    assert ("w" in result.output.tensors) is flagged
    if flagged:
        assert "16 of 16 nonzero values are below the smallest FP16 subnormal" in result.output.tensors["w"]


def test_a_few_tiny_weights_among_normal_ones_are_not_flagged():
    values = np.full(1000, 0.5)
    values[:5] = 1e-9  # 0.5 % of the nonzero values: below the 1 % share
    result = _numerics(_weight_graph(values.reshape(10, 100)))
    assert result.output.tensors == {} and result.modified is False


def test_out_of_range_scalar_forbids_its_op_and_the_flag_follows_value_flow():
    b = IRBuilder()
    x = b.input("x")
    fill = b.op("Where", [b.input("cond", "bool"), x], "fill", dtype="float32", scalars=(-3.4e38,))
    moved = b.op("Transpose", [fill], "move")  # data movement carries the extreme value
    scores = b.op("Add", [moved, x], "add")  # value-flow op: its output holds it too
    probs = b.op("Softmax", [scores], "softmax")  # bounded: its output does not
    b.output(b.op("MatMul", [probs, x], "mm"))
    result = _numerics(b, planner="all")
    assert "argument -3.4e+38 is beyond the FP16 range" in result.output.ops["fill"]
    assert {"fill_out", "move_out", "add_out"} <= set(result.output.tensors)
    assert "softmax_out" not in result.output.tensors
    ops = b.graph.ops
    assert [ops[n].precision for n in ("fill", "move", "add", "softmax")] == ["float32"] * 4
    assert ops["mm"].eligible


def test_out_of_fp16_range_scalar_is_harmless_for_bf16():
    b = IRBuilder()
    b.output(b.op("Where", [b.input("cond", "bool"), b.input("x")], "fill", dtype="float32", scalars=(-1e9,)))
    result = _numerics(b, "bf16", planner="all")
    assert result.output.ops == {} and b.graph.ops["fill"].eligible


def test_infinite_scalar_is_not_out_of_range():
    b = IRBuilder()
    b.output(b.op("Where", [b.input("cond", "bool"), b.input("x")], "fill", dtype="float32",
                  scalars=(float("-inf"),)))
    assert _numerics(b).output.ops == {}


@pytest.mark.parametrize("peak, dtype, flagged", [
    (1e5, "fp16", True), (1e5, "bf16", False),  # overflow: FP16 max 65504 / margin 2
    (40000.0, "fp16", True), (30000.0, "fp16", False),  # the margin
    (1e-6, "fp16", True), (1e-6, "bf16", False),  # every value subnormal in FP16
    (0.0, "fp16", False),  # an all-zero activation loses nothing
])
def test_calibrated_peaks_are_judged_for_the_target_dtype(peak, dtype, flagged):
    b = IRBuilder()
    h = b.op("Relu", [b.input("x")], "relu")
    b.graph.tensors[h].calibrated_peak = peak
    b.output(b.op("MatMul", [h, b.input("w")], "mm"))
    result = _numerics(b, dtype)
    assert (h in result.output.tensors) is flagged
    assert (b.graph.ops["mm"].precision == "float32") is flagged


def test_ops_inside_a_qdq_unit_keep_their_source_dtype():
    b = IRBuilder()
    deq = b.op("DequantizeLinear", [b.input("q", "int8"), b.input("scale")], "deq", dtype="float32")
    conv = b.op("MatMul", [deq, b.input("x")], "mm")
    b.output(b.op("QuantizeLinear", [conv, b.input("s2")], "quant", dtype="int8"))
    free = b.op("MatMul", [b.input("y"), b.input("z")], "free_mm")
    b.output(free)
    result = _numerics(b, planner="all")
    assert result.output.ops == {"mm": QDQ_KEEP}
    assert b.graph.ops["mm"].forbid_low == QDQ_KEEP and not b.graph.ops["mm"].eligible
    assert b.graph.ops["free_mm"].eligible


def test_nothing_to_flag_leaves_the_graph_unmodified():
    b = _weight_graph(np.full((4, 4), 0.25))
    result = _numerics(b)
    assert result.modified is False and result.output.tensors == {} and result.output.ops == {}
    assert "0 values beyond FP16's range" in result.details


def test_numerics_requires_classes():
    from passes.base import PassError

    from amp_compiler.plan import make_context

    b = _weight_graph(np.ones((4, 4)))
    with pytest.raises(PassError, match="numerics: requires violated: every op has a class.*mm"):
        NumericsPass()(b.graph, make_context())
