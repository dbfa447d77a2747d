"""The report describes the emitted graph: its cast count equals the casts the emitter wrote."""

from __future__ import annotations

import onnx
import pytest
from onnx import helper

from amp_compiler import convert_onnx

from .builders import fin, model, nodes_of, weight

torch = pytest.importorskip("torch")


def test_onnx_report_counts_exactly_the_cast_nodes_added_to_the_model():
    d = 1024
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"], name="mm1"),
             helper.make_node("ReduceMean", ["h"], ["m"], name="mean", keepdims=1),
             helper.make_node("Sub", ["h", "m"], ["c"], name="center"),
             helper.make_node("MatMul", ["c", "W2"], ["y"], name="mm2")]
    m = model(nodes, [fin("x", d, d)], [fin("y", d, d)], [weight("W1", d, d), weight("W2", d, d)])
    converted, report = convert_onnx(m, target="a100")
    source = {n.name for n in m.graph.node}
    added = [n for n in nodes_of(converted, "Cast") if n.name not in source]
    assert added, "the plan should need casts around the FP32 reduction"
    assert report.summary["inserted_casts"] == len(added)
    assert sorted(c["name"] for c in report.casts if c["inserted"]) == sorted(n.name for n in added)
    onnx.checker.check_model(converted)


class _LayerNormNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.norm, self.b = torch.nn.Linear(64, 64), torch.nn.LayerNorm(64), torch.nn.Linear(64, 10)

    def forward(self, x):
        return self.b(self.norm(self.a(x)))


def test_fx_report_counts_the_casts_the_emitter_adds_for_kernel_dtypes():
    """CPU ``native_layer_norm`` returns FP16 statistics for an FP16 input where the plan has FP32:
    the emitter's casts for them go through the IR, so the report counts every inserted cast node."""
    import amp_compiler

    torch.manual_seed(0)
    net = _LayerNormNet()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    batch = (torch.randn(32, 64), torch.randint(0, 10, (32,)))
    step = amp_compiler.compile_training(net, torch.nn.functional.cross_entropy, opt, batch, planner="all")
    inserted = [n for n in step.graph_module.graph.nodes if n.meta.get("amp_inserted")]
    by_emitter = [c for c in step.report.casts if "FX emitter" in c["reason"]]
    assert by_emitter, "expected casts for native_layer_norm's statistics"
    assert step.report.summary["inserted_casts"] == len(inserted)
    assert all(c["from"] == "float16" and c["to"] == "float32" for c in by_emitter)
