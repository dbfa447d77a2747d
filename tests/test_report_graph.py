"""The HTML report draws the plan: graph by precision with casts, time and memory charts."""

from __future__ import annotations

import html
import json
import re
import shutil
import struct
import subprocess

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from amp_compiler import convert_onnx
from amp_compiler.report import Report
from amp_compiler.report_charts import time_by_kind
from amp_compiler.report_graph import build, category, drawn, group_of, render
from amp_compiler.report_memory import MEMORY_KEYS, SCENARIOS, TOTAL_KEYS, predicted_memory
from benchmarks.synthetic import transformer_graph

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


@pytest.fixture(scope="module")
def synthetic():
    """A 16-block transformer (432 ops, Whisper-tiny's size), planned for an H100: FP16, FP32 islands, casts."""
    model = transformer_graph(400)
    return model, convert_onnx(model)[1]


def test_edges_follow_the_data_and_casts_sit_on_them(synthetic):
    model, report = synthetic
    d = build(report.data)
    ops = report.ops
    assert drawn(report.data) == list(range(len(ops)))  # every op of this model handles float data
    assert d.labels[:len(ops)] == [o["op_type"] for o in ops] and d.index[:len(ops)] == list(range(len(ops)))
    fed = {e.dst for e in d.edges}
    assert all(i in fed for i in range(len(ops)))  # every op reads an activation or the input
    for e in d.edges:
        assert d.xy[e.dst][1] > d.xy[e.src][1], "edges point down the page"
    inserted = [c for c in report.casts if c["inserted"]]
    readers = sum(1 for o in ops for t in o["inputs"] for c in inserted if t == c["output"])
    outputs = sum(1 for c in inserted for t in report.data["tensors"] if t.get("graph_output") and
                  t["name"] == c["output"])
    assert inserted and sum(1 for e in d.edges if e.cast) == readers + outputs
    for e in d.edges:
        if e.cast:  # the cast joins ops of different precision (or an I/O pseudo-node)
            src, dst = d.ops[e.src], d.ops[e.dst]
            assert e.cast["to"] == (dst["precision"] if dst else e.cast["to"])
            assert src is None or src["precision"] == e.cast["from"]


def test_colours_tell_rule_from_cost():
    assert category({"precision": "float16"}) == "fp16"
    assert category({"precision": "float32", "reason": "deny: reduction"}) == "fp32-rule"
    assert category({"precision": "float32", "reason": "infer: kept FP32 by the cost model: ..."}) == "fp32-cost"
    assert category({"precision": "float32", "class": "unknown"}) == "unknown"
    assert category({"precision": "n/a"}) == "none"


def test_module_groups_from_names_or_scopes():
    assert group_of({"name": "/encoder/layer.3/attention/self/MatMul"}) == "/encoder/layer.3"
    assert group_of({"name": "/pooler/dense/Gemm"}) == "/pooler/dense"
    assert group_of({"name": "node_MatMul_12"}) == ""
    assert group_of({"name": "x", "scope": "loop_body"}) == "loop_body"


def test_html_draws_every_op_escaped(synthetic):
    _, report = synthetic
    data = json.loads(report.to_json())
    data["ops"][0]["name"] = '<script>alert("x")</script>'
    page = Report(data).to_html()
    svg = re.search(r"<svg id=\"g-svg\".*?</svg>", page, re.S).group(0)
    assert svg.count('class="g-n ') == len(data["ops"])
    assert svg.count('class="g-castedge"') == sum(1 for e in build(data).edges if e.cast)
    assert "<script>alert" not in page and "&lt;script&gt;alert" in page
    assert 'id="g-time"' in page and 'id="g-mem"' in page


def test_old_reports_without_edges_still_render():
    data = {"schema_version": "1.0", "ops": [{"name": "a", "op_type": "MatMul", "precision": "float16"}]}
    assert "no edges" in render(data)
    assert "No memory prediction" in Report(data).to_html()


def _chain(n: int = 1000) -> onnx.ModelProto:
    """x -> MatMul(W) -> Relu -> out: two activations alive at once, one weight."""
    w = numpy_helper.from_array(np.full((n, n), 0.01, np.float32), "W")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"), helper.make_node("Relu", ["h"], ["y"], name="r")]
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, n])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, n])], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


