"""The passes on hand-built graphs: what they must change, and what they must leave alone."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from amp_compiler import convert_onnx
from amp_compiler.ir import ANY, FIXED, PARAMETER, UNIT
from amp_compiler.plan_report import build_report
from passes.convert import solve_mincut
from passes.costs import OpTimer, build_energy

from .builders import elem_type, fin, model, nodes_of, plan, run, weight

F16, F32 = TensorProto.FLOAT16, TensorProto.FLOAT


def _mlp(n=512, d=1024):
    """x -> MatMul -> Add -> Relu -> MatMul -> ReduceSum: GEMMs big enough that FP16 pays."""
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"], name="mm1"),
             helper.make_node("Add", ["h", "b"], ["hb"], name="add"),
             helper.make_node("Relu", ["hb"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "W2"], ["o"], name="mm2"),
             helper.make_node("ReduceSum", ["o"], ["y"], name="sum", keepdims=1)]
    return model(nodes, [fin("x", n, d)], [fin("y", 1, 1)], [weight("W1", d, d), weight("b", d), weight("W2", d, d)])


def test_mlp_gemms_go_low_and_reduction_stays_fp32():
    m = _mlp()
    out, report = convert_onnx(m)
    onnx.checker.check_model(out, full_check=True)
    ops = {o["name"]: o for o in report.ops}
    assert ops["mm1"]["precision"] == ops["mm2"]["precision"] == "float16"
    assert ops["sum"]["precision"] == "float32" and ops["sum"]["reason"].startswith("deny")
    assert report.summary["fp16_gemm_flop_fraction"] == 1.0
    x = np.random.default_rng(1).standard_normal((512, 1024)).astype(np.float32)
    ref, got = run(m, {"x": x})[0], run(out, {"x": x})[0]
    # the output is one sum whose terms cancel: its error is judged against the terms' magnitudes
    w = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    terms = np.maximum(x @ w["W1"] + w["b"], 0) @ w["W2"]
    assert np.max(np.abs(ref - got)) / np.abs(terms).sum() < 1e-3
    # graph input and output keep FP32 (keep_io_types), weights are stored once in FP16
    assert out.graph.input[0].type.tensor_type.elem_type == F32
    assert out.graph.output[0].type.tensor_type.elem_type == F32
    assert {i.name: i.data_type for i in out.graph.initializer} == {"W1_fp16": F16, "b_fp16": F16, "W2_fp16": F16}


def test_input_model_is_not_modified():
    m = _mlp(64, 256)
    before = m.SerializeToString()
    convert_onnx(m)
    assert m.SerializeToString() == before


def test_fp32_fp16_fp32_cast_pair_is_kept():
    # The pair rounds (and overflows above 65504): removing it would change results.
    nodes = [helper.make_node("Cast", ["x"], ["h"], name="down", to=F16),
             helper.make_node("Cast", ["h"], ["u"], name="up", to=F32),
             helper.make_node("Relu", ["u"], ["y"], name="relu")]
    m = model(nodes, [fin("x", 4)], [fin("y", 4)])
    out, _ = convert_onnx(m)
    assert [n.name for n in nodes_of(out, "Cast")] == ["down", "up"]
    x = np.array([70000.0, 1.0001, -3.0, 0.1], dtype=np.float32)
    np.testing.assert_array_equal(run(out, {"x": x})[0], run(m, {"x": x})[0])
    assert np.isinf(run(out, {"x": x})[0][0])


def test_fp16_fp32_fp16_cast_pair_is_removed():
    nodes = [helper.make_node("Cast", ["x"], ["u"], name="up", to=F32),
             helper.make_node("Cast", ["u"], ["h"], name="down", to=F16),
             helper.make_node("Relu", ["h"], ["y"], name="relu")]
    m = model(nodes, [fin("x", 4, dtype=F16)], [fin("y", 4, dtype=F16)])
    out, report = convert_onnx(m)
    assert nodes_of(out, "Cast") == []  # an exact identity: both casts go
    casts = next(p for p in report.passes if p["name"] == "casts")
    assert "2 casts removed" in casts["details"]
    x = np.array([1.5, -2.0, 0.0, 65504.0], dtype=np.float16)
    np.testing.assert_array_equal(run(out, {"x": x})[0], run(m, {"x": x})[0])


def test_shared_initializer_gets_one_copy_per_dtype():
    d = 1024
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
             helper.make_node("MatMul", ["h", "W"], ["h2"], name="mm2"),
             helper.make_node("ReduceSum", ["W"], ["wsum"], name="wsum", keepdims=1),
             helper.make_node("Mul", ["h2", "wsum"], ["y"], name="scale_by_wsum")]
    m = model(nodes, [fin("x", 2048, d)], [fin("y", 2048, d)], [weight("W", d, d)])  # FP16 far faster
    out, report = convert_onnx(m)
    onnx.checker.check_model(out, full_check=True)
    stored = {i.name: i.data_type for i in out.graph.initializer}
    assert stored == {"W": F32, "W_fp16": F16}
    assert [n.input[0] for n in out.graph.node if n.name == "wsum"] == ["W"]
    assert {n.input[1] for n in out.graph.node if n.op_type == "MatMul"} == {"W_fp16"}
    x = np.random.default_rng(0).standard_normal((2048, d)).astype(np.float32)
    ref, got = run(m, {"x": x})[0], run(out, {"x": x})[0]
    assert np.max(np.abs(ref - got)) / np.max(np.abs(ref)) < 1e-2


def test_resize_scales_stay_fp32():
    c = 64
    nodes = [helper.make_node("Conv", ["x", "W1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Resize", ["c1", "", "scales"], ["up"], name="resize", mode="nearest"),
             helper.make_node("Conv", ["up", "W2"], ["y"], name="conv2", pads=[1, 1, 1, 1])]
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], dtype=np.float32), "scales")
    m = model(nodes, [fin("x", 8, c, 64, 64)], [fin("y", 8, c, 128, 128)],
              [weight("W1", c, c, 3, 3), weight("W2", c, c, 3, 3), scales])
    graph, _ = plan(m)
    resize = graph.ops["resize"]
    assert resize.input_roles[0] == UNIT and resize.input_roles[2] == FIXED
    out, report = convert_onnx(m)
    onnx.checker.check_model(out, full_check=True)
    assert {o["name"]: o["precision"] for o in report.ops}["resize"] == "float16"
    assert elem_type(out, "scales") == F32
    x = np.random.default_rng(0).standard_normal((8, c, 64, 64)).astype(np.float32)
    ref, got = run(m, {"x": x})[0], run(out, {"x": x})[0]
    assert np.max(np.abs(ref - got)) / np.max(np.abs(ref)) < 1e-2


def _if_model(d=1024):
    then_g = helper.make_graph([helper.make_node("MatMul", ["x", "W1"], ["t_out"], name="then_mm")], "then",
                               [], [fin("t_out", 2048, d)])
    else_g = helper.make_graph([helper.make_node("MatMul", ["x", "W2"], ["e_mm"], name="else_mm"),
                                helper.make_node("Relu", ["e_mm"], ["e_out"], name="else_relu")], "else",
                               [], [fin("e_out", 2048, d)])
    nodes = [helper.make_node("If", ["cond"], ["z"], name="branch", then_branch=then_g, else_branch=else_g),
             helper.make_node("MatMul", ["z", "W1"], ["y"], name="after")]
    return model(nodes, [fin("cond", dtype=TensorProto.BOOL), fin("x", 2048, d)], [fin("y", 2048, d)],
                 [weight("W1", d, d), weight("W2", d, d)])


def test_if_branches_are_converted_consistently():
    m = _if_model()
    out, report = convert_onnx(m)
    onnx.checker.check_model(out, full_check=True)
    precision = {o["name"]: o["precision"] for o in report.ops}
    assert precision["branch.then_branch/then_mm"] == precision["branch.else_branch/else_mm"] == "float16"
    assert precision["after"] == "float16"
    if_node = nodes_of(out, "If")[0]
    branches = {a.name: a.g for a in if_node.attribute}
    # both branches hand back FP32, so the If output has one dtype whichever branch runs
    for g in branches.values():
        assert g.output[0].type.tensor_type.elem_type == F32
        assert any(n.op_type == "Cast" and n.attribute[0].i == F32 for n in g.node)
    x = np.random.default_rng(0).standard_normal((2048, 1024)).astype(np.float32)
    for cond in (True, False):
        feeds = {"cond": np.array(cond), "x": x}
        ref, got = run(m, feeds)[0], run(out, feeds)[0]
        assert np.max(np.abs(ref - got)) / np.max(np.abs(ref)) < 1e-2


def _tiny_gemm_between_deny_ops(blocks: int = 3, rows: int = 4096, d: int = 8):
    """GEMMs too small to gain from FP16, each between ops that must stay FP32: two cast
    kernels per GEMM in FP16, more than the tie tolerance's floor of launches."""
    nodes, inits, x = [], [], "x"
    for i in range(blocks):
        nodes += [helper.make_node("Exp", [x], [f"e{i}"], name=f"exp{i}"),
                  helper.make_node("MatMul", [f"e{i}", f"W{i}"], [f"h{i}"], name=f"tiny_mm{i}"),
                  helper.make_node("Log", [f"h{i}"], [f"l{i}"], name=f"log{i}")]
        inits.append(weight(f"W{i}", d, d))
        x = f"l{i}"
    nodes.append(helper.make_node("Identity", [x], ["y"], name="out"))
    return model(nodes, [fin("x", rows, d)], [fin("y", rows, d)], inits)


