"""Skeleton copies of a model: every tensor's data left out or pointed elsewhere, nothing large copied.

Used to write a model's ``.onnx`` file apart from its external data, and to run onnx's
checker and shape inference on a model without its weights (docs/architecture.md,
"Input handling").
"""

from __future__ import annotations

from typing import Callable

from onnx import AttributeProto, ModelProto, TensorProto

from .tensors import DATA_FIELDS, approx_nbytes, is_external
from .wire import is_repeated

#: message types that may contain tensors; the copy walks into them, copies everything else whole
_CONTAINERS = frozenset({"onnx.ModelProto", "onnx.GraphProto", "onnx.NodeProto", "onnx.AttributeProto",
                         "onnx.FunctionProto", "onnx.TrainingInfoProto", "onnx.SparseTensorProto"})
_PAYLOAD_ATTRS = frozenset({AttributeProto.TENSOR, AttributeProto.TENSORS, AttributeProto.GRAPH,
                            AttributeProto.GRAPHS, AttributeProto.SPARSE_TENSOR, AttributeProto.SPARSE_TENSORS})
#: a tensor's fields other than its data and where the data lies
_TENSOR_META = tuple(fd for fd in TensorProto.DESCRIPTOR.fields
                     if fd.name not in DATA_FIELDS and fd.name not in ("external_data", "data_location"))
TensorHook = Callable[[TensorProto], "list[tuple[str, str]] | None"]


def skeleton_copy(model: ModelProto, hook: TensorHook, made: list[TensorProto] | None = None,
                  main_attributes: list | None = None) -> ModelProto:
    """A copy of ``model`` in which each tensor for which ``hook`` returns entries is external, without data.

    Tensors ``hook`` answers None for are copied as they are. Nothing large is copied (at most
    ``_WHOLE_COPY_BYTES`` of data, by a whole copy emptied after: ``_copied_whole``). ``made``
    receives the copy's weight tensors made external (those ``tensors.iter_tensors`` yields: not a
    sparse tensor's indices), so that no walk of the copy has to find them. ``main_attributes``:
    each main-graph node's attribute list, where the caller read them already (``structure.node_rows``).
    """
    out = ModelProto()
    if main_attributes is not None and _copied_whole(model, main_attributes):
        out.CopyFrom(model)
        for t in out.graph.initializer:
            _make_external(t, hook, made)
        return out
    _copy_message(model, out, hook, made, main_attributes)
    return out


#: tensor data a whole copy may carry along before its tensors are emptied (a field-by-field copy
#: of 112k nodes took 0.2 s, the whole model's in C 0.02 s)
_WHOLE_COPY_BYTES = 16 << 20


def _copied_whole(model: ModelProto, main_attributes: list) -> bool:
    """Whether ``skeleton_copy`` may copy ``model`` whole and empty its tensors after: its only tensors
    are the main graph's initializers, holding little data inline (no node has a tensor or graph
    attribute, by the attribute's type as ``_copy_nodes`` reads it; no sparse initializer, function
    or training graph)."""
    g = model.graph
    if model.functions or model.training_info or g.sparse_initializer:
        return False
    if any(a.type in _PAYLOAD_ATTRS for attrs in main_attributes if attrs for a in attrs):
        return False
    return sum(approx_nbytes(t) for t in g.initializer if not is_external(t)) <= _WHOLE_COPY_BYTES


def _make_external(t: TensorProto, hook: TensorHook, made: list[TensorProto] | None) -> None:
    """``copy_tensor``'s result, in place: ``t`` emptied of its data and external at ``hook``'s entries."""
    entries = hook(t)
    if entries is None:
        return
    for name in (*DATA_FIELDS, "external_data"):
        t.ClearField(name)
    _external_at(t, entries, made)


def _copy_message(src, dst, hook: TensorHook, made: list[TensorProto] | None, attributes: list | None = None) -> None:
    """Copy ``src`` into ``dst``; ``attributes``: the attribute lists of the nodes of ``src`` (a graph)
    or of its graph (a model), where known."""
    for fd, value in src.ListFields():
        mt = fd.message_type
        repeated = is_repeated(fd)
        if mt is None:
            if repeated:
                getattr(dst, fd.name).extend(value)
            else:
                setattr(dst, fd.name, value)
        elif mt.full_name == "onnx.TensorProto":
            weights = None if fd.name == "indices" else made  # SparseTensorProto.indices
            for t in (value if repeated else [value]):
                copy_tensor(t, getattr(dst, fd.name).add() if repeated else getattr(dst, fd.name), hook, weights)
        elif mt.full_name == "onnx.NodeProto":  # always repeated
            nodes = value[:]
            _copy_nodes(nodes, [n.attribute for n in nodes] if attributes is None else attributes,
                        getattr(dst, fd.name), hook, made)
        elif mt.full_name in _CONTAINERS:
            for m in (value if repeated else [value]):
                sub = getattr(dst, fd.name).add() if repeated else getattr(dst, fd.name)
                _copy_message(m, sub, hook, made, attributes if fd.name == "graph" else None)
        elif repeated:
            getattr(dst, fd.name).extend(value)
        else:
            getattr(dst, fd.name).CopyFrom(value)


def _copy_nodes(nodes: list, attributes: list, dst, hook: TensorHook, made: list[TensorProto] | None) -> None:
    """Append copies of ``nodes`` (``attributes``: each one's attribute list) to the repeated field
    ``dst``: a node with a tensor or graph attribute field by field, each run of the others whole
    in one extend (protobuf copies them in C)."""
    start = 0
    for k, attrs in enumerate(attributes):
        if attrs and any(a.type in _PAYLOAD_ATTRS for a in attrs):
            dst.extend(nodes[start:k])
            _copy_message(nodes[k], dst.add(), hook, made)
            start = k + 1
    dst.extend(nodes[start:])


def copy_tensor(src: TensorProto, dst: TensorProto, hook: TensorHook, made: list[TensorProto] | None) -> None:
    """Copy ``src`` into ``dst`` as ``skeleton_copy`` does: whole, or, where ``hook`` gives entries, its
    metadata only, external at those entries (appended to ``made``)."""
    entries = hook(src)
    if entries is None:
        dst.CopyFrom(src)
        return
    for fd in _TENSOR_META:  # not ListFields(): it would copy the data out of the proto (upb)
        if is_repeated(fd):
            getattr(dst, fd.name).extend(getattr(src, fd.name))
        elif src.HasField(fd.name):
            if fd.message_type is not None:
                getattr(dst, fd.name).CopyFrom(getattr(src, fd.name))
            else:
                setattr(dst, fd.name, getattr(src, fd.name))
    _external_at(dst, entries, made)


def _external_at(t: TensorProto, entries, made: list[TensorProto] | None) -> None:
    """Mark data-less ``t`` external at ``entries`` (``(key, value)`` pairs); append it to ``made``."""
    t.data_location = TensorProto.EXTERNAL
    for key, value in entries:
        entry = t.external_data.add()
        entry.key, entry.value = key, value
    if made is not None:
        made.append(t)
