"""ONNX importer: ``ModelProto`` -> ``PrecisionGraph``.

Every node of the main graph and of every If/Loop/Scan subgraph becomes an IR op
(subgraph ops carry the subgraph's scope path); graph inputs, initializers and
node outputs become tensors with dtype and shape. Types come from the model's
``value_info``; ONNX shape inference fills the gaps, run on a copy whose large
tensors are stripped of their bytes (types and shapes are all it needs). With
``validate=True`` the model is checked first (``validation.py``). Float32 constants get
their raw ``ValueStats`` (no policy: the numerics pass judges them for the target dtype);
external data (a model loaded lazily) is never read whole: the statistics read it in chunks.
The importer keeps a map from IR op names to the original ``NodeProto`` so the
emitter can apply the plan back onto the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto, numpy_helper

from ..errors import ConversionError
from ..ir import ACTIVATION, CONSTANT, GRAPH_INPUT, Op, PortGroup, PrecisionGraph, Tensor
from ..numerics import ValueStats, stats_of
from ..registry import DEFAULT_REGISTRY, Registry
from .dtypes import onnx_to_dtype
from .tensors import iter_chunks
from .schemas import port_groups
from .structure import node_rows
from .inference import tensor_type
from .trip_counts import loop_trip_counts
from .untyped import type_untyped
from .validation import infer_types, validate_model

_SUBGRAPH_OPS = ("If", "Loop", "Scan")
_UNTYPED = (None, None)
_DTYPE = attrgetter("dtype")


@dataclass
class OnnxImport:
    """The IR plus what the emitter needs to find its way back into the proto."""

    graph: PrecisionGraph
    model: ModelProto
    nodes: dict[str, NodeProto] = field(default_factory=dict)  # IR op name -> node
    graphs: dict[str, GraphProto] = field(default_factory=dict)  # scope -> (sub)graph
    initializers: dict[str, TensorProto] = field(default_factory=dict)
    strict: bool = False  # validate=True: also check that ports bound to one type parameter agree
    base_dir: str | None = None  # the folder external data lies in (a model loaded lazily)
    #: float32 initializers' raw bytes, read once for their statistics and kept for the emitter
    #: (upb copies ``raw_data`` on every access; docs/architecture.md, "Performance")
    raw: dict[str, bytes] = field(default_factory=dict)
    #: a list to have the emitter defer the casts of folded weights to the write (``stream.PendingCast``)
    pending: list | None = None


def import_model(model: ModelProto, *, registry: Registry | None = None, source: str = "model",
                 default_dim: int = 8, base_dir: str | None = None, validate: bool = False) -> OnnxImport:
    """Build the IR of ``model``; with ``validate`` (as ``convert_onnx`` does) check it first
    (``validation.validate_model``: a ``ConversionError`` naming the file, the node or
    tensor and the reason for anything malformed). Without it, hand-built test graphs
    with loose shapes import as they are.

    ``base_dir`` is the folder external data lies in, for a model loaded without it
    (``files.load_model(..., external_data="lazy")``): such tensors are read in chunks,
    never whole. The model may be modified in place: values reused by sibling subgraphs
    are renamed, nodes out of topological order are sorted.
    """
    registry = registry or DEFAULT_REGISTRY
    raw: dict[str, bytes] = {}
    rows: list[tuple] = []  # the main graph's nodes and their fields, as validation read them
    subgraph_paths: list[str] = []
    inferred = validate_model(model, source=source, base_dir=base_dir, raw=raw, rows=rows,
                              subgraph_paths=subgraph_paths) if validate else infer_types(model)
    opsets = {(o.domain or ""): o.version for o in model.opset_import}
    if "" not in opsets and "ai.onnx" in opsets:
        opsets[""] = opsets["ai.onnx"]
    types = _collect_types(model, inferred, nested=bool(subgraph_paths) or not validate)
    graph = PrecisionGraph(model.graph.name or source)
    graph.opsets = opsets
    graph.set_dim_sizes(default_dim)
    imp = OnnxImport(graph, model, strict=validate, base_dir=str(base_dir) if base_dir is not None else None,
                     raw=raw)
    _import_graph(imp, model.graph, "", types, _OpKinds(registry, opsets), source, rows or None)
    if None in map(_DTYPE, graph.tensors.values()):  # else no op output to type: no walk of the ops
        type_untyped(graph)  # behind ops onnx has no schema for (com.microsoft), "Input handling"
    graph.trip_counts = loop_trip_counts(imp) if len(imp.graphs) > 1 else {}  # what the cost model repeats
    graph.inputs = [i.name for i in model.graph.input if i.name not in imp.initializers]
    graph.outputs = [o.name for o in model.graph.output]
    return imp


def _import_graph(imp: OnnxImport, g: GraphProto, scope: str, types: dict, kinds: _OpKinds, source: str,
                  rows: list[tuple] | None = None) -> None:
    """``rows``: ``g``'s nodes with their fields already read (``structure._node_rows``), if any."""
    graph = imp.graph
    imp.graphs[scope] = g
    for init in g.initializer:
        _define(graph, Tensor(init.name, onnx_to_dtype(init.data_type), tuple(init.dims), CONSTANT, scope=scope),
                source, scope)
        imp.initializers[init.name] = init
        if init.data_type == TensorProto.FLOAT:
            raw = imp.raw.get(init.name)
            if raw is None and init.HasField("raw_data") and init.data_location != TensorProto.EXTERNAL:
                imp.raw[init.name] = raw = init.raw_data
            if raw is not None:
                graph.tensors[init.name].stats = stats_of(np.frombuffer(raw, dtype=np.float32))
            else:
                graph.tensors[init.name].stats = ValueStats.of_chunks(iter_chunks(init, imp.base_dir))
            graph.tensors[init.name].origin = "initializer"
        elif init.data_type == TensorProto.FLOAT16 and len(init.dims) <= 1 and sum(init.dims) <= _SMALL_FP16:
            graph.tensors[init.name].stats = _fp16_stats(init)  # a Pow's exponent in an FP16 model (rule 9)
    for k, inp in enumerate(g.input):
        if inp.name in imp.initializers:
            continue
        dtype, shape = _value_type(inp)
        if dtype is None and scope:
            dtype = _formal_input_dtype(graph, scope, k)
        _define(graph, Tensor(inp.name, dtype, shape, GRAPH_INPUT, scope=scope), source, scope)
    ops, tensors = graph.ops, graph.tensors
    if rows is None:  # each proto field read once: upb builds a new object per read
        rows = node_rows(g)
    for idx, (node, outputs, inputs, node_domain, attributes, node_name, op_type) in enumerate(rows):
        name = node_name or f"{op_type}_{idx}"
        if scope:
            name = f"{scope}/{name}"
        while name in ops:
            name = f"{name}_{idx}"
        dtypes = []  # each port's dtype, outputs then inputs (None: absent): the port-type check's signature
        for port, out in enumerate(outputs):  # each port linked as it is read (``PrecisionGraph._link``'s work)
            if out:
                dtype, shape = types.get(out, _UNTYPED)
                if dtype is None:
                    dtype, shape = _node_output_type(node)
                if out in tensors:
                    _defined_twice(out, source, scope)
                tensors[out] = Tensor(out, dtype, shape, ACTIVATION, name, port, scope=scope)
            else:
                dtype = None
            dtypes.append(dtype)
        domain = "" if node_domain in ("", "ai.onnx") else node_domain
        if op_type in ("Constant", "ConstantOfShape") and not domain and outputs and outputs[0]:
            tensors[outputs[0]].stats = _constant_stats(node)
            tensors[outputs[0]].origin = "constant"
        for port, inp in enumerate(inputs):
            if inp:
                tensor = tensors.get(inp)
                if tensor is None:
                    raise ConversionError(source, f"node {node_name or name} ({op_type})",
                                          f"input {inp!r} is not produced by any node, graph input or initializer")
                tensor.consumers.append((name, port))
                dtypes.append(tensor.dtype)
            else:
                dtypes.append(None)
        attrs, subgraph_attrs = _read_attributes(attributes) if attributes else ({}, ())
        kind = kinds.of(domain, op_type, len(inputs), len(outputs))
        op = Op(name, op_type, inputs, outputs, domain, attrs, scope=scope, canonical=kind.canonical,
                port_groups=[] if kind.groups is None else list(kind.groups))
        if imp.strict and kind.shared_groups:
            signature = tuple(dtypes)
            if signature not in kind.agreeing:  # checked once per kind and port dtypes
                _check_port_types(graph, op, kind.shared_groups, node, source, idx)
                kind.agreeing.add(signature)
        ops[name] = op  # its ports linked above; ``name`` is new (``graph.add_op`` without its checks)
        imp.nodes[name] = node
        for attr_name, subgraphs in subgraph_attrs:
            for k, sub in enumerate(subgraphs):
                sub_scope = f"{name}.{attr_name}" + (f"[{k}]" if len(subgraphs) > 1 else "")
                graph.scopes[sub_scope] = (name, [i.name for i in sub.input], [o.name for o in sub.output])
                _import_graph(imp, sub, sub_scope, types, kinds, source)
    for out in g.output:
        if out.name not in graph.tensors:
            raise ConversionError(source, f"graph output {out.name!r}", "is not produced by any node or input")
        t = graph.tensors[out.name]
        t.is_graph_output = True
        t.scope_output = t.scope_output or bool(scope)  # may be an outer value returned as is


