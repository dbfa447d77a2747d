"""Rule 10 end to end: an additive attention mask filled with finfo(float32).min."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from amp_compiler import convert_onnx
from amp_compiler.validate import compare_outputs, run_reference

from .builders import fin, model, weight

S, D = 16, 32
FILL = float(np.finfo(np.float32).min)


def _masked_attention(mask_reader: str = "Softmax"):
    """q k^T / sqrt(d) + where(mask, 0, finfo.min) -> softmax -> v, as transformers' eager attention."""
    nodes = [
        helper.make_node("MatMul", ["x", "Wq"], ["q"], name="q_proj"),
        helper.make_node("Transpose", ["q"], ["qt"], name="qt", perm=[1, 0]),
        helper.make_node("MatMul", ["q", "qt"], ["raw_scores"], name="scores"),
        helper.make_node("Mul", ["raw_scores", "scale"], ["scores"], name="scale"),  # 1/sqrt(d): not rule 13's
        helper.make_node("Where", ["keep", "zero", "fill"], ["bias"], name="mask_fill"),
        helper.make_node("Add", ["scores", "bias"], ["masked"], name="mask_add"),
        helper.make_node(mask_reader, ["masked"], ["probs"], name="softmax"),
        helper.make_node("MatMul", ["probs", "x"], ["ctx"], name="context"),
        helper.make_node("MatMul", ["ctx", "Wo"], ["y"], name="out_proj"),
    ]
    inits = [weight("Wq", D, D, scale=0.2), weight("Wo", D, D, scale=0.2),
             numpy_helper.from_array(np.array(0.0, dtype=np.float32), "zero"),
             numpy_helper.from_array(np.array(D ** -0.5, dtype=np.float32), "scale"),
             numpy_helper.from_array(np.array(FILL, dtype=np.float32), "fill")]
    return model(nodes, [fin("x", S, D), fin("keep", S, S, dtype=TensorProto.BOOL)], [fin("y", S, D)], inits)


def _with_fill_in_a_constant_node(m):
    """The fill as a Constant node, as the TorchScript exporter writes it, instead of an initializer."""
    init = next(i for i in m.graph.initializer if i.name == "fill")
    m.graph.initializer.remove(init)
    m.graph.node.insert(0, helper.make_node("Constant", [], ["fill"], name="fill_const", value=init))
    return m


def test_a_mask_fill_in_a_constant_node_is_stored_saturated_and_runs_low():
    """Gemma-2 exported with the TorchScript exporter kept its mask Add and Softmax, and so its
    attention, FP32: rule 10 read initializers only."""
    m = _with_fill_in_a_constant_node(_masked_attention())
    converted, report = convert_onnx(m)  # defaults
    ops = {o["name"]: o for o in report.ops}
    assert all(ops[n]["precision"] == "float16" for n in ("mask_add", "softmax", "scores", "context")), ops
    assert "fill" in report.summary["saturated_constants"]
    stored = next(numpy_helper.to_array(n.attribute[0].t) for n in converted.graph.node if n.op_type == "Constant")
    assert float(stored) == -32768.0
    assert float(numpy_helper.to_array(m.graph.node[0].attribute[0].t)) == FILL  # the input model as it was
    rng = np.random.default_rng(0)
    keep = rng.random((S, S)) < 0.7
    keep[3] = False  # a fully masked row stays finite
    feeds = {"x": rng.standard_normal((S, D)).astype(np.float32), "keep": keep}
    ref, low = run_reference(m, feeds), run_reference(converted, feeds)
    rows = np.arange(S) != 3
    assert np.isfinite(low[0]).all()
    assert compare_outputs(["y"], [ref[0][rows]], [low[0][rows]])[0]["max_rel_error"] < 1e-2


def _fill_value(m) -> float:
    return float(numpy_helper.to_array(next(i for i in m.graph.initializer if i.name == "fill")))