def test_memory_is_in_the_summary_and_adds_up():
    _, report = convert_onnx(_chain(), planner="all")
    s = report.summary
    assert set(MEMORY_KEYS) <= set(s)
    assert s["predicted_memory_weights_fp32_bytes"] == 1000 * 1000 * 4
    assert s["predicted_memory_weights_all_fp16_bytes"] == s["predicted_memory_weights_mixed_bytes"] == 1000 * 1000 * 2
    act = 64 * 1000  # elements per activation; at most two alive at once (x and h, then h and y)
    assert s["predicted_memory_activations_fp32_bytes"] == 2 * act * 4
    assert s["predicted_memory_activations_all_fp16_bytes"] == 2 * act * 2
    # mixed: FP32 x, its FP16 copy and FP16 h alive at the MatMul (FP16 h, y and y's FP32 copy at the Relu)
    assert s["predicted_memory_activations_mixed_bytes"] == act * 4 + 2 * act * 2
    assert predicted_memory(report.data) == {k: s[k] for k in (*MEMORY_KEYS, *TOTAL_KEYS)}
    for scenario in SCENARIOS:  # one estimate: the totals are the split's sums
        assert s[f"predicted_memory_{scenario}_bytes"] == (s[f"predicted_memory_weights_{scenario}_bytes"]
                                                           + s[f"predicted_memory_activations_{scenario}_bytes"])


def test_a_view_shares_its_source_storage():
    """x -> MatMul -> Reshape -> Relu: the reshape holds no storage of its own, so h and y are
    the two activations alive at the Relu, and h lives until the Relu has read its view."""
    n = 1000
    w = numpy_helper.from_array(np.full((n, n), 0.01, np.float32), "W")
    shape = numpy_helper.from_array(np.array([64 * n], np.int64), "shape")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
             helper.make_node("Reshape", ["h", "shape"], ["v"], name="view"),
             helper.make_node("Relu", ["v"], ["y"], name="r")]
    g = helper.make_graph(nodes, "view", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, n])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64 * n])], [w, shape])
    _, report = convert_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), planner="all")
    s = report.summary
    assert s["predicted_memory_activations_fp32_bytes"] == 2 * 64 * n * 4  # a view counted would make it 3


def test_memory_of_a_report_without_float_tensors_is_zero():
    """An Identity over a sequence (ONNX's node suite): no float tensor, so no rows; the walk's
    empty arrays had been float64 and failed in numpy ("ufunc 'bitwise_and' not supported")."""
    ops = [{"name": "id", "inputs": ["seq"], "outputs": ["out"], "canonical": "identity"}]
    assert predicted_memory({"tensors": [], "ops": ops, "casts": []}) == {key: 0 for key in (*MEMORY_KEYS, *TOTAL_KEYS)}


@pytest.mark.parametrize("options", [{}, {"keep_io_types": False}, {"planner": "all", "keep_io_types": False}])
def test_a_view_returned_as_an_output_keeps_its_source_to_the_end(options):
    """x -> MatMul -> Reshape (graph output v) -> Relu -> Sigmoid: v is returned, so h (its storage)
    lives to the end, beside y and z; a read of v by the Relu had ended h there. With the default
    keep_io_types the FP16 plan returns v through a cast, which FP32 has not: there v_fp16 itself
    is returned (FP32 had counted 2 activations at the end, not 3)."""
    n = 1000
    w = numpy_helper.from_array(np.full((n, n), 0.01, np.float32), "W")
    shape = numpy_helper.from_array(np.array([64 * n], np.int64), "shape")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
             helper.make_node("Reshape", ["h", "shape"], ["v"], name="view"),
             helper.make_node("Relu", ["v"], ["y"], name="r"),
             helper.make_node("Sigmoid", ["y"], ["z"], name="s")]
    out = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [64 * n]) for name in ("v", "z")]
    g = helper.make_graph(nodes, "view", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, n])], out,
                          [w, shape])
    _, report = convert_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), **options)
    s = report.summary
    assert s["fp16_nodes"] == 4  # the plan every option set takes here
    assert s["predicted_memory_activations_fp32_bytes"] == 3 * 64 * n * 4  # h, y and z at the Sigmoid
    assert s["predicted_memory_activations_all_fp16_bytes"] == 3 * 64 * n * 2


def test_casts_of_the_source_model_count_in_every_scenario():
    """x -> Cast(FP16) -> Relu -> Cast(FP32) -> y: the model's own casts are ops, in FP32 and all-FP16 too."""
    nodes = [helper.make_node("Cast", ["x"], ["h"], name="c1", to=TensorProto.FLOAT16),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Cast", ["r"], ["y"], name="c2", to=TensorProto.FLOAT)]
    g = helper.make_graph(nodes, "casts", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1000])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1000])])
    _, report = convert_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]))
    assert {c["name"] for c in report.casts if not c["inserted"]} == {"c1", "c2"}
    assert [o["precision"] for o in report.ops] == ["float16", "float16", "float32"]
    assert not any(c["inserted"] for c in report.casts)
    s = report.summary  # two of x, h, r, y alive at once; x (4 bytes) lives only until c1 has read it
    assert s["predicted_memory_activations_fp32_bytes"] == 2 * 1000 * 4
    assert s["predicted_memory_activations_all_fp16_bytes"] == 2 * 1000 * 2
    assert s["predicted_memory_activations_mixed_bytes"] == 1000 * 4 + 1000 * 2


