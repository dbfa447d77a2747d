"""Validation's overflow check (``amp_compiler/overflow.py``): an FP16 value that overflows on a GPU
fails ``--validate`` on ONNX Runtime's CPU provider too, which computes such ops in FP32."""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto, helper

from amp_compiler.cli import main
from tests.builders import fin, model, weight

pytest.importorskip("onnxruntime")


def _ffn(tail=(), **constants):
    """A T5 FFN whose ``wo`` result reaches ~1e5 on N(0, 1) inputs (weights scaled as in the field)."""
    nodes = [helper.make_node("MatMul", ["x", "Wi"], ["h"], name="wi"),
             helper.make_node("Relu", ["h"], ["r"], name="act"),
             helper.make_node("MatMul", ["r", "Wo"], ["o"], name="wo"), *tail]
    out = tail[-1].output[0] if tail else "o"
    return model(nodes, [fin("x", 2, 16, 64)], [fin(out, 2, 16, 64)],
                 [weight("Wi", 64, 128, scale=10.0), weight("Wo", 128, 64, scale=100.0),
                  *(helper.make_tensor(k, 1, [], [v]) for k, v in constants.items())])


def _convert(tmp_path, m, *flags):
    src, out, rep = tmp_path / "m.onnx", tmp_path / "o.onnx", tmp_path / "r.json"
    src.write_bytes(m.SerializeToString())
    reports = [a for suffix in (".json", ".txt", ".html") for a in ("--report", str(rep.with_suffix(suffix)))]
    status = main([str(src), "-o", str(out), "--validate", *reports, "-q", *flags])
    return status, out, json.loads(rep.read_text())


def test_an_fp16_matmul_past_65504_fails_validation_on_the_cpu_runtime(tmp_path, capsys):
    """A T5 with realistic FFN scales passed --validate (error 6e-4) while a GPU gives inf: ONNX
    Runtime's CPU provider ran the FP16 MatMul in FP32. The exposed FP16 value shows the overflow."""
    status, out, report = _convert(tmp_path, _ffn([helper.make_node("Mul", ["o", "c"], ["y"], name="scale")],
                                                   c=1e-3), "--planner", "all")
    err = capsys.readouterr().err
    assert status == 1 and not out.exists()
    assert [row["writer"] for row in report["validation"]["overflows"]] == ["wo"]
    assert "o (written by wo) reaches" in err and "is inf in FP16" in err and "--calibrate" in err
    for page in ("r.txt", "r.html"):
        assert "overflow: o (written by wo) reaches" in (tmp_path / page).read_text()


def test_calibration_keeps_the_overflowing_matmul_fp32_and_validation_passes(tmp_path):
    status, out, report = _convert(tmp_path, _ffn(), "--planner", "all", "--calibrate")
    assert status == 0 and out.exists() and report["validation"]["overflows"] == []
    wo = next(op for op in report["ops"] if op["name"] == "wo")
    assert wo["precision"] == "float32" and "calibration data" in wo["reason"]


def test_an_overflow_a_saturating_op_absorbs_is_not_a_failure(tmp_path):
    """GELU's tanh form in FP16: h^3 (h ~ 800) overflows to inf and tanh returns +-1 as in FP32
    (numerics rule 9); the inf values on the way are no failure (a Flan-T5's gated GELU)."""
    nodes = [helper.make_node("MatMul", ["x", "Wi"], ["h"], name="wi"),
             helper.make_node("Pow", ["h", "three"], ["p"], name="cube"),
             helper.make_node("Mul", ["p", "k"], ["pk"], name="coef"),
             helper.make_node("Add", ["h", "pk"], ["a"], name="shift"),
             helper.make_node("Tanh", ["a"], ["y"], name="tanh")]
    inits = [weight("Wi", 64, 64, scale=100.0), helper.make_tensor("three", 1, [], [3.0]),
             helper.make_tensor("k", 1, [], [0.044715])]
    m = model(nodes, [fin("x", 2, 16, 64)], [fin("y", 2, 16, 64)], inits)
    # tanh's steep middle makes FP16's rounding of h ~ 800 show as error there: only overflow fails
    status, out, report = _convert(tmp_path, m, "--planner", "all", "--tolerance", "1")
    cube = next(op for op in report["ops"] if op["name"] == "cube")
    assert cube["precision"] == "float16"  # its value does overflow in the converted model
    assert status == 0 and report["validation"]["overflows"] == []


def test_the_fallback_moves_the_overflowing_op_and_says_why(tmp_path):
    """--fallback had stopped at round 0 on a T5 (its outputs within 6e-4 on the CPU runtime) and
    the validation after it failed; it now moves the writer of the overflowing value, and the
    report's why line names the fallback, not the user's --deny-node, as the reason."""
    m = _ffn([helper.make_node("Mul", ["o", "c"], ["y"], name="scale")], c=1e-3)
    status, out, report = _convert(tmp_path, m, "--planner", "all", "--fallback")
    assert status == 0 and report["validation"]["overflows"] == []
    assert report["fallback"]["moved_to_fp32"][0] == "wo"
    reasons = {op["name"]: op["reason"] for op in report["ops"]}
    assert reasons["wo"].startswith("fallback: its FP16 value overflows (")
    why = report["summary"]["fp32_tensor_core_why"]
    assert "fallback: " in why and "--deny-node" not in why


