"""Automatic fallback: the ops that add the error move to FP32, the rest stay FP16."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from amp_compiler import ConversionError, convert_onnx
from amp_compiler.fallback import convert_with_fallback
from amp_compiler.validate import run_reference

from .builders import fin, model, state_loop


def _cancellation(d=128):
    """(x @ W + 1000) - 1000: FP16 has a 0.5 step at 1000, so the round trip wipes out x @ W."""
    offset = numpy_helper.from_array(np.array(1000.0, np.float32), "offset")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
             helper.make_node("Add", ["h", "offset"], ["shifted"], name="shift_up"),
             helper.make_node("Sub", ["shifted", "offset"], ["back"], name="shift_down"),
             helper.make_node("MatMul", ["back", "V"], ["y"], name="mm2")]
    rng = np.random.default_rng(1)  # the same weights whatever ran before
    w, v = (numpy_helper.from_array((rng.standard_normal((d, d)) * s).astype(np.float32), name)
            for name, s in (("W", 0.01), ("V", 0.05)))
    return model(nodes, [fin("x", 64, d)], [fin("y", 64, d)], [w, offset, v])


def test_fallback_moves_only_the_ops_that_add_error():
    m = _cancellation()
    feeds = {"x": np.random.default_rng(0).standard_normal((64, 128)).astype(np.float32)}
    # planner="all" puts every op in FP16 (this small graph is launch bound); the numpy reference
    # evaluator rounds every op to FP16 as a GPU would (ONNX Runtime's CPU provider hides it)
    convert = functools.partial(convert_onnx, m, planner="all")
    converted, moved = convert_with_fallback(convert, m, feeds, tolerance=1e-2, runner=run_reference)
    report = converted.report
    assert "shift_up" in moved and len(moved) <= 2
    precision = {o["name"]: o["precision"] for o in report.ops}
    assert precision["shift_up"] == "float32"
    assert precision["mm"] == precision["mm2"] == "float16"
    assert report.data["fallback"]["max_rel_error"] <= 1e-2
    assert "fallback" in {o["name"]: o["reason"] for o in report.ops}["shift_up"]


def test_fallback_finds_ops_of_nodes_without_names():
    """ONNX node names are optional (the importer names an unnamed node ``<op_type>_<index>``): the
    error ranking matched report ops to nodes by name, found none, and gave up having moved 0 ops."""
    m = _cancellation()
    for node in m.graph.node:
        node.name = ""
    feeds = {"x": np.random.default_rng(0).standard_normal((64, 128)).astype(np.float32)}
    convert = functools.partial(convert_onnx, m, planner="all")
    converted, moved = convert_with_fallback(convert, m, feeds, tolerance=1e-2, runner=run_reference)
    precision = {o["op_type"]: o["precision"] for o in converted.report.ops if o["op_type"] != "MatMul"}
    assert moved and precision["Add"] == "float32"
    assert converted.report.data["fallback"]["max_rel_error"] <= 1e-2
    # default options: whatever the cost model plans, the result holds the tolerance
    converted, _ = convert_with_fallback(functools.partial(convert_onnx, m), m, feeds, tolerance=1e-2,
                                         runner=run_reference)
    assert converted.report.data["fallback"]["max_rel_error"] <= 1e-2


def test_fallback_moves_the_op_writing_a_graph_output_kept_fp32():
    """The op writing a graph output kept FP32 (an LM head) writes a renamed value (``y_fp16``, cast
    to ``y``): matched by its outputs alone it was never ranked, and a tight tolerance stopped with
    "stays above the tolerance" after moving every other op."""
    m = _cancellation()
    feeds = {"x": np.random.default_rng(0).standard_normal((64, 128)).astype(np.float32)}
    for options in ({}, {"planner": "all"}):  # default options first
        convert = functools.partial(convert_onnx, m, **options)
        converted, moved = convert_with_fallback(convert, m, feeds, tolerance=1e-6, runner=run_reference)
        precision = {o["name"]: o["precision"] for o in converted.report.ops}
        assert precision["mm2"] == "float32"
        assert converted.report.data["fallback"]["max_rel_error"] <= 1e-6


def test_fallback_gives_up_with_a_clear_error_when_out_of_rounds():
    m = _cancellation()
    feeds = {"x": np.random.default_rng(0).standard_normal((64, 128)).astype(np.float32)}
    with pytest.raises(ConversionError, match=r"max relative error .* stays above the tolerance 0.01 after "
                                              r"moving 0 ops to FP32"):
        convert_with_fallback(functools.partial(convert_onnx, m, planner="all"), m, feeds, tolerance=1e-2,
                              max_rounds=0, runner=run_reference)


def test_cli_fallback_on_the_reference_runtime(tmp_path, capsys):
    import onnx

    from amp_compiler import Report, cli

    src, out, report = tmp_path / "m.onnx", tmp_path / "m.mp.onnx", tmp_path / "r.json"
    onnx.save(_cancellation(), src)
    args = [str(src), "-o", str(out), "--planner", "all", "--runtime", "reference", "--report", str(report), "-q"]
    assert cli.main(args + ["--validate"]) == 1  # the all-FP16 plan is off by far more than 1e-2 ...
    assert "validation failed" in capsys.readouterr().err
    assert cli.main(args + ["--fallback"]) == 0  # ... until the fallback moves the shift to FP32
    data = Report.from_json(report)
    assert "shift_up" in data.data["fallback"]["moved_to_fp32"]
    assert data.data["validation"]["passed"] and data.data["validation"]["max_rel_error"] <= 1e-2
    assert {o["name"]: o["precision"] for o in data.ops}["mm"] == "float16", data.data["fallback"]


def _cancelling_loop():
    """A Loop whose body multiplies its state of N(0, 1) values by the identity, then adds and subtracts
    2048: FP16's spacing is 2 there, so FP16 loses the state (an error, not an overflow) inside a body
    no run can expose. The GEMM makes the body's ops tensor-core work the default plan converts."""
    body = [helper.make_node("MatMul", ["s_in", "W"], ["mixed"], name="body_mm"),  # W is the identity
            helper.make_node("Add", ["mixed", "big"], ["shifted"], name="body_shift"),
            helper.make_node("Sub", ["shifted", "big"], ["s_out"], name="body_unshift")]
    return state_loop(body, [numpy_helper.from_array(np.array(2048.0, np.float32), "big")], 2,
                      [numpy_helper.from_array(np.eye(64, dtype=np.float32), "W")])


