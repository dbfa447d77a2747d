"""A model converted before (by onnxconverter-common or by this tool) run through again: nothing
changes and the report says so (``passes/propagate.py``, docs/architecture.md "Passes")."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from amp_compiler import convert_onnx

from .builders import fin, model, run, weight


def _mlp() -> onnx.ModelProto:
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"], name="up"),
             helper.make_node("Relu", ["h"], ["a"], name="act"),
             helper.make_node("MatMul", ["a", "W2"], ["y"], name="down")]
    return model(nodes, [fin("x", 512, 256)], [fin("y", 512, 256)], [weight("W1", 256, 256), weight("W2", 256, 256)])


def test_a_second_run_keeps_the_first_runs_fp32_decisions():
    """The first run kept ``up`` FP32 (here by --deny-node; in the field by the cost model, whose
    choice a second run over the converted graph re-made differently: a BERT's pooler went FP16)."""
    first, _ = convert_onnx(_mlp(), deny_nodes={"up"})
    second, report = convert_onnx(first)
    ops = {op["name"]: op for op in report.ops}
    assert ops["up"]["precision"] == "float32" and "kept FP32 by the amp-compiler run" in ops["up"]["reason"]
    assert ops["down"]["precision"] == "float16" and "already in the low dtype" in ops["down"]["reason"]
    assert report.summary["nothing_to_do"].startswith("nothing to do: ")
    assert [n.op_type for n in second.graph.node] == [n.op_type for n in first.graph.node]
    x = np.random.default_rng(0).standard_normal((512, 256)).astype(np.float32)
    np.testing.assert_array_equal(run(second, {"x": x})[0], run(first, {"x": x})[0])


def test_an_fp16_model_is_left_as_it_is_and_the_report_says_so():
    fp16 = _mlp()
    for init in fp16.graph.initializer:
        init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float16), init.name))
    for vi in (*fp16.graph.input, *fp16.graph.output):
        vi.type.tensor_type.elem_type = TensorProto.FLOAT16
    converted, report = convert_onnx(fp16)
    assert "nothing to do: 3 ops already float16" in report.summary["nothing_to_do"]
    assert len(converted.graph.node) == len(fp16.graph.node)
    assert "nothing_to_do" not in convert_onnx(_mlp())[1].summary
