"""The report's reason texts: casts at a Loop/If subgraph's boundary are named as such, not as graph
I/O casts, and op names are written as op types only where a rule's reason quotes them
(``passes/explain.py``, ``amp_compiler/plan_report.py``; docs/architecture.md, "Report")."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from amp_compiler.onnx_api import convert_onnx
from passes import ClassifyPass, NumericsPass
from passes.explain import _named_apart

from .builders import IRBuilder, fin, model, plan, rms_norm_stack, weight

H = 64


def _loop(around: bool = True, states: int = 1):
    """``x = tanh(x @ wl)`` three times in a Loop, for each of ``states`` loop-carried values, the
    first's steps also scanned out; ``around``: a GEMM before and after the Loop (the graph's input
    and output border GEMMs), else the graph's input and outputs are the Loop's own."""
    xs = [f"x{j}" for j in range(states)] if states > 1 else ["x"]
    body_nodes = [helper.make_node("Identity", ["cond_in"], ["cond_out"], name="cond")]
    for x in xs:
        body_nodes += [helper.make_node("MatMul", [f"{x}_in", "wl"], [f"{x}m"], name=f"loop_mm_{x}"),
                       helper.make_node("Tanh", [f"{x}m"], [f"{x}_out"], name=f"loop_tanh_{x}")]
    body_nodes.append(helper.make_node("Identity", [f"{xs[0]}_out"], ["scan_out"], name="scan"))
    body = helper.make_graph(
        body_nodes, "body",
        [fin("i", dtype=TensorProto.INT64), fin("cond_in", dtype=TensorProto.BOOL),
         *(fin(f"{x}_in", "batch", H) for x in xs)],
        [fin("cond_out", dtype=TensorProto.BOOL), *(fin(f"{x}_out", "batch", H) for x in xs),
         fin("scan_out", "batch", H)])
    outs = ["xf"] if around else [f"output{j}" if states > 1 else "output" for j in range(states)]
    nodes = [helper.make_node("Loop", ["trip", "cond"] + (["x0"] if around else ["input"] * states),
                              [*outs, "scans"], body=body, name="loop0")]
    if around:
        nodes = [helper.make_node("MatMul", ["input", "w0"], ["x0"], name="mm0"), *nodes,
                 helper.make_node("MatMul", ["xf", "w3"], ["output"], name="mm3")]
        outs = ["output"]
    inits = [weight("w0", H, H), weight("wl", H, H, scale=0.2), weight("w3", H, H),
             numpy_helper.from_array(np.array(3, np.int64), "trip"), numpy_helper.from_array(np.array(True), "cond")]
    return model(nodes, [fin("input", "batch", H)], [*(fin(o, "batch", H) for o in outs), fin("scans", 3, "batch", H)],
                 inits, opset=17)


def test_loop_casts_are_counted_at_its_boundaries_and_only_graph_io_casts_advise_no_keep_io_types():
    """A Loop model with 1 input and 2 outputs read "its casts: 7 at graph inputs/outputs" and
    "--no-keep-io-types (7 I/O casts)": 5 of them are at the Loop's boundaries, which that option
    leaves as they are."""
    summary = convert_onnx(_loop())[1].summary
    why = summary["fp32_tensor_core_why"].splitlines()
    assert why[2] == ("its casts: 5 at subgraph boundaries of 1 Loop (declared types, which no option changes), "
                      "2 at graph inputs/outputs"), why
    assert "--no-keep-io-types (2 I/O casts)" in why[-1], why
    # the advice holds: without the 2 I/O casts the plan converts
    assert convert_onnx(_loop(), keep_io_types=False)[1].summary["fp16_gemm_flop_fraction"] > \
        summary["fp16_gemm_flop_fraction"]


def test_casts_only_at_a_loops_boundaries_advise_no_io_option():
    """The graph's input and outputs are the Loop's: every cast is at its body's declared types,
    none at graph inputs/outputs, and no option about those is advised."""
    why = convert_onnx(_loop(around=False, states=3))[1].summary["fp32_tensor_core_why"]
    assert "its casts: 7 at subgraph boundaries of 1 Loop (declared types" in why, why
    assert "graph inputs/outputs" not in why and "--no-keep-io-types" not in why, why


@pytest.mark.parametrize("keep_io_types", [True, False])
def test_casts_at_a_loop_body_boundary_say_so_not_keep_io_types(keep_io_types):
    """Under --no-keep-io-types the cast of the body's input had said "graph input keeps its dtype
    (keep_io_types)"."""
    # planner 'all': three iterations of a 64-wide GEMM do not pay for their casts by cost
    report = convert_onnx(_loop(around=False), keep_io_types=keep_io_types, planner="all")[1]
    reasons = {c["tensor"]: c["reason"] for c in report.casts}
    assert reasons["x_in"].startswith("subgraph input keeps its declared type (Loop loop0)"), reasons
    assert any(r.startswith("subgraph output keeps its declared type (Loop loop0)") for r in reasons.values()), reasons
    assert not any("keep_io_types" in r for r in reasons.values()), reasons


