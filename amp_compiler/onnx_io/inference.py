"""onnx's checker and strict type/shape inference, run on a copy of the model without tensor data.

Type errors and shape errors are fatal (ONNX Runtime would refuse the model too); a
declared ``value_info`` shape that disagrees with the inferred one is tolerated (stale
shapes are common and harmless), and inference then runs again in non-strict mode.
onnx reports errors as text: the node and reason are read off its messages with the
two patterns below. docs/architecture.md, "Input handling".
"""

from __future__ import annotations

import functools
import re
from contextlib import contextmanager
from typing import Iterable, Iterator

import onnx
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from onnx import GraphProto, ModelProto, TensorProto, TypeProto, ValueInfoProto

from ..errors import ConversionError
from .ort_onnx_ops import stand_in_for_inference
from .skeleton import copy_tensor, skeleton_copy
from .structure import graphs
from .tensors import INLINE_BYTES, approx_nbytes, is_external, iter_tensors
from .wire import is_repeated

_PLACEHOLDER = "__amp_compiler_no_data__"
#: tensors the inference copy keeps with their data: small ones (shape inputs of Reshape, ...)
_KEEP_INT_BYTES = 64 << 10
_FLOAT_CODES = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE})
#: "(op_type:Add, node name: add): [TypeInferenceError] msg" or "[ShapeInferenceError] (op_type:...): msg"
_INFERENCE_LINE = re.compile(r"(?:\[(\w+)\] )?\(op_type:([^,)]*)(?:, node name: ([^)]*))?\): (?:\[(\w+)\] )?(.*)")
_CHECKER_CONTEXT = re.compile(r"Name: (.*?) OpType: (\S+)")


def light_copy(model: ModelProto, stand_ins: list[TensorProto] | None = None, attributes: list | None = None,
               op_types: Iterable[str] | None = None, nested: bool = True) -> ModelProto:
    """A copy of ``model`` whose large or float tensors are data-less placeholders (``stand_ins``
    receives them), ONNX Runtime's ONNX-domain ops written as ops onnx knows (``ort_onnx_ops``).
    ``attributes``: each main-graph node's attribute list, ``op_types`` their op types, where the
    caller read them (``structure.node_rows``); ``nested=False``: the model has no subgraphs."""
    light = skeleton_copy(model, _strip, stand_ins, attributes)
    stand_in_for_inference(light, graphs if nested else _main_graph, None if nested else op_types)
    return light


def emitted_light_copy(model: ModelProto, pending: Iterable[TensorProto], stand_ins: list[TensorProto],
                       nested: bool = True, op_types: Iterable[str] | None = None) -> ModelProto:
    """``light_copy`` of a converted model, plus ``pending`` (name, type and dims of the weights it gets
    only when written, ``stream.PendingCast.meta``) as placeholders. Its nodes are copied whole, in C,
    tensor attributes included (``Constant`` values: weights are initializers), where ``light_copy``'s
    walk of each node's attributes took 0.7-1.2 s at 100k nodes (this copy 0.3 s). ``op_types``: those
    of its nodes, where known."""
    light = ModelProto()
    _copy_fields(model, light, but="graph")
    g = light.graph
    _copy_fields(model.graph, g, but="initializer")
    for t in model.graph.initializer:
        copy_tensor(t, g.initializer.add(), _strip, stand_ins)
    for meta in pending:
        t = g.initializer.add()
        t.CopyFrom(meta)
        t.data_location = TensorProto.EXTERNAL
        t.external_data.add(key="location", value=_PLACEHOLDER)
        stand_ins.append(t)
    stand_in_for_inference(light, graphs if nested else _main_graph, op_types)
    return light


def _copy_fields(src, dst, but: str) -> None:
    """Copy every field set in the message ``src`` into ``dst`` (whole, in C), but the field ``but``."""
    for fd, value in src.ListFields():
        if fd.name == but:
            continue
        if is_repeated(fd):
            getattr(dst, fd.name).extend(value)
        elif fd.message_type is not None:
            getattr(dst, fd.name).CopyFrom(value)
        else:
            setattr(dst, fd.name, value)


def _main_graph(g: GraphProto, path: str) -> Iterator[tuple[GraphProto, str]]:
    """``structure.graphs`` of a graph known to hold no subgraph."""
    yield g, path


def _strip(t: TensorProto) -> list[tuple[str, str]] | None:
    """Placeholder external entries for tensors inference does not need the values of."""
    if is_external(t):
        return [("location", _PLACEHOLDER)]
    size = approx_nbytes(t)
    if size >= _KEEP_INT_BYTES or (size >= INLINE_BYTES and t.data_type in _FLOAT_CODES):
        return [("location", _PLACEHOLDER)]
    return None


