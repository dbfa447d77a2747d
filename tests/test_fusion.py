"""Fusion groups per runtime profile, and the energy that prices them."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from tests.builders import fin, model, plan, plan_result, weight
from amp_compiler.plan_report import build_report  # noqa: E402  isort: skip
from amp_compiler.onnx_io.importer import import_model  # noqa: E402  isort: skip
from amp_compiler.registry import DEFAULT_REGISTRY  # noqa: E402  isort: skip
from cost_model.runtime import RUNTIMES, default_runtime, get_runtime  # noqa: E402  isort: skip
from cost_model.fusion import form_groups  # noqa: E402  isort: skip


def _block(d=128, n=256):
    """MatMul -> bias Add -> Tanh -> Mul -> residual Add, then QK^T -> Div -> Softmax -> PV."""
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
             helper.make_node("Add", ["h", "b"], ["hb"], name="bias"),
             helper.make_node("Tanh", ["hb"], ["a"], name="act"),
             helper.make_node("Mul", ["a", "a"], ["a2"], name="sq"),
             helper.make_node("Add", ["a2", "x"], ["r"], name="residual"),
             helper.make_node("Transpose", ["r"], ["rt"], name="kt", perm=[1, 0]),
             helper.make_node("MatMul", ["r", "rt"], ["s"], name="qk"),
             helper.make_node("Div", ["s", "scale"], ["s2"], name="scale_div"),
             helper.make_node("Softmax", ["s2"], ["p"], name="softmax", axis=-1),
             helper.make_node("MatMul", ["p", "r"], ["y"], name="pv")]
    inits = [weight("W", d, d), weight("b", d), helper.make_tensor("scale", 1, [], [8.0])]
    return model(nodes, [fin("x", n, d)], [fin("y", n, d)], inits)


def _groups(runtime: str) -> list[set[str]]:
    graph = import_model(_block()).graph
    from passes import ClassifyPass
    from passes.base import PlanContext

    ClassifyPass()(graph, PlanContext())
    groups = form_groups(graph, get_runtime(runtime), DEFAULT_REGISTRY)
    return sorted((set(m) for m in groups.members.values()), key=len, reverse=True)


def test_eager_runs_every_op_alone():
    assert all(len(g) == 1 for g in _groups("eager"))


def test_inductor_fuses_the_elementwise_chain_but_not_into_the_extern_gemm():
    groups = _groups("inductor")
    assert {"bias", "act", "sq", "residual"} <= groups[0]
    assert not any("mm" in g and len(g) > 1 for g in groups)  # cuBLAS is an extern kernel
    assert any({"scale_div", "softmax"} <= g for g in groups)


def test_tensorrt_fuses_the_gemm_epilogue_and_attention():
    groups = _groups("tensorrt")
    assert any({"mm", "bias", "act", "sq", "residual"} <= g for g in groups)
    assert any({"qk", "scale_div", "softmax", "pv"} <= g for g in groups)


def test_groups_stay_convex():
    """a -> b and a -> c -> d -> b with c a reduction inductor cannot fuse backwards into:
    b may not join a's group while d is outside it."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="a"),
             helper.make_node("MatMul", ["a", "W"], ["c"], name="c"),
             helper.make_node("Tanh", ["c"], ["d"], name="d"),
             helper.make_node("Add", ["a", "d"], ["b"], name="b")]
    graph = import_model(model(nodes, [fin("x", 64, 64)], [fin("b", 64, 64)], [weight("W", 64, 64)])).graph
    groups = form_groups(graph, get_runtime("inductor"), DEFAULT_REGISTRY)
    assert not groups.same_group("a", "b") or groups.same_group("a", "d")
    assert not groups.same_group("a", "c")


def test_fused_chain_costs_one_launch_and_its_boundary_traffic():
    """The same chain of 8 elementwise ops: eager pays 8 launches and 8 round trips through
    memory; inductor one launch and one read and write."""
    nodes = [helper.make_node("Relu" if i % 2 else "Tanh", [f"t{i}"], [f"t{i + 1}"], name=f"e{i}") for i in range(8)]
    m = model(nodes, [fin("t0", 4096, 1024)], [fin("t8", 4096, 1024)])
    result = plan_result(m, runtime="eager", planner="all")
    eager = build_report(result)
    _, fused = plan(m, runtime="inductor", planner="all")
    roofline = result.timer.roofline
    kernel = roofline.launch_overhead + roofline.bytes_time(2 * 4096 * 1024 * 4)  # read + write in FP32
    # (plus the interior ops' arithmetic, a few % here: each op is priced max(compute, its bytes))
    assert eager.summary["predicted_time_fp32_s"] == pytest.approx(8 * kernel, rel=0.05)
    assert fused.summary["predicted_time_fp32_s"] == pytest.approx(kernel, rel=0.05)