@dataclass(frozen=True)
class _OpKind:
    """What the importer derives from a node's domain, op type and port counts alone."""

    canonical: str | None
    groups: tuple[PortGroup, ...] | None  # None: no schema groups (another domain, or no opset for it)
    shared_groups: tuple[PortGroup, ...]  # the groups of two or more ports, whose dtypes must agree
    #: the port dtypes (``_import_graph``'s signature) seen to agree in every shared group
    agreeing: set[tuple] = field(default_factory=set, compare=False)


class _OpKinds:
    """``_OpKind`` per (domain, op type, input count, output count), worked out once per import: a
    graph of repeated layers has a few dozen kinds of node, and the registry row and schema groups
    are the same for every node of a kind."""

    def __init__(self, registry: Registry, opsets: dict[str, int]) -> None:
        self.registry, self.opsets = registry, opsets
        self.known: dict[tuple[str, str, int, int], _OpKind] = {}

    def of(self, domain: str, op_type: str, n_inputs: int, n_outputs: int) -> _OpKind:
        key = (domain, op_type, n_inputs, n_outputs)
        kind = self.known.get(key)
        if kind is None:
            kind = self.known[key] = self._derive(*key)
        return kind

    def _derive(self, domain: str, op_type: str, n_inputs: int, n_outputs: int) -> _OpKind:
        row = self.registry.lookup_onnx(domain, op_type)
        opset = self.opsets.get(domain)
        groups = None
        if opset is not None and domain == "":
            groups = port_groups(op_type, "", opset, n_inputs, n_outputs) or ()
        shared = tuple(g for g in groups or () if len(g.inputs) + len(g.outputs) >= 2)
        return _OpKind(row.canonical if row else None, groups, shared)


