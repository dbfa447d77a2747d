"""The numerics pass on hand-built IR: each rule reads the target dtype (FP16 and BF16)."""

from __future__ import annotations

import numpy as np
import pytest

from passes import ClassifyPass, NumericsPass, PropagatePass
from passes.numerics import QDQ_KEEP

from .builders import IRBuilder


def _numerics(b: IRBuilder, dtype: str = "fp16", **options):
    """classify -> numerics -> propagate; deny propagation (a propagate rule, on by default) off unless
    asked for, so each test sees its numerics rule alone."""
    options.setdefault("deny_propagation", False)
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
    b.output(b.op("MatMul", [probs, x], "mm"), b.op("Relu", [moved], "relu"))  # not a mask fill: Relu reads it
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


def test_an_underflowing_bias_does_not_veto_its_add_but_does_veto_a_product():
    b = IRBuilder()
    x = b.input("x")
    bias = b.const("bias", np.full(256, 1e-9))  # a BN-folded bias: flushed to zero beside its addend
    scale = b.const("scale", np.full(256, 1e-9))
    h = b.op("MatMul", [x, b.input("w")], "mm")
    added = b.op("Add", [h, bias], "add_bias")
    b.output(b.op("Mul", [added, scale], "mul_scale"))
    result = _numerics(b, planner="all")
    assert "bias" not in result.output.tensors
    assert "would flush to zero" in result.output.tensors["scale"]
    ops = b.graph.ops
    assert ops["add_bias"].eligible and not ops["mul_scale"].eligible


def test_an_overflowing_addend_still_vetoes_its_add():
    b = IRBuilder()
    b.output(b.op("Add", [b.op("MatMul", [b.input("x"), b.input("w")], "mm"), b.const("c", np.full(256, 1e6))],
                  "add_big"))
    result = _numerics(b, planner="all")
    assert "c" in result.output.tensors and not b.graph.ops["add_big"].eligible


def _rms_norm(eps: float) -> IRBuilder:
    """x -> Pow -> ReduceMean -> Add(eps) -> Sqrt -> Div(x, root) -> MatMul (Reciprocal is deny on its own)."""
    b = IRBuilder()
    x = b.input("x")
    sq = b.op("Pow", [x, b.const("two", [2.0])], "pow")
    var = b.op("ReduceMean", [sq], "mean", shape=(256, 1))
    shifted = b.op("Add", [var, b.const("eps", [eps])], "add_eps")
    root = b.op("Sqrt", [shifted], "sqrt")
    normed = b.op("Div", [x, root], "scale")
    b.output(b.op("MatMul", [normed, b.input("w")], "mm"))
    return b


@pytest.mark.parametrize("eps, dtype, protected", [
    (1e-6, "fp16", True),  # below FP16's smallest normal (6.1e-5)
    (1e-6, "bf16", False),  # BF16 has FP32's exponent range
    (1e-3, "fp16", False),  # var + eps stays a normal FP16 number
])
def test_reduction_add_eps_sqrt_chain_is_protected_per_dtype(eps, dtype, protected):
    b = _rms_norm(eps)
    result = _numerics(b, dtype, planner="all")
    ops = b.graph.ops
    assert (set(result.output.ops) == {"mean", "add_eps", "sqrt"}) is protected  # the mean (infer) too
    assert all(not ops[n].eligible for n in ("mean", "add_eps", "sqrt")) is protected
    assert ops["scale"].eligible  # after the root the value is an ordinary one
    if protected:
        assert f"plus eps {eps:.3g}" in ops["sqrt"].reason


@pytest.mark.parametrize("dtype, flagged", [("fp16", True), ("bf16", False)])
def test_a_reciprocal_of_eps_that_overflows_is_flagged_as_a_value(dtype, flagged):
    b = IRBuilder()
    var = b.op("ReduceMean", [b.input("x")], "mean", shape=(256, 1))
    inv = b.op("Reciprocal", [b.op("Add", [var, b.const("eps", [1e-6])], "add_eps")], "recip")
    b.output(b.op("MatMul", [b.op("Mul", [b.input("y"), inv], "scale"), b.input("w")], "mm"))
    result = _numerics(b, dtype, planner="all")
    assert ("recip_out" in result.output.tensors) is flagged
    assert b.graph.ops["scale"].eligible is not flagged  # it reads the overflowing value
    if flagged:
        assert "can reach 1e+06 (1/eps), beyond the FP16 range" in result.output.tensors["recip_out"]


