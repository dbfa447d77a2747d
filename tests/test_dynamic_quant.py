"""Dynamically quantized models (``quantize_dynamic``: DynamicQuantizeLinear -> MatMulInteger ->
Cast -> Mul by the scales): the rescale of the int32 accumulator keeps FP32 (numerics rule 4,
docs/architecture.md "Numerics")."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from amp_compiler import convert_onnx

from .builders import fin, model, weight

K = 64


def _dynamic_quant() -> onnx.ModelProto:
    wq = np.full((K, K), 127, np.int8)
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"], name="quant"),
        helper.make_node("MatMulInteger", ["xq", "Wq", "xz", "wz"], ["acc"], name="int_gemm"),
        helper.make_node("Cast", ["acc"], ["accf"], name="to_float", to=TensorProto.FLOAT),
        helper.make_node("Mul", ["xs", "ws"], ["scale"], name="scale"),
        helper.make_node("Mul", ["accf", "scale"], ["h"], name="rescale"),
        helper.make_node("MatMul", ["h", "W2"], ["y"], name="proj"),
    ]
    return model(nodes, [fin("x", K, K)], [fin("y", K, K)],
                 [numpy_helper.from_array(wq, "Wq"), numpy_helper.from_array(np.int8(0), "wz"),
                  numpy_helper.from_array(np.float32(0.01), "ws"), weight("W2", K, K)])


@pytest.mark.parametrize("planner", ["optimal", "all"], ids=["defaults", "all"])
def test_the_int32_accumulator_is_rescaled_in_fp32(planner):
    """MatMulInteger was "unknown" and the Cast of its accumulator could go FP16: 255 x 127 x 64
    is 2e6, inf in FP16 before the scale brings it back (planned "all", where legal, it did).
    With defaults this 64-row GEMM may stay FP32 by cost; the report says so."""
    fp32 = _dynamic_quant()
    reference = onnx.ModelProto()
    reference.CopyFrom(fp32)  # W2 is drawn anew per build
    converted, report = convert_onnx(fp32, **({} if planner == "optimal" else {"planner": planner}))
    ops = {op["name"]: op for op in report.ops}
    assert ops["int_gemm"]["class"] != "unknown"
    for name in ("to_float", "rescale"):  # its reason had said "in a QDQ unit ... fuse DequantizeLinear"
        reason = ops[name]["reason"]
        assert ops[name]["precision"] == "float32" and "MatMulIntegerToFloat" in reason, ops[name]
        assert "DequantizeLinear" not in reason
    if ops["proj"]["precision"] == "float32":  # the why-line names the rescale, not a QDQ unit
        held = report.summary["fp32_tensor_core_why"].partition("held FP32 by: ")[2]
        assert "dynamic quantization" in held and "QDQ" not in held, held
        assert "of float GEMM/conv FLOPs (1 integer GEMMs left int8)" in report.summary["fp32_tensor_core_why"]
    if planner == "all":
        assert ops["proj"]["precision"] == "float16"
    else:  # never silently FP32
        why = report.summary["fp32_tensor_core_why"]
        assert ops["proj"]["precision"] == "float16" or why.startswith("FP32 by cost"), why
    x = np.abs(np.random.default_rng(0).standard_normal((K, K))).astype(np.float32) * 3
    got, want = _unfused(converted, x), _unfused(reference, x)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2 * np.abs(want).max())


def _unfused(m: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    """ONNX Runtime with its fusions off: MatMulIntegerToFloat would absorb the Cast, as a GPU
    runtime without that fusion does not."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_what_feeds_a_dynamic_quantizer_keeps_fp32():
    """A quantize_dynamic GPT-2's attention context (a float MatMul, then Reshape) feeds the next
    layer's DynamicQuantizeLinear: in FP16 its int8 roundings flipped, and default options failed
    validation at 1.2e-2 on three of four seeds. Even under planner="all" it keeps its dtype."""
    nodes = [helper.make_node("MatMul", ["x", "W0"], ["ctx"], name="context"),
             helper.make_node("Reshape", ["ctx", "shape"], ["flat"], name="flat"),
             helper.make_node("DynamicQuantizeLinear", ["flat"], ["xq", "xs", "xz"], name="quant"),
             helper.make_node("MatMulInteger", ["xq", "Wq", "xz", "wz"], ["acc"], name="int_gemm"),
             helper.make_node("Cast", ["acc"], ["accf"], name="to_float", to=TensorProto.FLOAT),
             helper.make_node("Mul", ["accf", "xs"], ["y"], name="rescale")]
    m = model(nodes, [fin("x", K, K)], [fin("y", K, K)],
              [weight("W0", K, K), numpy_helper.from_array(np.array([K, K], np.int64), "shape"),
               numpy_helper.from_array(np.full((K, K), 3, np.int8), "Wq"), numpy_helper.from_array(np.int8(0), "wz")])
    for options in ({}, {"planner": "all"}):  # default options first
        ops = {op["name"]: op for op in convert_onnx(m, **options)[1].ops}
        for name in ("context", "flat"):
            assert ops[name]["precision"] == "float32", (options, ops[name])
            assert "feeds a DynamicQuantizeLinear" in ops[name]["reason"], (options, ops[name])