def _check_port_types(graph: PrecisionGraph, op: Op, shared_groups: tuple[PortGroup, ...], node: NodeProto,
                      source: str, idx: int) -> None:
    """Ports bound to one type parameter of the schema must have one dtype (onnx's inference misses
    some mismatches, in models with local functions for one; the casts the plan inserts would not
    make such a model valid). ``shared_groups``: the op's groups of two or more ports."""
    tensors = graph.tensors
    for group in shared_groups:
        names = [op.inputs[i] for i in group.inputs if i < len(op.inputs)] + \
                [op.outputs[o] for o in group.outputs if o < len(op.outputs)]
        dtypes = {tensors[name].dtype for name in names if name and name in tensors}
        dtypes.discard(None)
        if len(dtypes) > 1:
            _raise_port_type_mismatch(graph, group, names, node, source, idx)


def _raise_port_type_mismatch(graph: PrecisionGraph, group: PortGroup, names: list[str], node: NodeProto,
                              source: str, idx: int) -> None:
    """The error for a group whose ports' dtypes disagree: the first port and the first one unlike it."""
    first: tuple[str, str] | None = None
    for name in names:
        dtype = graph.tensors[name].dtype if name and name in graph.tensors else None
        if dtype is None:
            continue
        if first is None:
            first = (name, dtype)
        elif dtype != first[1]:
            label = f"node {node.name!r} ({node.op_type})" if node.name else f"node #{idx} ({node.op_type})"
            param = group.param.partition("@")[0].partition(":")[0]
            raise ConversionError(source, label, f"{first[0]!r} ({first[1]}) and {name!r} ({dtype}) "
                                                 f"must have the same type {param}")