def test_the_fallback_moves_overflowing_ops_of_nodes_without_names(tmp_path):
    """ONNX node names are optional: the overflowing writers were looked up by node name, and so were
    the readers of an inserted cast whose FP16 copy overflows; the fallback moved the writer, then
    found nothing to move and failed. The plan's ops are found by the values they write."""
    m = _ffn([helper.make_node("Relu", ["o"], ["o2"], name="act2"),
              helper.make_node("Mul", ["o2", "c"], ["y"], name="scale")], c=1e-3)
    for node in m.graph.node:
        node.name = ""
    status, _, report = _convert(tmp_path, m, "--planner", "all", "--fallback")
    assert status == 0 and report["validation"]["overflows"] == []
    moved = report["fallback"]["moved_to_fp32"]
    precision = {op["op_type"]: op["precision"] for op in report["ops"] if op["name"] in moved}
    assert len(moved) >= 2 and precision and set(precision.values()) == {"float32"}


def test_the_overflow_check_reads_a_model_whose_weights_are_external_data(tmp_path):
    """A dynamo export keeps its weights in a .data file: the check was skipped for it (a Gemma's
    scaled embeddings at 1.2e5 passed --validate); ONNX Runtime now reads the data from the folder."""
    import onnx

    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(_ffn([helper.make_node("Mul", ["o", "c"], ["y"], name="scale")], c=1e-3), str(src),
              save_as_external_data=True, location="m.onnx.data", size_threshold=0)
    assert main([str(src), "-o", str(out), "--validate", "--planner", "all", "-q"]) == 1
    assert not out.exists()


def test_the_reference_runtime_names_where_the_overflow_starts(tmp_path):
    """On the reference runtime infs flow on: the report names the value that overflows and counts
    the values downstream of it instead of listing each as an overflow."""
    m = _ffn([helper.make_node("Mul", ["o", "c"], ["s"], name="scale"),
              helper.make_node("Relu", ["s"], ["y"], name="act2")], c=1e-3)
    status, _, report = _convert(tmp_path, m, "--planner", "all", "--runtime", "reference")
    rows = report["validation"]["overflows"]
    assert status == 1 and [r["name"] for r in rows if r["origin"]] == ["o"]
    assert len(rows) > 1  # scale's and act2's values are inf too
    text = (tmp_path / "r.txt").read_text()
    assert "overflow: o (written by wo)" in text and f"overflow: {len(rows) - 1} more values are not finite" in text


def _merged_ffn():
    """A merged decoder's shape (an If on use_cache_branch around two copies): the FFN of
    ``_ffn`` in each branch, so every GEMM is in a subgraph."""
    def branch(tag):
        nodes = [helper.make_node("MatMul", ["x", "Wi"], [f"{tag}_h"], name=f"{tag}_wi"),
                 helper.make_node("Relu", [f"{tag}_h"], [f"{tag}_r"], name=f"{tag}_act"),
                 helper.make_node("MatMul", [f"{tag}_r", "Wo"], [f"{tag}_o"], name=f"{tag}_wo"),
                 helper.make_node("Mul", [f"{tag}_o", "c"], [f"{tag}_y"], name=f"{tag}_scale")]
        return helper.make_graph(nodes, tag, [], [fin(f"{tag}_y", 2, 16, 64)])

    m = _ffn(c=1e-3)
    del m.graph.node[:]
    m.graph.node.append(helper.make_node("If", ["use_cache_branch"], ["y"], name="if",
                                         then_branch=branch("past"), else_branch=branch("first")))
    m.graph.input.append(fin("use_cache_branch", 1, dtype=TensorProto.BOOL))
    m.graph.output[0].name = "y"
    return m


def test_an_overflow_inside_a_merged_decoders_branches_is_found_and_calibrated_away(tmp_path):
    """A merged T5 decoder has every GEMM in an If branch: neither --validate's check nor
    --calibrate saw a value there, so its wo overflow passed validation and calibration kept
    nothing FP32. The branch each switch value takes is checked and calibrated."""
    status, _, report = _convert(tmp_path, _merged_ffn(), "--planner", "all")
    assert status == 1
    assert {(r["name"], r["writer"]) for r in report["validation"]["overflows"] if r["origin"]} == {
        ("past_o (use_cache_branch=True)", "past_wo"), ("first_o (use_cache_branch=False)", "first_wo")}
    status, _, report = _convert(tmp_path, _merged_ffn(), "--planner", "all", "--calibrate")
    precision = {op["name"]: op["precision"] for op in report["ops"]}
    assert status == 0 and precision["if.then_branch/past_wo"] == precision["if.else_branch/first_wo"] == "float32"
    assert precision["if.then_branch/past_wi"] == "float16"


