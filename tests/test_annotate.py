"""Each converted node carries its decision in metadata_props (IR >= 10) or doc_string."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from amp_compiler import convert_onnx
from amp_compiler.cli import main
from amp_compiler.onnx_io.annotate import PREFIX, annotate_model, annotated_fraction, walk_nodes
from amp_compiler.report_graph import group_of
from benchmarks.synthetic import transformer_graph

from .builders import fin, model, weight


def _model(ir_version: int) -> onnx.ModelProto:
    m = transformer_graph(48, hidden=64, seq=8, batch=2)
    m.ir_version = ir_version
    m.graph.node[0].doc_string = "written by the exporter"
    return m


def _meta(node: onnx.NodeProto) -> dict[str, str]:
    return {p.key[len(PREFIX):]: p.value for p in node.metadata_props if p.key.startswith(PREFIX)}


@pytest.mark.parametrize("ir_version", [9, 10])
@pytest.mark.parametrize("options", [{}, {"planner": "all"}], ids=["default", "all"])  # 'all': FP16 ops and casts
def test_nodes_carry_their_decision_and_the_model_still_checks_and_runs(ir_version, options):
    out, report = convert_onnx(_model(ir_version), **options)
    assert annotated_fraction(out) >= 0.9
    onnx.checker.check_model(out, full_check=True)
    sess = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"])
    y = sess.run(None, {"x": np.ones((2, 8, 64), np.float32)})[0]
    assert np.isfinite(y).all()
    ops = {o["outputs"][0]: o for o in report.ops if o["outputs"]}
    for node in out.graph.node:
        op = ops.get(node.output[0])
        if op is None:
            continue
        if ir_version >= 10:
            assert _meta(node) == {"precision": op["precision"], "class": op["class"], "reason": op["reason"]}
        else:
            assert f"precision={op['precision']}; class={op['class']}; reason={op['reason']}" in node.doc_string
    first = _model(ir_version).graph.node[0].name
    kept = next(n for n in out.graph.node if n.name == first)
    assert kept.doc_string.startswith("written by the exporter")  # a source doc string survives


def test_nodes_inside_subgraphs_are_annotated_too():
    branch = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["b_mm"], name="then_mm"),
                                helper.make_node("Relu", ["b_mm"], ["b_out"], name="then_relu")], "then", [],
                               [fin("b_out", 16, 16)])
    other = helper.make_graph([helper.make_node("Sigmoid", ["x"], ["e_out"], name="else_sig")], "else", [],
                              [fin("e_out", 16, 16)])
    nodes = [helper.make_node("If", ["cond"], ["z"], name="branch", then_branch=branch, else_branch=other),
             helper.make_node("MatMul", ["z", "W"], ["y"], name="after")]
    m = model(nodes, [fin("cond", dtype=TensorProto.BOOL), fin("x", 16, 16)], [fin("y", 16, 16)],
              [weight("W", 16, 16)])
    m.ir_version = 10
    out, _ = convert_onnx(m, planner="all")
    onnx.checker.check_model(out, full_check=True)
    inner = [n for n in walk_nodes(out.graph) if n.name in ("then_mm", "then_relu", "else_sig")]
    assert len(inner) == 3 and all(_meta(n)["precision"] == "float16" for n in inner)
    assert annotated_fraction(out) >= 0.9


def test_the_exporters_module_paths_reach_the_report():
    m = _model(10)
    for k, node in enumerate(m.graph.node):  # what torch's dynamo exporter writes on every node
        entry = node.metadata_props.add()
        entry.key, entry.value = "pkg.torch.onnx.name_scopes", str(["", "m", f"m.layers.{k // 24}", f"op{k}"])
    _, report = convert_onnx(m)
    assert [o.get("module") for o in report.ops] == [f"m.layers.{k // 24}" for k in range(len(m.graph.node))]
    assert {group_of(o) for o in report.ops} == {f"m.layers.{k}" for k in range((len(m.graph.node) + 23) // 24)}
    m.graph.node[0].metadata_props[0].value = "not a list literal ["
    _, report = convert_onnx(m)
    assert "module" not in report.ops[0] and report.ops[1]["module"] == "m.layers.0"


def test_inserted_casts_say_which_edge_they_serve():
    out, report = convert_onnx(_model(10), planner="all")
    inserted = [c for c in report.casts if c["inserted"]]
    assert inserted
    nodes = {n.output[0]: n for n in out.graph.node}
    for cast in inserted:
        node = nodes[cast["output"]]
        readers = [n.name for n in out.graph.node if cast["output"] in n.input]
        meta = _meta(node)
        assert meta["class"] == "inserted cast"
        assert meta["cast"].startswith(f"{cast['from']} -> {cast['to']} on {cast['tensor']} -> ")
        assert all(r in meta["cast"] for r in readers)


def test_annotating_twice_replaces_rather_than_repeats():
    out, report = convert_onnx(_model(9), planner="all")
    before = [n.doc_string for n in out.graph.node]
    annotate_model(out, report)
    assert [n.doc_string for n in out.graph.node] == before
    out10, report10 = convert_onnx(_model(10), planner="all")
    counts = [len(n.metadata_props) for n in out10.graph.node]
    annotate_model(out10, report10)
    assert [len(n.metadata_props) for n in out10.graph.node] == counts


def test_annotation_can_be_turned_off(tmp_path):
    plain, _ = convert_onnx(_model(10), annotate=False)
    assert annotated_fraction(plain) == 0.0
    src = tmp_path / "m.onnx"
    onnx.save(_model(10), src)
    assert main([str(src), "-o", str(tmp_path / "off.onnx"), "-q", "--no-annotate"]) == 0
    assert main([str(src), "-o", str(tmp_path / "on.onnx"), "-q"]) == 0
    off, on = onnx.load(tmp_path / "off.onnx"), onnx.load(tmp_path / "on.onnx")
    assert annotated_fraction(off) == 0.0 and annotated_fraction(on) >= 0.9
    assert off.ByteSize() < on.ByteSize()
