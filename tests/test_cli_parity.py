"""The options users bring from ModelOpt AutoCast and ORT's float16 tool (docs/migrating.md).

Each test drives one option through ``convert_onnx`` and, where the CLI has it, through
``amp-compile``; the model is a three-MatMul MLP (width 64-128) that the H100 cost model
keeps entirely in FP32 by default (launch bound), so a forced FP16 op is visible.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from amp_compiler import cli, convert_onnx
from amp_compiler.errors import ConversionError
from cost_model import DEVICES

from .builders import fin, model, nodes_of, run, weight

NEW_DEVICES = ["b200", "gb200", "l40s", "rtx5090", "jetson_orin", "mi300x"]


def mlp(batch: int = 4) -> onnx.ModelProto:
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["h0"], name="/enc/0/MatMul"),
             helper.make_node("Relu", ["h0"], ["r0"], name="/enc/0/Relu"),
             helper.make_node("MatMul", ["r0", "w1"], ["h1"], name="/enc/1/MatMul"),
             helper.make_node("Relu", ["h1"], ["r1"], name="/enc/1/Relu"),
             helper.make_node("MatMul", ["r1", "w2"], ["h2"], name="/head/MatMul"),
             helper.make_node("ReduceSum", ["h2", "axes"], ["y"], name="/head/ReduceSum", keepdims=1)]
    inits = [weight("w0", 64, 128), weight("w1", 128, 64), weight("w2", 64, 64),
             numpy_helper.from_array(np.array([-1], np.int64), "axes")]
    return model(nodes, [fin("x", batch, 64)], [fin("y", batch, 1)], inits)


def islands() -> onnx.ModelProto:
    """``mlp`` with an Exp (deny) after each MatMul: FP16 GEMMs would need six cast kernels, more
    than a near-tie, so the cost model keeps everything FP32 (launch bound)."""
    m = mlp()
    for node in m.graph.node:
        if node.op_type == "Relu":
            node.op_type = "Exp"
    return m


def precisions(report) -> dict[str, str]:
    return {row["name"]: row["precision"] for row in report.data["ops"]}


def reasons(report) -> dict[str, str]:
    return {row["name"]: row["reason"] for row in report.data["ops"]}


@pytest.fixture
def mlp_file(tmp_path):
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp(), path)
    return path


def cli_plan(path, tmp_path, *options) -> dict[str, str]:
    """Run ``amp-compile --dry-run`` and return op -> precision from its JSON report."""
    report = tmp_path / "plan.json"
    assert cli.main([str(path), "--dry-run", "-q", "--report", str(report), *map(str, options)]) == 0
    return {row["name"]: row["precision"] for row in json.loads(report.read_text())["ops"]}


def cli_error(capsys, argv) -> str:
    assert cli.main([str(a) for a in argv]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_exclude_nodes_by_pattern_stay_fp32(mlp_file, tmp_path, capsys):
    _, report = convert_onnx(mlp(), planner="all", exclude_nodes=["/head/"])
    got = precisions(report)
    assert got["/head/MatMul"] == "float32" and "--exclude-nodes '/head/'" in reasons(report)["/head/MatMul"]
    assert got["/enc/0/MatMul"] == got["/enc/1/MatMul"] == "float16"
    # re.match semantics (AutoCast's): the pattern anchors at the start of the name; one that matches
    # no node had converted as if not given, and now says so
    for options in ({}, {"planner": "all"}):  # default options first
        with pytest.raises(ConversionError, match="--exclude-nodes 'MatMul': matches no node name .*re.match"):
            convert_onnx(mlp(), exclude_nodes=["MatMul"], **options)
        assert precisions(convert_onnx(mlp(), exclude_nodes=[".*MatMul"], **options)[1])["/head/MatMul"] == "float32"
    with pytest.raises(ValueError, match="exclude_nodes: bad regular expression '/enc/\\('"):
        convert_onnx(mlp(), exclude_nodes=["/enc/("])
    with pytest.raises(ValueError, match="takes a list"):
        convert_onnx(mlp(), exclude_nodes="/head/")
    line = cli_error(capsys, [mlp_file, "--dry-run", "--exclude-nodes", "/enc/("])
    assert line.startswith("amp-compile: error: --exclude-nodes /enc/(: not a regular expression")
    assert cli_plan(mlp_file, tmp_path, "--planner", "all", "--exclude-nodes", r"/enc/\d/MatMul") == {
        **got, "/enc/0/MatMul": "float32", "/enc/1/MatMul": "float32", "/head/MatMul": "float16"}


def test_include_nodes_forces_low_against_the_cost_model(mlp_file, tmp_path):
    assert set(precisions(convert_onnx(islands())[1]).values()) == {"float32"}  # launch bound: all FP32
    _, report = convert_onnx(islands(), include_nodes=["/enc/1/MatMul"])
    assert precisions(report)["/enc/1/MatMul"] == "float16"
    assert "forced to the low dtype by the user (--include-nodes '/enc/1/MatMul')" in reasons(report)["/enc/1/MatMul"]
    # include wins over exclude, as in AutoCast's NodeClassifier
    both = cli_plan(mlp_file, tmp_path, "--include-nodes", "/enc/1/Mat", "--exclude-nodes", "/enc/")
    assert both["/enc/1/MatMul"] == "float16" and both["/enc/0/MatMul"] == "float32"


def test_force_op_is_not_allow(tmp_path):
    allowed = precisions(convert_onnx(islands(), allow=["ReduceSum"])[1])
    assert allowed["/head/ReduceSum"] == "float32"  # a class change: the cost model still says FP32
    onnx.save(islands(), tmp_path / "islands.onnx")
    forced = cli_plan(tmp_path / "islands.onnx", tmp_path, "--force-op", "ReduceSum")
    assert forced["/head/ReduceSum"] == "float16"  # forced, although ReduceSum is a deny op


def test_force_respects_legality():
    """A forced op whose weight FP16 cannot hold stays FP32: never clamped."""
    m = mlp()
    big = numpy_helper.to_array(m.graph.initializer[1]).copy()
    big[0, 0] = 1e6
    m.graph.initializer[1].CopyFrom(numpy_helper.from_array(big, "w1"))
    got = precisions(convert_onnx(m, force_ops=["MatMul"])[1])
    assert got["/enc/1/MatMul"] == "float32" and got["/enc/0/MatMul"] == "float16"


def test_max_reduction_depth(mlp_file, tmp_path):
    _, report = convert_onnx(mlp(), planner="all", max_reduction_depth=64)
    got = precisions(report)
    assert got["/enc/1/MatMul"] == "float32"  # K = 128
    assert "accumulates over 128 elements" in reasons(report)["/enc/1/MatMul"]
    assert got["/enc/0/MatMul"] == got["/head/MatMul"] == "float16"  # K = 64
    assert all(p == "float16" for n, p in cli_plan(mlp_file, tmp_path, "--planner", "all",
                                                   "--max-reduction-depth", "128").items() if "MatMul" in n)


def test_init_max_bytes_casts_large_initializers_at_run_time(tmp_path):
    folded, _ = convert_onnx(mlp(), planner="all")
    assert {i.name: i.data_type for i in folded.graph.initializer if i.name.startswith("w")} == {
        "w0_fp16": TensorProto.FLOAT16, "w1_fp16": TensorProto.FLOAT16, "w2_fp16": TensorProto.FLOAT16}
    src = tmp_path / "mlp.onnx"
    onnx.save(mlp(), src)
    out = tmp_path / "out.onnx"
    # w0, w1: 32 KiB each, over the limit; w2: 16 KiB, under it
    assert cli.main([str(src), "-o", str(out), "-q", "--planner", "all", "--init-max-bytes", "20000"]) == 0
    converted = onnx.load(out)
    onnx.checker.check_model(converted, full_check=True)
    stored = {i.name: i.data_type for i in converted.graph.initializer if i.name.startswith("w")}
    assert stored == {"w0": TensorProto.FLOAT, "w1": TensorProto.FLOAT, "w2_fp16": TensorProto.FLOAT16}
    assert {n.input[0] for n in nodes_of(converted, "Cast")} >= {"w0", "w1"}
    x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    np.testing.assert_allclose(run(converted, {"x": x})[0], run(onnx.load(src), {"x": x})[0], rtol=2e-2, atol=2e-3)


def plugin_model() -> onnx.ModelProto:
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["h0"], name="mm0"),
             helper.make_node("FancyGelu", ["h0"], ["g"], name="plugin", domain="my.plugins"),
             helper.make_node("MatMul", ["g", "w1"], ["y"], name="mm1")]
    m = model(nodes, [fin("x", 4, 64)], [fin("y", 4, 64)], [weight("w0", 64, 64), weight("w1", 64, 64)],
              value_info=[fin("g", 4, 64)])
    m.opset_import.append(helper.make_opsetid("my.plugins", 1))
    return m


def test_custom_ops_table_classifies_plugin_ops(tmp_path, capsys):
    _, plain = convert_onnx(plugin_model(), planner="all")
    assert plain.data["summary"]["unknown_ops"] == ["my.plugins::FancyGelu"]
    table = tmp_path / "plugins.json"
    table.write_text(json.dumps({"ops": [{"op_type": "FancyGelu", "domain": "my.plugins", "class": "infer"}]}))
    src, out = tmp_path / "plugin.onnx", tmp_path / "out.onnx"
    onnx.save(plugin_model(), src)
    assert cli.main([str(src), "-o", str(out), "-q", "--planner", "all", "--custom-ops", str(table),
                     "--report", str(tmp_path / "r.json")]) == 0
    data = json.loads((tmp_path / "r.json").read_text())
    plugin = next(r for r in data["ops"] if r["name"] == "plugin")
    assert (plugin["class"], plugin["precision"]) == ("infer", "float16") and not data["summary"]["unknown_ops"]
    fancy = nodes_of(onnx.load(out), "FancyGelu")[0]
    assert fancy.input[0] == "h0" and fancy.domain == "my.plugins"  # reads the FP16 MatMul output directly
    # a malformed table: one line naming the file and the entry
    table.write_text(json.dumps({"ops": [{"op_type": "FancyGelu", "class": "fast"}]}))
    line = cli_error(capsys, [src, "-o", out, "--custom-ops", table])
    assert str(table) in line and "ops[0]" in line and "'fast'" in line


@pytest.mark.parametrize("device", NEW_DEVICES)
def test_new_devices_plan(device, mlp_file, tmp_path):
    assert device in DEVICES
    report = tmp_path / "plan.json"
    assert cli.main([str(mlp_file), "--dry-run", "-q", "--target", device, "--report", str(report)]) == 0
    summary = json.loads(report.read_text())["summary"]
    assert summary["target"] == device and summary["predicted_time_fp32_s"] > 0


def test_target_file_and_dict(mlp_file, tmp_path, capsys):
    figures = {"name": "my_npu", "fp32_tflops": 20.0, "fp16_tflops": 400.0, "mem_bandwidth_gbs": 1000.0,
               "launch_overhead_us": 1.0}
    device = tmp_path / "npu.json"
    device.write_text(json.dumps(figures))
    report = tmp_path / "plan.json"
    assert cli.main([str(mlp_file), "--dry-run", "-q", "--target-file", str(device), "--report", str(report)]) == 0
    from_file = json.loads(report.read_text())["summary"]
    assert from_file["target"] == "my_npu"
    from_dict = convert_onnx(mlp(), target=figures)[1].data["summary"]
    from_path = convert_onnx(mlp(), target=str(device))[1].data["summary"]
    h100 = convert_onnx(mlp(), target="h100")[1].data["summary"]
    assert from_dict["predicted_time_fp32_s"] == from_path["predicted_time_fp32_s"] == \
        pytest.approx(from_file["predicted_time_fp32_s"])
    assert from_dict["predicted_time_fp32_s"] != pytest.approx(h100["predicted_time_fp32_s"])
    for broken, field in (({**figures, "mem_bandwidth_gbs": "fast"}, "mem_bandwidth_gbs"),
                          ({k: v for k, v in figures.items() if k != "fp16_tflops"}, "fp16_tflops"),
                          ({**figures, "fp16_tflop": 1.0}, "fp16_tflop")):
        device.write_text(json.dumps(broken))
        line = cli_error(capsys, [mlp_file, "--dry-run", "--target-file", device])
        assert line.startswith(f"amp-compile: error: {device}: field '{field}': ")
    device.write_text("{not json")
    assert "not valid JSON" in cli_error(capsys, [mlp_file, "--dry-run", "--target-file", device])
    with pytest.raises(ValueError, match="field 'fp32_tflops': expected a positive number"):
        convert_onnx(mlp(), target={**figures, "fp32_tflops": -1})


def test_data_max_with_calibration(tmp_path, capsys):
    """AutoCast's data_max: with --calibrate, ops touching activations above X stay FP32."""
    m = mlp()
    w0 = numpy_helper.to_array(m.graph.initializer[0]) * 2000  # first layer's outputs reach the hundreds
    m.graph.initializer[0].CopyFrom(numpy_helper.from_array(w0.astype(np.float32), "w0"))
    src = tmp_path / "m.onnx"
    onnx.save(m, src)
    plain = cli_plan(src, tmp_path, "--planner", "all", "--calibrate")
    assert plain["/enc/0/MatMul"] == "float16"  # far below FP16's range
    strict = cli_plan(src, tmp_path, "--planner", "all", "--calibrate", "--data-max", "100")
    assert strict["/enc/0/MatMul"] == strict["/enc/0/Relu"] == "float32"
    loose = cli_plan(src, tmp_path, "--planner", "all", "--calibrate", "--data-max", "60000")
    assert loose == plain
    assert "--data-max applies only with --calibrate" in cli_error(capsys, [src, "--dry-run", "--data-max", "100"])