def test_time_chart_totals_match_the_summary(synthetic):
    _, report = synthetic
    kinds, casts = time_by_kind(report.data)
    mixed = sum(v["mixed"] for _, v in kinds) + casts
    assert mixed == pytest.approx(report.summary["predicted_time_mixed_s"])
    assert sum(v["fp32"] for _, v in kinds) == pytest.approx(sum(o["predicted_time_fp32_s"] for o in report.ops))
    assert casts > 0
    deny = {o["canonical"] for o in report.ops if o["class"] == "deny"}
    assert deny and all(v["low"] == v["fp32"] for k, v in kinds if k in deny)  # deny ops stay FP32 in all-low


def test_ops_without_float_data_are_listed_not_drawn():
    data = {"tensors": [{"name": "x", "dtype": "float32", "numel": 4, "kind": "input"},
                        {"name": "y", "dtype": "float32", "numel": 4, "kind": "activation", "graph_output": True}],
            "ops": [{"name": "shape", "op_type": "Shape", "inputs": ["x"], "outputs": ["s"]},
                    {"name": "gather", "op_type": "Gather", "inputs": ["s", "i"], "outputs": ["g"]},
                    {"name": "reshape", "op_type": "Reshape", "inputs": ["x", "g"], "outputs": ["y"]}]}
    d = build(data)
    assert d.index == [0, 2, -1, -1] and d.hidden == 1  # Shape reads x; Gather of ints is left out
    assert {(d.labels[e.src], d.labels[e.dst]) for e in d.edges} == {
        ("input: x", "Shape"), ("input: x", "Reshape"), ("Reshape", "output: y")}
    page = render(data)
    assert "1 ops without float data" in page and 'data-i="2"' in page and 'data-i="1"' not in page


def _relu_chain(n: int, name) -> list[dict]:
    return [{"name": name(i), "op_type": "Relu", "precision": "float16" if i % 3 else "float32", "reason": "deny: x",
             "inputs": [f"t{i}"], "outputs": [f"t{i + 1}"]} for i in range(n)]


def test_large_graphs_fold_module_groups_or_say_why_not():
    assert render({"ops": _relu_chain(50, str)}).count('class="g-n ') == 50
    assert "more than the 4,000" in render({"ops": _relu_chain(4001, str)})
    folded = {"ops": _relu_chain(4500, lambda i: f"/model/layers.{i // 100}/Relu_{i}")}
    d = build(folded)
    assert d.folded == 45 and len(d.ops) == 45
    assert [(e.src, e.dst) for e in d.edges] == [(k, k + 1) for k in range(44)]  # the chain, block to block
    assert {op["category"] for op in d.ops} == {"fp16"}  # two thirds of each block
    page = render(folded)
    assert page.count('class="g-n g-fp16" data-filter="/model/layers.') == 45 and "module groups is one box" in page


# ---- a real headless browser ---------------------------------------------------------------

PROBE = """<script>window.addEventListener("load",function(){var svg=document.getElementById("g-svg");
var nodes=svg.querySelectorAll(".g-n"),shown=0,fills={};nodes.forEach(function(g){var b=g.getBoundingClientRect();
if(b.width>0&&b.height>0)shown++;var f=getComputedStyle(g.querySelector("rect")).fill;fills[f]=(fills[f]||0)+1;});
var cast=svg.querySelector(".g-cast"),r=svg.getBoundingClientRect();
document.body.insertAdjacentHTML("beforeend","<pre id=probe>"+JSON.stringify({w:r.width,h:r.height,
nodes:nodes.length,shown:shown,fills:fills,casts:svg.querySelectorAll(".g-castedge").length,
castStroke:cast?getComputedStyle(cast).stroke:"",viewBox:svg.getAttribute("viewBox"),
tools:!document.querySelector(".g-tools").hidden,act:act()})+"</pre>");});
function act(){var svg=document.getElementById("g-svg"),box=document.getElementById("g-search"),
 nodes=svg.querySelectorAll(".g-n"),out={};
box.value="softmax";box.dispatchEvent(new Event("input"));out.hits=svg.querySelectorAll(".g-hit").length;
nodes[5].dispatchEvent(new MouseEvent("click"));out.clicked="op-"+nodes[5].dataset.i;
var sel=document.querySelector("tr.g-sel");out.selected=sel?sel.id:"";
document.getElementById("op-"+nodes[9].dataset.i).querySelector("td.name").click();out.tenth=nodes[9].id;
var focus=svg.querySelector(".g-focus");out.focused=focus?focus.id:"";
document.querySelector("[data-g=collapse]").click();out.collapsed=svg.querySelectorAll(".g-n.g-hide").length;
document.querySelector("[data-g=expand]").click();out.expanded=svg.querySelectorAll(".g-n.g-hide").length;
return out;}
</script>"""


