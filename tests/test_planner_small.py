"""Small and batch-1 models: converted where the runtime fuses casts, and told why where it does not."""

from __future__ import annotations

import pytest
from onnx import helper

from tests.builders import fin, model, weight
from amp_compiler.onnx_api import convert_onnx  # noqa: E402  isort: skip
from benchmarks.synthetic import transformer_graph  # noqa: E402  isort: skip


def _depthwise_cnn(c=32, px=64):
    """Batch 1: stem conv, depthwise 3x3 (group = channels), pointwise 1x1, pool, classifier."""
    nodes = [helper.make_node("Conv", ["x", "W0"], ["a"], name="stem", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["a1"], name="r0"),
             helper.make_node("Conv", ["a1", "Wd"], ["d"], name="depthwise", group=c, pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["d"], ["d1"], name="r1"),
             helper.make_node("Conv", ["d1", "Wp"], ["p"], name="pointwise"),
             helper.make_node("Relu", ["p"], ["p1"], name="r2"),
             helper.make_node("GlobalAveragePool", ["p1"], ["g"], name="pool"),
             helper.make_node("Flatten", ["g"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "Wc", "bc"], ["y"], name="classifier", transB=1)]
    inits = [weight("W0", c, 3, 3, 3), weight("Wd", c, 1, 3, 3), weight("Wp", 2 * c, c, 1, 1),
             weight("Wc", 16, 2 * c), weight("bc", 16)]
    return model(nodes, [fin("x", 1, 3, px, px)], [fin("y", 1, 16)], inits)


_MODELS = {"transformer 2x64": lambda: transformer_graph(24, hidden=128, seq=64, batch=2),
           "depthwise cnn batch 1": _depthwise_cnn}


@pytest.mark.parametrize("name", _MODELS)
@pytest.mark.parametrize("deploy", ["tensorrt", "inductor"])
def test_small_models_convert_where_casts_fuse(name, deploy):
    _, report = convert_onnx(_MODELS[name](), deploy=deploy)
    s = report.summary
    assert s["fp16_gemm_flop_fraction"] >= 0.95
    assert s["predicted_time_mixed_s"] <= s["predicted_time_fp32_s"]
    assert s["predicted_memory_mixed_bytes"] < 0.6 * s["predicted_memory_fp32_bytes"]


@pytest.mark.parametrize("name", _MODELS)
def test_launch_bound_model_on_ort_says_why_and_what_would_change_it(name):
    """ONNX Runtime runs each cast as a kernel: where FP16 saves less than those launches the
    plan stays FP32, the report's first lines give the numbers, and --objective memory converts."""
    _, report = convert_onnx(_MODELS[name]())
    s = report.summary
    assert s["fp16_gemm_flop_fraction"] == 0.0 and s["predicted_time_all_fp16_s"] > s["predicted_time_fp32_s"]
    why = s["fp32_tensor_core_why"]
    assert "100% of GEMM/conv FLOPs" in why and "(ort-cuda)" in why and "casts by +" in why
    first = report.to_text(max_rows=5).splitlines()[2:5]
    assert all(line.startswith("! ") and "…" not in line for line in first)
    assert "casts by +" in first[1] and "--objective memory" in first[2]
    _, by_memory = convert_onnx(_MODELS[name](), objective="memory")
    assert by_memory.summary["fp16_gemm_flop_fraction"] >= 0.95