def test_custom_op_fp32_ports(tmp_path):
    """trt_plugins_precision's per-port form: a plugin input that stays FP32 in an FP16 op."""
    table = {"ops": [{"op_type": "FancyGelu", "domain": "my.plugins", "class": "infer", "fp32_inputs": [0]}]}
    out, report = convert_onnx(plugin_model(), planner="all", custom_ops=table)
    assert precisions(report)["plugin"] == "float16"
    fancy = nodes_of(out, "FancyGelu")[0]
    cast = next(n for n in out.graph.node if n.output[0] == fancy.input[0])
    assert cast.op_type == "Cast" and cast.attribute[0].i == TensorProto.FLOAT


def test_fallback_with_a_feed_and_a_tolerance(tmp_path):
    """auto_convert_mixed_precision(model, feed_dict, rtol=...): --fallback --inputs --tolerance."""
    src, out, feed = tmp_path / "m.onnx", tmp_path / "out.onnx", tmp_path / "feed.npz"
    onnx.save(mlp(), src)
    np.savez(feed, x=np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32) * 30)
    args = [str(src), "-o", str(out), "-q", "--planner", "all", "--runtime", "reference", "--inputs", str(feed),
            "--report", str(tmp_path / "r.json")]
    assert cli.main(args + ["--validate", "--tolerance", "1e-4"]) == 1
    assert cli.main(args + ["--fallback", "--tolerance", "1e-4"]) == 0
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["validation"]["passed"] and data["validation"]["max_rel_error"] <= 1e-4
    assert data["fallback"]["moved_to_fp32"]


