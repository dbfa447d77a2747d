"""RMSNorms written in the form ONNX Runtime fuses (docs/architecture.md, "ONNX emitter")."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from tests.builders import fin, model, plan_result, rms_norm_stack
from cost_model.norm_pattern import rms_norms  # noqa: E402  isort: skip
from amp_compiler.onnx_api import convert_onnx  # noqa: E402  isort: skip
from benchmarks import torture  # noqa: E402  isort: skip

ort = pytest.importorskip("onnxruntime")


def _rms_stack(blocks=3, d=64, tokens=16, seed=0, torchscript=False):
    """MatMul -> RMSNorm (rsqrt form) -> Mul(gamma), ``blocks`` times, gammas in [0.5, 1.5]."""
    rng = np.random.default_rng(seed)
    return rms_norm_stack(blocks, d, tokens, gamma=lambda i, d: rng.uniform(0.5, 1.5, d), torchscript=torchscript)


def _ort(m: onnx.ModelProto, feeds: dict, optimized: str) -> tuple[np.ndarray, list[str]]:
    """Outputs on the CPU EP at the default optimisation level, and the op types ORT ran."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.optimized_model_filepath = optimized
    y = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    return y, [n.op_type for n in onnx.load(optimized).graph.node]


def _copy(m: onnx.ModelProto) -> onnx.ModelProto:
    c = onnx.ModelProto()
    c.CopyFrom(m)
    return c


@pytest.mark.parametrize("objective, torchscript", [("time", False), ("memory", False), ("time", True)])
def test_ort_fuses_each_emitted_rms_norm_into_one_kernel(objective, torchscript, tmp_path):
    """On ort-cuda the rsqrt tail is written as Div: ONNX Runtime loads the output and fuses
    every norm into one SimplifiedLayerNormalization, its FP32 chain behind FP16 GEMMs (the
    casts around it priced as absorbed, the GEMMs convert by default), within 1e-2 of FP32.
    ``torchscript``: the TorchScript exporter's Gemma norm (``Div(1, s)``, a no-op Cast, the
    scale ``1 + w`` unfolded) was not matched: each norm an FP32 island, Gemma-2 0 % FP16."""
    src = _rms_stack(torchscript=torchscript)
    feeds = {"x": np.random.default_rng(1).standard_normal((16, 64)).astype(np.float32)}
    ref, unfused = _ort(src, feeds, str(tmp_path / "src.onnx"))
    assert ("SimplifiedLayerNormalization" in unfused) is torchscript  # ORT fuses that form as written
    assert len(rms_norms(plan_result(_copy(src)).graph, rsqrt_form=True)) == 3  # and so the cost model prices it
    out, report = convert_onnx(_copy(src), objective=objective)
    assert report.summary["fp16_gemm_flop_fraction"] >= (1.0 if objective == "memory" else 0.6)
    assert not [n for n in out.graph.node if n.op_type == "Reciprocal"]
    y, ran = _ort(out, feeds, str(tmp_path / "out.onnx"))
    assert ran.count("SimplifiedLayerNormalization") == 3
    assert not {"Pow", "ReduceMean", "Sqrt", "Div"} & set(ran)
    assert np.abs(y - ref).max() <= 1e-2 * np.abs(ref).max()


def test_fp16_producers_get_the_cast_shape_the_cuda_fusion_absorbs():
    """ORT's CUDA EP (not testable here) folds Cast(->FP32) read by exactly Pow and Div, and the
    Cast(->FP16) between Div and the scale Mul, into the fused kernel (layer_norm_fusion.cc,
    SimplifiedLayerNormFusion, ``is_gpu_ep``): the emitted nodes must have that shape."""
    out, _ = convert_onnx(_rms_stack(), objective="memory")
    nodes = list(out.graph.node)
    by_output = {o: n for n in nodes for o in n.output}
    readers = lambda t: [n for n in nodes if t in n.input]  # noqa: E731
    divs = [n for n in nodes if n.op_type == "Div"]
    assert len(divs) == 3
    for div in divs:
        lead = by_output[div.input[0]]
        assert lead.op_type == "Cast" and helper.get_attribute_value(lead.attribute[0]) == onnx.TensorProto.FLOAT
        assert sorted(n.op_type for n in readers(lead.output[0])) == ["Div", "Pow"]
        (tail,) = readers(div.output[0])
        assert tail.op_type == "Cast" and helper.get_attribute_value(tail.attribute[0]) == onnx.TensorProto.FLOAT16
        assert [n.op_type for n in readers(tail.output[0])] == ["Mul"]