def run_checker(light: ModelProto, source: str, stand_ins: list[TensorProto] | None = None) -> None:
    """onnx's checker on ``light``; ``stand_ins``: its placeholders, as ``light_copy`` gave them
    (found by a walk of ``light`` when not given)."""
    try:
        with _empty_stand_ins(_placeholders(light) if stand_ins is None else stand_ins):
            onnx.checker.check_model(light)
    except onnx.checker.ValidationError as exc:
        text = str(exc)
        context = _CHECKER_CONTEXT.search(text)
        where = ""
        if _NO_SHAPE in text and (unshaped := _unshaped_io(light)):
            raise ConversionError(source, unshaped, "has no shape: ONNX requires one on the main graph's inputs "
                                                    "and outputs (symbolic dims are fine: dim_param), so the model "
                                                    "is not valid ONNX; declare its rank and dims") from None
        if context:
            name, op = context.group(1).strip(), context.group(2)
            where = f"node {name!r} ({op})" if name else f"a {op} node"
        raise ConversionError(source, where, f"invalid ONNX model: {text.strip().splitlines()[0]}") from None


_NO_SHAPE = "Field 'shape' of 'type' is required but missing"


def _unshaped_io(model: ModelProto) -> str:
    """The first main-graph input or output whose tensor type has no shape, as the error names it."""
    for kind, values in (("graph input", model.graph.input), ("graph output", model.graph.output)):
        for v in values:
            if v.type.HasField("tensor_type") and not v.type.tensor_type.HasField("shape"):
                return f"{kind} {v.name!r}"
    return ""


@contextmanager
def _empty_stand_ins(stand_ins: list[TensorProto]) -> Iterator[None]:
    """Make the placeholders empty tensors (the checker looks for external files) and put them back
    as they were afterwards: changed in place, which costs no copy of the model."""
    saved = [(list(t.dims), [(e.key, e.value) for e in t.external_data]) for t in stand_ins]
    for t in stand_ins:
        del t.external_data[:]
        t.ClearField("data_location")
        del t.dims[:]
        t.dims.append(0)
    try:
        yield
    finally:
        for t, (dims, entries) in zip(stand_ins, saved):
            del t.dims[:]
            t.dims.extend(dims)
            t.data_location = TensorProto.EXTERNAL
            for key, value in entries:
                t.external_data.add(key=key, value=value)


def placeholder_names(model: ModelProto) -> set[str]:
    """Names of the tensors ``light_copy`` left without their data."""
    return {t.name for t in _placeholders(model)}


def _placeholders(model: ModelProto) -> Iterable[TensorProto]:
    return [t for t in iter_tensors(model) if is_external(t)
            and any(e.key == "location" and e.value == _PLACEHOLDER for e in t.external_data)]


def infer(light: ModelProto, source: str) -> tuple[ModelProto, bool]:
    """Strict type/shape inference of ``light``; fatal errors become ``ConversionError``. Returns
    ``light`` with the inferred value_info (a new model; ``light`` itself where inference gave
    nothing) and whether the strict pass held (False: declared shapes disagreed, non-strict ones kept)."""
    try:
        return onnx.shape_inference.infer_shapes(light, check_type=True, strict_mode=True), True
    except Exception as exc:  # onnx raises InferenceError, or ValueError/RuntimeError for bad input
        fatal = _fatal_inference_error(str(exc))
        if fatal is not None:
            raise ConversionError(source, *fatal) from None
    try:  # only stale declared shapes disagreed: keep what non-strict inference can tell
        return onnx.shape_inference.infer_shapes(light, check_type=False, strict_mode=False), False
    except Exception:  # inference is best effort from here on
        return light, False


def _fatal_inference_error(text: str) -> tuple[str, str] | None:
    """(where, reason) of the first error that is not a stale declared shape; None if there is none."""
    lines = [m for m in (_INFERENCE_LINE.search(line) for line in text.splitlines()) if m]
    if not lines:
        return "", f"type and shape inference failed: {text.strip().splitlines()[0] if text.strip() else text}"
    for m in lines:
        op, name, message = m.group(2), (m.group(3) or "").strip(), m.group(5).strip()
        kind = m.group(4) or m.group(1) or ""
        if kind == "ShapeInferenceError" and message.startswith("Inferred shape and existing shape differ"):
            continue
        if "Inference error(s)" in message:
            continue  # raised inside an op's function body: onnx's expansion, not this model (e.g. test_mvn)
        what = ("type" if kind == "TypeInferenceError" or re.search(r"\btypes?\b", message) else
                "shape" if kind == "ShapeInferenceError" else "type and shape")
        where = f"node {name!r} ({op})" if name else f"a {op} node"
        if "has unsupported type" in message:  # TorchScript's Min on int64 ids at opset 11 (T5): Min-12 takes it
            message += _type_advice(op, message)
        return where, f"{what} inference failed: {message}"
    return None