def _if():
    """A GEMM, then an If whose branches each run a GEMM on it, then a GEMM; the condition is a
    reduction of the input (FP32 by rule)."""
    def branch(name: str, w: str):
        return helper.make_graph([helper.make_node("MatMul", ["x", w], [f"{name}_y"], name=f"{name}_mm"),
                                  helper.make_node("Relu", [f"{name}_y"], [f"{name}_out"], name=f"{name}_relu")],
                                 name, [], [fin(f"{name}_out", "batch", H)])
    nodes = [helper.make_node("MatMul", ["input", "w0"], ["x"], name="mm0"),
             helper.make_node("ReduceSum", ["input"], ["s"], keepdims=0, name="rs"),
             helper.make_node("ReduceSum", ["s"], ["s2"], keepdims=0, name="rs2"),
             helper.make_node("Greater", ["s2", "zero"], ["c"], name="gt"),
             helper.make_node("If", ["c"], ["y"], then_branch=branch("then", "w1"), else_branch=branch("else", "w2"),
                              name="if0"),
             helper.make_node("MatMul", ["y", "w3"], ["output"], name="mm3")]
    inits = [weight(f"w{i}", H, H) for i in range(4)] + [numpy_helper.from_array(np.array(0, np.float32), "zero")]
    return model(nodes, [fin("input", "batch", H)], [fin("output", "batch", H)], inits, opset=17)


def test_if_branch_outputs_are_subgraph_boundaries_and_no_cast_claims_keep_io_types_when_it_is_off():
    # defaults: each branch costs half a run (cost_model/repeats.py), and the near-tie rule converts
    # every GEMM of the 8-row graph, with nothing to explain
    summary = convert_onnx(_if())[1].summary
    assert summary["fp16_gemm_flop_fraction"] == 1.0 and not summary["fp32_tensor_core_why"], summary
    # at 64 rows (defaults otherwise) one GEMM stays FP32: the why-line counts the If's boundary casts
    # apart from the one at the graph's inputs/outputs, and advises dropping only that one
    why = convert_onnx(_if(), dim_values={"batch": 64})[1].summary["fp32_tensor_core_why"]
    assert "3 at subgraph boundaries of 1 If (declared types, which no option changes), 1 at graph inputs/outputs" \
        in why, why
    assert "--no-keep-io-types (1 I/O casts)" in why, why
    # the fastest plan of the 8-row graph keeps every GEMM FP32 and counts the same way
    why = convert_onnx(_if(), objective="fastest")[1].summary["fp32_tensor_core_why"]
    assert "3 at subgraph boundaries of 1 If (declared types, which no option changes), 1 at graph inputs/outputs" \
        in why, why
    reasons = {c["tensor"]: c["reason"] for c in convert_onnx(_if(), keep_io_types=False)[1].casts}
    # the input stays FP32 for the reduction, cast for the GEMM: read by it, not kept by the option that is off
    assert reasons["input"] == "read by mm0", reasons
    assert sum(r.startswith("subgraph output keeps its declared type (If if0)") for r in reasons.values()) == 2, reasons


# -- names in reasons ------------------------------------------------------------------------------