def test_min_cut_pays_fewer_casts_than_greedy():
    m = _tiny_gemm_between_deny_ops()
    _, optimal = plan(m, planner="optimal")
    _, greedy = plan(m, planner="greedy")
    assert greedy.summary["casts"] == 6 and optimal.summary["casts"] == 0
    assert optimal.summary["predicted_time_mixed_s"] < greedy.summary["predicted_time_mixed_s"]
    tiny = {o["name"]: o for o in optimal.ops}["tiny_mm0"]
    assert tiny["precision"] == "float32" and "kept FP32 by the cost model" in tiny["reason"]


def _random_dag(seed: int, n_ops: int = 9):
    rng = np.random.default_rng(seed)
    names, nodes, inits = ["x"], [], []
    for i in range(n_ops):
        kind = rng.choice(["MatMul", "Add", "Relu", "ReduceSum", "Transpose"])
        a = names[rng.integers(len(names))]
        out = f"t{i}"
        if kind == "MatMul":
            inits.append(weight(f"w{i}", 256, 256))
            nodes.append(helper.make_node("MatMul", [a, f"w{i}"], [out], name=f"n{i}"))
        elif kind == "Add":
            b = names[rng.integers(len(names))]
            nodes.append(helper.make_node("Add", [a, b], [out], name=f"n{i}"))
        elif kind == "ReduceSum":
            nodes.append(helper.make_node("ReduceSum", [a], [out], name=f"n{i}", keepdims=1))
        else:
            nodes.append(helper.make_node(kind, [a], [out], name=f"n{i}"))
        names.append(out)
    outs = [fin(n, None) for n in names[-2:]]
    for o in outs:
        o.type.tensor_type.ClearField("shape")
    m = model(nodes, [fin("x", int(rng.choice([16, 256, 4096])), 256)], outs, inits)
    return onnx.shape_inference.infer_shapes(m)


