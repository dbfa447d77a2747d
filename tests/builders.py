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


class IRBuilder:
    """Hand-built IR for pass unit tests: no ONNX, no ONNX Runtime.

    Ops are named by ONNX op type (the registry gives the canonical op); with no port
    groups, classify gives every float port of a known op one ``unit`` role.
    """

    def __init__(self, shape: tuple = (256, 256)) -> None:
        from amp_compiler.ir import PrecisionGraph

        self.graph = PrecisionGraph("ir")
        self.shape = shape
        self.graph.set_dim_sizes(8)

    def input(self, name: str, dtype: str = "float32", shape: tuple | None = None) -> str:
        from amp_compiler.ir import GRAPH_INPUT, Tensor

        self.graph.add_tensor(Tensor(name, dtype, shape or self.shape, GRAPH_INPUT))
        self.graph.inputs.append(name)
        return name

    def const(self, name: str, values, kind: str = "constant") -> str:
        from amp_compiler.ir import Tensor
        from amp_compiler.numerics import stats_of

        arr = np.asarray(values, dtype=np.float32)
        t = self.graph.add_tensor(Tensor(name, "float32", arr.shape, kind))
        t.stats = stats_of(arr)
        return name

    def op(self, op_type: str, inputs: list[str], name: str | None = None, dtype: str | None = None,
           shape: tuple | None = None, scalars: tuple = (), n_out: int = 1) -> str:
        """Add an op; returns its (first) output's name, ``<name>_out``."""
        from amp_compiler.ir import Op, Tensor
        from amp_compiler.registry import DEFAULT_REGISTRY

        name = name or f"{op_type.lower()}{len(self.graph.ops)}"
        first = self.graph.tensors[inputs[0]] if inputs else None
        dtype = dtype or (first.dtype if first is not None else "float32")
        outs = [f"{name}_out" if k == 0 else f"{name}_out{k}" for k in range(n_out)]
        for out in outs:
            self.graph.add_tensor(Tensor(out, dtype, shape or (first.shape if first is not None else self.shape)))
        row = DEFAULT_REGISTRY.lookup_onnx("", op_type)
        self.graph.add_op(Op(name, op_type, list(inputs), outs, canonical=row.canonical if row else None,
                             scalars=tuple(scalars)))
        return outs[0]

    def output(self, *names: str) -> None:
        for n in names:
            self.graph.tensors[n].is_graph_output = True
            self.graph.outputs.append(n)

    def run(self, *passes, **options):
        """Run ``passes`` (instances) in order with ``make_context(**options)``; returns their results."""
        ctx = make_context(**options)
        return [p(self.graph, ctx) for p in passes]


