"""ONNX emitter: apply a planned ``PrecisionGraph`` back onto the imported ``ModelProto``.

Only what the plan changed is touched: node inputs/outputs rewired to casts, new
Cast nodes, dtype attributes of ops whose precision changed (``Cast.to``,
``ConstantOfShape.value``, ...), folded constants written as new initializers,
initializers nobody reads any more removed, value_info and graph I/O types updated.
Names, metadata, doc strings, other attributes and untouched nodes survive as they were.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from onnx import AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto, TypeProto, helper, numpy_helper

from ..ir import PrecisionGraph, Tensor
from ..registry import DEFAULT_REGISTRY
from .dtypes import dtype_to_onnx
from .files import defer_cast
from .importer import OnnxImport
from .order import replace_nodes
from .ort_fusions import castlike_casts
from . import rms_norm_form
from .stream import PendingCast

if TYPE_CHECKING:
    from passes.result import PlanResult

try:
    import ml_dtypes
except ImportError:  # pragma: no cover - ml_dtypes comes with onnx
    ml_dtypes = None


def emit(imp: OnnxImport, result: PlanResult) -> ModelProto:
    """Apply ``result``'s plan (carried by ``imp.graph``) onto ``imp.model``, in place; returns the model."""
    graph, model = imp.graph, imp.model
    original = result.original_dtypes
    scopes: dict[str, list[NodeProto]] = {scope: [] for scope in imp.graphs}
    castlike = castlike_casts(graph)
    likes: dict[tuple[str, str], str] = {}  # (scope, dtype) -> scalar initializer CastLike reads
    # RMSNorms in the form ONNX Runtime fuses, rewritten on the IR: the report built from it describes this file
    gone = rms_norm_form.rewrite(graph, rms_norm_form.div_forms(graph, result.timer))
    for name, op in graph.ops.items():
        node = imp.nodes.get(name)
        if node is None and name in castlike:  # ONNX Runtime's LayerNorm fusion would absorb a Cast
            like = likes.setdefault((op.scope, op.attrs["to"]), graph.fresh_name(f"castlike_{op.attrs['to']}"))
            node = helper.make_node("CastLike", [op.inputs[0], like], op.outputs, name=name)
        elif node is None:  # inserted by a pass
            node = _cast_node(op, name)
        else:
            _rewrite_node(graph, node, op, original)
        scopes[op.scope].append(node)
    # innermost subgraphs first: replacing an outer graph's nodes copies the subgraphs they hold
    for scope in sorted(imp.graphs, key=lambda s: _depth(graph, s), reverse=True):
        g = imp.graphs[scope]
        replace_nodes(g, scopes[scope])
        _write_initializers(imp, g, scope)
        g.initializer.extend(_scalar(like, dtype) for (s, dtype), like in likes.items() if s == scope)
        _update_types(graph, g, scope, original)
        rms_norm_form.drop_value_info(g, gone)
    return model


def _rewrite_node(graph: PrecisionGraph, node: NodeProto, op, original: dict) -> None:
    """Bring a source node in line with its op: type, inputs, outputs, dtype attributes. Most
    nodes keep their wiring; each field is compared in place, not copied out of the proto."""
    if node.op_type != op.op_type:  # an RMSNorm's Mul(x, 1/s) written as Div(x, s)
        node.op_type = op.op_type
    if node.input != op.inputs:
        del node.input[:]
        node.input.extend(op.inputs)
    outputs = op.outputs
    first = outputs[0] if outputs else None  # the source's first output: a kept graph output is renamed,
    if node.output != outputs:               # and its old name has the old dtype
        first = node.output[0] if node.output else None
        del node.output[:]
        node.output.extend(outputs)
    if op.op_type == "Constant" and outputs and graph.tensors[outputs[0]].saturate_to is not None:
        _saturate_constant(node, graph.tensors[outputs[0]].saturate_to)  # before any retyping
    if first is not None and outputs and outputs[0]:
        before = original.get(first)
        dtype = graph.tensors[outputs[0]].dtype
        if before is not None and dtype != before and dtype in _CODES:  # most ops: dtype unchanged
            _retarget_dtype_attrs(node, dtype)


def _cast_node(op, name: str) -> NodeProto:
    """The Cast node of an inserted cast, as ``helper.make_node`` builds it (the same bytes, a quarter
    of its time: 16k casts at 100k nodes)."""
    node = NodeProto(op_type="Cast", input=op.inputs, output=op.outputs)
    if name:  # proto2: a name set empty would be written
        node.name = name
    node.attribute.add(name="to", type=AttributeProto.INT, i=dtype_to_onnx(op.attrs["to"]))
    return node