@pytest.mark.parametrize("bounded_op", ["Softmax", "Tanh", "LayerNormalization"])
def test_deny_propagation_stops_at_ops_whose_output_is_bounded(bounded_op):
    b = IRBuilder()
    s = b.op("ReduceSum", [b.input("x")], "sum")  # deny: its range is unknown
    scaled = b.op("Mul", [s, b.input("k")], "scaled")  # infer fed by deny: tainted
    bounded = b.op(bounded_op, [scaled], "bounded")
    after = b.op("Add", [bounded, b.input("z")], "after")
    b.output(b.op("MatMul", [after, b.input("w")], "mm"))
    b.run(ClassifyPass(), NumericsPass(), PropagatePass(), planner="all", deny_propagation=True)
    ops = b.graph.ops
    assert not ops["scaled"].eligible and "downstream of deny op sum" in ops["scaled"].reason
    assert ops["bounded"].eligible and ops["after"].eligible
    b2 = IRBuilder()  # without the option nothing downstream of the deny op is tainted
    b2.output(b2.op("Mul", [b2.op("ReduceSum", [b2.input("x")], "sum"), b2.input("k")], "scaled"))
    b2.run(ClassifyPass(), NumericsPass(), PropagatePass(), planner="all", deny_propagation=False)
    assert b2.graph.ops["scaled"].eligible


@pytest.mark.parametrize("form", ["div_by_root", "mul_by_reciprocal", "mul_by_one_over_root", "other_numerator"])
def test_deny_propagation_stops_at_a_written_out_norms_result(form):
    b = IRBuilder()
    h = b.op("MatMul", [b.input("x"), b.input("w0")], "mm0")
    ms = b.op("ReduceMean", [b.op("Pow", [h, b.const("two", 2.0)], "pow")], "mean")  # infer; Pow is deny
    root = b.op("Sqrt", [b.op("Add", [ms, b.const("eps", 1e-3)], "add_eps")], "sqrt")
    if form == "mul_by_reciprocal":  # Llama: x * 1/sqrt(mean(x^2) + eps)
        normed = b.op("Mul", [h, b.op("Reciprocal", [root], "recip")], "norm")
    elif form == "mul_by_one_over_root":  # the TorchScript exporter's rsqrt: x * Div(1, sqrt(...))
        normed = b.op("Mul", [h, b.op("Div", [b.const("one", 1.0), root], "one_over")], "norm")
    else:  # T5: x / sqrt(mean(x^2) + eps); or some other value divided by that root (not bounded)
        normed = b.op("Div", [h if form == "div_by_root" else b.input("v"), root], "norm")
    b.output(b.op("MatMul", [b.op("Mul", [normed, b.input("gamma")], "scale"), b.input("w")], "mm"))
    b.run(ClassifyPass(), NumericsPass(), PropagatePass(), planner="all", deny_propagation=True)
    ops = b.graph.ops
    assert "downstream of deny op pow" in ops["sqrt"].reason  # the statistics stay FP32 (the mean is infer)
    bounded = form != "other_numerator"  # |x / rms(x)| <= sqrt(n), as LayerNormalization's output
    assert ops["norm"].eligible is bounded and ops["scale"].eligible is bounded
    if not bounded:
        assert "downstream of deny op pow" in ops["scale"].reason


@pytest.mark.parametrize("bounded", [True, False])
def test_trig_of_a_bounded_argument_may_go_low_and_of_an_unbounded_one_not(bounded):
    b = IRBuilder()
    h = b.op("MatMul", [b.input("x"), b.input("w")], "mm")
    arg = b.op("Tanh", [h], "squash") if bounded else b.op("Relu", [h], "relu")
    b.output(b.op("MatMul", [b.op("Sin", [arg], "sin"), b.input("w2")], "mm2"))
    result = _numerics(b, planner="all")
    assert ("sin" in result.output.ops) is not bounded
    assert b.graph.ops["sin"].eligible is bounded
    assert b.graph.ops["mm"].eligible  # activations feeding the argument are not position math


@pytest.mark.parametrize("dtype, spacing", [("fp16", "2"), ("bf16", "16")])
def test_position_times_frequency_stays_fp32_with_the_dtype_spacing(dtype, spacing):
    b = IRBuilder((2048, 32))
    pos = b.op("Cast", [b.input("pos", "int64")], "pos_float", dtype="float32")
    angle = b.op("Mul", [pos, b.const("inv_freq", np.ones((1, 32)))], "angle")
    b.output(b.op("MatMul", [b.op("Cos", [angle], "cos"), b.input("w")], "mm"))
    result = _numerics(b, dtype, planner="all")
    assert set(result.output.ops) == {"pos_float", "angle", "cos"}
    assert f"spacing near 2048 is {spacing}," in result.output.ops["cos"]
    assert b.graph.ops["mm"].eligible