@pytest.mark.parametrize("seed", range(12))
def test_min_cut_finds_the_exact_optimum(seed):
    """Brute force over every plan of a small random graph: the cut's plan costs the minimum."""
    graph, _ = plan(_random_dag(seed))
    from passes.base import PlanContext

    ctx = PlanContext()
    graph.set_dim_sizes(8)
    energy = build_energy(graph, ctx, OpTimer(graph, ctx))
    units = list(energy.unit_ops)
    best = min(energy.total(dict(zip(units, bits)))[0] for bits in itertools.product((0, 1), repeat=len(units)))
    assert energy.total(solve_mincut(energy))[0] == pytest.approx(best, rel=1e-9, abs=1e-15)


def _embedding(vocab=50000, d=1024, n=4096):
    nodes = [helper.make_node("Gather", ["table", "ids"], ["emb"], name="lookup"),
             helper.make_node("MatMul", ["emb", "W"], ["y"], name="proj")]
    return model(nodes, [fin("ids", n, dtype=TensorProto.INT64)], [fin("y", n, d)],
                 [weight("table", vocab, d), weight("W", d, d)])


def test_embedding_lookup_stays_fp32_when_the_table_is_cast_every_step():
    m = _embedding()
    # inference: the table is stored once in FP16, the lookup follows the GEMM
    _, inference = plan(m)
    assert {o["name"]: o["precision"] for o in inference.ops}["lookup"] == "float16"
    # training: the table is an FP32 master weight, casting all of it each step costs more than
    # the lookup saves, so the planner keeps the lookup FP32 and casts its small output instead
    from amp_compiler.onnx_io.importer import import_model
    from amp_compiler.plan import make_context, run_passes

    imp = import_model(m)
    imp.graph.tensors["table"].kind = PARAMETER
    imp.graph.tensors["W"].kind = PARAMETER
    report = build_report(run_passes(imp.graph, make_context(training=True), "test"))
    ops = {o["name"]: o for o in report.ops}
    assert ops["lookup"]["precision"] == "float32"
    assert "casts" in ops["lookup"]["reason"]
    assert ops["proj"]["precision"] == "float16"
    cast_tensors = {c["tensor"] for c in report.casts}
    assert "table" not in cast_tensors and "emb" in cast_tensors


