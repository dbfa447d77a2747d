"""Calibrated activation ranges keep overflowing tensors out of FP16."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from amp_compiler import convert_onnx
from amp_compiler.metrics import rel_error

from .builders import LOOP_D, LOOP_ROWS, fin, growing_loop, model, run, weight


def _overflowing_input(d=1024):
    """Inputs beyond FP16's range feed a GEMM (tame output), then Softmax and a second GEMM."""
    nodes = [helper.make_node("MatMul", ["x", "Wq"], ["scores"], name="scores_mm"),
             helper.make_node("Softmax", ["scores"], ["p"], name="softmax", axis=-1),
             helper.make_node("MatMul", ["p", "Wv"], ["y"], name="value_mm")]
    return model(nodes, [fin("x", 512, d)], [fin("y", 512, d)], [weight("Wq", d, d, scale=1e-5),
                                                                 weight("Wv", d, d)])


def test_calibration_keeps_ops_reading_overflowing_values_fp32_and_output_finite():
    m = _overflowing_input()
    x = np.random.default_rng(0).standard_normal((512, 1024)).astype(np.float32) * 3e4
    x[:, 0] = 1.5e5  # beyond 65504: a cast to FP16 makes it inf
    feeds = {"x": x}
    ref = run(m, feeds)[0]
    _, naive = convert_onnx(m)
    # the uncalibrated plan stores x in FP16, where its large values become inf (ORT's CPU kernels
    # then happen to hide that, a GPU would not)
    assert any(c["tensor"] == "x" and c["to"] == "float16" for c in naive.casts)
    assert np.isinf(x.astype(np.float16)).any()
    calibrated, report = convert_onnx(m, calibration_inputs=feeds)
    onnx.checker.check_model(calibrated, full_check=True)
    assert not any(c["tensor"] == "x" and c["to"] == "float16" for c in report.casts)
    ops = {o["name"]: o for o in report.ops}
    assert ops["scores_mm"]["precision"] == "float32"
    assert "activation x reaches 1.5e+05" in ops["scores_mm"]["reason"]
    assert ops["value_mm"]["precision"] == "float16"  # tame GEMMs still convert
    got = run(calibrated, feeds)[0]
    assert np.all(np.isfinite(got))
    assert rel_error(ref, got) < 1e-2


def test_calibration_changes_nothing_on_a_tame_model():
    d = 1024
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")]
    m = model(nodes, [fin("x", 512, d)], [fin("y", 512, d)], [weight("W", d, d)])
    _, plain = convert_onnx(m)
    _, calibrated = convert_onnx(m, calibrate=True)
    assert [o["precision"] for o in plain.ops] == [o["precision"] for o in calibrated.ops] == ["float16"]


def test_cli_calibrate_reads_the_given_inputs(tmp_path):
    from amp_compiler import Report, cli

    m = _overflowing_input()
    x = np.random.default_rng(0).standard_normal((512, 1024)).astype(np.float32)
    x[:, 0] = 1.5e5
    src, out, report = tmp_path / "m.onnx", tmp_path / "m.mp.onnx", tmp_path / "r.json"
    onnx.save(m, src)
    np.savez(tmp_path / "batch.npz", x=x)
    assert cli.main([str(src), "-o", str(out), "--calibrate", "--inputs", str(tmp_path / "batch.npz"),
                     "--report", str(report), "-q"]) == 0
    ops = {o["name"]: o for o in Report.from_json(report).ops}
    assert ops["scores_mm"]["precision"] == "float32" and "reaches 1.5e+05" in ops["scores_mm"]["reason"]
    assert ops["value_mm"]["precision"] == "float16"
    onnx.checker.check_model(str(out), full_check=True)


def _vanishing(layers=48, d=256):
    """A deep ReLU MLP scaled by 1/sqrt(d): activations halve in size at every layer."""
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        w = (rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32)
        inits.append(onnx.numpy_helper.from_array(w, f"W{i}"))
        nodes += [helper.make_node("MatMul", [x, f"W{i}"], [f"h{i}"], name=f"mm{i}"),
                  helper.make_node("Relu", [f"h{i}"], [f"r{i}"], name=f"relu{i}")]
        x = f"r{i}"
    return model(nodes, [fin("x", 128, d)], [fin(x, 128, d)], inits)