def test_fallback_moves_the_low_ops_of_a_loop_body_whose_outputs_carry_the_error():
    """A body's values cannot be exposed one by one: a Loop whose FP16 body loses its state is measured
    as one op, and moving it moves the low ops of its body (they had never been candidates, and the
    fallback gave up with the error unchanged)."""
    m = _cancelling_loop()
    feeds = {"x": np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)}
    convert = functools.partial(convert_onnx, m, planner="all")  # a body too small to convert by cost
    converted, moved = convert_with_fallback(convert, m, feeds, tolerance=1e-2, runner=run_reference)
    assert {"loop0.body/body_shift", "loop0.body/body_unshift"} <= set(moved)
    ops = {o["name"]: o for o in converted.report.ops}
    assert ops["loop0.body/body_shift"]["precision"] == "float32"
    assert "body of Loop loop0" in ops["loop0.body/body_shift"]["reason"]
    assert converted.report.data["fallback"]["max_rel_error"] <= 1e-2


def _merged_cancelling_decoder():
    """A merged decoder's shape (an If on ``use_cache_branch``, optimum's ``decoder_model_merged``) whose
    branch without the cache loses its values in FP16 (the identity GEMM's output plus and minus 2048:
    an error, not an overflow), the other one keeping them: both branches' ops are tensor-core work the
    default plan converts."""
    def branch(tag: str, cancels: bool):
        nodes = [helper.make_node("MatMul", ["x", "W"], [f"{tag}_mm"], name=f"{tag}_mm")]
        if cancels:
            nodes += [helper.make_node("Add", [f"{tag}_mm", "big"], [f"{tag}_shifted"], name=f"{tag}_shift"),
                      helper.make_node("Sub", [f"{tag}_shifted", "big"], [f"{tag}_kept"], name=f"{tag}_unshift")]
        else:
            nodes.append(helper.make_node("Relu", [f"{tag}_mm"], [f"{tag}_kept"], name=f"{tag}_relu"))
        nodes.append(helper.make_node("MatMul", [f"{tag}_kept", "W2"], [f"{tag}_out"], name=f"{tag}_head"))
        return helper.make_graph(nodes, tag, [], [fin(f"{tag}_out", 4, 64)])

    return model([helper.make_node("If", ["use_cache_branch"], ["y"], name="if", then_branch=branch("past", False),
                                   else_branch=branch("nopast", True))],
                 [fin("x", 4, 64), fin("use_cache_branch", 1, dtype=TensorProto.BOOL)], [fin("y", 4, 64)],
                 [numpy_helper.from_array(np.eye(64, dtype=np.float32), "W"),
                  numpy_helper.from_array(np.random.default_rng(3).standard_normal((64, 64)).astype(np.float32) * 0.1,
                                          "W2"),
                  numpy_helper.from_array(np.array(2048.0, np.float32), "big")])


def test_fallback_ranks_the_ops_of_a_merged_decoders_branches_one_by_one():
    """The error is in the branch the drawn feeds do not take: both ways of the switch are inlined and
    their ops ranked like the main graph's. Before, no branch op was a candidate and the fallback gave
    up, error 0.48, having moved nothing."""
    m = _merged_cancelling_decoder()
    feeds = {"x": np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32),
             "use_cache_branch": np.array([True])}
    converted, moved = convert_with_fallback(functools.partial(convert_onnx, m), m, feeds, tolerance=1e-2,
                                             runner=run_reference)
    assert {"if.else_branch/nopast_shift", "if.else_branch/nopast_unshift"} <= set(moved)
    assert not any(name.startswith("if.then_branch/") for name in moved)  # nothing of the clean branch
    assert converted.report.data["fallback"]["max_rel_error"] <= 1e-2
