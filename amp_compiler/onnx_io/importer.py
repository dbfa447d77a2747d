"""ONNX importer: ``ModelProto`` -> ``PrecisionGraph``.

Every node of the main graph and of every If/Loop/Scan subgraph becomes an IR op
(subgraph ops carry the subgraph's scope path); graph inputs, initializers and
node outputs become tensors with dtype and shape. Types come from the model's
``value_info``; when some are missing, ONNX shape inference runs on a copy whose
large initializers are stripped of their bytes (types and shapes are all it needs).
The importer keeps a map from IR op names to the original ``NodeProto`` so the
emitter can apply the plan back onto the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto

from ..errors import ConversionError
from ..ir import ACTIVATION, CONSTANT, GRAPH_INPUT, Op, PrecisionGraph, Tensor
from ..registry import DEFAULT_REGISTRY, Registry
from .dtypes import onnx_to_dtype
from .schemas import port_groups

_SMALL_INITIALIZER = 1024  # bytes kept when stripping initializers for shape inference
_SUBGRAPH_OPS = ("If", "Loop", "Scan")
FP16_MAX = 65504.0
FP16_TINY = 2.0 ** -24  # smallest FP16 subnormal: nonzero magnitudes below it flush to zero


@dataclass
class OnnxImport:
    """The IR plus what the emitter needs to find its way back into the proto."""

    graph: PrecisionGraph
    model: ModelProto
    nodes: dict[str, NodeProto] = field(default_factory=dict)  # IR op name -> node
    graphs: dict[str, GraphProto] = field(default_factory=dict)  # scope -> (sub)graph
    initializers: dict[str, TensorProto] = field(default_factory=dict)


def import_model(model: ModelProto, *, registry: Registry | None = None, source: str = "model",
                 default_dim: int = 8) -> OnnxImport:
    registry = registry or DEFAULT_REGISTRY
    opsets = {(o.domain or ""): o.version for o in model.opset_import}
    if "" not in opsets and "ai.onnx" in opsets:
        opsets[""] = opsets["ai.onnx"]
    types = _collect_types(model, source)
    graph = PrecisionGraph(model.graph.name or source)
    graph.meta.update(source=source, opsets=opsets, default_dim=default_dim)
    imp = OnnxImport(graph, model)
    _import_graph(imp, model.graph, "", types, opsets, registry, source)
    graph.inputs = [i.name for i in model.graph.input if i.name not in imp.initializers]
    graph.outputs = [o.name for o in model.graph.output]
    return imp


def _import_graph(imp: OnnxImport, g: GraphProto, scope: str, types: dict, opsets: dict, registry: Registry,
                  source: str) -> None:
    graph = imp.graph
    imp.graphs[scope] = g
    for init in g.initializer:
        _define(graph, Tensor(init.name, onnx_to_dtype(init.data_type), tuple(init.dims), CONSTANT, scope=scope),
                source, scope)
        imp.initializers[init.name] = init
        _check_range(graph.tensors[init.name], init, source)
    for inp in g.input:
        if inp.name in imp.initializers:
            continue
        dtype, shape = _value_type(inp)
        _define(graph, Tensor(inp.name, dtype, shape, GRAPH_INPUT, scope=scope), source, scope)
    for idx, node in enumerate(g.node):
        name = node.name or f"{node.op_type}_{idx}"
        if scope:
            name = f"{scope}/{name}"
        while name in graph.ops:
            name = f"{name}_{idx}"
        for out in node.output:
            if out:
                dtype, shape = types.get(out, (None, None))
                if dtype is None:
                    dtype, shape = _node_output_type(node)
                _define(graph, Tensor(out, dtype, shape, ACTIVATION, scope=scope), source, scope)
        for inp in node.input:
            if inp and inp not in graph.tensors:
                raise ConversionError(source, f"node {node.name or name} ({node.op_type})",
                                      f"input {inp!r} is not produced by any node, graph input or initializer")
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        row = registry.lookup_onnx(domain, node.op_type)
        op = Op(name, node.op_type, list(node.input), list(node.output), domain=domain, attrs=_attrs(node),
                scope=scope, canonical=row.canonical if row else None)
        opset = opsets.get(domain)
        if opset is not None and domain in ("",):
            groups = port_groups(node.op_type, "", opset, len(node.input), len(node.output))
            op.port_groups = list(groups or ())
        graph.add_op(op)
        imp.nodes[name] = node
        for attr in node.attribute:
            subgraphs = [attr.g] if attr.type == AttributeProto.GRAPH else list(attr.graphs)
            for k, sub in enumerate(subgraphs):
                sub_scope = f"{name}.{attr.name}" + (f"[{k}]" if len(subgraphs) > 1 else "")
                graph.scopes[sub_scope] = (name, [i.name for i in sub.input], [o.name for o in sub.output])
                _import_graph(imp, sub, sub_scope, types, opsets, registry, source)
    for out in g.output:
        if out.name not in graph.tensors:
            raise ConversionError(source, f"graph output {out.name!r}", "is not produced by any node or input")
        t = graph.tensors[out.name]
        t.is_graph_output = True
        t.scope_output = t.scope_output or bool(scope)  # may be an outer value returned as is


def _define(graph: PrecisionGraph, tensor: Tensor, source: str, scope: str) -> None:
    if tensor.name in graph.tensors:
        where = f"subgraph {scope}" if scope else "the main graph"
        raise ConversionError(source, f"tensor {tensor.name!r}",
                              f"is defined twice (again in {where}); names must be unique across scopes")
    graph.tensors[tensor.name] = tensor


def _attrs(node: NodeProto) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a in node.attribute:
        if a.type == AttributeProto.INT:
            out[a.name] = a.i
        elif a.type == AttributeProto.FLOAT:
            out[a.name] = a.f
        elif a.type == AttributeProto.STRING:
            out[a.name] = a.s.decode("utf-8", "replace")
        elif a.type == AttributeProto.INTS:
            out[a.name] = list(a.ints)
    return out


def _value_type(vi: onnx.ValueInfoProto) -> tuple[str | None, tuple | None]:
    if not vi.type.HasField("tensor_type"):
        return None, None
    tt = vi.type.tensor_type
    shape = None
    if tt.HasField("shape"):
        shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim)
    return onnx_to_dtype(tt.elem_type) if tt.elem_type else None, shape


def _node_output_type(node: NodeProto) -> tuple[str | None, tuple | None]:
    """Types the schema fixes without inference: Constant's value, Cast's ``to``."""
    for a in node.attribute:
        if node.op_type == "Constant" and a.name == "value":
            return onnx_to_dtype(a.t.data_type), tuple(a.t.dims)
        if node.op_type == "Cast" and a.name == "to":
            return onnx_to_dtype(a.i), None
    return None, None


def _collect_types(model: ModelProto, source: str) -> dict[str, tuple[str | None, tuple | None]]:
    """dtype and shape of every value the model declares; shape inference fills the gaps."""
    types: dict[str, tuple[str | None, tuple | None]] = {}

    def walk(g: GraphProto) -> tuple[int, int]:
        for vi in (*g.input, *g.output, *g.value_info):
            dtype, shape = _value_type(vi)
            if dtype is not None:
                types[vi.name] = (dtype, shape)
        outputs = known = 0
        for node in g.node:
            for out in node.output:
                if out:
                    outputs += 1
                    known += out in types
            for a in node.attribute:
                for sub in ([a.g] if a.type == AttributeProto.GRAPH else list(a.graphs)):
                    o, k = walk(sub)
                    outputs += o
                    known += k
        return outputs, known

    outputs, known = walk(model.graph)
    if known < outputs:
        for name, value in _infer_types(model, source).items():
            types.setdefault(name, value)
    return types


def _infer_types(model: ModelProto, source: str) -> dict[str, tuple[str | None, tuple | None]]:
    stripped = ModelProto()
    stripped.CopyFrom(_without_large_data(model))
    try:
        inferred = onnx.shape_inference.infer_shapes(stripped, check_type=False, strict_mode=False)
    except Exception as exc:  # inference is best effort: missing types are handled downstream
        inferred = stripped
        del exc
    types: dict[str, tuple[str | None, tuple | None]] = {}

    def walk(g: GraphProto) -> None:
        for vi in (*g.value_info, *g.output):
            dtype, shape = _value_type(vi)
            if dtype is not None:
                types[vi.name] = (dtype, shape)
        for node in g.node:
            for a in node.attribute:
                for sub in ([a.g] if a.type == AttributeProto.GRAPH else list(a.graphs)):
                    walk(sub)

    walk(inferred.graph)
    return types


def _without_large_data(model: ModelProto) -> ModelProto:
    """A copy of the model whose large initializers have dims and dtype but no bytes."""
    light = ModelProto()
    light.CopyFrom(model) if model.ByteSize() < (64 << 20) else _copy_skeleton(model, light)
    return light


def _copy_skeleton(model: ModelProto, light: ModelProto) -> None:
    graph = model.graph
    saved = list(graph.initializer)
    del graph.initializer[:]
    try:
        light.CopyFrom(model)
    finally:
        graph.initializer.extend(saved)
    for init in saved:
        t = light.graph.initializer.add()
        t.name, t.data_type = init.name, init.data_type
        t.dims.extend(init.dims)
        if init.ByteSize() <= _SMALL_INITIALIZER:
            t.CopyFrom(init)


def _check_range(tensor: Tensor, init: TensorProto, source: str) -> None:
    """Mark float32 initializers whose values FP16 cannot hold (too large, or flushing to zero)."""
    if init.data_type != TensorProto.FLOAT or init.data_location == TensorProto.EXTERNAL:
        return
    values = _float_values(init)
    if values is None or values.size == 0:
        return
    with np.errstate(invalid="ignore"):
        big = max(abs(float(np.nanmin(values))), abs(float(np.nanmax(values))))
    if big > FP16_MAX and np.isfinite(big):
        tensor.low_unsafe = f"initializer {init.name} has values beyond the FP16 range (max |w| = {big:.3g})"
        return
    below = np.count_nonzero(np.abs(values) < FP16_TINY)
    if not below:
        return
    zeros = np.count_nonzero(values == 0)
    tiny, nonzero = below - zeros, values.size - zeros
    if tiny and tiny * 100 >= nonzero:
        tensor.low_unsafe = (f"initializer {init.name}: {tiny} of {nonzero} nonzero values are below the "
                             f"smallest FP16 subnormal and would flush to zero")


def _float_values(init: TensorProto) -> np.ndarray | None:
    if init.raw_data:
        return np.frombuffer(init.raw_data, dtype=np.float32)
    if init.float_data:
        return np.asarray(init.float_data, dtype=np.float32)
    return None