def rms_norm_stack(blocks: int = 6, d: int = 64, tokens: int = 16, gamma=None,
                   torchscript: bool = False, eps: float = 1e-6) -> onnx.ModelProto:
    """``blocks`` x (MatMul -> T5/Llama RMSNorm as the dynamo exporter writes torch.rsqrt: Pow,
    ReduceMean, Add ``eps``, Sqrt, Reciprocal, Mul(h, r)). ``gamma(block, d)``, if given, returns
    each norm's learned 1-D scale, applied as ``Mul(gamma, normed)`` as T5 and Llama do.
    ``torchscript``: as the TorchScript exporter writes Gemma's norm: ``h.float()`` a Cast,
    ``Div(Constant 1, s)`` for the Reciprocal, the scale ``Add(1, gamma - 1)`` left unfolded."""
    nodes, inits, x = [], [], "x"
    for i in range(blocks):
        n = f"b{i}_"
        normed = f"{n}n" if gamma is not None else f"{n}y"
        h = f"{n}hf" if torchscript else f"{n}h"
        nodes += [helper.make_node("MatMul", [x, f"{n}W"], [f"{n}h"], name=f"{n}mm")]
        if torchscript:
            nodes += [helper.make_node("Cast", [f"{n}h"], [h], name=f"{n}float", to=TensorProto.FLOAT),
                      helper.make_node("Constant", [], [f"{n}one"], name=f"{n}one",
                                       value=numpy_helper.from_array(np.array(1.0, np.float32)))]
        nodes += [helper.make_node("Pow", [h, "two"], [f"{n}p"], name=f"{n}pow"),
                  helper.make_node("ReduceMean", [f"{n}p", "axes"], [f"{n}m"], name=f"{n}mean", keepdims=1),
                  helper.make_node("Add", [f"{n}m", "eps"], [f"{n}a"], name=f"{n}add"),
                  helper.make_node("Sqrt", [f"{n}a"], [f"{n}s"], name=f"{n}sqrt"),
                  helper.make_node("Div", [f"{n}one", f"{n}s"], [f"{n}r"], name=f"{n}rsqrt") if torchscript else
                  helper.make_node("Reciprocal", [f"{n}s"], [f"{n}r"], name=f"{n}rsqrt"),
                  helper.make_node("Mul", [h, f"{n}r"], [normed], name=f"{n}norm")]
        inits.append(weight(f"{n}W", d, d))
        if gamma is not None:
            g = np.asarray(gamma(i, d), np.float32)
            if torchscript:
                nodes.append(helper.make_node("Add", [f"{n}one", f"{n}g1"], [f"{n}g"], name=f"{n}one_plus"))
                inits.append(numpy_helper.from_array(g - 1, f"{n}g1"))
            else:
                inits.append(numpy_helper.from_array(g, f"{n}g"))
            nodes.append(helper.make_node("Mul", [f"{n}g", normed], [f"{n}y"], name=f"{n}scale"))
        x = f"{n}y"
    inits += [numpy_helper.from_array(np.array(2.0, np.float32), "two"),
              numpy_helper.from_array(np.array([-1], np.int64), "axes"),
              numpy_helper.from_array(np.array(eps, np.float32), "eps")]
    nodes.append(helper.make_node("Identity", [x], ["y"], name="out"))
    return model(nodes, [fin("x", tokens, d)], [fin("y", tokens, d)], inits)


def state_loop(body_nodes: list, body_initializers: list, trips: int, outer: list,
               head_weight: str = "W", rows: int = 4, d: int = 64) -> onnx.ModelProto:
    """``x`` [rows, d] carried through ``trips`` iterations of a Loop ``loop0`` whose body maps ``s_in`` to
    ``s_out`` by ``body_nodes``, then a GEMM ``head`` on the final state by ``head_weight`` (in ``outer``)."""
    body = helper.make_graph(
        [*body_nodes, helper.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond")],
        "body", [fin("i", dtype=TensorProto.INT64), fin("cond_in", dtype=TensorProto.BOOL), fin("s_in", rows, d)],
        [fin("cond_out", dtype=TensorProto.BOOL), fin("s_out", rows, d)], body_initializers)
    nodes = [helper.make_node("Loop", ["trips", "cond", "x"], ["s_final"], name="loop0", body=body),
             helper.make_node("MatMul", ["s_final", head_weight], ["y"], name="head")]
    return model(nodes, [fin("x", rows, d)], [fin("y", rows, d)],
                 [*outer, numpy_helper.from_array(np.array(trips, np.int64), "trips"),
                  numpy_helper.from_array(np.array(True), "cond")])


def growing_loop(trips: int = 4, head_weight: str = "W", rows: int = 4, d: int = 64) -> onnx.ModelProto:
    """A Loop whose state grows about 32x per iteration (4 iterations reach ~1e6) through a GEMM
    and a scale in its body, then a GEMM on the final state (by the body's weight ``W``, or another).
    At the default [4, 64] too small for the cost model to convert its body (each iteration's casts
    cost more than its GEMM saves, ``cost_model/repeats.py``): tests of what an FP16 body does plan it
    with ``planner="all"``; at ``LOOP_ROWS`` x ``LOOP_D`` the default plan converts it."""
    body = [helper.make_node("MatMul", ["s_in", "W"], ["mm"], name="body_mm"),
            helper.make_node("Mul", ["mm", "k"], ["s_out"], name="body_scale")]
    # each element N(0, 16) whatever ``d`` (scale 0.5 at d = 64, as the tests' numbers assume), then times 8
    weights = [weight(name, d, d, scale=4 / d ** 0.5) for name in dict.fromkeys(["W", head_weight])]
    return state_loop(body, [numpy_helper.from_array(np.array(8.0, np.float32), "k")], trips, weights, head_weight,
                      rows, d)


#: a Loop state the default plan converts: each iteration's 1024-wide GEMM pays for the body's casts
LOOP_ROWS, LOOP_D = 512, 1024
