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


def _optimized_pre_ln_block(opset: int) -> onnx.ModelProto:
    """GPT-2's attention entry as ``optimize_model(..., model_type="gpt2")`` saves an opset-14
    export: ONNX Runtime's own ``LayerNormalization`` in the ONNX domain (onnx has it from 17 only),
    a ``SkipLayerNormalization`` (no schema in onnx: all behind it untyped) and a ``Split`` of the
    QKV projection into three heads' inputs; no value_info."""
    h = 32
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["ln"], name="ln", axis=-1, epsilon=1e-5),
             helper.make_node("MatMul", ["ln", "W0"], ["h0"], name="proj"),
             helper.make_node("SkipLayerNormalization", ["h0", "x", "g", "b"], ["sln"], name="skip_ln", domain=MS,
                              epsilon=1e-5),
             helper.make_node("MatMul", ["sln", "Wqkv"], ["qkv"], name="qkv"),
             helper.make_node("Split", ["qkv", "sizes"], ["q", "k", "v"], name="split", axis=-1),
             helper.make_node("Mul", ["k", "half"], ["ks"], name="scale_k"),
             helper.make_node("Add", ["q", "ks"], ["qk"], name="add_qk"),
             helper.make_node("Add", ["qk", "v"], ["y"], name="add_v")]
    g = helper.make_graph(nodes, "ort_optimized_ln", [fin("x", 1, 16, h)], [fin("y", 1, 16, h)],
                          [numpy_helper.from_array(np.ones(h, np.float32), "g"),
                           numpy_helper.from_array(np.zeros(h, np.float32), "b"),
                           weight("W0", h, h), weight("Wqkv", h, 3 * h),
                           numpy_helper.from_array(np.array([h] * 3, np.int64), "sizes"),
                           numpy_helper.from_array(np.array(0.5, np.float32), "half")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("opset", [14, 17])
@pytest.mark.parametrize("planner", ["optimal", "all"], ids=["defaults", "all"])
def test_ort_layer_norm_below_opset_17_and_split_after_contrib_ops(tmp_path, opset, planner):
    """onnx's checker refused ONNX Runtime's ONNX-domain LayerNormalization in an opset-14 file
    ("No Op registered for LayerNormalization with domain_version of 14"; ONNX Runtime loads it);
    and the untyped Split behind a SkipLayerNormalization typed only its first output, so at
    either opset the Mul on its second was "no float data" and ONNX Runtime refused the output
    ("Type parameter (T) of Optype (Mul) bound to different types")."""
    src, dst, rep = tmp_path / "gpt2_ort.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    onnx.save(_optimized_pre_ln_block(opset), str(src))
    chosen = [] if planner == "optimal" else ["--planner", planner]
    assert main([str(src), "-o", str(dst), "--validate", "--report", str(rep), "-q", *chosen]) == 0
    ops = {op["name"]: op for op in json.loads(rep.read_text())["ops"]}
    assert ops["ln"]["class"] == "infer" and ops["split"]["precision"] != "n/a"
    assert ops["scale_k"]["precision"] == ops["add_qk"]["precision"] == ops["split"]["precision"]
    if planner == "all":
        assert ops["ln"]["precision"] == ops["scale_k"]["precision"] == "float16"


def _gemm_shape_names_left_behind() -> onnx.ModelProto:
    """A 3-D MatMul + Add (ONNX Runtime's MatMulAddFusion makes it a Gemm between two Reshapes whose
    shapes it names ``gemm_input_shape``/``gemm_output_shape``) in a file that holds initializers of
    those names already, as one ``optimize_model`` saved does."""
    d = 32
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"], name="mm"), helper.make_node("Add", ["m", "b"], ["a"], name="add"),
             helper.make_node("Reshape", ["x", "gemm_input_shape"], ["flat"], name="flat"),
             helper.make_node("Reshape", ["flat", "gemm_output_shape"], ["back"], name="back"),
             helper.make_node("Add", ["a", "back"], ["y"], name="out")]
    g = helper.make_graph(nodes, "left_behind", [fin("x", 1, 16, d)], [fin("y", 1, 16, d)],
                          [weight("W", d, d), numpy_helper.from_array(np.zeros(d, np.float32), "b"),
                           numpy_helper.from_array(np.array([16, d], np.int64), "gemm_input_shape"),
                           numpy_helper.from_array(np.array([1, 16, d], np.int64), "gemm_output_shape")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_validation_opens_the_converted_file_as_it_is(tmp_path, capsys):
    """The overflow check runs both models with their intermediate values exposed as outputs, which
    blocks ONNX Runtime's fusions: a BERT saved by ``optimize_model`` validated, and its output then
    failed to load at every optimisation level (MatMulAddFusion: "Attempt to replace the existing
    tensor"). Here the source fails the same way, and the line says so; nothing is written."""
    src, dst = tmp_path / "left_behind.onnx", tmp_path / "out.onnx"
    onnx.save(_gemm_shape_names_left_behind(), str(src))
    for options in ([], ["--planner", "all"]):  # default options first
        assert main([str(src), "-o", str(dst), "--validate", "-q", *options]) == 2, options
        err = capsys.readouterr().err.strip()
        assert "the converted model: ONNX Runtime: cannot load it: " in err and "replace the existing tensor" in err, err
        assert err.endswith("(the FP32 model fails the same way as it is: ONNX Runtime refuses the source file)")
        assert not dst.exists()


def _skip_layer_norm_with_its_sum() -> onnx.ModelProto:
    """A residual block as ONNX Runtime's transformer optimizer writes a GPT-NeoX's: a
    ``SkipLayerNormalization`` whose fourth output (``input_skip_bias_sum``, the residual) a plain
    LayerNormalization reads, whose output is a graph output (nothing pulls it to FP16)."""
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="proj"),
             helper.make_node("SkipLayerNormalization", ["h", "x", "g", "b"], ["normed", "", "", "sum"],
                              name="skip_ln", domain=MS, epsilon=1e-5),
             helper.make_node("MatMul", ["normed", "W2"], ["y"], name="head"),
             helper.make_node("LayerNormalization", ["sum", "g", "b"], ["residual"], name="ln", axis=-1)]
    g = helper.make_graph(nodes, "skip", [fin("x", "batch", 128, 256)], [fin("y", "batch", 128, 256),
                          fin("residual", "batch", 128, 256)],
                          [weight("W", 256, 256), weight("W2", 256, 256), weight("g", 256), weight("b", 256)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    m.ir_version = 8
    return m


def test_a_contrib_ops_later_outputs_are_typed_by_its_schema(tmp_path):
    """Only the first output of a contrib op was typed: SkipLayerNormalization's residual sum went
    FP16 with the op while the LayerNormalization reading it stayed FP32, no cast between, and
    ONNX Runtime refused the converted file, written without ``--validate``."""
    pytest.importorskip("onnxruntime")
    src, dst, rep = tmp_path / "neox_ort.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    onnx.save(_skip_layer_norm_with_its_sum(), str(src))
    assert main([str(src), "-o", str(dst), "--report", str(rep), "-q"]) == 0  # defaults; no --validate
    ops = {op["name"]: op for op in json.loads(rep.read_text())["ops"]}
    assert ops["skip_ln"]["precision"] != "n/a" and ops["ln"]["precision"] != "n/a"  # both float ops, planned
    import onnxruntime as ort

    x = np.random.default_rng(0).standard_normal((2, 128, 256)).astype(np.float32)
    want, got = (ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, {"x": x})
                 for p in (src, dst))
    for a, b in zip(want, got):
        assert np.abs(a - b).max() <= 1e-2 * np.abs(a).max()


def test_ort_cpu_layout_ops_are_said_first():
    """A file saved at ONNX Runtime's default level (ORT_ENABLE_ALL) holds its CPU-only NCHWc
    convolutions, which the plan leaves as exported; the report's first lines say so and what to
    convert instead, not only an "unknown ops" row."""
    nchwc = "com.microsoft.nchwc"
    nodes = [helper.make_node("ReorderInput", ["x"], ["xr"], name="reorder_in", domain=nchwc),
             helper.make_node("Conv", ["xr", "W"], ["c"], name="conv", domain=nchwc, kernel_shape=[3, 3],
                              pads=[1, 1, 1, 1]),
             helper.make_node("ReorderOutput", ["c"], ["co"], name="reorder_out", domain=nchwc, channels=16),
             helper.make_node("Relu", ["co"], ["y"], name="relu")]
    g = helper.make_graph(nodes, "nchwc", [fin("x", 1, 16, 8, 8)], [fin("y", 1, 16, 8, 8)], [weight("W", 16, 16, 3, 3)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(nchwc, 1)])
    report = convert_onnx(m)[1]
    note = report.summary["cpu_layout_ops"]
    assert note.startswith("3 ops of ORT's CPU-only layout") and "ORT_ENABLE_EXTENDED" in note
    assert f"! {note[:60]}" in report.to_text()
    plain = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
                                                [fin("x", 1, 16, 8, 8)], [fin("y", 1, 16, 8, 8)]),
                              opset_imports=[helper.make_opsetid("", 17)])
    assert "cpu_layout_ops" not in convert_onnx(plain)[1].summary