def _formal_input_dtype(graph: PrecisionGraph, scope: str, k: int) -> str | None:
    """dtype of an untyped subgraph input, from the value the owning Loop/Scan binds to it."""
    owner = graph.ops.get(graph.scopes[scope][0])
    if owner is None:
        return None
    if owner.op_type == "Loop":  # body inputs: iteration number, condition, loop-carried values
        if k < 2:
            return ("int64", "bool")[k]
        actual = owner.inputs[k] if k < len(owner.inputs) else ""
    elif owner.op_type == "Scan":  # body inputs: state values, then one slice of each scan input
        offset = 1 if graph.opsets.get(owner.domain, 9) < 9 else 0  # Scan-8: sequence_lens
        actual = owner.inputs[k + offset] if k + offset < len(owner.inputs) else ""
    else:
        return None
    return graph.tensors[actual].dtype if actual and actual in graph.tensors else None


def _define(graph: PrecisionGraph, tensor: Tensor, source: str, scope: str) -> None:
    if tensor.name in graph.tensors:
        _defined_twice(tensor.name, source, scope)
    graph.tensors[tensor.name] = tensor


def _defined_twice(name: str, source: str, scope: str) -> None:
    where = f"subgraph {scope}" if scope else "the main graph"
    raise ConversionError(source, f"tensor {name!r}", f"is defined twice (again in {where}); names must be unique "
                                                      "across scopes")


def _read_attributes(attributes) -> tuple[dict[str, Any], list[tuple[str, list[GraphProto]]]]:
    """A node's scalar and int-list attributes (``Op.attrs``), and its graph attributes as
    (name, subgraphs); each ``AttributeProto``'s type read once for both."""
    out: dict[str, Any] = {}
    subgraphs: list[tuple[str, list[GraphProto]]] = []
    for a in attributes:
        kind = a.type
        if kind == AttributeProto.INT:
            out[a.name] = a.i
        elif kind == AttributeProto.FLOAT:
            out[a.name] = a.f
        elif kind == AttributeProto.STRING:
            out[a.name] = a.s.decode("utf-8", "replace")
        elif kind == AttributeProto.INTS:
            out[a.name] = list(a.ints)
        elif kind == AttributeProto.GRAPH:
            subgraphs.append((a.name, [a.g]))
        elif kind == AttributeProto.GRAPHS:
            subgraphs.append((a.name, list(a.graphs)))
    return out, subgraphs


def _value_type(vi: onnx.ValueInfoProto, memo: dict | None = None) -> tuple[str | None, tuple | None]:
    code, shape = tensor_type(vi, memo)
    return onnx_to_dtype(code) if code else None, shape


def _node_output_type(node: NodeProto) -> tuple[str | None, tuple | None]:
    """Types the schema fixes without inference: Constant's value, Cast's ``to``."""
    for a in node.attribute:
        if node.op_type == "Constant" and a.name == "value":
            return onnx_to_dtype(a.t.data_type), tuple(a.t.dims)
        if node.op_type == "Cast" and a.name == "to":
            return onnx_to_dtype(a.i), None
    return None, None