def _type_advice(op: str, message: str) -> str:
    """What to do about a type ``op`` refuses: a newer opset only where the newest ``op`` takes the
    type (a Falcon's ``Cast`` to complex128, which no Cast takes, had been told to re-export)."""
    found = re.search(r"tensor\([a-z0-9]+\)", message)
    versions = sorted((s for s in onnx.defs.get_all_schemas_with_history() if s.name == op and s.domain in ("", "ai.onnx")),
                      key=lambda s: s.since_version)
    if found is None or not versions:
        return f" ({op} at the model's opset does not take this type; ONNX Runtime refuses it too)"
    taking = [s.since_version for s in versions if any(found.group() in c.allowed_type_strs for c in s.type_constraints)]
    if taking:
        return (f" ({op} at the model's opset does not take this type; ONNX Runtime refuses it too: export with "
                f"opset_version {taking[0]} or newer)")
    return f" (no version of ONNX's {op} takes {found.group()}: the model cannot run on ONNX Runtime as exported)"


def inferred_types(light: ModelProto, nested: bool = True) -> dict[str, tuple[int, tuple | None]]:
    """``{value name: (elem_type, shape)}`` of the typed values of ``light``'s graphs; ``nested=False``:
    the model has no subgraphs (the structure check found none), so its nodes are not walked."""
    if not nested:
        return _main_graph_types(light)
    types: dict[str, tuple[int, tuple | None]] = {}
    memo: dict[bytes, tuple[int, tuple | None]] = {}
    for g, _ in graphs(light.graph, ""):
        for vi in (*g.value_info, *g.output):
            code, shape = tensor_type(vi, memo)
            if code:
                types[vi.name] = (code, shape)
    return types


def _main_graph_types(light: ModelProto) -> dict[str, tuple[int, tuple | None]]:
    """``inferred_types`` of a model without subgraphs, read off its bytes parsed as ``_values_only()``
    messages, whose ``type`` fields are the ``TypeProto``'s bytes: the memo's keys, without a message
    built and serialized per value (half the time at 112k values; serializing and parsing cost 0.03 s)."""
    types: dict[str, tuple[int, tuple | None]] = {}
    memo: dict[bytes, tuple[int, tuple | None]] = {}
    g = _values_only().FromString(light.SerializeToString()).graph
    for vi in (*g.value_info, *g.output):
        key = vi.type
        found = memo.get(key)
        if found is None:
            found = memo[key] = _read_type(TypeProto.FromString(key))
        if found[0]:
            types[vi.name] = found
    return types


@functools.cache
def _values_only() -> type:
    """A message class that reads a ``ModelProto``'s bytes as its graph's value_info and outputs alone,
    each as (name, the bytes of its ``TypeProto``); the other fields are left unparsed."""
    file = descriptor_pb2.FileDescriptorProto(name="amp_compiler_values_only.proto", package="amp_values_only")
    field = descriptor_pb2.FieldDescriptorProto
    value = file.message_type.add(name="Value")
    value.field.add(name="name", number=1, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    value.field.add(name="type", number=2, type=field.TYPE_BYTES, label=field.LABEL_OPTIONAL)
    graph = file.message_type.add(name="Graph")  # GraphProto's field numbers
    for name, number in (("output", 12), ("value_info", 13)):
        graph.field.add(name=name, number=number, type=field.TYPE_MESSAGE, label=field.LABEL_REPEATED,
                        type_name=".amp_values_only.Value")
    model = file.message_type.add(name="Model")  # ModelProto.graph
    model.field.add(name="graph", number=7, type=field.TYPE_MESSAGE, label=field.LABEL_OPTIONAL,
                    type_name=".amp_values_only.Graph")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("amp_values_only.Model"))


def tensor_type(vi: ValueInfoProto, memo: dict[bytes, tuple[int, tuple | None]] | None = None
                ) -> tuple[int, tuple | None]:
    """(elem_type code, shape) of a tensor value's type (code 0: none given); (0, None) for another
    kind of value. Each message is read once (upb builds a new object per read; graphs have one
    value per node). With ``memo``, types are read once per distinct ``TypeProto``, keyed by its
    bytes: serializing one in C costs a fraction of reading its dims field by field, and a
    graph of repeated layers holds a handful of distinct types (7 in a 24k-node transformer)."""
    tp = vi.type
    if memo is not None:
        key = tp.SerializeToString()
        found = memo.get(key)
        if found is None:
            found = memo[key] = _read_type(tp)
        return found
    return _read_type(tp)


def _read_type(tp) -> tuple[int, tuple | None]:
    """``tensor_type`` of a ``TypeProto``."""
    if not tp.HasField("tensor_type"):
        return 0, None
    tt = tp.tensor_type
    if not tt.HasField("shape"):
        return tt.elem_type, None
    return tt.elem_type, tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim)
