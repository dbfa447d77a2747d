"""Small hand-built ONNX graphs for the pass tests, and helpers to plan and run them."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from amp_compiler.onnx_io.importer import import_model
from amp_compiler.plan import make_context, run_passes
from amp_compiler.plan_report import build_report

RNG = np.random.default_rng(0)


def weight(name: str, *shape: int, scale: float = 0.05) -> onnx.TensorProto:
    return numpy_helper.from_array((RNG.standard_normal(shape) * scale).astype(np.float32), name)


def model(nodes, inputs, outputs, initializers=(), opset: int = 18, value_info=()) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "test", inputs, outputs, list(initializers), value_info=list(value_info))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def fin(name: str, *shape, dtype=TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, list(shape))


def plan(m: onnx.ModelProto, **options):
    """Import and run the passes; returns (graph, report)."""
    result = plan_result(m, **options)
    return result.graph, build_report(result)


def plan_result(m: onnx.ModelProto, **options):
    """Import and run the passes; returns the ``PlanResult``."""
    dims = options.pop("dim_values", None)
    imp = import_model(m, default_dim=options.get("default_dim", 8))
    return run_passes(imp.graph, make_context(**options), "test", dims)


def run(m: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(None, feeds)


def nodes_of(m: onnx.ModelProto, op_type: str) -> list[onnx.NodeProto]:
    return [n for n in m.graph.node if n.op_type == op_type]


def elem_type(m: onnx.ModelProto, name: str) -> int:
    """The dtype the converted model declares or stores for ``name``."""
    for init in m.graph.initializer:
        if init.name == name:
            return init.data_type
    inferred = onnx.shape_inference.infer_shapes(m)
    for vi in (*inferred.graph.input, *inferred.graph.output, *inferred.graph.value_info):
        if vi.name == name:
            return vi.type.tensor_type.elem_type
    raise KeyError(name)