def _norm_mlp(sub: str, mean: str):
    """opset 11's written-out LayerNorm between two GEMMs (its mean and Sub FP32 by the centring
    rule), the Sub named ``sub`` and the mean ``mean``; the other nodes take op-type words too."""
    nodes = [helper.make_node("MatMul", ["input", "w0"], ["y"], name="matmul"),
             helper.make_node("Add", ["y", "b0"], ["yb"], name="Add"),
             helper.make_node("ReduceMean", ["yb"], ["mu"], axes=[-1], name=mean),
             helper.make_node("Sub", ["yb", "mu"], ["d"], name=sub),
             helper.make_node("Mul", ["d", "d"], ["d2"], name="mul"),
             helper.make_node("ReduceMean", ["d2"], ["var"], axes=[-1], name="ReduceMean"),
             helper.make_node("Add", ["var", "eps"], ["ve"], name="add"),
             helper.make_node("Sqrt", ["ve"], ["sd"], name="Sqrt"),
             helper.make_node("Div", ["d", "sd"], ["n"], name="div"),
             helper.make_node("MatMul", ["n", "w1"], ["output"], name="MatMul")]
    inits = [weight("w0", H, H), weight("b0", H), numpy_helper.from_array(np.array(1e-5, np.float32), "eps"),
             weight("w1", H, H)]
    return model(nodes, [fin("input", "batch", "sequence", H)], [fin("output", "batch", "sequence", H)], inits,
                 opset=11)


_CENTRING = ("centring (x - mean(x)): its Sub subtracts this mean from the values it averages; the error of "
             "rounding the mean to FP16's 11 bits stays whole in a difference far smaller than the mean")


@pytest.mark.parametrize("sub, mean", [("sub", "rm"), ("Sub", "rm"), ("subtracts", "rm"), ("its", "rm"),
                                       ("sub", "mean"), ("centre", "mean")])
def test_a_sub_named_like_an_op_or_a_word_reads_as_its_sub_once(sub, mean):
    """A Sub named "sub" read "its Sub its Subtracts this mean": every occurrence of the name in
    the reason, within words too, had been replaced by the op's type (and a mean named "mean" read
    "centring (x - its ReduceMean(x))"). The other nodes are named add, mul, matmul, MatMul, Sqrt..."""
    why = convert_onnx(_norm_mlp(sub, mean))[1].summary["fp32_tensor_core_why"]
    held = next(line for line in why.splitlines() if line.startswith("held FP32 by: "))
    assert held.startswith(f"held FP32 by: {_CENTRING} (2 ops)"), held


def test_each_rule_quoting_an_op_names_it_by_type_and_nothing_else():
    """Two instances of each rule that quotes op names, named with op-type words two ways, read as
    one text; the rule's own words (a trig op's type, "mean") are left alone."""
    b = IRBuilder()
    x = b.input("x")
    for mean, sub in (("mean", "sub"), ("ReduceMean", "Sub")):  # numerics rule 12
        b.output(b.op("Sub", [x, b.op("ReduceMean", [x], mean, shape=(256, 1))], sub))
    for scores, probs in (("matmul", "softmax"), ("MatMul", "Softmax")):  # rule 13
        w = np.full((256, 256), 0.01, np.float32)
        q = b.op("MatMul", [x, b.const(f"{scores}_wq", w)], f"{scores}_q")
        k = b.op("Transpose", [b.op("MatMul", [x, b.const(f"{scores}_wk", w)], f"{scores}_k")], f"{scores}_kt")
        masked = b.op("Add", [b.op("MatMul", [q, k], scores), b.input(f"{scores}_mask")], f"{scores}_masked")
        b.output(b.op("Softmax", [masked], probs))
    for name in ("mul", "Mul"):  # rule 2: a scalar argument beyond FP16's range
        b.output(b.op("Mul", [x], name, scalars=(1e6,)))
    pos = b.input("pos", "int64")
    for angle, sin in (("angle", "Sin"), ("Mul", "sin")):  # rule 7: the argument of a Sin of positions
        cast = b.op("Cast", [pos], f"{sin}_cast", dtype="float32")
        b.output(b.op("Sin", [b.op("Mul", [cast, b.const(f"{sin}_f", [0.5])], f"{angle}_")], sin))
    for mean, inv in (("sq_mean", "reciprocal"), ("Reciprocal_mean", "Reciprocal")):  # rule 8: 1/eps overflows
        ve = b.op("Add", [b.op("ReduceMean", [x], mean, shape=(256, 1)), b.const(f"{inv}_eps", [1e-6])], f"{inv}_add")
        b.output(b.op("Reciprocal", [ve], inv))
    flags = b.run(ClassifyPass(), NumericsPass(), dtype="fp16")[1].output
    texts = lambda *names: {_named_apart(b.graph, flags.ops[n]) for n in names}  # noqa: E731
    assert texts("mean", "sub", "ReduceMean", "Sub") == {_CENTRING}
    assert texts("matmul", "softmax", "MatMul", "Softmax") == {
        "unscaled attention scores: its MatMul's product of two activations reaches its Softmax with no 1/sqrt(d) "
        "scale on the way and no normalisation in front, so the scores grow with the activations and can pass "
        "FP16's max 65504 (HF's GPT-Neo computes these in FP32)"}
    assert texts("mul", "Mul") == {"its Mul: argument 1e+06 is beyond the FP16 range"}
    assert texts("Sin", "sin") == {"Sin of an unbounded argument: FP16's spacing near 2048 is 2, so the angle is lost"}
    assert texts("angle_", "Mul_") == {"computes the argument of its Sin: FP16's spacing near 2048 is 2, so the angle "
                                       "is lost"}
    overflows = {_named_apart(b.graph, flags.tensors[f"{n}_out"]) for n in ("reciprocal", "Reciprocal")}
    assert overflows == {"its Reciprocal can reach 1e+06 (1/eps), beyond the FP16 range"}