def _tanh_gelu(exponent: float, into: str = "Tanh", extra_reader: bool = False) -> IRBuilder:
    """GELU's tanh form around MatMuls: x + 0.044715 x^p -> scale -> ``into``."""
    b = IRBuilder()
    x = b.op("MatMul", [b.input("x"), b.input("w")], "mm")
    cube = b.op("Pow", [x, b.const("p", [exponent])], "pow")
    inner = b.op("Add", [x, b.op("Mul", [cube, b.const("c", [0.044715])], "scale")], "shift")
    sat = b.op(into, [b.op("Mul", [inner, b.const("k", [0.7978845])], "gain")], "sat")
    out = b.op("MatMul", [b.op("Mul", [x, sat], "gate"), b.input("w2")], "mm2")
    b.output(out, *([cube] if extra_reader else []))
    return b


@pytest.mark.parametrize("exponent, into, extra_reader, safe", [
    (3.0, "Tanh", False, True),  # GELU's tanh form: an overflowing x^3 makes tanh +-1, as in FP32
    (2.0, "Sigmoid", False, True),
    (3.0, "Relu", False, False),  # Relu does not saturate: x^3 = inf would reach the output
    (3.0, "Tanh", True, False),  # the power itself is also a graph output
    (5.0, "Tanh", False, False),  # only small powers
])
def test_small_power_into_a_saturating_op_may_run_low(exponent, into, extra_reader, safe):
    b = _tanh_gelu(exponent, into, extra_reader)
    _numerics(b, planner="all")
    pow_op = b.graph.ops["pow"]
    assert (pow_op.op_class == "infer" and pow_op.eligible) is safe
    assert (pow_op.op_class == "deny") is not safe


def test_a_power_the_user_denies_stays_deny():
    b = _tanh_gelu(3.0)
    _numerics(b, planner="all", deny={"Pow"})
    assert b.graph.ops["pow"].op_class == "deny" and not b.graph.ops["pow"].eligible


def _tiny_weight_graph(scale: float, rescale: float | None = None):
    """x -> MatMul(w ~ scale) [-> Mul(rescale)] -> LayerNormalization -> MatMul."""
    b = IRBuilder()
    w = b.const("w", np.full((256, 256), scale))
    h = b.op("MatMul", [b.input("x"), w], "proj")
    if rescale is not None:
        h = b.op("Mul", [h, b.const("k", rescale)], "rescale")
    ln = b.op("LayerNormalization", [h, b.input("g"), b.input("beta")], "ln")
    b.output(b.op("MatMul", [ln, b.input("w2")], "out"))
    return b


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_tiny_weights_keep_their_products_fp32_until_a_rescale(dtype):
    # 2e-7: above FP16's smallest subnormal (rule 1 keeps the weight), yet x @ w ~ 2e-7 * sqrt(256) is subnormal
    b = _tiny_weight_graph(2e-7)
    result = _numerics(b, dtype, planner="all")
    ops = b.graph.ops
    if dtype == "bf16":  # BF16 has FP32's exponent range: nothing to flag
        assert not result.output.tensors and ops["proj"].eligible and ops["ln"].eligible
        return
    assert "w" not in result.output.tensors  # the constant itself is storable ...
    why = result.output.tensors["proj_out"]  # ... its product is not
    assert "constant w times O(1) activations" in why and "below the smallest FP16 normal" in why
    assert not ops["proj"].eligible and not ops["ln"].eligible and "constant w" in ops["ln"].reason
    assert ops["out"].eligible  # the normalised value is O(1) again
    rescaled = _tiny_weight_graph(2e-7, rescale=1e4)  # the rescale ends the walk: LayerNorm may go low
    flags = _numerics(rescaled, dtype, planner="all").output.tensors
    assert "proj_out" in flags and "rescale_out" not in flags
    assert rescaled.graph.ops["ln"].eligible and not rescaled.graph.ops["rescale"].eligible


def test_zero_and_ordinary_weights_flag_no_product():
    for scale in (0.0, 0.05):  # exact zeros (a pruned layer) stay exact; ordinary weights are O(1)
        b = _tiny_weight_graph(scale)
        assert "proj_out" not in _numerics(b, planner="all").output.tensors and b.graph.ops["ln"].eligible


def test_a_tiny_layer_scale_before_a_residual_add_flags_nothing():
    """ConvNeXt's layer scale (1e-6 at init) times O(1) is tiny, but only added to the residual stream:
    the lost digits lie below the sum's own spacing (as for the underflowing biases of rule 6)."""
    b = IRBuilder()
    x = b.input("x")
    h = b.op("MatMul", [x, b.input("w")], "pw")
    scaled = b.op("Mul", [h, b.const("gamma", np.full((256,), 1e-6))], "layer_scale")
    moved = b.op("Transpose", [scaled], "move")
    b.output(b.op("MatMul", [b.op("Add", [x, moved], "residual"), b.input("w2")], "next"))
    assert not _numerics(b, planner="all").output.tensors
    assert all(op.eligible for op in b.graph.ops.values())