def test_traffic_a_lookup_reads_its_rows_and_a_view_moves_nothing():
    vocab, d, n = 50000, 1024, 4096
    nodes = [helper.make_node("Gather", ["table", "ids"], ["emb"], name="lookup"),
             helper.make_node("Reshape", ["emb", "shape"], ["flat"], name="view"),
             helper.make_node("Add", ["flat", "flat"], ["y"], name="add")]
    shape = numpy_helper.from_array(np.array([n * d], dtype=np.int64), "shape")
    graph, _ = plan(model(nodes, [fin("ids", n, dtype=TensorProto.INT64)], [fin("y", n * d)],
                          [weight("table", vocab, d), shape]))
    from passes.base import PlanContext

    timer = OpTimer(graph, PlanContext())
    ops = graph.ops
    # ids (int64) + the n rows it fetches + the rows it writes; not the 200 MB table
    assert timer.bytes(ops["lookup"], "float32") == n * 8 + 2 * n * d * 4
    assert timer.bytes(ops["lookup"], "float16") == n * 8 + 2 * n * d * 2
    assert timer.bytes(ops["view"], "float32") == 0
    assert timer.bytes(ops["add"], "float32") == 3 * n * d * 4


def test_unscale_marker_stops_propagation():
    d = 1024
    nodes = [helper.make_node("MatMul", ["x", "W"], ["g"], name="grad_mm"),
             helper.make_node("Mul", ["g", "inv_scale"], ["g_unscaled"], name="unscale"),
             helper.make_node("Mul", ["g_unscaled", "lr"], ["step"], name="lr_mul"),
             helper.make_node("Sub", ["W", "step"], ["W_new"], name="update")]
    m = model(nodes, [fin("x", d, d)], [fin("W_new", d, d)],
              [weight("W", d, d), numpy_helper.from_array(np.array(1 / 1024, np.float32), "inv_scale"),
               numpy_helper.from_array(np.array(0.1, np.float32), "lr")])
    from amp_compiler.onnx_io.importer import import_model
    from amp_compiler.plan import make_context, run_passes

    imp = import_model(m)
    imp.graph.tensors["g_unscaled"].unscale_marker = True
    report = build_report(run_passes(imp.graph, make_context(), "test"))
    ops = {o["name"]: o for o in report.ops}
    assert ops["grad_mm"]["precision"] == "float16"
    for name in ("unscale", "lr_mul", "update"):
        assert ops[name]["precision"] == "float32"
        assert "unscale marker" in ops[name]["reason"]


def test_user_overrides_deny_node_and_deny_op():
    m = _mlp(512, 1024)
    _, report = plan(m, deny_nodes=["mm2"])
    ops = {o["name"]: o for o in report.ops}
    assert ops["mm2"]["precision"] == "float32" and "--deny-node" in ops["mm2"]["reason"]
    assert ops["mm1"]["precision"] == "float16"
    _, report = plan(m, deny=["MatMul"])
    assert all(o["precision"] == "float32" for o in report.ops if o["op_type"] == "MatMul")


