"""Symbolic dims a Reshape makes up are related to the inputs' dims, so ``--dim`` sizes every
tensor (``amp_compiler/dims.py``, ``onnx_io/symbolic_dims.py``)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import warnings
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from amp_compiler import convert_onnx
from amp_compiler.cli import main
from amp_compiler.dims import DimSizes

from .builders import fin, model, weight


def test_expressions_of_declared_or_sized_dims_are_sized_and_others_are_unknown():
    sizes = DimSizes({"seq": 2048}, 8, declared={"batch", "seq", "batch-size"})
    assert [sizes.get(d, 8) for d in ("seq", "batch", "4*batch", "seq + 1", "batch*seq", "floor(seq/2)")] == \
        [2048, 8, 32, 2049, 8 * 2048, 1024]
    assert sizes.get("unk__3*batch", 8) == 8  # a made-up symbol: the whole dim is unknown
    assert sizes.get("batch-size", 8) == 8 and DimSizes({"batch-size": 3}, 8).get("batch-size") == 3  # a name
    assert sizes.unsized("batch*seq") == {"batch"} and sizes.unsized("seq + 1") == set()
    assert sizes.unsized("unk__3*batch") == {"unk__3*batch"}


def _flattened_projection():
    """x [batch, seq, 64] -> Reshape [-1, 64] (onnx names the rows ``unk__N``) -> MatMul [64, 1024]."""
    nodes = [helper.make_node("Reshape", ["x", "rows"], ["flat"], name="flatten"),
             helper.make_node("MatMul", ["flat", "W"], ["y"], name="proj")]
    shape = helper.make_tensor("rows", TensorProto.INT64, [2], [-1, 64])
    return model(nodes, [fin("x", "batch", "seq", 64)], [fin("y", None, 1024)], [shape, weight("W", 64, 1024)])


def test_a_reshaped_tensor_is_sized_by_the_inputs_dims():
    summary = convert_onnx(_flattened_projection(), dim_values={"batch": 4, "seq": 512})[1].summary
    assert summary["gemm_flops"] == 2 * (4 * 512) * 64 * 1024  # not 2 * 8 * 64 * 1024: the rows are batch*seq
    default = convert_onnx(_flattened_projection())[1].summary
    assert default["gemm_flops"] == 2 * (8 * 8) * 64 * 1024


def _weight_normed_projection():
    """``_flattened_projection`` whose weight is weight-normed in the graph, as a TorchScript export
    writes wav2vec2's positional conv: ``g * V / ReduceL2(V, axes)``, the axes an input (opset 18)."""
    m = _flattened_projection()
    m.graph.initializer.remove(next(t for t in m.graph.initializer if t.name == "W"))
    nodes = [helper.make_node("Constant", [], ["axes"], name="axes",
                              value=helper.make_tensor("axes_value", TensorProto.INT64, [1], [0])),
             helper.make_node("ReduceL2", ["V", "axes"], ["norm"], name="norm", keepdims=1),
             helper.make_node("Div", ["V", "norm"], ["unit"], name="direction"),
             helper.make_node("Mul", ["unit", "g"], ["W"], name="scale")]
    for i, node in enumerate(nodes):
        m.graph.node.insert(i, node)
    m.graph.initializer.extend([weight("V", 64, 1024), weight("g", 1, 1024)])
    return m


def test_weights_computed_in_the_graph_do_not_stop_relating_dims():
    """ONNX Runtime's symbolic inference cannot shape the opset-18 ReduceL2 and gave up on the whole
    graph: a wav2vec2 exported with ``dynamo=False`` was planned with every frame dim sized 8 (12
    MFLOP instead of 246) and kept FP32. Values computed from the weights alone enter its copy of
    the graph as shaped inputs."""
    summary = convert_onnx(_weight_normed_projection(), dim_values={"batch": 4, "seq": 512})[1].summary
    assert summary["gemm_flops"] == 2 * (4 * 512) * 64 * 1024


def test_a_declared_dim_named_apart_from_the_inputs_takes_the_related_one():
    """The TorchScript exporter declares value_info with dims of its own naming (``Reshape_out_dim_0``)."""
    m = _flattened_projection()
    m.graph.value_info.append(fin("flat", "Reshape_out_dim_0", 64))
    summary = convert_onnx(m, dim_values={"batch": 4, "seq": 512})[1].summary
    assert summary["gemm_flops"] == 2 * (4 * 512) * 64 * 1024