@pytest.mark.parametrize("dtype, bound", [("fp16", 32768.0), ("bf16", None)])
def test_mask_fill_is_stored_saturated_and_the_mask_path_runs_low(dtype, bound):
    m = _masked_attention()
    converted, report = convert_onnx(m, planner="all", dtype=dtype)
    ops = {o["name"]: o for o in report.ops}
    assert ops["mask_add"]["precision"] != "float32" and ops["softmax"]["precision"] != "float32"
    saturated = report.summary.get("saturated_constants", {})
    if bound is None:  # BF16 holds 3.39e38 but not finfo(float32).min: clamped to BF16's max
        assert "fill" in saturated
    else:
        assert "fill" in saturated and "32768" in saturated["fill"]
        assert -bound <= min(float(numpy_helper.to_array(i).min()) for i in converted.graph.initializer
                             if i.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16))
    assert _fill_value(m) == FILL  # the input model is left as it was


def test_a_mask_whose_path_stays_fp32_keeps_its_exact_value():
    m = _masked_attention()
    converted, report = convert_onnx(m, deny=("MatMul",))  # nothing tensor-core runs FP16: all FP32
    assert "saturated_constants" not in report.summary
    assert _fill_value(converted) == FILL


@pytest.mark.parametrize("options", [{}, {"planner": "all"}], ids=["defaults", "all"])
def test_a_fully_masked_row_stays_finite_and_matches_fp32(options):
    m = _masked_attention()
    converted, _ = convert_onnx(m, **options)
    rng = np.random.default_rng(0)
    keep = rng.random((S, S)) < 0.7
    keep[3] = False  # a fully masked row: -inf fills would make it NaN
    feeds = {"x": rng.standard_normal((S, D)).astype(np.float32), "keep": keep}
    ref, low = run_reference(m, feeds), run_reference(converted, feeds)
    assert np.isfinite(low[0]).all()
    rows = np.arange(S) != 3  # (FP32's fully masked row is a uniform average: no row to match)
    assert compare_outputs(["y"], [ref[0][rows]], [low[0][rows]])[0]["max_rel_error"] < 1e-2


def test_a_fully_masked_row_is_the_uniform_average_fp32_gives():
    """Scores well below 2^-12 of the stored fill (FP16: 8) round back to it when added: the fully
    masked row's softmax is uniform, as FP32's -3.4e38 makes it (a fill off a power of two, 16376,
    turned the scores' noise into a near one-hot row: error 2.9 on the torture set's mask_1e9)."""
    m = _masked_attention()
    rng = np.random.default_rng(3)  # weights of its own: the shared builder RNG depends on test order
    for init, scale in zip(m.graph.initializer[:2], (0.06, 0.2)):  # row 3 scores up to 4.8: below 8, above
        init.CopyFrom(numpy_helper.from_array((rng.standard_normal((D, D)) * scale).astype(np.float32), init.name))
    converted, _ = convert_onnx(m, planner="all")  # the 4 that 16376 absorbed
    keep = np.random.default_rng(1).random((S, S)) < 0.7
    keep[3] = False
    feeds = {"x": np.random.default_rng(2).standard_normal((S, D)).astype(np.float32), "keep": keep}
    ref, low = run_reference(m, feeds)[0], run_reference(converted, feeds)[0]
    assert compare_outputs(["y"], [ref], [low])[0]["max_rel_error"] < 1e-2  # row 3 included


def test_a_fill_that_reaches_anything_but_a_softmax_keeps_its_readers_fp32():
    m = _masked_attention(mask_reader="Relu")
    _, report = convert_onnx(m, planner="all")
    ops = {o["name"]: o for o in report.ops}
    assert "saturated_constants" not in report.summary
    assert ops["mask_add"]["precision"] == "float32" and "beyond the FP16 range" in ops["mask_add"]["reason"]


def _with_a_fully_masked_row_guard(m, test: str):
    """SDPA's decomposition after the softmax: rows whose masked scores are all -inf get zeros,
    asked with Equal(masked, -inf) (or IsInf(masked)) -> Not -> Where(.., probs, 0)."""
    nodes = list(m.graph.node)
    softmax = next(i for i, n in enumerate(nodes) if n.name == "softmax")
    inputs = ["masked", "neg_inf"] if test == "Equal" else ["masked"]
    guard = [helper.make_node(test, inputs, ["is_inf"], name="inf_test"),
             helper.make_node("Not", ["is_inf"], ["finite"], name="finite"),
             helper.make_node("Where", ["finite", "probs", "zero"], ["guarded"], name="guard")]
    context = next(n for n in nodes if n.name == "context")
    context.input[0] = "guarded"
    del m.graph.node[:]
    m.graph.node.extend(nodes[:softmax + 1] + guard + nodes[softmax + 1:])
    m.graph.initializer.append(numpy_helper.from_array(np.array(-np.inf, dtype=np.float32), "neg_inf"))
    return m