@pytest.mark.parametrize("runtime, free", [("inductor", True), ("tensorrt", True), ("ort-cuda", False),
                                           ("eager", False)])
def test_a_cast_inside_a_fused_kernel_is_free_only_where_casts_fuse(runtime, free):
    """Exp (deny, FP32) between two FP16 GEMMs' epilogue ops: the casts around it fall inside
    one fused group on inductor/TensorRT, and cost a kernel each on ORT and eager."""
    d = 256
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"], name="mm1"),
             helper.make_node("Tanh", ["h"], ["a"], name="a"),
             helper.make_node("Exp", ["a"], ["e"], name="exp"),
             helper.make_node("Tanh", ["e"], ["f"], name="f"),
             helper.make_node("MatMul", ["f", "W2"], ["y"], name="mm2")]
    m = model(nodes, [fin("x", 512, d)], [fin("y", 512, d)], [weight("W1", d, d), weight("W2", d, d)])
    result = plan_result(m, runtime=runtime, planner="all")
    graph, report, timer = result.graph, build_report(result), result.timer
    cost = timer.cast_time(graph.tensors["a"], "float16")  # priced on the graph as planned
    assert (cost == 0.0) == free
    assert free or cost > timer.roofline.launch_overhead
    assert report.summary["inserted_casts"] >= 2  # the casts are there; only their price differs


def test_profiles_and_defaults():
    assert set(RUNTIMES) >= {"eager", "ort-cuda", "tensorrt", "inductor"}
    assert default_runtime("onnx") == "ort-cuda"
    assert default_runtime("torch", "inductor") == "inductor" and default_runtime("torch", None) == "eager"
    with pytest.raises(ValueError, match="unknown runtime profile"):
        get_runtime("tvm")
    assert not RUNTIMES["ort-cuda"].fuse_casts and RUNTIMES["inductor"].fuse_casts
    assert RUNTIMES["inductor-cudagraphs"].launch_scale < RUNTIMES["inductor"].launch_scale
    np.testing.assert_equal(len(RUNTIMES["eager"].fused_edges), 0)


def _rms_norm(form: str):
    """x -> Pow -> ReduceMean -> Add eps -> Sqrt -> (Reciprocal, Mul x | Div x) -> Mul scale."""
    import onnx
    from onnx import numpy_helper

    tail = ([helper.make_node("Reciprocal", ["s"], ["r"]), helper.make_node("Mul", ["x", "r"], ["n"])]
            if form == "reciprocal" else [helper.make_node("Div", ["x", "s"], ["n"])])
    nodes = [helper.make_node("Pow", ["x", "two"], ["p"]), helper.make_node("ReduceMean", ["p", "axes"], ["m"]),
             helper.make_node("Add", ["m", "eps"], ["a"]), helper.make_node("Sqrt", ["a"], ["s"]), *tail,
             helper.make_node("Mul", ["w", "n"], ["y"])]
    inits = [numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array([-1], np.int64), "axes"),
             numpy_helper.from_array(np.array(1e-6, np.float32), "eps"), weight("w", 64)]
    return onnx.shape_inference.infer_shapes(model(nodes, [fin("x", 16, 64)], [fin("y", 16, 64)], inits))


def test_ort_fuses_an_rms_norm_only_in_its_div_form(tmp_path):
    """Why the ONNX emitter rewrites the RMSNorms ``ort-cuda`` prices as fused (onnx_io/rms_norm_form.py)
    and the ruler prices a file's Reciprocal form unfused: ONNX Runtime's SimplifiedLayerNormFusion
    matches ``Sqrt -> Div``, not the ``Sqrt -> Reciprocal -> Mul`` the dynamo exporter writes for
    ``torch.rsqrt``. If ORT learns the second form, ``analysis`` may price it fused too."""
    ort = pytest.importorskip("onnxruntime")
    import onnx

    fused = {}
    for form in ("div", "reciprocal"):
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.optimized_model_filepath = str(tmp_path / f"{form}.onnx")
        ort.InferenceSession(_rms_norm(form).SerializeToString(), so, providers=["CPUExecutionProvider"])
        fused[form] = [n.op_type for n in onnx.load(so.optimized_model_filepath).graph.node]
    assert fused["div"] == ["SimplifiedLayerNormalization"]
    assert "Reciprocal" in fused["reciprocal"] and "SimplifiedLayerNormalization" not in fused["reciprocal"]