def _browser() -> str:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    pytest.skip(f"no headless browser: none of {', '.join(BROWSERS)} is on PATH (apt-get install chromium)")


def _chrome(browser: str, *args: str) -> str:
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1280,1400",
           "--virtual-time-budget=5000", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True).stdout


def _rendered(tmp_path, report: Report, name: str) -> dict:
    """Open the report in the browser and read what it laid out and painted."""
    page = tmp_path / f"{name}.html"
    page.write_text(report.to_html().replace("</body>", PROBE + "</body>"), encoding="utf-8")
    dom = _chrome(_browser(), "--dump-dom", page.as_uri())
    return json.loads(html.unescape(re.search(r"<pre id=\"probe\">(.*?)</pre>", dom, re.S).group(1)))


def _check_drawn(seen: dict, report: Report) -> None:
    assert seen["w"] > 500 and seen["h"] > 500
    assert seen["nodes"] == seen["shown"] == len(drawn(report.data))  # every float op laid out with a size
    assert seen["tools"] and seen["viewBox"] != "0 0 0 0"  # the script ran (controls shown, view set)
    green, orange = "rgb(127, 211, 154)", "rgb(245, 163, 92)"  # FP16 and FP32-by-rule fills
    assert seen["fills"].get(green, 0) > 0 and seen["fills"].get(orange, 0) > 0
    assert seen["casts"] > 0 and seen["castStroke"] == "rgb(123, 63, 228)"
    act = seen["act"]  # search, click-to-row, collapse/expand, run by the probe in the page
    ops = [report.ops[i] for i in drawn(report.data)]
    assert act["hits"] == sum(1 for o in ops if "softmax" in (o["name"] + o["op_type"]).lower()) > 0
    assert act["selected"] == act["clicked"]  # graph -> table
    assert act["focused"] == act["tenth"]  # table -> graph
    grouped = {}
    for o in ops:
        grouped.setdefault(group_of(o), []).append(o)
    assert act["collapsed"] == sum(len(v) for k, v in grouped.items() if k and len(v) > 1)
    assert act["expanded"] == 0


def test_whisper_size_graph_is_drawn_in_chromium(tmp_path, synthetic):
    _, report = synthetic
    _check_drawn(_rendered(tmp_path, report, "synthetic"), report)
    shot = tmp_path / "shot.png"
    page = tmp_path / "plain.html"
    report.save(page)
    _chrome(_browser(), f"--screenshot={shot}", page.as_uri())
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", png[16:24]) == (1280, 1400)


def test_twelve_layer_bert_is_drawn_in_chromium(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    _browser()  # skip before the export when there is no browser
    cfg = transformers.BertConfig(num_hidden_layers=12, hidden_size=64, num_attention_heads=2, intermediate_size=128,
                                  vocab_size=512, max_position_embeddings=64)
    bert = transformers.BertModel(cfg).eval()

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = bert

        def forward(self, ids):
            return self.m(input_ids=ids).last_hidden_state

    path = tmp_path / "bert12.onnx"
    with torch.no_grad():  # the TorchScript exporter: 4x faster here, and names nodes by module path
        torch.onnx.export(Wrapped().eval(), (torch.randint(0, 512, (2, 16)),), str(path), dynamo=False,
                          opset_version=18, input_names=["ids"], output_names=["out"])
    # tiny widths are launch-bound (the cost model rightly keeps them FP32): plan every safe op in FP16,
    # Softmax denied as a user would, for FP32 islands and casts
    _, report = convert_onnx(str(path), planner="all", deny=["Softmax"])
    assert len(report.ops) > 400
    assert {group_of(o) for o in report.ops} >= {f"/m/encoder/layer.{i}" for i in range(12)}
    seen = _rendered(tmp_path, report, "bert")
    _check_drawn(seen, report)
    assert seen["act"]["collapsed"] > 12 * 30  # the twelve layers fold away