@pytest.mark.parametrize("test", ["Equal", "IsInf"])
def test_a_test_of_the_masked_scores_for_infinity_does_not_keep_the_mask_fp32(test):
    """Asking whether a masked score is infinite gets the same answer for the fill stored clamped
    as for finfo.min (both finite): such a reader does not stop rule 10. A T5's attention on the torch
    path (SDPA decomposed, with that guard) kept its mask Add and Softmax FP32 in every layer."""
    m = _with_a_fully_masked_row_guard(_masked_attention(), test)
    converted, report = convert_onnx(m, planner="all")
    ops = {o["name"]: o["precision"] for o in report.ops}
    assert ops["mask_fill"] == ops["mask_add"] == ops["softmax"] == "float16", ops
    default = {o["name"]: o["reason"] for o in convert_onnx(m).report.ops}  # default planner: no rule holds it
    assert not any("beyond" in default[name] for name in ("mask_fill", "mask_add", "softmax")), default
    assert "fill" in report.summary["saturated_constants"]
    rng = np.random.default_rng(0)
    keep = rng.random((S, S)) < 0.7
    keep[3] = False  # a fully masked row: finite in both, so the guard keeps it
    feeds = {"x": rng.standard_normal((S, D)).astype(np.float32), "keep": keep}
    ref, low = run_reference(m, feeds)[0], run_reference(converted, feeds)[0]
    rows = np.arange(S) != 3  # (row 3 matches only for scores below 8: see the uniform-average test)
    assert np.isfinite(low).all() and compare_outputs(["y"], [ref[rows]], [low[rows]])[0]["max_rel_error"] < 1e-2


def test_a_comparison_with_a_finite_threshold_still_keeps_the_mask_fp32():
    """Only a test against infinity reads a clamped fill as finfo.min: ``masked == -1e30`` would not."""
    m = _with_a_fully_masked_row_guard(_masked_attention(), "Equal")
    threshold = next(i for i in m.graph.initializer if i.name == "neg_inf")
    threshold.CopyFrom(numpy_helper.from_array(np.array(-1e30, dtype=np.float32), "neg_inf"))
    _, report = convert_onnx(m, planner="all")
    ops = {o["name"]: o["precision"] for o in report.ops}
    assert ops["mask_add"] == ops["softmax"] == "float32", ops
    default = {o["name"]: o for o in convert_onnx(m).report.ops}  # default planner: held by the same rule
    assert default["mask_add"]["precision"] == "float32" and "beyond" in default["mask_add"]["reason"]


