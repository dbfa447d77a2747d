"""Cases found by the field sweep on the ONNX path (models and options the other tests do not name)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from amp_compiler import convert_onnx

from .builders import fin, model, plan_result, weight
from .test_kv_cache import _kv_decoder, merged_decoder


def test_a_merged_decoder_is_priced_as_one_branch_runs_not_both():
    """An ``If`` runs one of its branches: a merged decoder (the same step in both) was predicted at
    twice its step's time, FP32 and mixed, since each branch was priced once (``cost_model/repeats.py``)."""
    step = convert_onnx(_kv_decoder())[1].summary
    merged = convert_onnx(merged_decoder(_kv_decoder()))[1].summary
    for key in ("predicted_time_fp32_s", "predicted_time_mixed_s"):
        assert merged[key] == pytest.approx(step[key], rel=0.05), key


def _grn_block(channels: int = 96, side: int = 56) -> onnx.ModelProto:
    """A ConvNeXt-V2 block's MLP around its GRN (``Gx = ||x||`` over the pixels, ``Nx = Gx / (mean_c(Gx) +
    eps)``, ``gamma * (x * Nx) + beta + x``), channels last as transformers writes it."""
    c, wide = channels, 4 * channels
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="pwconv1"),
        helper.make_node("ReduceL2", ["h", "spatial"], ["gx"], name="grn_norm", keepdims=1),
        helper.make_node("ReduceMean", ["gx", "last"], ["gx_mean"], name="grn_mean", keepdims=1),
        helper.make_node("Add", ["gx_mean", "eps"], ["gx_mean_eps"], name="grn_eps"),
        helper.make_node("Div", ["gx", "gx_mean_eps"], ["nx"], name="grn_ratio"),
        helper.make_node("Mul", ["h", "nx"], ["hn"], name="grn_apply"),
        helper.make_node("Mul", ["gamma", "hn"], ["scaled"], name="grn_gamma"),
        helper.make_node("Add", ["scaled", "beta"], ["shifted"], name="grn_beta"),
        helper.make_node("Add", ["shifted", "h"], ["grn_out"], name="grn_residual"),
        helper.make_node("MatMul", ["grn_out", "w2"], ["y"], name="pwconv2"),
    ]
    inits = [weight("w1", c, wide), weight("w2", wide, c), weight("gamma", wide), weight("beta", wide),
             numpy_helper.from_array(np.array([1, 2], np.int64), "spatial"),
             numpy_helper.from_array(np.array([-1], np.int64), "last"),
             numpy_helper.from_array(np.array(1e-6, np.float32), "eps")]
    return model(nodes, [fin("x", 8, side, side, c)], [fin("y", 8, side, side, c)], inits)


def test_a_grn_ratio_to_its_own_mean_stops_deny_propagation_and_the_block_runs_fp16():
    """ConvNeXt-V2 (transformers' default config, 224², batch 1) planned 1.00x its FP32 time against
    0.88x for all-FP16: deny propagation from each GRN's ReduceL2 kept ``x * Nx`` and the residual
    after it FP32 (full-size activations, casts on both sides). ``Nx``, a non-negative value over its
    own mean, is at most the number of values averaged: the walk stops there as at a norm."""
    result = plan_result(_grn_block())
    precision = {name: op.precision for name, op in result.graph.ops.items()}
    assert precision["grn_norm"] == "float32"  # the sum of squares still may overflow FP16
    for name in ("pwconv1", "grn_apply", "grn_gamma", "grn_beta", "grn_residual", "pwconv2"):
        assert precision[name] == "float16", (name, precision)
    assert result.costs.prediction.mixed_s < 0.95 * result.costs.prediction.fp32_s


def _sdpa_as_torchscript_writes_it(d: int = 64) -> onnx.ModelProto:
    """``F.scaled_dot_product_attention(q, k, v)`` without ``scale=``, as the TorchScript exporter writes
    it (Falcon's attention): the scale ``1/sqrt(d)`` computed from ``q``'s shape, its square root
    multiplied into q and into k transposed, then the scores' MatMul and Softmax."""
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q"], name="q_proj"),
        helper.make_node("MatMul", ["x", "wk"], ["k"], name="k_proj"),
        helper.make_node("MatMul", ["x", "wv"], ["v"], name="v_proj"),
        helper.make_node("Shape", ["q"], ["q_shape"], name="shape"),
        helper.make_node("Slice", ["q_shape", "minus1", "end"], ["d_int"], name="last_dim"),
        helper.make_node("Cast", ["d_int"], ["d_float"], name="d_float", to=onnx.TensorProto.FLOAT),
        helper.make_node("Sqrt", ["d_float"], ["sqrt_d"], name="sqrt_d"),
        helper.make_node("Div", ["one", "sqrt_d"], ["scale"], name="scale"),
        helper.make_node("Cast", ["scale"], ["scale_f"], name="scale_cast", to=onnx.TensorProto.FLOAT),
        helper.make_node("Sqrt", ["scale_f"], ["sqrt_scale"], name="sqrt_scale"),
        helper.make_node("Mul", ["q", "sqrt_scale"], ["q_scaled"], name="q_scaled"),
        helper.make_node("Transpose", ["k"], ["kt"], name="kt", perm=[0, 2, 1]),
        helper.make_node("Mul", ["kt", "sqrt_scale"], ["kt_scaled"], name="kt_scaled"),
        helper.make_node("MatMul", ["q_scaled", "kt_scaled"], ["scores"], name="scores"),
        helper.make_node("Softmax", ["scores"], ["probs"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["probs", "v"], ["y"], name="context"),
    ]
    inits = [weight("wq", d, d), weight("wk", d, d), weight("wv", d, d),
             numpy_helper.from_array(np.array([-1], np.int64), "minus1"),
             numpy_helper.from_array(np.array([2**62], np.int64), "end"),
             numpy_helper.from_array(np.array(1.0, np.float32), "one")]
    return model(nodes, [fin("x", 8, 256, d)], [fin("y", 8, 256, d)], inits)