def test_no_keep_io_types_changes_graph_io_dtypes():
    m = _mlp(512, 1024)
    nodes = list(m.graph.node)[:4]  # drop the reduction: the output is the GEMM's
    m2 = model(nodes, [fin("x", 512, 1024)], [fin("o", 512, 1024)],
               [weight("W1", 1024, 1024), weight("b", 1024), weight("W2", 1024, 1024)])
    out, report = convert_onnx(m2, keep_io_types=False)
    onnx.checker.check_model(out, full_check=True)
    assert out.graph.input[0].type.tensor_type.elem_type == F16
    assert out.graph.output[0].type.tensor_type.elem_type == F16
    assert report.summary["casts"] == 0
    out_keep, report_keep = convert_onnx(m2)
    assert report_keep.summary["casts"] == 2


def test_existing_cast_to_float_inside_fp16_region_is_retargeted():
    d = 1024
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm1"),
             helper.make_node("Cast", ["h"], ["hc"], name="to_float", to=F32),
             helper.make_node("MatMul", ["hc", "W"], ["y"], name="mm2")]
    m = model(nodes, [fin("x", 512, d)], [fin("y", 512, d)], [weight("W", d, d)])
    out, report = convert_onnx(m)
    onnx.checker.check_model(out, full_check=True)
    assert "to_float" not in {n.name for n in out.graph.node}  # FP16->FP16 after retargeting: removed
    x = np.random.default_rng(0).standard_normal((512, d)).astype(np.float32)
    ref, got = run(m, {"x": x})[0], run(out, {"x": x})[0]
    assert np.max(np.abs(ref - got)) / np.max(np.abs(ref)) < 1e-2


@pytest.mark.parametrize("value, phrase", [(1e6, "beyond the FP16 range"), (1e-9, "flush to zero")])
def test_weights_fp16_cannot_hold_keep_their_op_fp32(value, phrase):
    d = 1024
    w = np.full((d, d), value, dtype=np.float32)
    w[0, 0] = -value  # a sign that must survive
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm_bad"),
             helper.make_node("MatMul", ["h", "V"], ["y"], name="mm_ok")]
    m = model(nodes, [fin("x", 512, d)], [fin("y", 512, d)], [numpy_helper.from_array(w, "W"), weight("V", d, d)])
    out, report = convert_onnx(m)
    ops = {o["name"]: o for o in report.ops}
    assert ops["mm_bad"]["precision"] == "float32" and phrase in ops["mm_bad"]["reason"]
    if value < 1:  # x @ W ~ 3e-8 is below FP16's smallest normal too: its reader stays FP32 (numerics rule 11)
        assert ops["mm_ok"]["precision"] == "float32" and "constant W times O(1) activations" in ops["mm_ok"]["reason"]
    else:
        assert ops["mm_ok"]["precision"] == "float16"
    stored = {i.name: numpy_helper.to_array(i) for i in out.graph.initializer}
    np.testing.assert_array_equal(stored["W"], w)  # untouched: no clamp, no sign flip


def test_classify_roles_from_schemas_and_registry():
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["y", "mean", "inv"], name="ln"),
             helper.make_node("Shape", ["y"], ["s"], name="shape"),
             helper.make_node("MyOp", ["y"], ["z"], name="custom", domain="my.domain")]
    m = model(nodes, [fin("x", 8, 64)], [fin("z", 8, 64), fin("s", 2, dtype=TensorProto.INT64),
                                         fin("mean", 8, 1), fin("inv", 8, 1)],
              [weight("g", 64), weight("b", 64)])
    m.opset_import.append(helper.make_opsetid("my.domain", 1))
    m.graph.value_info.append(fin("y", 8, 64))
    graph, report = plan(m)
    ln = graph.ops["ln"]
    assert ln.input_roles == [UNIT, UNIT, UNIT] and ln.output_roles == [UNIT, FIXED, FIXED]
    assert graph.ops["shape"].input_roles == [ANY]
    custom = {o["name"]: o for o in report.ops}["custom"]
    assert custom["class"] == "unknown" and "unknown op my.domain::MyOp" in custom["reason"]
    assert report.summary["unknown_ops"] == ["my.domain::MyOp"]
    # not counted FP32 ("n/a": no plan changes its dtypes), so the summary does not say "kept FP32"
    assert custom["precision"] == "n/a" and "my.domain::MyOp (run as exported, in their source dtypes)" in \
        report.to_text()


