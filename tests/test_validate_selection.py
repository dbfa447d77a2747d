"""Outputs chosen by TopK/ArgMax indices over near-tied scores (``onnx_io/selection.py``): a YOLO-style
head failed ``--validate`` at relative error 0.9 on boxes whose scores agreed to 2e-5, and
``--fallback`` moved every Conv to FP32 chasing the reorder."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from amp_compiler import convert_onnx
from amp_compiler.fallback import convert_with_fallback
from amp_compiler.onnx_io.selection import index_selected_outputs
from amp_compiler.validate import validate

from .builders import fin, model

N, K = 16, 4


def _detector(nudge: float = 0.0, box_scale: float = 1.0, argmax: bool = False):
    """scores = x @ W (+ ``nudge`` on candidate 1: a converted model's rounding), the top K (or the
    ArgMax) of them, and the rows of a box table at those indices (scaled by ``box_scale``)."""
    w = np.eye(N, dtype=np.float32)
    boxes = np.arange(N * 4, dtype=np.float32).reshape(N, 4) * box_scale
    bump = np.zeros(N, np.float32)
    bump[1] = nudge
    nodes = [helper.make_node("MatMul", ["x", "W"], ["raw"], name="score_head"),
             helper.make_node("Add", ["raw", "bump"], ["scores"], name="rounding")]
    if argmax:
        nodes += [helper.make_node("ArgMax", ["scores"], ["idx"], name="best", axis=1, keepdims=0),
                  helper.make_node("Gather", ["boxes", "idx"], ["picked"], name="pick", axis=0),
                  helper.make_node("Identity", ["scores"], ["top"], name="keep_scores")]
    else:
        nodes += [helper.make_node("TopK", ["scores", "k"], ["top", "idx"], name="topk", axis=1),
                  helper.make_node("Gather", ["boxes", "idx"], ["picked"], name="pick", axis=0)]
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(bump, "bump"),
             numpy_helper.from_array(boxes, "boxes"), numpy_helper.from_array(np.array([K], np.int64), "k")]
    picked = fin("picked", 1, 4) if argmax else fin("picked", 1, K, 4)
    return model(nodes, [fin("x", 1, N)], [fin("top", 1, N if argmax else K), picked], inits)


def _feeds(tied: bool):
    x = np.linspace(1.0, 0.1, N, dtype=np.float32)[None]
    if tied:
        x[0, 1] = x[0, 0]  # the two best candidates tie in FP32
    return {"x": x}


def test_the_outputs_an_index_chooses_are_found():
    assert {name: sel.op_type for name, sel in index_selected_outputs(_detector()).items()} == {"picked": "TopK"}
    assert index_selected_outputs(_detector(argmax=True))["picked"].op_type == "ArgMax"


@pytest.mark.parametrize("argmax", [False, True])
def test_a_reorder_of_tied_scores_is_not_counted_against_the_conversion(argmax):
    result = validate(_detector(argmax=argmax), _detector(1e-4, argmax=argmax), _feeds(tied=True), 1e-2)
    rows = {row["name"]: row for row in result["outputs"]}
    assert rows["picked"]["max_rel_error"] > 0.01  # the tie went the other way: other boxes
    assert rows["picked"]["counted"] is False
    assert rows["picked"]["note"].startswith(f"chosen by {'ArgMax' if argmax else 'TopK'} ")
    assert "tie within 0 of their magnitude" in rows["picked"]["note"]
    assert result["passed"] and result["max_rel_error"] < 1e-3  # the scores themselves agree


def test_a_determined_selection_or_wrong_values_still_fail():
    """Scores 0.06 apart do not reorder under a 1e-4 nudge: the output is compared (and passes);
    boxes that are wrong at the right indices fail, tie or no tie."""
    result = validate(_detector(), _detector(1e-4), _feeds(tied=False), 1e-2)
    assert result["passed"] and all(row.get("counted", True) for row in result["outputs"])
    wrong = validate(_detector(), _detector(0.0, box_scale=1.5), _feeds(tied=False), 1e-2)
    assert not wrong["passed"] and "note" not in {row["name"]: row for row in wrong["outputs"]}["picked"]


def test_fallback_does_not_chase_a_reorder_of_tied_scores():
    """The converted model's scores differ by a nudge no op can be moved to undo: the fallback had
    moved op after op, then failed."""
    converted = lambda deny_nodes: convert_onnx(_detector(1e-4), deny_nodes=deny_nodes)  # noqa: E731
    result, moved = convert_with_fallback(converted, _detector(), _feeds(tied=True), 1e-2)
    assert moved == []
    assert list(result.report.data["fallback"]["not_counted"]) == ["picked"]
