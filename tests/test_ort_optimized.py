"""Models ONNX Runtime saved after its own fusions (``optimized_model_filepath``): ``com.microsoft``
ops onnx has no schema for (``onnx_io/untyped.py``, docs/architecture.md "Input handling")."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from amp_compiler import convert_onnx
from amp_compiler.cli import main

from .builders import fin, weight

MS = "com.microsoft"


def _fused_attention() -> onnx.ModelProto:
    """BERT's scores as ORT_ENABLE_EXTENDED leaves them: ``FusedMatMul`` with the 1/sqrt(d) in
    ``alpha``, the mask added, a softmax whose NaN rows a Where zeroes, and a ``FusedGemm`` head;
    nothing behind the fused ops is declared (ONNX Runtime writes no value_info for them)."""
    nodes = [
        helper.make_node("FusedMatMul", ["q", "k"], ["scores"], name="qk", domain=MS, alpha=0.25, transB=1),
        helper.make_node("Add", ["scores", "bias"], ["masked"], name="masked"),
        helper.make_node("Softmax", ["masked"], ["probs"], name="softmax", axis=-1),
        helper.make_node("IsNaN", ["probs"], ["nan"], name="nan"),
        helper.make_node("Where", ["nan", "zero", "probs"], ["clean"], name="where"),
        helper.make_node("MatMul", ["clean", "v"], ["context"], name="context"),
        helper.make_node("Reshape", ["context", "flat"], ["rows"], name="rows"),
        helper.make_node("FusedGemm", ["rows", "W", "B"], ["y"], name="head", domain=MS, activation="Relu"),
    ]
    g = helper.make_graph(nodes, "ort_optimized",
                          [fin("q", 2, 4, 8, 16), fin("k", 2, 4, 8, 16), fin("v", 2, 4, 8, 16), fin("bias", 2, 1, 1, 8)],
                          [fin("y", 64, 32)],
                          [numpy_helper.from_array(np.zeros((), np.float32), "zero"),
                           numpy_helper.from_array(np.array([64, 16], np.int64), "flat"),
                           weight("W", 16, 32), weight("B", 32)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("planner", ["optimal", "all"], ids=["defaults", "all"])
def test_values_behind_contrib_ops_are_typed_and_the_model_validates(tmp_path, planner):
    """The untyped Softmax output was "no float data": the Where after it went FP16 with its input
    left FP32, and ONNX Runtime refused the converted BERT ("Type parameter (T) of Optype (Where)
    bound to different types")."""
    src, dst, rep = tmp_path / "bert_ort.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    onnx.save(_fused_attention(), str(src))
    chosen = [] if planner == "optimal" else ["--planner", planner]
    assert main([str(src), "-o", str(dst), "--validate", "--report", str(rep), "-q", *chosen]) == 0
    ops = {op["name"]: op for op in json.loads(rep.read_text())["ops"]}
    assert ops["softmax"]["precision"] == ops["where"]["precision"] != "n/a"
    if planner == "all":
        assert ops["where"]["precision"] == "float16"


@pytest.mark.parametrize("planner", ["optimal", "all"], ids=["defaults", "all"])
def test_fused_gemm_is_a_gemm_and_fused_matmul_alpha_is_its_scale(planner):
    """FusedGemm was "unknown" (kept FP32); FusedMatMul's alpha is BERT's folded 1/sqrt(d), but the
    unscaled-scores rule kept it and its softmax FP32. With defaults these few-µs kernels are
    priced by the cost model, not held by a rule."""
    report = convert_onnx(_fused_attention(), **({} if planner == "optimal" else {"planner": planner}))[1]
    ops = {op["name"]: op for op in report.ops}
    assert ops["head"]["class"] == "allow" and "unscaled" not in ops["qk"]["reason"]
    if planner == "all":
        assert ops["head"]["precision"] == ops["qk"]["precision"] == "float16"
    else:
        assert all(ops[n]["precision"] == "float16" or "cost model" in ops[n]["reason"] for n in ("head", "qk"))


def test_embed_layer_normalization_is_planned_and_validates(tmp_path):
    """ONNX Runtime's BERT optimizer fuses the embeddings and their LayerNorm into
    EmbedLayerNormalization, which was "unknown" and kept FP32."""
    h = 32
    nodes = [helper.make_node("EmbedLayerNormalization", ["input_ids", "segment_ids", "word", "position", "segment",
                                                          "gamma", "beta"], ["emb", "mask_index"], name="embed",
                              domain=MS, epsilon=1e-12),
             helper.make_node("MatMul", ["emb", "W"], ["y"], name="proj")]
    ints = TensorProto.INT32
    g = helper.make_graph(nodes, "embed", [fin("input_ids", "batch", "sequence", dtype=ints),
                                           fin("segment_ids", "batch", "sequence", dtype=ints)],
                          [fin("y", "batch", "sequence", h)],
                          [weight("word", 100, h), weight("position", 64, h), weight("segment", 2, h),
                           numpy_helper.from_array(np.ones(h, np.float32), "gamma"),
                           numpy_helper.from_array(np.zeros(h, np.float32), "beta"), weight("W", h, h)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    m.ir_version = 8
    src, dst, rep = tmp_path / "embed.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    onnx.save(m, str(src))
    assert main([str(src), "-o", str(dst), "--validate", "--report", str(rep), "-q", "--planner", "all"]) == 0
    ops = {op["name"]: op for op in json.loads(rep.read_text())["ops"]}
    assert ops["embed"]["class"] == "infer" and ops["embed"]["precision"] == "float16"