def test_graph_output_also_read_by_fp32_op_keeps_its_name_and_dtype():
    # The output cast and the cast for the FP32 reader are siblings: both must survive as one
    # node writing the output under its own name (a name clash here once dropped the output).
    d = 1024
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
             helper.make_node("ReduceSum", ["h"], ["s"], name="sum", keepdims=1)]
    m = model(nodes, [fin("x", 512, d)], [fin("h", 512, d), fin("s", 1, 1)], [weight("W", d, d)])
    out, report = convert_onnx(m)
    onnx.checker.check_model(out, full_check=True)
    assert [o.name for o in out.graph.output] == ["h", "s"]
    assert {o["name"]: o["precision"] for o in report.ops}["mm"] == "float16"
    writers = [n for n in out.graph.node if "h" in n.output]
    assert len(writers) == 1 and writers[0].op_type == "Cast"
    x = np.random.default_rng(0).standard_normal((512, d)).astype(np.float32)
    for ref, got in zip(run(m, {"x": x}), run(out, {"x": x})):
        assert np.max(np.abs(ref - got)) / np.max(np.abs(ref)) < 1e-2


def _rms_norm(d=512, n=256, numerator="x"):
    """T5-style RMSNorm (Pow/ReduceMean/Sqrt/Div) feeding a GEMM, plus a Reshape into another GEMM.
    ``numerator="v"`` divides another input by the root: not a normalisation, so not bounded."""
    nodes = [helper.make_node("Pow", ["x", "two"], ["sq"], name="pow"),
             helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], name="mean", keepdims=1),
             helper.make_node("Add", ["ms", "eps"], ["ms_eps"], name="add_eps"),
             helper.make_node("Sqrt", ["ms_eps"], ["rms"], name="sqrt"),
             helper.make_node("Div", [numerator, "rms"], ["normed"], name="div"),
             helper.make_node("MatMul", ["normed", "W"], ["y"], name="proj"),
             helper.make_node("Reshape", ["sq", "shape"], ["sq2"], name="reshape"),
             helper.make_node("MatMul", ["sq2", "W"], ["z"], name="proj_sq")]
    consts = [numpy_helper.from_array(np.array(2.0, np.float32), "two"),
              numpy_helper.from_array(np.array([-1], np.int64), "axes"),
              numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
              numpy_helper.from_array(np.array([n, d], np.int64), "shape"), weight("W", d, d)]
    inputs = [fin("x", n, d)] + ([fin(numerator, n, d)] if numerator != "x" else [])
    return model(nodes, inputs, [fin("y", n, d), fin("z", n, d)], consts)


def test_deny_propagation_keeps_infer_ops_fed_by_deny_ops_fp32():
    m = _rms_norm(numerator="v")
    _, plain = convert_onnx(m, planner="all", deny_propagation=False)
    _, strict = convert_onnx(m, planner="all")  # deny propagation is on by default
    plain_ops, strict_ops = ({o["name"]: o for o in r.ops} for r in (plain, strict))
    # eps 1e-6 is below FP16's smallest normal: the numerics pass keeps add-eps and sqrt FP32 either way
    for name in ("add_eps", "sqrt"):
        assert plain_ops[name]["precision"] == strict_ops[name]["precision"] == "float32"
        assert "of a reduction plus eps 1e-06" in plain_ops[name]["reason"]
    assert plain_ops["div"]["precision"] == "float16"
    # the mean square's range is unknown: with deny propagation FP32 all the way to the GEMM
    assert strict_ops["div"]["precision"] == "float32" and "downstream of deny op" in strict_ops["div"]["reason"]
    assert strict_ops["proj"]["precision"] == "float16"  # allow ops still take FP16
    # a clear op on the way to an allow op is not tainted: the cost model decides it
    assert "downstream of deny op" not in strict_ops["reshape"]["reason"]
    assert strict_ops["proj_sq"]["precision"] == "float16"
    # a true RMSNorm's x / rms is bounded (as LayerNormalization's output): the walk stops there
    assert {o["name"]: o for o in convert_onnx(_rms_norm(), planner="all")[1].ops}["div"]["precision"] == "float16"