def _held(report, name: str) -> tuple[str, str]:
    op = next(o for o in report.ops if o["name"] == name)
    return op["precision"], op["reason"]


def test_a_torchscript_rms_norms_reciprocal_div_is_held_by_the_eps_rule_not_deny_propagation():
    """TorchScript writes ``torch.rsqrt`` as ``Div(1, Sqrt(mean(x^2) + eps))``: that Div had been reported
    "downstream of deny op ... Pow", though what it reads is at least sqrt(eps); the eps rule holds it,
    as it holds an Rsqrt (``numerics_chains.eps_chains``). The plan is the same."""
    _, report = plan(rms_norm_stack(blocks=2, torchscript=True))
    precision, reason = _held(report, "b0_rsqrt")
    assert precision == "float32", reason
    assert "of a reduction plus eps 1e-06" in reason and "downstream of deny" not in reason, reason


def test_a_torchscript_rms_norms_reciprocal_of_a_tiny_eps_is_flagged_beyond_fp16():
    """eps 1e-12: 1/sqrt(eps) = 1e6, beyond FP16. An Rsqrt's output was flagged so; the TorchScript
    ``Div(1, s)`` was not, and the normalising ``Mul(x, r)`` could read r as inf (0 * inf = NaN)."""
    _, report = plan(rms_norm_stack(blocks=2, torchscript=True, eps=1e-12))
    precision, reason = _held(report, "b0_norm")
    assert precision == "float32" and "b0_rsqrt can reach 1e+06" in reason, reason


def test_torch_normalize_is_held_by_its_flushed_eps_and_a_tiny_layer_norm_eps_holds_nothing():
    """``F.normalize``'s ``x / clamp_min(norm, 1e-12)`` on the torch path: the Div had been reported held by
    deny propagation from the norm (its output is at most 1); the clamp's minimum flushes to zero in FP16,
    as the ONNX path says of the same minimum stored as a constant. A LayerNorm's eps of 1e-12 (BERT's),
    also a scalar argument, is no clamp minimum: the rule leaves it alone."""
    import torch
    import torch.nn.functional as F

    import amp_compiler

    class Normalized(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.ln = torch.nn.Linear(H, H), torch.nn.Linear(H, H), torch.nn.LayerNorm(H, eps=1e-12)

        def forward(self, x):
            return self.b(self.ln(F.normalize(self.a(x), dim=-1)))

    report = amp_compiler.compile(Normalized().eval(), (torch.randn(8, H),)).report
    divs = [o for o in report.ops if "aten.div" in o["name"]]
    assert divs and all(o["precision"] == "float32" for o in divs), divs
    assert all("argument min=1e-12 is below the smallest FP16 subnormal" in o["reason"] for o in divs), divs
    norms = [o for o in report.ops if "layer_norm" in o["name"]]
    assert norms and not any("subnormal" in o["reason"] for o in norms), norms