def _collect_types(model: ModelProto, inferred: dict, nested: bool = True
                   ) -> dict[str, tuple[str | None, tuple | None]]:
    """dtype and shape of every value the model declares; shape inference (``inferred``) fills the
    gaps, and the dims a declaration leaves unknown or names apart from the inputs' dims (the
    TorchScript exporter's ``Mul_out_dim_0``) where inference related them (``symbolic_dims``).
    ``nested=False``: the model has no subgraphs (validation found none), its nodes are not walked."""
    types: dict[str, tuple[str | None, tuple | None]] = {}
    _declared_types(model.graph, types, {}, nested)
    inputs = {d.dim_param for vi in model.graph.input for d in vi.type.tensor_type.shape.dim if d.dim_param}
    for name, (code, shape) in inferred.items():
        found = types.get(name)
        if found is None:
            types[name] = (onnx_to_dtype(code), shape)
        elif shape is not None and found[1] != shape:
            types[name] = (found[0], _related_shape(found[1], shape, inputs))
    return types


def _related_shape(declared: tuple | None, inferred: tuple, inputs: set[str]) -> tuple:
    """``declared`` with each dim it leaves unknown, or names apart from the inputs' dims, taken
    from ``inferred`` (same rank only)."""
    if declared is None:
        return inferred
    if len(declared) != len(inferred):
        return declared
    return tuple(d if isinstance(d, int) or d in inputs or i is None else i for d, i in zip(declared, inferred))


def _declared_types(g: GraphProto, types: dict, memo: dict, nested: bool = True) -> None:
    """Add the typed values ``g`` and its subgraphs declare to ``types`` (a module-level function:
    a recursive closure is a reference cycle that would keep ``types`` alive until a collection);
    ``memo``: ``tensor_type``'s, shared by the subgraphs; ``nested=False``: ``g`` holds none."""
    for vi in (*g.input, *g.output, *g.value_info):
        dtype, shape = _value_type(vi, memo)
        if dtype is not None:
            types[vi.name] = (dtype, shape)
    if not nested:
        return
    for node in g.node:
        for a in node.attribute:
            for sub in ([a.g] if a.type == AttributeProto.GRAPH else list(a.graphs)):
                _declared_types(sub, types, memo)


def _constant_stats(node: NodeProto) -> ValueStats | None:
    """Raw statistics of a Constant or ConstantOfShape node's float32 value (a mask fill of -1e9, say)."""
    for a in node.attribute:
        if a.name == "value" and a.type == AttributeProto.TENSOR and a.t.data_type == TensorProto.FLOAT:
            values = _float_values(a.t)
        elif a.name == "value" and a.type == AttributeProto.TENSOR and a.t.data_type == TensorProto.FLOAT16:
            return _fp16_stats(a.t)
        elif a.name in ("value_float", "value_floats"):
            values = np.asarray([a.f] if a.name == "value_float" else list(a.floats), dtype=np.float32)
        else:
            continue
        if values is not None:
            return stats_of(values)
    return None


#: FP16 initializers up to this many elements get statistics (a scalar exponent; weights need none)
_SMALL_FP16 = 64


def _fp16_stats(t: TensorProto) -> ValueStats | None:
    """Statistics of a small FP16 constant: a Pow's exponent 3 stored FP16 by ONNX Runtime's float16
    tool, or by an earlier run of ours, had no value, so GELU's x**3 stayed deny (numerics rule 9)."""
    if t.data_location == TensorProto.EXTERNAL:
        return None
    values = numpy_helper.to_array(t).astype(np.float32).ravel()
    return stats_of(values) if values.size else None


def _float_values(init: TensorProto) -> np.ndarray | None:
    if init.raw_data:
        return np.frombuffer(init.raw_data, dtype=np.float32)
    if init.float_data:
        return np.asarray(init.float_data, dtype=np.float32)
    return None
