"""A Loop or Scan body costs what its iterations cost: the cost model weighs its ops and casts by how
many times one run of the model runs it (``cost_model/repeats.py``), read from the file where it says."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.builders import fin, growing_loop, model, plan_result, weight
from amp_compiler.onnx_io.importer import import_model  # noqa: E402  isort: skip
from cost_model.repeats import scope_repeats  # noqa: E402  isort: skip
from passes.costs import OpTimer  # noqa: E402  isort: skip


def _body_share(m, **options):
    """(predicted FP32 seconds of the whole model, of the body's ops alone) as the planner prices them."""
    result = plan_result(m, **options)
    timer, graph = result.costs.timer, result.graph
    body = sum(timer.time(op, "float32") for op in graph.ops.values() if op.scope and op.has_unit_ports
               and not op.inserted)
    return result.costs.prediction.fp32_s, body


def _m_as_constant_node(trips: int):
    """``growing_loop`` with its trip count made by a ``Constant`` node instead of an initializer."""
    m = growing_loop(trips)
    init = next(i for i in m.graph.initializer if i.name == "trips")
    m.graph.initializer.remove(init)
    m.graph.node.insert(0, helper.make_node("Constant", [], ["trips"], name="trip_count",
                                            value=numpy_helper.from_array(np.array(trips, np.int64))))
    return m


def test_a_constant_trip_count_is_read_from_an_initializer_or_a_constant_node():
    assert import_model(growing_loop(5)).graph.trip_counts == {"loop0": 5}
    assert import_model(_m_as_constant_node(7)).graph.trip_counts == {"loop0": 7}


def test_the_body_costs_its_trip_count_times_its_one_iteration():
    total_1, body_1 = _body_share(growing_loop(1))
    total_10, body_10 = _body_share(growing_loop(10))
    assert body_10 == pytest.approx(10 * body_1) and body_1 > 0
    assert total_10 - total_1 == pytest.approx(9 * body_1)  # the main graph's ops cost the same


def test_a_trip_count_given_at_run_time_is_priced_at_the_default_dim():
    m = growing_loop(3)
    init = next(i for i in m.graph.initializer if i.name == "trips")
    m.graph.initializer.remove(init)
    m.graph.input.append(helper.make_tensor_value_info("trips", TensorProto.INT64, []))
    graph = import_model(m).graph
    assert graph.trip_counts == {}
    graph.set_dim_sizes(5)
    assert scope_repeats(graph) == {"loop0.body": 5}
    _, body_default = _body_share(m, default_dim=5)
    _, body_known = _body_share(growing_loop(5), default_dim=5)
    assert body_default == pytest.approx(body_known)


def _scan(length: int, nested_trips: int | None = None):
    """A Scan over ``length`` rows of ``xs`` [length, 4, 64] whose body multiplies each row by ``W``
    (inside a Loop of ``nested_trips`` iterations, where given)."""
    body = helper.make_graph(
        [helper.make_node("MatMul", ["row", "W"], ["mm"], name="scan_mm"),
         helper.make_node("Add", ["acc_in", "mm"], ["acc_out"], name="scan_add"),
         helper.make_node("Identity", ["mm"], ["ys"], name="scan_y")],
        "scan_body", [fin("acc_in", 4, 64), fin("row", 4, 64)], [fin("acc_out", 4, 64), fin("ys", 4, 64)])
    scan = helper.make_node("Scan", ["acc0", "xs"], ["acc", "ys_all"], name="scan0", body=body, num_scan_inputs=1)
    outputs = [fin("acc", 4, 64)]
    nodes = [scan]
    if nested_trips is not None:
        loop_body = helper.make_graph(
            [scan, helper.make_node("Identity", ["cond_in"], ["cond_out"], name="c")], "loop_body",
            [fin("i", dtype=TensorProto.INT64), fin("cond_in", dtype=TensorProto.BOOL), fin("acc0", 4, 64)],
            [fin("cond_out", dtype=TensorProto.BOOL), fin("acc", 4, 64)])
        nodes = [helper.make_node("Loop", ["trips", "cond", "x0"], ["acc_final"], name="outer", body=loop_body)]
        outputs = [fin("acc_final", 4, 64)]
        inputs = [fin("x0", 4, 64), fin("xs", length, 4, 64)]
        inits = [weight("W", 64, 64), numpy_helper.from_array(np.array(nested_trips, np.int64), "trips"),
                 numpy_helper.from_array(np.array(True), "cond")]
    else:
        inputs, inits = [fin("acc0", 4, 64), fin("xs", length, 4, 64)], [weight("W", 64, 64)]
        outputs.append(fin("ys_all", length, 4, 64))
    return model(nodes, inputs, outputs, inits)


def test_a_scan_body_runs_once_per_row_and_a_nested_body_as_often_as_both_loops():
    assert scope_repeats(import_model(_scan(6)).graph) == {"scan0.body": 6}
    assert scope_repeats(import_model(_scan(6, nested_trips=3)).graph) == {"outer.body": 3, "outer.body/scan0.body": 18}

    def body_gemm(m) -> float:
        result = plan_result(m)
        gemm = next(op for name, op in result.graph.ops.items() if name.endswith("/scan_mm"))
        return result.costs.timer.time(gemm, "float32")

    once = body_gemm(_scan(1))
    assert body_gemm(_scan(6)) == pytest.approx(6 * once)
    assert body_gemm(_scan(6, nested_trips=3)) == pytest.approx(18 * once)


def test_the_report_says_how_many_times_each_body_was_priced(tmp_path):
    from amp_compiler import convert_onnx
    from amp_compiler.report.text import render_text

    _, report = convert_onnx(_scan(6, nested_trips=3))
    note = report.summary["body_runs"]
    assert "outer ×3 (its trip count)" in note and "scan0 ×18 (its length, inside outer)" in note
    assert "loop bodies" in render_text(report)
    m = growing_loop(3)
    m.graph.initializer.remove(next(i for i in m.graph.initializer if i.name == "trips"))
    m.graph.input.append(helper.make_tensor_value_info("trips", TensorProto.INT64, []))
    assert "loop0 ×8 (not fixed in the model: sized --default-dim)" in convert_onnx(m)[1].summary["body_runs"]
    assert "body_runs" not in convert_onnx(model([helper.make_node("MatMul", ["x", "W"], ["y"])], [fin("x", 4, 64)],
                                                 [fin("y", 4, 64)], [weight("W", 64, 64)]))[1].summary


def _gemm_loop(rows: int, d: int, trips: int):
    """``x`` [rows, d] through ``trips`` iterations of ``s = (s @ W) * 0.5``, then a GEMM head."""
    body = helper.make_graph(
        [helper.make_node("MatMul", ["s_in", "W"], ["mm"], name="body_mm"),
         helper.make_node("Mul", ["mm", "half"], ["s_out"], name="body_scale"),
         helper.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond")],
        "body", [fin("i", dtype=TensorProto.INT64), fin("cond_in", dtype=TensorProto.BOOL), fin("s_in", rows, d)],
        [fin("cond_out", dtype=TensorProto.BOOL), fin("s_out", rows, d)],
        [numpy_helper.from_array(np.array(0.5, np.float32), "half")])
    nodes = [helper.make_node("Loop", ["trips", "cond", "x"], ["s_final"], name="loop0", body=body),
             helper.make_node("MatMul", ["s_final", "W"], ["y"], name="head")]
    return model(nodes, [fin("x", rows, d)], [fin("y", rows, d)],
                 [weight("W", d, d), numpy_helper.from_array(np.array(trips, np.int64), "trips"),
                  numpy_helper.from_array(np.array(True), "cond")])


@pytest.mark.parametrize("trips", [1, 4, 32])
def test_a_body_converts_by_default_where_each_iteration_pays_for_its_casts(trips):
    """Default options: a 64-wide body's GEMM saves less than its two casts cost per iteration and stays
    FP32 from 4 iterations on; a 1024-wide one over 512 rows saves more and converts at every count (at
    one iteration within the launch floor of a near-tie; from 4 on predicted faster than FP32)."""
    def planned(rows, d):
        result = plan_result(_gemm_loop(rows, d, trips))
        precision = result.graph.ops["loop0.body/body_mm"].precision
        return precision, result.costs.prediction.mixed_s / result.costs.prediction.fp32_s

    small, _ = planned(4, 64)
    assert trips == 1 or small == "float32"
    large, ratio = planned(512, 1024)
    assert large == "float16" and (trips == 1 or ratio < 0.9)