def test_a_torchscript_export_plans_at_the_sizes_given(tmp_path):
    """``torch.onnx.export(dynamo=False)`` names every Reshape output anew: without relating them
    the Llama's GEMMs stayed sized 8 at ``--dim seq=2048`` and the plan was the tiny model's."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=4, vocab_size=500, use_cache=False)
    llama = transformers.LlamaForCausalLM(cfg).eval()
    src = tmp_path / "llama.onnx"
    ids, mask = torch.randint(0, 500, (1, 16)), torch.ones(1, 16, dtype=torch.long)
    axes = {0: "batch", 1: "seq"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's deprecation and tracer notes
        torch.onnx.export(llama, (ids, mask), str(src), input_names=["input_ids", "attention_mask"],
                          output_names=["logits"], dynamic_axes={"input_ids": axes, "attention_mask": axes},
                          opset_version=17, dynamo=False)
    for seq in (1024, 2048):
        rep = tmp_path / f"r{seq}.json"
        assert main([str(src), "--dry-run", "--dim", "batch=1", "--dim", f"seq={seq}", "--report", str(rep), "-q"]) == 0
        ops = json.loads(rep.read_text())["ops"]
        projections = [op["flops"] for op in ops if op["op_type"] == "MatMul" and "proj" in op["name"]]
        assert len(projections) == 7  # q, k, v, o, gate, up, down
        assert min(projections) == 2 * seq * 128 * 128  # every token, not 8 rows
    rep = tmp_path / "default.json"
    assert main([str(src), "--dry-run", "--report", str(rep), "-q"]) == 0
    why = json.loads(rep.read_text())["summary"]["fp32_tensor_core_why"]
    if why:  # at the default 8 tokens the plan may be FP32 by cost; its advice names the inputs' dims first
        assert "input dims sized 8: batch, seq" in why and "unk__" not in why


def test_an_op_the_symbolic_inference_cannot_shape_leaves_no_file_behind(tmp_path, monkeypatch):
    """ONNX Runtime's tool saves ``sym_shape_infer_temp.onnx`` into the working directory when a
    shape stays unknown; the conversion must not write there."""
    nodes = [helper.make_node("Reshape", ["x", "rows"], ["flat"], name="flatten"),
             helper.make_node("Plugin", ["flat"], ["p"], name="plugin", domain="com.example"),
             helper.make_node("MatMul", ["flat", "W"], ["y"], name="proj")]
    shape = helper.make_tensor("rows", TensorProto.INT64, [2], [-1, 64])
    m = model(nodes, [fin("x", "batch", "seq", 64)], [fin("y", None, 1024), fin("p", None, 64)],
              [shape, weight("W", 64, 1024)])
    m.opset_import.append(helper.make_opsetid("com.example", 1))
    monkeypatch.chdir(tmp_path)
    summary = convert_onnx(m, dim_values={"batch": 4, "seq": 512})[1].summary
    assert list(tmp_path.iterdir()) == []
    assert summary["gemm_flops"] == 2 * (4 * 512) * 64 * 1024  # what it could shape is still used


def test_a_segformer_exported_from_a_batch_1_example_validates_by_default(tmp_path):
    """The dynamo exporter with a batch-1 example and a dynamic batch axis bakes 1 into a Reshape
    target behind the inputs' symbolic ``batch``: drawn at 2, the FP32 run failed ``--validate``
    (the field check's Segformer and SigLIP); the graph pins the size, and the report says where."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("onnxscript", reason="torch.onnx.export(dynamo=True) needs onnxscript")
    torch.manual_seed(0)
    cfg = transformers.SegformerConfig(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], num_labels=5,
                                       decoder_hidden_size=64, num_attention_heads=[1, 1, 2, 2])
    segformer = transformers.SegformerForSemanticSegmentation(cfg).eval()
    src, dst, rep = tmp_path / "segformer.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(segformer, (torch.rand(1, 3, 64, 64),), str(src), input_names=["pixel_values"],
                          dynamic_axes={"pixel_values": {0: "batch"}}, dynamo=True, verbose=False)
    assert main([str(src), "-o", str(dst), "--validate", "--report", str(rep), "-q"]) == 0
    report = json.loads(rep.read_text())
    assert report["validation"]["passed"]
    assert "batch = 1, pinned by Reshape" in report["summary"]["inputs_drawn"]["pixel_values"]