def test_eps_chain_rule_and_deny_propagation_each_save_an_rms_norm_from_overflow(monkeypatch):
    import passes.numerics
    from amp_compiler.validate import run_reference

    m = _rms_norm()
    feeds = {"x": np.random.default_rng(0).standard_normal((256, 512)).astype(np.float32) * 1000}
    ref = run(m, feeds)[0]  # y only; z overflows by construction

    def error(**options) -> float:
        y = run_reference(convert_onnx(m, planner="all", **options)[0], feeds)[0]
        return float(np.max(np.abs(y - ref)) / np.max(np.abs(ref))) if np.all(np.isfinite(y)) else np.inf

    assert error(deny_propagation=False) < 1e-2  # the add-eps -> sqrt chain stays FP32 (numerics rule 8)
    monkeypatch.setattr(passes.numerics, "eps_chains", lambda *args: ({}, {}))
    assert error(deny_propagation=False) > 0.5  # without that rule mean(x^2) ~ 1e6 is inf in FP16: x / inf = 0
    assert error() < 1e-2  # deny propagation (on by default) keeps it FP32 up to the bounded x / rms


def test_cli_deny_propagation_flag(tmp_path):
    from amp_compiler import Report, cli

    src, report = tmp_path / "m.onnx", tmp_path / "r.json"
    onnx.save(_rms_norm(numerator="v"), src)
    for flag, tainted in (([], True), (["--deny-propagation"], True), (["--no-deny-propagation"], False)):
        assert cli.main([str(src), "--dry-run", "--planner", "all", *flag, "--report", str(report), "-q"]) == 0
        div = {o["name"]: o for o in Report.from_json(report).ops}["div"]
        assert ("downstream of deny op pow through sqrt" in div["reason"]) is tainted


def test_tensor_sizes_follow_shape_and_dim_size_changes():
    """The sizes memoised on a tensor (ir.PrecisionGraph._sizes) go stale with its shape or the dim sizes."""
    from amp_compiler.ir import PrecisionGraph, Tensor

    graph = PrecisionGraph()
    t = graph.add_tensor(Tensor("x", "float32", ("batch", 4)))
    graph.set_dim_sizes(2)
    assert (graph.numel("x"), graph.nbytes("x"), graph.nbytes(t, "float16")) == (8, 32, 16)
    assert graph.concrete_shape("x") == [2, 4]
    graph.set_dim_sizes(8, {"batch": 3})
    assert (graph.numel(t), graph.concrete_shape("x")) == (12, [3, 4])
    t.shape = (5, 4)
    assert (graph.numel(t), graph.nbytes(t), graph.concrete_shape("x")) == (20, 80, [5, 4])
    graph.concrete_shape("x").append(7)  # callers get their own list
    assert graph.concrete_shape("x") == [5, 4]
    t.shape = None
    assert (graph.numel(t), graph.concrete_shape("x")) == (8, None)


@pytest.mark.parametrize("k, keepdims, klass", [(2, 0, "infer"), (8, 1, "infer"), (9, 0, "deny")])
def test_a_sum_over_a_few_elements_is_infer(k, keepdims, klass):
    """A mixture of experts' top-k combination (classify rule 9): ReduceSum over k expert outputs
    is k - 1 Adds; as deny it held the residual stream after every MoE block FP32 (Mixtral: 0 %
    of GEMM FLOPs in FP16). Over a symbolic or larger extent it stays deny."""
    out_shape = ["tokens", 1, 64] if keepdims else ["tokens", 64]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["e"], name="experts"),
             helper.make_node("ReduceSum", ["e", "axes"], ["s"], name="combine", keepdims=keepdims),
             helper.make_node("MatMul", ["s", "W2"], ["y"], name="proj")]
    inits = [weight("W", 64, 64), weight("W2", 64, 64), helper.make_tensor("axes", TensorProto.INT64, [1], [1])]
    m = model(nodes, [fin("x", "tokens", k, 64)], [fin("y", *out_shape)], inits)
    graph, _ = plan(m)
    assert graph.ops["combine"].op_class == klass
    symbolic = model(nodes, [fin("x", "tokens", "k", 64)], [fin("y", *out_shape)], inits)
    assert plan(symbolic)[0].ops["combine"].op_class == "deny"


