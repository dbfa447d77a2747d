"""Small and batch-1 models convert by default; where casts cost more than a tie, the report says why."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.builders import fin, model, plan_result, rms_norm_stack, weight
from amp_compiler.onnx_api import convert_onnx  # noqa: E402  isort: skip
from amp_compiler.plan_report import build_report  # noqa: E402  isort: skip
from passes.convert import TIE_LAUNCHES, tie_tolerance  # noqa: E402  isort: skip
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


def _se_cnn(c=16, px=64, blocks=2):
    """Batch 1, EfficientNet-style: stem, MBConv blocks (expand 1x1, depthwise 3x3, squeeze-excitation:
    ReduceMean -> 1x1 conv -> SiLU -> 1x1 conv -> Sigmoid -> Mul, project 1x1, residual), head, pool,
    classifier. SiLU is Sigmoid and Mul, as the dynamo exporter writes it."""
    mk = helper.make_node
    nodes, e = [], 4 * c

    def silu(x, n):
        nodes.extend([mk("Sigmoid", [x], [f"{n}_s"], name=f"{n}_sig"), mk("Mul", [x, f"{n}_s"], [n], name=n)])
        return n

    nodes.append(mk("Conv", ["x", "W0"], ["a"], name="stem", pads=[1] * 4, strides=[2, 2]))
    x = silu("a", "a1")
    inits = [weight("W0", c, 3, 3, 3), numpy_helper.from_array(np.array([2, 3], np.int64), "hw")]
    for i in range(blocks):
        n = f"b{i}_"
        nodes.append(mk("Conv", [x, f"{n}We"], [f"{n}e"], name=f"{n}expand"))
        nodes.append(mk("Conv", [silu(f"{n}e", f"{n}e1"), f"{n}Wd"], [f"{n}d"], name=f"{n}depthwise", group=e,
                        pads=[1] * 4))
        d = silu(f"{n}d", f"{n}d1")
        nodes += [mk("ReduceMean", [d, "hw"], [f"{n}m"], name=f"{n}se_mean", keepdims=1),
                  mk("Conv", [f"{n}m", f"{n}Wr", f"{n}br"], [f"{n}r"], name=f"{n}se_reduce")]
        nodes += [mk("Conv", [silu(f"{n}r", f"{n}r1"), f"{n}Wx", f"{n}bx"], [f"{n}g"], name=f"{n}se_expand"),
                  mk("Sigmoid", [f"{n}g"], [f"{n}g1"], name=f"{n}se_gate"),
                  mk("Mul", [d, f"{n}g1"], [f"{n}se"], name=f"{n}se_scale"),
                  mk("Conv", [f"{n}se", f"{n}Wp"], [f"{n}p"], name=f"{n}project"),
                  mk("Add", [x, f"{n}p"], [f"{n}y"], name=f"{n}residual")]
        inits += [weight(f"{n}We", e, c, 1, 1), weight(f"{n}Wd", e, 1, 3, 3), weight(f"{n}Wr", 4, e, 1, 1),
                  weight(f"{n}br", 4), weight(f"{n}Wx", e, 4, 1, 1), weight(f"{n}bx", e), weight(f"{n}Wp", c, e, 1, 1)]
        x = f"{n}y"
    nodes.append(mk("Conv", [x, "Wh"], ["h"], name="head"))
    nodes += [mk("GlobalAveragePool", [silu("h", "h1")], ["g"], name="pool"), mk("Flatten", ["g"], ["f"], name="flat"),
              mk("Gemm", ["f", "Wc", "bc"], ["y"], name="classifier", transB=1)]
    inits += [weight("Wh", e, c, 1, 1), weight("Wc", 10, e), weight("bc", 10)]
    return model(nodes, [fin("x", 1, 3, px, px)], [fin("y", 1, 10)], inits)


_MODELS = {"transformer 2x64": lambda: transformer_graph(24, hidden=128, seq=64, batch=2),
           "depthwise cnn batch 1": _depthwise_cnn,
           "squeeze-excite cnn batch 1": _se_cnn}


@pytest.mark.parametrize("name", _MODELS)
@pytest.mark.parametrize("deploy, deny_propagation", [("ort-cuda", False), ("ort-cuda", True), ("eager", True),
                                                      ("tensorrt", True), ("inductor", False)])
def test_small_models_convert_by_default(name, deploy, deny_propagation):
    """Launch-bound: FP16 saves < 1 µs and adds a few cast kernels where casts are kernels
    (ort-cuda, eager), a tie by the floor of TIE_LAUNCHES launches, so memory decides; where
    casts fuse FP16 is simply faster. Never slower than FP32 beyond the tie tolerance."""
    result = plan_result(_MODELS[name](), runtime=deploy, deny_propagation=deny_propagation)
    s = build_report(result).summary
    assert s["fp16_gemm_flop_fraction"] >= 0.95
    tol = tie_tolerance(s["predicted_time_fp32_s"], TIE_LAUNCHES * result.timer.launch)
    assert s["predicted_time_mixed_s"] <= s["predicted_time_fp32_s"] + tol
    assert s["predicted_memory_mixed_bytes"] < 0.6 * s["predicted_memory_fp32_bytes"]


def _rms_norm_stack(scaled=False):
    """GEMMs between T5-style RMSNorms (eps 1e-6: numerics rule 8 keeps the mean and the root
    FP32; Pow and Reciprocal are deny): every norm is an FP32 island, two casts each.
    ``scaled``: each norm ends in a Mul by a learned 1-D weight, as T5's and Llama's do."""
    return rms_norm_stack(gamma=(lambda i, d: np.full(d, 1.5)) if scaled else None)


def test_rule_held_islands_on_ort_keep_fp32_and_say_why(monkeypatch):
    """ONNX Runtime runs each cast as a kernel and does not fuse this RMSNorm (its
    SimplifiedLayerNormFusion ends at a Mul by a 1-D weight, which this norm lacks): two casts
    per island are far more than the tie floor, so the plan stays FP32; the report's first lines give the numbers, what the
    casts border and what would change it, and --objective memory converts."""
    _, report = convert_onnx(_rms_norm_stack())
    s = report.summary
    assert s["fp16_gemm_flop_fraction"] == 0.0
    why = s["fp32_tensor_core_why"]
    assert "100% of GEMM/conv FLOPs" in why and "(ort-cuda)" in why and "casts by +" in why
    assert "border ops that stay FP32 whatever the plan: 6 casts at 6 Pow, 6 at 6 Reciprocal" in why
    first = report.to_text(max_rows=5).splitlines()[2:7]
    assert all(line.startswith("! ") for line in first) and not any("…" in first[i] for i in (0, 1, 2, 4))
    assert "casts by +" in first[1] and "border ops" in first[2] and "--objective memory" in first[4]
    # the rules that hold the islands FP32, commonest first (the terminal may cut the line)
    assert first[3].startswith("! held FP32 by: pow overflows or loses precision in FP16 (6 ops); 1/x overflows")
    assert "held FP32 by: " in why and "(6 ops)" in why.splitlines()[3]
    assert "--dim" not in why  # every dim is static: sizing dims would change nothing
    dynamic = _rms_norm_stack()
    dynamic.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "tokens"
    assert "--dim NAME=SIZE (1 input dims sized 8: tokens)" in convert_onnx(dynamic)[1].summary["fp32_tensor_core_why"]
    assert "--dim" not in convert_onnx(dynamic, dim_values={"tokens": 16})[1].summary["fp32_tensor_core_why"]

    # a dim inference made up (TorchScript's unk__N) and nothing could relate: no --dim can name it
    monkeypatch.setattr("amp_compiler.onnx_io.symbolic_dims.symbolic_model", lambda light: None)
    dynamic.graph.value_info.append(helper.make_tensor_value_info("b0_h", TensorProto.FLOAT, ["unk__7", 64]))
    why = convert_onnx(dynamic, dim_values={"tokens": 16})[1].summary["fp32_tensor_core_why"]
    assert "--default-dim N (1 dims no input declares sized 8)" in why and "--dim NAME" not in why, why
    _, by_memory = convert_onnx(_rms_norm_stack(), objective="memory")
    assert by_memory.summary["fp16_gemm_flop_fraction"] == 1.0
    _, fused = convert_onnx(_rms_norm_stack(), deploy="inductor")  # the casts fold into the norm's kernel
    assert fused.summary["fp16_gemm_flop_fraction"] == 1.0


def test_scaled_rms_norms_fuse_on_ort_and_the_gemms_convert():
    """With the scale Mul T5 and Llama have, ONNX Runtime runs each norm as one kernel that
    absorbs the casts around its FP32 eps chain (cost_model/norm_pattern.py): no cast is charged
    there, and every GEMM between two norms converts by default. The first one needs a cast
    kernel of the FP32 graph input, one launch: a near-tie that converts it too (its weights
    halve), so every GEMM runs FP16."""
    _, report = convert_onnx(_rms_norm_stack(scaled=True))
    s = report.summary
    assert s["fp16_gemm_flop_fraction"] == 1.0 and not s["fp32_tensor_core_why"]
    assert s["predicted_time_mixed_s"] <= s["predicted_time_fp32_s"] + TIE_LAUNCHES * 4e-6  # H100: 4 µs a launch
    _, eager = convert_onnx(_rms_norm_stack(scaled=True), deploy="eager")  # casts are kernels there
    assert eager.summary["fp16_gemm_flop_fraction"] == 0.0


def test_why_prices_memory_as_the_report_does():
    """The why-line's "memory by" is the summary's own all-FP16 change (weights plus peak
    activations). It was the cut's proxy, the sum of every op output: on the 100k-node
    benchmark graph, -37,486 MiB for a model predicted at 12 MiB."""
    import re

    _, report = convert_onnx(_rms_norm_stack())
    s = report.summary
    change = float(re.search(r"memory by ([-+][0-9.]+) MiB", s["fp32_tensor_core_why"]).group(1)) * 2 ** 20
    span = s["predicted_memory_mixed_bytes"] - s["predicted_memory_all_fp16_bytes"]  # the plan is all FP32 here
    assert s["fp16_gemm_flop_fraction"] == 0.0 and span > 0
    assert abs(change + span) <= 2 ** 20 / 200, (change, span)  # to the line's 2 decimals


def test_why_counts_ops_held_by_deny_propagation_as_one_reason():
    """Each op deny propagation holds carries the names of its deny op and path in its reason; the
    "held FP32 by" line counted each as a reason of its own: "... through b0_Add_25: ... (1 ops)"."""
    import re

    from benchmarks.synthetic import transformer_graph

    _, report = convert_onnx(transformer_graph(150))  # decomposed statistics: Pow (deny), then Adds
    graph_ops = {op["name"] for op in report.data["ops"]}
    held = next(line for line in report.summary["fp32_tensor_core_why"].splitlines() if line.startswith("held"))
    counts = {why.strip(): int(n) for why, n in re.findall(r"([^;]+) \((\d+) ops?\)", held[len("held FP32 by: "):])}
    downstream = [n for why, n in counts.items() if why.startswith("downstream of a deny op")]
    assert downstream and downstream[0] > 1, held
    assert not any(name in held for name in graph_ops), held  # no op's name: a count of kinds


def test_why_counts_casts_and_the_ops_they_border_apart():
    """An Exp (deny) between two small convolutions: two casts border one op. The first lines
    said "2x Exp", read as two Exp ops (a Segformer's four deny ops read "8x")."""
    nodes = [helper.make_node("Conv", ["x", "K1"], ["a"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Exp", ["a"], ["up"], name="exp"),
             helper.make_node("Conv", ["up", "K2"], ["y"], name="conv2", pads=[1, 1, 1, 1])]
    inits = [weight("K1", 16, 16, 3, 3), weight("K2", 16, 16, 3, 3)]
    m = model(nodes, [fin("x", 1, 16, 8, 8)], [fin("y", 1, 16, 8, 8)], inits)
    why = convert_onnx(m)[1].summary["fp32_tensor_core_why"]
    assert "whatever the plan: 2 casts at 1 Exp" in why, why


@pytest.mark.parametrize("deploy", ["tensorrt", "inductor"])
def test_the_advice_names_only_options_not_in_effect(deploy):
    """A YOLOS's patch embedding reads the FP32 image under --deploy tensorrt and stays FP32 by
    cost; the advice was to pass --deploy tensorrt|inductor, already given. Under a runtime that
    fuses casts only the objective is left to suggest."""
    nodes = [helper.make_node("Conv", ["x", "W"], ["y"], name="patch", strides=[16, 16])]
    m = model(nodes, [fin("x", 8, 3, 64, 64)], [fin("y", 8, 32, 4, 4)], [weight("W", 32, 3, 16, 16)])
    _, eager = convert_onnx(m, deploy="eager")
    assert "--deploy tensorrt|inductor (casts fuse), --objective memory" in eager.summary["fp32_tensor_core_why"]
    _, fused = convert_onnx(m, deploy=deploy)
    why = fused.summary["fp32_tensor_core_why"]
    assert "FP32 by cost" in why and why.splitlines()[-1] == ("would change it: --no-keep-io-types (2 I/O casts), "
                                                              "--objective memory")


def test_casts_only_at_the_graph_boundary_are_said_plainly():
    """One small GEMM between FP32 graph input and output: the only casts are at the boundary (the
    line had read "the casts are at 2 at graph inputs/outputs")."""
    m = model([helper.make_node("MatMul", ["x", "W"], ["y"], name="proj")], [fin("x", 512, 256)],
              [fin("y", 512, 256)], [weight("W", 256, 256)])
    why = convert_onnx(m)[1].summary["fp32_tensor_core_why"]
    assert "\nits casts: 2 at graph inputs/outputs\n" in why, why