def test_a_mask_fill_in_a_scalar_argument_runs_low_on_the_torch_path():
    """``scores.masked_fill(~mask, finfo.min)`` (DeBERTa, GPT-Neo): the fill is an FX scalar
    argument, not a constant. It only masks the softmax, so the masked_fill and softmax run FP16
    with the fill written as -32768 (before: both kept FP32, two cast kernels around them, and the
    small model stayed FP32 by cost); a fully masked row stays finite, the uniform average."""
    torch = pytest.importorskip("torch")
    import amp_compiler

    class Attention(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q, self.o = torch.nn.Linear(D, D), torch.nn.Linear(D, D)

        def forward(self, x, mask):
            q = self.q(x)
            scores = (q @ q.transpose(-1, -2) / 8).masked_fill(~mask.bool()[:, None, :], FILL)
            return self.o(torch.softmax(scores, -1) @ q)

    torch.manual_seed(0)
    m, x = Attention().eval(), torch.randn(2, S, D)
    mask = torch.ones(2, S, dtype=torch.long)
    mask[1] = 0  # a fully masked sequence
    compiled = amp_compiler.compile(m, example_kwargs={"x": x, "mask": mask})
    s = compiled.report.summary
    assert s["fp16_gemm_flop_fraction"] == 1.0 and "-3.4e+38" in next(iter(s["saturated_constants"].values()))
    assert {o["precision"] for o in compiled.report.ops if o["op_type"] == "aten._softmax.default"} == {"float16"}
    assert f"{-2.0 ** 15}" in compiled.code and "-3.4028234663852886e+38" not in compiled.code
    with torch.no_grad():
        ref, out = m(x, mask), compiled(x, mask)
    assert torch.isfinite(out).all() and float((ref - out).abs().max() / ref.abs().max()) < 1e-2


def test_a_relative_position_mask_through_sdpa_runs_low_on_the_torch_path():
    """T5's attention: a position bias masked with ``where(mask, bias, finfo.min)`` handed to
    ``scaled_dot_product_attention`` as a float mask. Core aten's decomposition of SDPA asks
    ``eq(scores + mask, -inf)`` to zero fully masked rows; that test had stopped rule 10, so the
    mask's where, Add and Softmax stayed FP32 (an mT5 at 8x512: 57 % of its GEMM FLOPs FP16, now 92 %)."""
    torch = pytest.importorskip("torch")
    import amp_compiler

    class RelativeAttention(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv, self.o = torch.nn.Linear(D, 3 * D), torch.nn.Linear(D, D)
            self.bias = torch.nn.Embedding(2 * S, 1)

        def forward(self, x, mask):
            q, k, v = self.qkv(x).unsqueeze(1).chunk(3, -1)
            pos = torch.arange(x.shape[1])
            bias = self.bias(pos[None, :] - pos[:, None] + S)[..., 0]
            keep = mask.bool()[:, None, None, :]
            bias = torch.where(keep, bias, torch.finfo(torch.float32).min)
            return self.o(torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)[:, 0])

    torch.manual_seed(0)
    m, x = RelativeAttention().eval(), torch.randn(2, S, D)
    mask = torch.ones(2, S, dtype=torch.long)
    mask[1, S // 2:] = 0
    compiled = amp_compiler.compile(m, example_kwargs={"x": x, "mask": mask})
    report = compiled.report
    assert any(o["op_type"] == "aten.eq.Scalar" for o in report.ops)  # the guard this is about
    softmax = {o["precision"] for o in report.ops if o["op_type"] == "aten._softmax.default"}
    assert softmax == {"float16"} and report.summary.get("saturated_constants"), report.summary
    with torch.no_grad():
        ref, out = m(x, mask), compiled(x, mask)
    assert torch.isfinite(out).all() and float((ref - out).abs().max() / ref.abs().max()) < 1e-2


@pytest.mark.parametrize("planner", ["optimal", "all"], ids=["defaults", "all"])
def test_calibration_does_not_flag_what_a_clamped_fill_flows_into(planner):
    """Calibration runs the FP32 model, where the mask holds finfo.min: rule 3 flagged the Where
    and the Add into the softmax (3.4e38 "beyond FP16"), and with --calibrate a dynamo GPT-NeoX,
    StableLM and Speech2Text were planned all FP32, though the converted model stores the fill
    clamped. Scores that overflow on their own are still flagged."""
    m = _masked_attention()
    rng = np.random.default_rng(0)
    keep = rng.random((S, S)) < 0.7
    feeds = {"x": rng.standard_normal((S, D)).astype(np.float32), "keep": keep}
    options = {} if planner == "optimal" else {"planner": planner}
    _, report = convert_onnx(m, calibration_inputs=feeds, **options)
    ops = {o["name"]: o["precision"] for o in report.ops}
    assert ops["mask_fill"] == ops["mask_add"] == ops["softmax"] == "float16", ops
    assert "fill" in report.summary["saturated_constants"]
    loud = {"x": feeds["x"] * 300, "keep": keep}  # scores of ~1e6: beyond FP16 before any mask
    _, report = convert_onnx(m, calibration_inputs=loud, **options)
    ops = {o["name"]: o["precision"] for o in report.ops}
    assert ops["scores"] == ops["mask_add"] == ops["softmax"] == "float32", ops