def _depth(graph: PrecisionGraph, scope: str) -> int:
    depth = 0
    while scope:
        owner = graph.scopes[scope][0]
        scope = graph.ops[owner].scope if owner in graph.ops else ""
        depth += 1
    return depth


def _retarget_dtype_attrs(node: NodeProto, dtype: str) -> None:
    """Ops whose output dtype is an attribute: make the attribute say ``dtype``, the first
    output's new dtype (``_rewrite_node`` calls this where it differs from the source's).

    An attribute left at its schema default is written out explicitly (ConstantOfShape's
    default ``value`` is an FP32 zero, RandomNormal's default ``dtype`` is FP32), and
    Constant's ``value_float(s)`` become a ``value`` tensor of the new dtype.
    """
    row = DEFAULT_REGISTRY.lookup_onnx(node.domain, node.op_type)
    wanted = set(row.dtype_attrs) if row else set()
    if not wanted and not node.attribute:
        return  # no dtype attribute to retarget nor to add (most ops)
    int_attrs = {"to", "dtype"} | wanted
    present = set()
    for i, a in enumerate(node.attribute):
        present.add(a.name)
        if a.name in int_attrs and a.type == a.INT:
            a.i = dtype_to_onnx(dtype)
        elif a.name == "value" and a.type == a.TENSOR:
            converted = to_dtype(numpy_helper.to_array(a.t), dtype)
            a.t.CopyFrom(numpy_helper.from_array(converted, a.t.name))
        elif node.op_type == "Constant" and a.name in ("value_float", "value_floats"):
            values = np.asarray(a.f if a.name == "value_float" else list(a.floats), dtype=np.float32)
            node.attribute[i].CopyFrom(helper.make_attribute("value", _tensor(to_dtype(values, dtype))))
    if "value" in wanted and "value" not in present and node.op_type == "ConstantOfShape":
        node.attribute.append(helper.make_attribute("value", _tensor(to_dtype(np.zeros(1, np.float32), dtype))))
    if "dtype" in wanted and "dtype" not in present:
        node.attribute.append(helper.make_attribute("dtype", dtype_to_onnx(dtype)))


def _tensor(values: np.ndarray) -> TensorProto:
    proto = TensorProto()
    _fill_tensor(proto, "", values)
    return proto


def _write_initializers(imp: OnnxImport, g: GraphProto, scope: str) -> None:
    """Add folded constants, drop initializers nobody reads any more; others are left as they are.

    With ``imp.pending`` (a list: ``convert_onnx``) the main graph's constants folded from in-memory
    FP32 bytes are listed there instead, to be cast while the file is written (``stream``)."""
    graph = imp.graph
    used = set()
    for op in graph.ops.values():
        used.update(op.inputs)
    used.discard("")
    used |= {t.name for t in graph.tensors.values() if t.is_graph_output}
    declared = {i.name for i in g.input}
    unused = [i for i, init in enumerate(g.initializer) if init.name not in used and init.name not in declared]
    for t in graph.tensors.values():  # mask sentinels first: their folded copies read the clamped values
        if t.saturate_to is not None and t.scope == scope and t.name in imp.initializers:
            _saturate(imp, imp.initializers[t.name], t.saturate_to)
    for t in graph.tensors.values():
        if t.folded_from and t.scope == scope and t.name in used and t.name not in imp.initializers:
            source = imp.initializers[t.folded_from]
            raw = imp.raw.get(t.folded_from)
            if imp.pending is not None and not scope and raw is not None and t.dtype in _CODES:
                imp.pending.append(PendingCast(t.name, tuple(source.dims), raw, t.dtype))  # cast while writing
                continue
            new = g.initializer.add()
            _fold_into(new, t, source, imp)
            imp.initializers[t.name] = new
    for i in reversed(unused):
        del g.initializer[i]


def _fold_into(proto: TensorProto, t: Tensor, source: TensorProto, imp: OnnxImport) -> None:
    """``proto`` := constant ``source`` cast to ``t.dtype``. From external data (a model loaded
    lazily, over 2 GB say) the cast is deferred: ``files.save_model`` streams it chunk by chunk,
    so no weight is ever held whole in memory."""
    base = imp.base_dir
    if source.data_location == TensorProto.EXTERNAL and base and source.name not in imp.raw:
        defer_cast(proto, t.name, source, dtype_to_onnx(t.dtype), base)
    else:
        _fill_tensor(proto, t.name, to_dtype(_array(source, imp), t.dtype))