@pytest.mark.parametrize("seed", range(6))
def test_forced_plan_is_the_exact_optimum_given_the_forced_units(seed):
    """Brute force: with some units pinned low, the re-solved cut costs the constrained minimum."""
    import itertools

    from passes.base import PlanContext
    from passes.convert import solve_mincut
    from passes.costs import OpTimer, build_energy
    from passes.user_rules import pin_forced

    from .test_passes import _random_dag, plan

    graph, _ = plan(_random_dag(seed))
    ctx = PlanContext()
    energy = build_energy(graph, ctx, OpTimer(graph, ctx))
    units = list(energy.unit_ops)
    free = solve_mincut(energy)
    forced = [u for u in units if not free[u]][:2] or units[:1]
    ctx.force_low_nodes = frozenset(energy.unit_ops[u][0] for u in forced)
    pinned = pin_forced(graph, ctx, energy, free, solve_mincut)
    assert all(pinned[u] == 1 for u in forced) and set(pinned) == set(units)
    best = min(energy.total(p)[0] for bits in itertools.product((0, 1), repeat=len(units))
               if all((p := dict(zip(units, bits)))[u] for u in forced))
    assert energy.total(pinned)[0] == pytest.approx(best, rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("node, inputs, inits, depth", [
    (helper.make_node("Conv", ["x", "w"], ["y"], name="op", pads=[1, 1, 1, 1]), [fin("x", 1, 16, 8, 8)],
     [weight("w", 32, 16, 3, 3)], 16 * 3 * 3),
    (helper.make_node("Gemm", ["x", "w"], ["y"], name="op", transA=1), [fin("x", 96, 4)], [weight("w", 96, 64)], 96),
    (helper.make_node("ReduceSum", ["x", "axes"], ["y"], name="op", keepdims=0), [fin("x", 4, 10, 12)],
     [numpy_helper.from_array(np.array([1, 2], np.int64), "axes")], 120),
])
def test_reduction_depth_per_op(node, inputs, inits, depth):
    """Conv: Cin x kernel; Gemm: K (A's first dim when transposed); Reduce*: the elements one output sums."""
    from amp_compiler.onnx_io.importer import import_model
    from passes.user_rules import reduction_depth

    m = onnx.shape_inference.infer_shapes(model([node], inputs, [fin("y", None)], inits))
    graph = import_model(m).graph
    assert reduction_depth(graph, graph.ops["op"]) == depth