def test_calibration_keeps_vanishing_activations_out_of_fp16():
    from amp_compiler.validate import run_reference

    m = _vanishing()
    feeds = {"x": np.random.default_rng(1).standard_normal((128, 256)).astype(np.float32)}
    ref = run(m, feeds)[0]
    assert 0 < np.max(np.abs(ref)) < 2.0 ** -14  # the output is subnormal in FP16 ...
    naive, _ = convert_onnx(m, planner="all")
    calibrated, report = convert_onnx(m, planner="all", calibration_inputs=feeds)

    def error(converted):  # rounded to FP16 op by op, as on a GPU
        got = run_reference(converted, feeds)[0]
        return rel_error(ref, got)

    assert error(naive) > 5e-2  # ... so the all-FP16 model loses it
    ops = {o["name"]: o for o in report.ops}
    assert ops["mm0"]["precision"] == "float16"  # the early layers, at normal magnitudes, stay FP16
    assert ops["mm47"]["precision"] == "float32" and "would be subnormal" in ops["mm47"]["reason"]
    assert error(calibrated) < 1e-2


def test_bf16_calibration_flags_nothing():
    m = _vanishing(layers=4)
    feeds = {"x": np.random.default_rng(1).standard_normal((128, 256)).astype(np.float32) * 1e-6}
    _, report = convert_onnx(m, dtype="bf16", planner="all", calibration_inputs=feeds)
    assert all(o["precision"] == "bfloat16" for o in report.ops)


def _reference(m, feeds):
    """The model on onnx's reference evaluator: its FP16 ops round (and overflow) as a GPU's do."""
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(m).run(None, feeds)[0]


def test_calibration_measures_loop_bodies():
    m = growing_loop()
    before = m.SerializeToString()
    feeds = {"x": np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)}
    ref = run(m, feeds)[0]
    assert np.abs(ref).max() > 65504
    naive, _ = convert_onnx(m, planner="all")  # a body too small to convert by cost (builders.growing_loop)
    assert not np.isfinite(_reference(naive, feeds)).all()  # the body's state overflows FP16
    calibrated, report = convert_onnx(m, calibration_inputs=feeds, planner="all")
    assert m.SerializeToString() == before  # the probed run's extra outputs are gone
    onnx.checker.check_model(calibrated, full_check=True)
    ops = {o["name"]: o for o in report.ops}
    assert ops["loop0.body/body_mm"]["precision"] == "float32"
    assert "activation mm reaches" in ops["loop0.body/body_mm"]["reason"]
    got = _reference(calibrated, feeds)
    assert np.isfinite(got).all() and rel_error(ref, got) < 1e-2
    _, default = convert_onnx(m, calibration_inputs=feeds)  # default planner: the same measure holds it
    ops = {o["name"].rsplit("/", 1)[-1]: o for o in default.ops}
    assert ops["body_mm"]["precision"] == "float32" and "activation mm reaches" in ops["body_mm"]["reason"]


def test_calibration_keeps_fp32_a_loop_body_the_default_plan_converts_where_it_overflows():
    """Default options: a body whose 1024-wide GEMM pays for its casts each iteration is planned FP16;
    its state passes 65504 in four steps, and calibration keeps that GEMM FP32."""
    m = growing_loop(rows=LOOP_ROWS, d=LOOP_D)
    feeds = {"x": np.random.default_rng(0).standard_normal((LOOP_ROWS, LOOP_D)).astype(np.float32)}
    assert np.abs(run(m, feeds)[0]).max() > 65504
    _, plain = convert_onnx(m)
    assert {o["name"]: o["precision"] for o in plain.ops}["loop0.body/body_mm"] == "float16"
    _, report = convert_onnx(m, calibration_inputs=feeds)
    ops = {o["name"]: o for o in report.ops}
    assert ops["loop0.body/body_mm"]["precision"] == "float32"
    assert "activation mm reaches" in ops["loop0.body/body_mm"]["reason"]


def test_calibration_of_a_loop_that_runs_no_iteration_flags_nothing_in_its_body():
    m = growing_loop(trips=0)
    feeds = {"x": np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)}
    _, report = convert_onnx(m, calibration_inputs=feeds, planner="all")
    ops = {o["name"]: o for o in report.ops}
    assert ops["loop0.body/body_mm"]["precision"] == "float16"


def test_calibration_measures_scan_bodies_with_listed_output_axes():
    """A Scan accumulating scaled rows (a GEMM by 5000 x the identity, tensor-core work the default plan
    converts): its running sum passes FP16's range after a few rows. Its ``scan_output_axes`` lists
    the scan outputs, so the probed run's must be listed too."""
    from onnx import numpy_helper

    body = helper.make_graph(
        [helper.make_node("MatMul", ["row", "K"], ["scaled"], name="body_scale"),
         helper.make_node("Add", ["acc_in", "scaled"], ["acc_out"], name="body_acc"),
         helper.make_node("Identity", ["acc_out"], ["step_out"], name="body_step")],
        "body", [fin("acc_in", 64), fin("row", 64)], [fin("acc_out", 64), fin("step_out", 64)],
        [numpy_helper.from_array((5e3 * np.eye(64)).astype(np.float32), "K")])
    nodes = [helper.make_node("Scan", ["acc0", "rows"], ["acc", "steps"], name="scan0", body=body,
                              num_scan_inputs=1, scan_output_axes=[0]),
             helper.make_node("MatMul", ["steps", "W"], ["y"], name="head")]
    m = model(nodes, [fin("acc0", 64), fin("rows", 16, 64)], [fin("acc", 64), fin("y", 16, 64)],
              [weight("W", 64, 64)])
    # each row times 5000 below the 32752 margin; their running sum above it
    rows = np.abs(np.random.default_rng(1).standard_normal((16, 64))).astype(np.float32)
    feeds = {"acc0": np.zeros(64, np.float32), "rows": rows}
    _, report = convert_onnx(m, calibration_inputs=feeds, planner="all")  # 16 rows: too small to convert by cost
    ops = {o["name"]: o for o in report.ops}
    assert ops["scan0.body/body_scale"]["precision"] == "float16"  # its output stays in range
    assert ops["scan0.body/body_acc"]["precision"] == "float32"
    assert "activation acc_out reaches" in ops["scan0.body/body_acc"]["reason"]


