"""Rule 9 end to end: GELU's tanh form in FP16 on activations whose cube overflows FP16."""

from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper

from amp_compiler import convert_onnx
from amp_compiler.validate import compare_outputs, run_reference

from .builders import fin, model, weight

N, D = 64, 64


def _gelu_model():
    const = lambda name, v: numpy_helper.from_array(np.array([v], dtype=np.float32), name)  # noqa: E731
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"], name="fc1"),
        helper.make_node("Pow", ["h", "three"], ["h3"], name="pow"),
        helper.make_node("Mul", ["h3", "c"], ["h3c"], name="scale"),
        helper.make_node("Add", ["h", "h3c"], ["inner"], name="shift"),
        helper.make_node("Mul", ["inner", "k"], ["arg"], name="gain"),
        helper.make_node("Tanh", ["arg"], ["t"], name="tanh"),
        helper.make_node("Add", ["t", "one"], ["t1"], name="plus_one"),
        helper.make_node("Mul", ["h", "t1"], ["g2"], name="gate"),
        helper.make_node("Mul", ["g2", "half"], ["g"], name="halve"),
        helper.make_node("MatMul", ["g", "W2"], ["y"], name="fc2"),
    ]
    inits = [const("three", 3.0), const("c", 0.044715), const("k", 0.7978845608), const("one", 1.0),
             const("half", 0.5), weight("W1", D, D, scale=0.5), weight("W2", D, D, scale=0.1)]
    return model(nodes, [fin("x", N, D)], [fin("y", N, D)], inits)


def test_tanh_gelu_runs_fp16_and_its_overflowing_cube_saturates_as_in_fp32():
    m = _gelu_model()
    converted, report = convert_onnx(m, planner="all")
    ops = {o["name"]: o for o in report.ops}
    assert ops["pow"]["precision"] == "float16" and ops["pow"]["class"] == "infer"
    feeds = {"x": (np.random.default_rng(0).standard_normal((N, D)) * 20).astype(np.float32)}
    h = feeds["x"] @ numpy_helper.to_array(next(i for i in m.graph.initializer if i.name == "W1"))
    assert np.abs(h).max() > 40.5  # 40.5^3 > 65504: the cube overflows FP16 somewhere
    err = compare_outputs(["y"], run_reference(m, feeds), run_reference(converted, feeds))[0]["max_rel_error"]
    assert err < 5e-3



def _fp16(m):
    """``m`` as ONNX Runtime's float16 tool leaves it: every initializer (the exponent 3 too) and the I/O FP16."""
    for init in m.graph.initializer:
        init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float16), init.name))
    for vi in (*m.graph.input, *m.graph.output):
        vi.type.tensor_type.elem_type = 10
    return m


def test_an_fp16_gelu_keeps_its_cube_low_and_what_moves_is_said():
    """The importer read no value from an FP16 constant, so in a model already FP16 (ONNX Runtime's
    float16 tool, or a TorchScript export converted by us, whose exponent is a Constant node) the
    cube was a plain deny Pow: moved back to FP32 with two casts, and the report said nothing."""
    again = convert_onnx(_fp16(_gelu_model()))[1]
    ops = {o["name"]: o for o in again.ops}
    assert ops["pow"]["precision"] == "float16" and ops["pow"]["class"] == "infer", ops["pow"]
    assert again.summary["nothing_to_do"].startswith("nothing to do: 10 ops already float16")
    # a Pow no rule lets run low: what moved back to FP32 is said in the first line
    relu = _gelu_model()
    relu.graph.node[5].op_type = "Relu"  # no Tanh: the cube's overflow is not saturated
    said = convert_onnx(_fp16(relu))[1].summary["raised_from_low"]
    assert said.startswith("source already float16: 9 ops left as they were, 1 moved to FP32 by a rule with 2 casts "
                           "(1 Pow: pow overflows"), said