def _saturate(imp: OnnxImport, init: TensorProto, bound: float) -> None:
    """Store a mask sentinel clamped to +-``bound`` (numerics rule 10), in place, FP32 kept."""
    if init.data_location == TensorProto.EXTERNAL and init.name not in imp.raw:
        return  # a sentinel is a scalar or a small fill: never moved to external data by an exporter
    values = np.clip(_array(init, imp), -bound, bound).astype(np.float32)
    for field in ("float_data", "raw_data", "external_data", "data_location"):  # mapped (files.load_model): inline now
        init.ClearField(field)
    init.raw_data = values.tobytes()
    if init.name in imp.raw:
        imp.raw[init.name] = init.raw_data


def _saturate_constant(node: NodeProto, bound: float) -> None:
    """A Constant node's mask sentinel clamped to +-``bound`` (numerics rule 10), in its FP32 value."""
    for i, a in enumerate(node.attribute):
        if a.name == "value" and a.type == a.TENSOR:
            a.t.CopyFrom(numpy_helper.from_array(np.clip(numpy_helper.to_array(a.t), -bound, bound), a.t.name))
        elif a.name in ("value_float", "value_floats"):
            values = np.asarray(a.f if a.name == "value_float" else list(a.floats), dtype=np.float32)
            clipped = np.clip(values, -bound, bound).astype(np.float32)
            node.attribute[i].CopyFrom(helper.make_attribute("value", _tensor(clipped)))


def _scalar(name: str, dtype: str) -> TensorProto:
    """A zero of ``dtype``: the type operand of an emitted CastLike."""
    proto = TensorProto()
    _fill_tensor(proto, name, to_dtype(np.zeros((), np.float32), dtype))
    return proto


def _fill_tensor(proto: TensorProto, name: str, values: np.ndarray) -> None:
    proto.name = name
    proto.data_type = dtype_to_onnx("bfloat16" if values.dtype == getattr(ml_dtypes, "bfloat16", None)
                                    else str(values.dtype))
    proto.dims.extend(values.shape)
    proto.raw_data = np.ascontiguousarray(values).tobytes()


def _array(init: TensorProto, imp: OnnxImport) -> np.ndarray:
    raw = imp.raw.get(init.name)  # the bytes the importer read: no second copy out of the proto
    if raw is not None:
        return np.frombuffer(raw, dtype=np.float32).reshape(tuple(init.dims))
    base = imp.base_dir
    return numpy_helper.to_array(init, base_dir=base) if base else numpy_helper.to_array(init)


def to_dtype(values: np.ndarray, dtype: str) -> np.ndarray:
    """Convert an array to an IR dtype (bfloat16 through ml_dtypes)."""
    if dtype == "bfloat16":
        return values.astype(ml_dtypes.bfloat16)
    return values.astype(np.dtype(dtype))


def _update_types(graph: PrecisionGraph, g: GraphProto, scope: str, original: dict) -> None:
    described = set()
    stale = []
    tensors = graph.tensors
    for k, vi in enumerate((*g.input, *g.output, *g.value_info)):
        name = vi.name
        t = tensors.get(name)
        described.add(name)
        if t is not None and t.dtype and vi.type.HasField("tensor_type") and t.dtype in _CODES:
            vi.type.tensor_type.elem_type = _CODES[t.dtype]
        if k >= len(g.input) + len(g.output) and (t is None or not _alive(graph, t)):
            stale.append(vi)
    for vi in stale:
        g.value_info.remove(vi)
    types: dict[tuple, TypeProto] = {}  # (elem type, dims) -> the type of the new values that have it
    for t in tensors.values():
        if t.name not in original and t.scope == scope and t.name not in described and t.dtype in _CODES \
                and t.producer:
            dims = _dims(t)
            key = (_CODES[t.dtype], None if dims is None else tuple(dims))
            type_proto = types.get(key)
            if type_proto is None:
                type_proto = types[key] = helper.make_tensor_type_proto(key[0], dims)
            vi = g.value_info.add()  # as helper.make_tensor_value_info builds it
            vi.name = t.name
            vi.type.CopyFrom(type_proto)


def _alive(graph: PrecisionGraph, t: Tensor) -> bool:
    return t.producer is not None or t.kind != "activation"


def _dims(t: Tensor):
    if t.shape is None:
        return None
    return [d if isinstance(d, (int, str)) else None for d in t.shape]


_CODES = {name: dtype_to_onnx(name) for name in ("float32", "float16", "bfloat16", "float64")}