def test_the_fallback_moves_an_overflowing_op_inside_a_merged_decoders_branches(tmp_path):
    """It had denied the node by its name in the branch ("past_wo"), which names no planned op
    ("if.then_branch/past_wo"), declared success, and the validation after it failed."""
    status, _, report = _convert(tmp_path, _merged_ffn(), "--planner", "all", "--fallback")
    assert status == 0 and report["validation"]["overflows"] == []
    moved = report["fallback"]["moved_to_fp32"]
    # each overflowing writer with the low op writing its input, as in the main graph (``wo``, ``act``)
    assert sorted(moved[:4]) == ["if.else_branch/first_act", "if.else_branch/first_wo",
                                 "if.then_branch/past_act", "if.then_branch/past_wo"]
    # then the FP32 result, cast to FP16 for the scale, overflows in that cast: its reader moves
    assert sorted(moved[4:]) == ["if.else_branch/first_scale", "if.then_branch/past_scale"]


def test_an_input_beyond_65504_overflows_in_its_cast_to_fp16(tmp_path):
    """Values the conversion casts to FP16 overflow in the cast: a graph input of raw features
    up to 1e5 was inf from its first cast on and --validate passed on the CPU runtime."""
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="proj"),
             helper.make_node("Mul", ["h", "c"], ["y"], name="scale")]
    m = model(nodes, [fin("x", 16, 64)], [fin("y", 16, 64)],
              [weight("W", 64, 64, scale=1e-3), helper.make_tensor("c", 1, [], [1e-2])])
    feeds = tmp_path / "x.npz"
    np.savez(feeds, x=np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32) * 5e4)
    status, _, report = _convert(tmp_path, m, "--planner", "all", "--inputs", str(feeds))
    assert status == 1
    assert [(r["name"], r["writer"]) for r in report["validation"]["overflows"] if r["origin"]] == [("x", "x_cast_fp16")]


def test_default_options_on_the_overflowing_ffn(tmp_path):
    """The cases above force every op FP16 (--planner all); with default options the cost model
    chooses, and validation and the fallback hold whatever it chose: an FP16 ``wo`` is caught (status 1,
    its value named), an FP32 one passes; --fallback always ends within tolerance and with no overflow."""
    m = _ffn([helper.make_node("Mul", ["o", "c"], ["y"], name="scale")], c=1e-3)
    status, _, report = _convert(tmp_path, m)
    wo = {op["name"]: op["precision"] for op in report["ops"]}["wo"]
    overflows = report["validation"]["overflows"]
    assert (status, [r["writer"] for r in overflows]) == ((1, ["wo"]) if wo == "float16" else (0, []))
    for node in m.graph.node:
        node.name = ""  # and unnamed
    status, _, report = _convert(tmp_path, m, "--fallback")
    assert status == 0 and report["validation"]["overflows"] == []


def test_a_loop_body_the_default_plan_converts_fails_validation_where_it_overflows(tmp_path):
    """Default options, a body big enough to convert by cost: its FP16 state overflows, validation
    names the body's GEMM, and --fallback moves it."""
    from tests.builders import LOOP_D, LOOP_ROWS, growing_loop

    m = growing_loop(rows=LOOP_ROWS, d=LOOP_D)
    status, out, report = _convert(tmp_path, m)
    assert status == 1 and not out.exists()
    rows = {row["value"]: row for row in report["validation"]["overflows"]}
    assert rows["mm"]["writer"] == "body_mm" and rows["mm"]["fp32_peak"] > 65504
    status, out, report = _convert(tmp_path, m, "--fallback")
    assert status == 0 and "loop0.body/body_mm" in report["fallback"]["moved_to_fp32"]


def test_an_fp16_loop_body_past_65504_fails_validation_on_the_cpu_runtime(tmp_path, capsys):
    """A Loop body's values cannot be exposed, and ONNX Runtime's CPU provider computes its FP16 ops in
    FP32: a body state reaching ~1e6 passed --validate (error 4e-4) while a GPU gives inf. The FP32
    run's per-iteration peaks of the body's FP16 values show it; the fallback then moves the body's
    writers first, as it does for main-graph overflows."""
    from tests.builders import growing_loop

    m = growing_loop()  # its body is FP16 under --planner all (too small for the cost model to convert)
    status, out, report = _convert(tmp_path, m, "--planner", "all")
    err = capsys.readouterr().err
    assert status == 1 and not out.exists()
    rows = {row["value"]: row for row in report["validation"]["overflows"]}
    assert rows["mm"]["writer"] == "body_mm" and rows["mm"]["origin"] and rows["mm"]["fp32_peak"] > 65504
    assert not rows["s_out_fp16"]["origin"]  # the scale reads the overflowing mm
    assert "is inf in FP16" in err
    assert "overflow: mm (written by body_mm) reaches" in (tmp_path / "r.txt").read_text()

    status, out, report = _convert(tmp_path, m, "--fallback", "--planner", "all")
    assert status == 0 and out.exists()
    assert {"loop0.body/body_mm", "loop0.body/body_scale"} <= set(report["fallback"]["moved_to_fp32"])
    assert not report["validation"].get("overflows")
