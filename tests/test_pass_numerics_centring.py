"""Rule 12: a mean subtracted from the values it averages stays FP32; other means are infer."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

import passes.numerics as numerics
from amp_compiler import convert_onnx
from amp_compiler.validate import compare_outputs, run_reference
from passes import ClassifyPass, NumericsPass, PropagatePass

from .builders import IRBuilder, fin, model, weight

N, D = 32, 64


def _layer_norm(b: IRBuilder, x: str, between: str | None = None) -> str:
    """x - mean(x) -> Pow -> ReduceMean -> Add eps -> Sqrt -> Div, the mean optionally passed
    through a data-movement op (``between``) before the Sub."""
    mu = b.op("ReduceMean", [x], "mean", shape=(256, 1))
    if between:
        mu = b.op(between, [mu], "move", shape=(256, 1))
    d = b.op("Sub", [x, mu], "centre")
    var = b.op("ReduceMean", [b.op("Pow", [d, b.const("two", [2.0])], "pow")], "var", shape=(256, 1))
    root = b.op("Sqrt", [b.op("Add", [var, b.const("eps", [1e-5])], "add_eps")], "sqrt")
    return b.op("Div", [d, root], "norm")


def _plan(b: IRBuilder, dtype: str = "fp16"):
    return b.run(ClassifyPass(), NumericsPass(), PropagatePass(), dtype=dtype, planner="all",
                 deny_propagation=False)[1]


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("between", [None, "Unsqueeze", "Cast"])
def test_centring_mean_and_its_sub_stay_fp32_and_say_why(dtype, between):
    b = IRBuilder()
    h = b.op("MatMul", [b.input("x"), b.input("w0")], "mm0")
    b.output(b.op("MatMul", [_layer_norm(b, h, between), b.input("w")], "mm"))
    flagged = _plan(b, dtype).output.ops
    ops = b.graph.ops
    kept = ["mean", "centre"] + (["move"] if between else [])
    for name in kept:
        assert not ops[name].eligible and ops[name].precision == "float32"
        assert "centring (x - mean(x)): centre subtracts this mean" in flagged[name]
        assert ops[name].reason.endswith(flagged[name])
    assert ops["mm0"].eligible and ops["mm"].eligible and ops["norm"].eligible


def test_centring_is_found_through_a_reshape_of_the_averaged_values():
    """GroupNorm written out: the Sub reads the reshaped values the mean averaged."""
    b = IRBuilder()
    grouped = b.op("Reshape", [b.op("MatMul", [b.input("x"), b.input("w0")], "mm0")], "group")
    mu = b.op("ReduceMean", [grouped], "mean", shape=(256, 1))
    b.output(b.op("Sub", [b.op("Reshape", [grouped], "again"), mu], "centre"))
    assert {"mean", "centre"} <= set(_plan(b).output.ops)


@pytest.mark.parametrize("reader", ["Mul", "MatMul", "Sub_other"])
def test_pooling_and_squeeze_excitation_means_stay_infer(reader):
    """A mean scaling its input (squeeze-excitation), feeding a GEMM (mean over tokens) or
    subtracted from values it did not average is no centring: it goes FP16."""
    b = IRBuilder()
    h = b.op("MatMul", [b.input("x"), b.input("w0")], "mm0")
    mu = b.op("ReduceMean", [h], "mean", shape=(256, 1))
    if reader == "Mul":
        out = b.op("Mul", [h, b.op("Sigmoid", [mu], "gate")], "excite")
    elif reader == "MatMul":
        out = b.op("MatMul", [mu, b.input("w1")], "head")
    else:
        out = b.op("Sub", [b.input("v"), mu], "shift")
    b.output(b.op("MatMul", [out, b.input("w")], "mm"))
    assert _plan(b).output.ops == {}
    assert b.graph.ops["mean"].op_class == "infer" and b.graph.ops["mean"].eligible


def _layer_norm_model():
    """Input (FP32) -> written-out LayerNorm -> MatMul: the centring runs on the source values."""
    mk = helper.make_node
    nodes = [mk("ReduceMean", ["x", "axes"], ["mu"], name="mean", keepdims=1), mk("Sub", ["x", "mu"], ["d"], name="sub"),
             mk("Pow", ["d", "two"], ["d2"], name="pow"), mk("ReduceMean", ["d2", "axes"], ["var"], name="var", keepdims=1),
             mk("Add", ["var", "eps"], ["vare"], name="add_eps"), mk("Sqrt", ["vare"], ["std"], name="sqrt"),
             mk("Div", ["d", "std"], ["n"], name="div"), mk("MatMul", ["n", "W"], ["y"], name="proj")]
    consts = [weight("W", D, D), numpy_helper.from_array(np.float32(2.0), "two"),
              numpy_helper.from_array(np.float32(1e-5), "eps"), numpy_helper.from_array(np.array([-1], np.int64), "axes")]
    return model(nodes, [fin("x", N, D)], [fin("y", N, D)], consts)


def test_layer_norm_of_offset_values_holds_with_the_rule_and_not_without(monkeypatch):
    """Values 1000 +- 1: FP16's spacing near 1000 is 0.5, so an FP16 centring loses the deviations;
    the rule keeps it FP32 and the FP16 GEMM after the norm holds (GPU-like emulation)."""
    m = _layer_norm_model()
    feeds = {"x": (1000 + np.random.default_rng(0).standard_normal((N, D))).astype(np.float32)}
    ref = run_reference(m, feeds)

    def error(converted):
        return compare_outputs(["y"], ref, run_reference(converted, feeds))[0]["max_rel_error"]

    converted, report = convert_onnx(m, planner="all")
    ops = {o["name"]: o for o in report.ops}
    assert ops["mean"]["precision"] == ops["sub"]["precision"] == "float32"
    assert ops["proj"]["precision"] == "float16"
    assert error(converted) < 5e-3
    by_default, default_report = convert_onnx(m)  # what a user gets: the same centring, within tolerance
    defaults = {o["name"]: o for o in default_report.ops}
    assert defaults["mean"]["precision"] == defaults["sub"]["precision"] == "float32"
    assert error(by_default) < 5e-3
    monkeypatch.setattr(numerics, "centrings", lambda *args: {})
    unguarded, _ = convert_onnx(m, planner="all")
    assert error(unguarded) > 0.1


def test_the_torch_path_keeps_the_same_centring_fp32():
    """aten mean/sub: the centring mean and Sub FP32, the eps chain's mean FP32 (rule 8), a gate's mean FP16."""
    torch = pytest.importorskip("torch")
    import amp_compiler

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(D, D), torch.nn.Linear(D, D)

        def forward(self, x):
            h = self.a(x)
            d = h - h.mean(-1, keepdim=True)
            normed = d / torch.sqrt((d * d).mean(-1, keepdim=True) + 1e-5)
            return self.b(normed) + torch.sigmoid(h.mean(-1, keepdim=True)) * h

    report = amp_compiler.compile(Block().eval(), (torch.randn(N, D),), planner="all").report
    ops = {o["name"]: o for o in report.ops}
    assert [ops[n]["precision"] for n in ("aten.mean", "aten.sub", "aten.mean#2", "aten.mean#3")] == \
        ["float32", "float32", "float32", "float16"]
    assert "centring (x - mean(x))" in ops["aten.mean"]["reason"] and "plus eps" in ops["aten.mean#2"]["reason"]