def test_attention_scaled_by_a_factor_computed_from_a_shape_is_not_held_fp32_as_unscaled():
    """A Falcon exported by the TorchScript exporter kept its scores' MatMul FP32 as "unscaled attention
    scores" (and, with the casts around it, the whole model by cost): its ``1/sqrt(d)`` is computed from
    ``Shape(q)``, which the rule took for an activation's value rather than a static one."""
    result = plan_result(_sdpa_as_torchscript_writes_it())
    scores = result.graph.ops["scores"]
    assert "unscaled attention scores" not in (scores.reason or ""), scores.reason
    assert scores.precision == "float16"


def _cosine_attention(scale_max: float | None, tokens: int = 64, d: int = 32) -> onnx.ModelProto:
    """SwinV2's cosine attention as the TorchScript exporter writes it: scores of the L2-normalised q and
    k (here already normalised), times ``exp(clamp(logit_scale, max=scale_max))`` (no Clip where
    ``scale_max`` is None), plus a bias, softmax, times v."""
    scale_in = "logit_scale"
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q"], name="q_proj"),
             helper.make_node("MatMul", ["x", "wk"], ["k"], name="k_proj"),
             helper.make_node("MatMul", ["x", "wv"], ["v"], name="v_proj"),
             helper.make_node("Transpose", ["k"], ["kt"], name="kt", perm=[1, 0]),
             helper.make_node("MatMul", ["q", "kt"], ["scores"], name="scores")]
    if scale_max is not None:
        nodes.append(helper.make_node("Clip", ["logit_scale", "", "scale_max"], ["clipped"], name="clip"))
        scale_in = "clipped"
    nodes += [helper.make_node("Exp", [scale_in], ["scale"], name="exp"),
              helper.make_node("Mul", ["scores", "scale"], ["scaled"], name="scale_scores"),
              helper.make_node("Add", ["scaled", "bias"], ["biased"], name="add_bias"),
              helper.make_node("Softmax", ["biased"], ["probs"], name="softmax", axis=-1),
              helper.make_node("MatMul", ["probs", "v"], ["y"], name="context")]
    inits = [weight("wq", d, d), weight("wk", d, d), weight("wv", d, d), weight("bias", tokens, tokens),
             numpy_helper.from_array(np.array([np.log(10.0)], np.float32), "logit_scale"),
             numpy_helper.from_array(np.array(scale_max or 0.0, np.float32), "scale_max")]
    return model(nodes, [fin("x", tokens, d)], [fin("y", tokens, d)], inits)


def test_an_exp_of_a_clamped_constant_seeds_no_deny_propagation():
    """SwinV2 scales its cosine-attention scores by ``clamp(logit_scale, max=log(100)).exp()``, at most
    100: deny propagation from that Exp had held every block's scores ``Mul`` and ``Add``s FP32 as "of
    unknown range" (a default SwinV2-tiny: 39 ops, 40 casts). Its argument's bound makes the range known,
    as a frozen constant's value does (CLIP's ``logit_scale.exp()``); the Exp itself stays FP32. An Exp
    the bound does not keep within FP16 still seeds the walk."""
    def precisions(scale_max):
        graph = plan_result(_cosine_attention(scale_max), planner="all").graph
        return {name: (op.precision, op.reason) for name, op in graph.ops.items()}

    for scale_max in (np.log(100.0), None):  # clamped; the constant log(10) itself
        bounded = precisions(scale_max)
        assert bounded["exp"][0] == "float32"
        for name in ("scale_scores", "add_bias"):
            assert bounded[name][0] == "float16", (scale_max, name, bounded[name])
    held = precisions(12.0)  # exp(12) > 65504
    assert held["scale_scores"][0] == "float32" and "downstream of deny op exp" in held["scale_scores"][1]
    for scale_max, seeds in ((np.log(100.0), False), (12.0, True)):  # default options: the same walk
        ops = plan_result(_cosine_attention(scale_max)).graph.ops
        assert ("downstream of deny op exp" in ops["scale_scores"].reason) == seeds, ops["scale_scores"].reason