def test_calibrating_a_loop_leaves_its_body_for_the_emitter():
    """The probed run's additions are trimmed off the body itself: restoring a copy of the Loop node had
    left the importer's reference to the body stale, so the emitter rewrote a detached body and the
    written model's body read an FP32 weight the emitter had replaced by its FP16 copy (a scripted
    loop exported by torch: ONNX Runtime refused the file)."""
    m = growing_loop(trips=2, head_weight="W_head")  # the body alone reads W
    feeds = {"x": np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)}
    converted, report = convert_onnx(m, calibration_inputs=feeds, planner="all")
    onnx.checker.check_model(converted, full_check=True)
    assert {o["name"]: o["precision"] for o in report.ops}["loop0.body/body_mm"] == "float16"
    got = run(converted, feeds)[0]
    assert rel_error(run(m, feeds)[0], got) < 1e-2


def _nested(inner: onnx.NodeProto, outer_op: str = "Loop") -> onnx.ModelProto:
    """``inner`` (reading ``o_in``, writing ``s_final``) inside the body of a one-trip Loop ``outer``, or in
    the then-branch of an If inside it (its else-branch passes ``o_in`` through), then a GEMM ``head``."""
    from onnx import TensorProto, numpy_helper

    body_nodes = [helper.make_node("Identity", ["ocond_in"], ["ocond_out"], name="ocond")]
    if outer_op == "If":
        then = helper.make_graph([inner], "then", [], [fin("s_final", 4, 64)])
        other = helper.make_graph([helper.make_node("Identity", ["o_in"], ["passed"], name="pass")], "else", [],
                                  [fin("passed", 4, 64)])
        body_nodes.append(helper.make_node("If", ["ocond_in"], ["o_out"], name="branch", then_branch=then,
                                           else_branch=other))
    else:
        body_nodes += [inner, helper.make_node("Identity", ["s_final"], ["o_out"], name="oid")]
    body = helper.make_graph(body_nodes, "obody", [fin("j", dtype=TensorProto.INT64),
                                                   fin("ocond_in", dtype=TensorProto.BOOL), fin("o_in", 4, 64)],
                             [fin("ocond_out", dtype=TensorProto.BOOL), fin("o_out", 4, 64)])
    nodes = [helper.make_node("Loop", ["otrips", "cond", "x"], ["o_final"], name="outer", body=body),
             helper.make_node("MatMul", ["o_final", "W"], ["y"], name="head")]
    source = growing_loop()
    return model(nodes, [fin("x", 4, 64)], [fin("y", 4, 64)],
                 [*source.graph.initializer, numpy_helper.from_array(np.array(1, np.int64), "otrips")])


@pytest.mark.parametrize("outer_op", ["Loop", "If"])
def test_calibration_measures_a_loop_nested_in_a_loop_body(outer_op):
    """A growing Loop inside a Loop's body (or inside an If in it): calibration had measured only bodies of
    main-graph nodes, so its GEMM, whose state passes 65504, was planned FP16 under calibration."""
    inner = growing_loop().graph.node[0]
    inner.name, inner.input[2] = "inner", "o_in"
    m = _nested(inner, outer_op)
    before = m.SerializeToString()
    feeds = {"x": np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)}
    ref = run(m, feeds)[0]
    assert np.abs(ref).max() > 65504
    calibrated, report = convert_onnx(m, calibration_inputs=feeds, planner="all")
    assert m.SerializeToString() == before  # the probed run's additions are gone, at every depth
    ops = {o["name"].rsplit("/", 1)[-1]: o for o in report.ops}
    assert ops["body_mm"]["precision"] == "float32"
    assert "activation mm reaches" in ops["body_mm"]["reason"]
    got = _reference(calibrated, feeds)
    assert np.isfinite(got).all() and rel_error(ref, got) < 1e-2