def test_only_profiles_that_fuse_it_and_only_the_rms_norm_tail_are_rewritten():
    out, _ = convert_onnx(_rms_stack(), deploy="inductor")
    assert len([n for n in out.graph.node if n.op_type == "Reciprocal"]) == 3
    nodes = [helper.make_node("Sqrt", ["x"], ["s"], name="sqrt"), helper.make_node("Reciprocal", ["s"], ["r"], name="rec"),
             helper.make_node("Mul", ["x", "r"], ["y"], name="mul")]  # no Pow/ReduceMean: not an RMSNorm
    out, _ = convert_onnx(model(nodes, [fin("x", 4, 8)], [fin("y", 4, 8)], []))
    assert [n.op_type for n in out.graph.node if n.op_type in ("Reciprocal", "Div")] == ["Reciprocal"]


def test_rewritten_rms_norm_holds_in_gpu_like_emulation(tmp_path):
    """The torture set's rms_norm case (activations ~1000) in the exporter's Reciprocal form,
    converted to FP16 GEMMs: each op on its declared dtypes stays within the torture tolerance."""
    src = _rms_stack(blocks=2, d=128, tokens=32)
    x = (np.random.default_rng(2).standard_normal((32, 128)) * 1000.0).astype(np.float32)
    onnx.save_model(src, tmp_path / "src.onnx")
    ref, _ = torture.fp16_storage_outputs(tmp_path / "src.onnx", {"x": x})
    out, report = convert_onnx(_copy(src), objective="memory")
    assert report.summary["fp16_gemm_flop_fraction"] == 1.0
    onnx.save_model(out, tmp_path / "out.onnx")
    y, why = torture.fp16_storage_outputs(tmp_path / "out.onnx", {"x": x})
    assert y is not None, why
    err = np.abs(y[0].astype(np.float32) - ref[0]).max() / np.abs(ref[0]).max()
    assert np.isfinite(y[0]).all() and err <= torture.TOLERANCE


@pytest.mark.parametrize("objective", ["time", "memory"])
def test_the_ruler_prices_the_emitted_div_form_as_the_plan_priced_the_rsqrt_form(objective):
    """The planner prices each Reciprocal-form norm as the fused kernel it will be once written;
    the independent ruler, reading the emitted Div form (casts included), agrees exactly, while
    it prices the exporter's own Reciprocal form unfused (ONNX Runtime does not fuse it)."""
    from amp_compiler.analysis import analyze_model
    from amp_compiler.onnx_io.importer import import_model
    from amp_compiler.plan import make_context
    from cost_model.timer import OpTimer

    out, report = convert_onnx(_rms_stack(), objective=objective)
    assert analyze_model(out).predicted_time_s == pytest.approx(report.summary["predicted_time_mixed_s"], rel=1e-9)
    graph = import_model(_rms_stack()).graph
    planned = OpTimer(graph, make_context(runtime="ort-cuda"))
    assert [len(n.members) for n in planned.groups.norms.values()] == [7, 7, 7]  # Pow .. Reciprocal, Mul, scale Mul
    assert not OpTimer(graph, make_context(runtime="ort-cuda"), as_written=True).groups.norms
    assert not OpTimer(graph, make_context(runtime="eager")).groups.norms
    fp32 = analyze_model(_rms_stack()).predicted_time_s
    assert fp32 > report.summary["predicted_time_fp32_s"]  # 7 kernels a norm as written, 1 once rewritten


@pytest.mark.parametrize("objective", ["time", "memory"])
def test_the_report_describes_the_file_as_written(objective):
    """The rewrite is made on the IR, so the report lists exactly the written nodes: the Div
    under the norm's name and its Cast, no Reciprocal or casts the rewrite removed, and every
    float op in the dtype the file declares for its inputs."""
    src = _rms_stack()
    out, report = convert_onnx(_copy(src), objective=objective)
    written = {n.name: n for n in out.graph.node}
    reported = {op["name"]: op for op in report.to_dict()["ops"]}
    casts = {c["name"]: c for c in report.to_dict()["casts"] if c["inserted"]}
    assert set(written) == set(reported) | set(casts)
    assert all(written[name].op_type == op["op_type"] for name, op in reported.items())
    assert all(written[name].op_type == "Cast" and helper.get_attribute_value(written[name].attribute[0])
               == onnx.helper.np_dtype_to_tensor_dtype(np.dtype(c["to"])) for name, c in casts.items())
    assert [op["op_type"] for name, op in reported.items() if name.endswith("_norm")] == ["Div"] * 3
    inferred = onnx.shape_inference.infer_shapes(out).graph
    dtype = {v.name: v.type.tensor_type.elem_type for v in [*inferred.value_info, *inferred.input, *inferred.output]}
    dtype.update({i.name: i.data_type for i in inferred.initializer})
    float_types = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.FLOAT16: "float16"}
    for name, op in reported.items():
        declared = {float_types[dtype[i]] for i in written[name].input if dtype.get(i) in float_types}
        if declared and op["op_type"] not in ("Identity",):
            assert declared == {op["precision"]}, (name, declared, op["precision"])
