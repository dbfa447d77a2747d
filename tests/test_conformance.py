"""Conformance over the ONNX backend node tests (``onnx.backend.test.case.node``).

Runs the whole suite once (``benchmarks.conformance``, about half a minute): every
case with a float input or output is converted with ``planner="all"`` (everything
that may run in FP16 does), checked with ``onnx.checker`` (full_check), run on ONNX
Runtime with the reference inputs and compared with the reference outputs at an
FP16 tolerance. Cases ORT cannot run in FP32 are listed apart and not counted.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from amp_compiler import convert_onnx
from amp_compiler.cli import build_parser
from amp_compiler.ir import FIXED, UNIT
from amp_compiler.plan import make_context
from benchmarks import conformance as conf

from .builders import fin, plan, run


@pytest.fixture(scope="module")
def suite():
    results, summary = conf.run_conformance()
    print()
    print(conf.format_table(results, summary))
    return results, summary


def _names(results, status, reason=None):
    return [f"{r.name}: {r.reason}: {r.detail}" for r in results
            if r.status == status and (reason is None or r.reason == reason)]


def test_no_crashes(suite):
    results, summary = suite
    assert summary.crashes == 0, _names(results, conf.FAILING, conf.CRASH)


def test_no_checker_failures(suite):
    results, summary = suite
    assert summary.checker_failures == 0, _names(results, conf.FAILING, conf.CHECKER)


def test_every_converted_model_loads_and_runs(suite):
    results, summary = suite
    assert summary.load_failures == 0, [n for kind in (conf.LOAD, conf.RUN)
                                        for n in _names(results, conf.FAILING, kind)]


def test_at_least_99_percent_match_or_stay_fp32_with_a_reason(suite):
    results, summary = suite
    assert summary.counted > 1000  # the suite really ran: ~1,600 float cases, ~1,400 ORT can run
    assert summary.pass_rate >= conf.REQUIRED_PASS_RATE, _names(results, conf.FAILING)


def test_conversion_is_not_vacuous(suite):
    # single-op models are too small for the cost model; planner="all" must still put them in FP16
    results, summary = suite
    assert summary.converted >= 900
    assert summary.converted >= 0.6 * summary.counted
    assert summary.converted_op_types >= 100
    converted_ops = {r.op for r in results if r.status == conf.CONVERTED}
    for op in ("MatMul", "Gemm", "Conv", "ConvTranspose", "Attention", "Softmax",
               "LayerNormalization", "RMSNormalization", "BatchNormalization", "Resize", "Gelu",
               "Cast", "Where", "Gather", "Loop", "Scan"):
        assert op in converted_ops, op
    # a graph of constants alone (Constant, ConstantOfShape, an If choosing between constant branches) has
    # nothing to gain: even planner="all" leaves such a group FP32 (rounding an NMS's thresholds to FP16
    # only to cast them back changed its selection)
    lone = [r for r in results if r.name in ("test_constant", "test_constantofshape_float_ones", "test_if")]
    assert len(lone) == 3 and all(r.status == conf.KEPT and "not connected to a tensor-core op" in r.detail
                                  for r in lone), lone


def test_kept_fp32_cases_say_why(suite):
    results, _ = suite
    kept = [r for r in results if r.status == conf.KEPT]
    assert kept
    unexplained = [f"{r.name}: {r.reason}: {r.detail}" for r in kept
                   if not r.detail or r.reason.startswith("other")]
    assert not unexplained


def test_ort_unrunnable_cases_are_listed_with_ort_error(suite):
    results, summary = suite
    unrunnable = [r for r in results if r.status == conf.ORT_UNRUNNABLE]
    assert len(unrunnable) == summary.ort_unrunnable
    assert all(r.reason for r in unrunnable)
    assert summary.counted + summary.ort_unrunnable == summary.float_cases


# -- the root causes the conformance run found, one small graph each ---------------------------------

F16, F32 = TensorProto.FLOAT16, TensorProto.FLOAT


def _model(nodes, inputs, outputs, opset, initializers=()):
    g = helper.make_graph(nodes, "t", inputs, outputs, list(initializers))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = helper.find_min_ir_version_for([helper.make_opsetid("", opset)])
    return m


def _converted_ok(m, feeds, planner="all", rtol=1e-2):
    """Convert, full-check, run on ORT and compare with the FP32 original; returns (model, report)."""
    out, report = convert_onnx(m, planner=planner)
    onnx.checker.check_model(out, full_check=True)
    for ref, got in zip(run(m, feeds), run(out, feeds)):
        assert got.dtype == ref.dtype
        np.testing.assert_allclose(got.astype(np.float64), ref.astype(np.float64), rtol=rtol,
                                   atol=1e-3 * float(np.max(np.abs(ref)) or 1))
    return out, report


def _precisions(report):
    return {o["op_type"]: o["precision"] for o in report.ops}


def _x(*shape):
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


def test_planner_all_is_an_option_of_the_api_and_the_cli():
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [fin("x", 4)], [fin("y", 4)], 18)
    _, optimal = convert_onnx(m)
    assert _precisions(optimal)["Relu"] == "float32"  # no tensor-core op in reach: FP16 buys nothing
    _, forced = _converted_ok(m, {"x": _x(4)})
    assert _precisions(forced)["Relu"] == "float16"
    assert "planner 'all'" in forced.ops[0]["reason"]
    assert build_parser().parse_args(["m.onnx", "--planner", "all"]).planner == "all"
    with pytest.raises(ValueError, match="all"):
        make_context(planner="everything")


def test_attention_value_input_takes_the_op_precision_without_present_value():
    # V has a type parameter of its own (T2) that only types the absent present_value output
    m = _model([helper.make_node("Attention", ["Q", "K", "V"], ["Y"], q_num_heads=2, kv_num_heads=2)],
               [fin("Q", 1, 4, 16), fin("K", 1, 6, 16), fin("V", 1, 6, 16)], [fin("Y", 1, 4, 16)], 23)
    graph, _ = plan(m, planner="all")
    assert graph.ops["Attention_0"].input_roles == [UNIT, UNIT, UNIT]
    _converted_ok(m, {"Q": _x(1, 4, 16), "K": _x(1, 6, 16), "V": _x(1, 6, 16)})


def test_rms_normalization_input_follows_the_output_dtype():
    m = _model([helper.make_node("RMSNormalization", ["X", "W"], ["Y"], axis=-1)],
               [fin("X", 3, 8), fin("W", 8)], [fin("Y", 3, 8)], 23)
    graph, _ = plan(m, planner="all")
    assert graph.ops["RMSNormalization_0"].input_roles == [UNIT, UNIT]
    _converted_ok(m, {"X": _x(3, 8), "W": _x(8)})


def test_default_dtype_attributes_are_written_out_when_retargeted():
    # ConstantOfShape without ``value`` makes an FP32 zero; Constant(value_floats) an FP32 tensor
    shape = numpy_helper.from_array(np.array([4], dtype=np.int64), "shape")
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["zeros"]),
             helper.make_node("Constant", [], ["c"], value_floats=[1.0, 2.0, 3.0, 4.0]),
             helper.make_node("Add", ["x", "zeros"], ["a"]),
             helper.make_node("Mul", ["a", "c"], ["y"])]
    m = _model(nodes, [fin("x", 4)], [fin("y", 4)], 18, [shape])
    out, report = _converted_ok(m, {"x": _x(4)})
    assert set(_precisions(report).values()) == {"float16"}
    cos = next(n for n in out.graph.node if n.op_type == "ConstantOfShape")
    assert cos.attribute[0].name == "value" and cos.attribute[0].t.data_type == F16
    const = next(n for n in out.graph.node if n.op_type == "Constant")
    assert const.attribute[0].name == "value" and const.attribute[0].t.data_type == F16


def test_cast_writing_a_kept_graph_output_is_retargeted():
    # the output is renamed (the FP32 name goes to a new cast); ``to`` must follow the renamed value
    m = _model([helper.make_node("Cast", ["x"], ["y"], to=F32)], [fin("x", 4, dtype=TensorProto.DOUBLE)],
               [fin("y", 4)], 18)
    out, _ = _converted_ok(m, {"x": _x(4).astype(np.float64)})
    assert [helper.get_attribute_value(n.attribute[0]) for n in out.graph.node] == [F16, F32]


def test_sequence_ops_keep_their_input_dtype():
    # the element dtype flows into a sequence value the IR does not track
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("SequenceConstruct", ["r"], ["seq"]),
             helper.make_node("SequenceAt", ["seq", "zero"], ["y"])]
    zero = numpy_helper.from_array(np.array(0, dtype=np.int64), "zero")
    m = _model(nodes, [fin("x", 4)], [fin("y", 4)], 18, [zero])
    graph, _ = plan(m, planner="all")
    assert graph.ops["SequenceConstruct_1"].input_roles == [FIXED]
    _converted_ok(m, {"x": _x(4)})


def test_untyped_loop_body_inputs_take_the_dtype_the_loop_binds():
    untyped = onnx.ValueInfoProto(name="prev")
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond"], ["cond_out"]),
         helper.make_node("Add", ["prev", "delta"], ["current"]),
         helper.make_node("Identity", ["prev"], ["scan"])],
        "body", [fin("i", dtype=TensorProto.INT64), fin("cond", dtype=TensorProto.BOOL), untyped],
        [fin("cond_out", dtype=TensorProto.BOOL), onnx.ValueInfoProto(name="current"),
         onnx.ValueInfoProto(name="scan")])
    trip = numpy_helper.from_array(np.array(3, dtype=np.int64), "trip")
    cond = numpy_helper.from_array(np.array(True), "cond0")
    m = _model([helper.make_node("Loop", ["trip", "cond0", "start"], ["final", "all"], body=body)],
               [fin("start"), fin("delta")], [fin("final"), fin("all", 3)], 18, [trip, cond])
    graph, _ = plan(m, planner="all")
    assert graph.tensors["prev"].dtype == "float32"
    out, report = _converted_ok(m, {"start": np.array(1.5, np.float32), "delta": np.array(0.25, np.float32)})
    assert _precisions(report)["Add"] == "float16"


def test_ops_in_another_low_dtype_are_left_alone():
    m = _model([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Cast", ["x"], ["z"], to=F32)],
               [fin("x", 4, dtype=TensorProto.BFLOAT16)],
               [fin("y", 4, dtype=TensorProto.BFLOAT16), fin("z", 4)], 18)
    out, report = convert_onnx(m, planner="all")
    assert _precisions(report)["Relu"] == "bfloat16"
    relu = next(n for n in out.graph.node if n.op_type == "Relu")
    assert list(relu.input) == ["x"] and list(relu.output) == ["y"]  # no cast to FP16 and back
    onnx.checker.check_model(out, full_check=True)


def test_layer_norm_statistics_outputs_stay_fp32_without_blocking_the_op():
    # Mean/InvStdDev (type U: float/bfloat16 only) are FP32-only ports; Y still goes FP16
    m = _model([helper.make_node("LayerNormalization", ["X", "W", "B"], ["Y", "Mean", "InvStdDev"], axis=-1)],
               [fin("X", 2, 8), fin("W", 8), fin("B", 8)], [fin("Y", 2, 8), fin("Mean", 2, 1),
                                                           fin("InvStdDev", 2, 1)], 17)
    graph, _ = plan(m, planner="all")
    op = graph.ops["LayerNormalization_0"]
    assert op.forbid_low is None and op.output_roles == [UNIT, FIXED, FIXED]
    _, report = _converted_ok(m, {"X": _x(2, 8), "W": _x(8), "B": _x(8)})
    assert _precisions(report)["LayerNormalization"] == "float16"


@pytest.mark.parametrize("reduction", ["add", "mul", "max", "min"])
def test_scatter_with_a_reduction_is_deny(reduction):
    idx = numpy_helper.from_array(np.array([[0], [0]], dtype=np.int64), "idx")
    m = _model([helper.make_node("ScatterND", ["x", "idx", "u"], ["y"], reduction=reduction)],
               [fin("x", 4, 3), fin("u", 2, 3)], [fin("y", 4, 3)], 18, [idx])
    _, report = _converted_ok(m, {"x": _x(4, 3), "u": _x(2, 3)}, rtol=1e-6)
    assert report.ops[0]["precision"] == "float32" and report.ops[0]["reason"].startswith("deny: scatter")
    plain = _model([helper.make_node("ScatterND", ["x", "idx", "u"], ["y"])],
                   [fin("x", 4, 3), fin("u", 2, 3)], [fin("y", 4, 3)], 18, [idx])
    assert _precisions(convert_onnx(plain, planner="all")[1])["ScatterND"] == "float16"


def test_eye_like_stays_fp32_for_want_of_a_kernel():
    m = _model([helper.make_node("EyeLike", ["x"], ["y"], dtype=F32)], [fin("x", 3, 3)], [fin("y", 3, 3)], 22)
    _, report = _converted_ok(m, {"x": _x(3, 3)})
    assert report.ops[0]["precision"] == "float32" and "kernel" in report.ops[0]["reason"]


def test_dequantize_linear_output_follows_its_scale():
    # FP16 scale: y is FP16 (output_dtype unset); the deny op runs in FP32, so the scale is widened too
    scale = numpy_helper.from_array(np.array(0.5, dtype=np.float16), "s")
    m = _model([helper.make_node("DequantizeLinear", ["q", "s"], ["y"])],
               [fin("q", 4, dtype=TensorProto.INT8)], [fin("y", 4, dtype=F16)], 21, [scale])
    graph, _ = plan(m, planner="all")
    assert graph.ops["DequantizeLinear_0"].input_roles == ["other", UNIT]
    _converted_ok(m, {"q": np.array([1, -2, 3, 127], dtype=np.int8)})