def test_planner_all_leaves_constants_that_only_fp32_ops_read_exact():
    """--planner all had stored an NMS's score threshold as FP16 (0.1 -> 0.09998) and cast it back
    to FP32 for the NMS, which stays FP32: a changed threshold for no FP16 work."""
    from onnx import TensorProto, helper

    from tests.builders import fin, model, plan_result, weight

    const = [helper.make_node("Constant", [], [n], name=n, value=helper.make_tensor(n, TensorProto.FLOAT, [1], [v]))
             for n, v in (("iou", 0.5), ("threshold", 0.1))]
    nodes = [helper.make_node("MatMul", ["feat", "Wb"], ["boxes"], name="box_head"),
             helper.make_node("MatMul", ["feat", "Ws"], ["logits"], name="score_head"),
             helper.make_node("Sigmoid", ["logits"], ["sig"], name="sigmoid"),
             helper.make_node("Transpose", ["sig"], ["scores"], name="classes_first", perm=[0, 2, 1]),
             helper.make_node("Constant", [], ["most"], name="most",
                              value=helper.make_tensor("most", TensorProto.INT64, [1], [5])), *const,
             helper.make_node("NonMaxSuppression", ["boxes", "scores", "most", "iou", "threshold"], ["sel"], name="nms")]
    m = model(nodes, [fin("feat", 1, 50, 16)], [fin("sel", "k", 3, dtype=TensorProto.INT64)],
              [weight("Wb", 16, 4), weight("Ws", 16, 3)])
    for options in ({}, {"planner": "all"}):  # default options first: the cost model may keep the heads FP32
        ops = plan_result(m, **options).graph.ops
        if options:
            assert ops["box_head"].precision == ops["sigmoid"].precision == "float16"  # the rest is all-FP16
        assert ops["iou"].precision == ops["threshold"].precision == "float32"
        assert not [op for op in ops.values() if op.op_type == "Cast" and set(op.inputs) & {"iou", "threshold"}]


def test_planner_all_passes_a_graph_input_to_a_graph_output_through_views_in_fp32():
    """``planner="all"``, keep_io_types: a graph input read by a MatMul and also returned, as it is
    (``x``) and through views alone (Identity, Reshape), had its view chain cast to FP16 and back:
    the returned values rounded for no kernel at all. Views of FP32 graph inputs stay FP32 now, bit
    for bit; a lone Transpose of an input still runs its FP16 kernel (the conformance suite's
    single-op models), and the cost-based planners, which never lowered the chain, are unchanged."""
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [16, 32])
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm"),
             helper.make_node("Identity", ["x"], ["xi"], name="id"),
             helper.make_node("Reshape", ["xi", "shape"], ["xr"], name="reshape"),
             helper.make_node("Transpose", ["x"], ["xt"], name="transpose")]
    m = model(nodes, [fin("x", 8, 64)], [fin("y", 8, 64), fin("x", 8, 64), fin("xr", 16, 32), fin("xt", 64, 8)],
              [weight("W", 64, 64), shape])
    x = np.random.default_rng(3).standard_normal((8, 64)).astype(np.float32) * 3
    for planner in ("all", "optimal", "greedy"):
        out, report = convert_onnx(m, planner=planner)
        precision = {o["name"]: o["precision"] for o in report.ops}
        assert precision["id"] == precision["reshape"] == "float32", (planner, precision)
        (ident,), (reshape,) = nodes_of(out, "Identity"), nodes_of(out, "Reshape")
        assert (ident.input[0], reshape.input[0], reshape.output[0]) == ("x", ident.output[0], "xr"), planner  # no casts
        y, x_out, xr, xt = run(out, {"x": x})
        assert np.array_equal(x_out, x) and np.array_equal(xr, x.reshape(16, 32)), planner  # not rounded
        assert elem_type(out, "xr") == TensorProto.FLOAT
        if planner == "all":
            assert precision["mm"] == precision["transpose"] == "float16"
            assert "planner 'all' leaves FP32" in next(o["reason"] for o in report.ops if o["name"] == "id")
            assert not np.array_equal(xt, x.T)  # the Transpose did run in FP16: the rounding is visible