def _computed_head_split():
    """A TorchScript export's ``view(*x.size()[:-1], 4, 16)``: the Reshape target is
    Concat(Unsqueeze(Gather(Shape(h), 0)), Unsqueeze(Gather(Shape(h), 1)), [4], [16]), which onnx's
    inference cannot evaluate (no rank for anything after it); then q @ qT per head."""
    def dim(i):
        return [helper.make_node("Gather", ["hshape", f"i{i}"], [f"d{i}"], name=f"gather{i}", axis=0),
                helper.make_node("Unsqueeze", [f"d{i}", "zero"], [f"u{i}"], name=f"unsqueeze{i}")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="proj"),
             helper.make_node("Shape", ["h"], ["hshape"], name="shape"), *dim(0), *dim(1),
             helper.make_node("Concat", ["u0", "u1", "heads"], ["target"], name="concat", axis=0),
             helper.make_node("Reshape", ["h", "target"], ["split"], name="split"),
             helper.make_node("Transpose", ["split"], ["q"], name="heads_first", perm=[0, 2, 1, 3]),
             helper.make_node("Transpose", ["split"], ["k"], name="keys", perm=[0, 2, 3, 1]),
             helper.make_node("MatMul", ["q", "k"], ["scores"], name="scores")]
    ints = [helper.make_tensor("i0", TensorProto.INT64, [], [0]), helper.make_tensor("i1", TensorProto.INT64, [], [1]),
            helper.make_tensor("zero", TensorProto.INT64, [1], [0]),
            helper.make_tensor("heads", TensorProto.INT64, [2], [4, 16])]
    return model(nodes, [fin("x", "batch", "seq", 64)], [fin("scores", "batch", 4, "seq", "seq")],
                 [weight("W", 64, 64), *ints], opset=13)


def test_values_after_a_reshape_to_a_computed_shape_are_shaped():
    """A BERT exported at opset 11/13 with eager attention: every GEMM after the first head split
    was priced at 16 FLOPs (8.65 MFLOP seen of 168), and the plan kept it FP32 by cost."""
    report = convert_onnx(_computed_head_split(), dim_values={"batch": 2, "seq": 128})[1]
    flops = {op["name"]: op["flops"] for op in report.ops}
    assert flops["scores"] == 2 * 2 * 4 * 128 * 128 * 16
    assert report.summary["gemm_flops"] == flops["scores"] + 2 * 2 * 128 * 64 * 64


def test_a_large_constant_node_does_not_stop_relating_dims():
    """A Speech2Text exported with dynamo=False holds its sinusoidal position table in a Constant
    node: the inference copy strips its data, ONNX Runtime's inference read it and failed, and 158
    dims stayed sized 8."""
    m = _flattened_projection()
    table = helper.make_tensor("table_value", TensorProto.FLOAT, [64, 64], [0.5] * 64 * 64)  # 16 KiB: stripped
    m.graph.node.insert(0, helper.make_node("Constant", [], ["table"], name="positions", value=table))
    m.graph.node.insert(1, helper.make_node("MatMul", ["x0", "table"], ["x"], name="mix"))
    m.graph.input[0].name = "x0"
    summary = convert_onnx(m, dim_values={"batch": 4, "seq": 512})[1].summary
    assert summary["gemm_flops"] == 2 * (4 * 512) * 64 * (64 + 1024)


def test_relating_dims_does_not_import_torch(tmp_path):
    """ONNX Runtime's shape tool is loaded without ``onnxruntime/tools/__init__.py``, which imports
    torch where it is installed: seconds added to every ONNX conversion with symbolic dims."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed: nothing could import it")
    path = tmp_path / "flat.onnx"
    onnx.save(_flattened_projection(), path)
    probe = ("import sys\nfrom amp_compiler import convert_onnx\n"
             "flops = convert_onnx(sys.argv[1], dim_values={'batch': 4, 'seq': 512})[1].summary['gemm_flops']\n"
             "print(int(flops), 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(2 * (4 * 512) * 64 * 1024), "False"]  # dims related, torch never loaded
