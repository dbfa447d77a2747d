"""Tensor checks of an ONNX model: data types, dims, stored data sizes, graph I/O types.

Every tensor must have a known data type, no negative dims, and stored data of the
size its shape and type need (raw, typed fields or external data inside the model's
folder). docs/architecture.md, "Input handling".
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import onnx
from onnx import GraphProto, ModelProto, TensorProto

from ..errors import ConversionError
from .structure import node_label
from .mapped import inline_view, is_inline
from .tensors import external_range, is_external, tensor_nbytes

VALID_CODES = frozenset(v for v in TensorProto.DataType.values() if v != TensorProto.UNDEFINED)
#: typed field, values per element, for the dtypes whose typed-field layout is one value per element
_TYPED_FIELD = {
    TensorProto.FLOAT: ("float_data", 1), TensorProto.COMPLEX64: ("float_data", 2),
    TensorProto.DOUBLE: ("double_data", 1), TensorProto.COMPLEX128: ("double_data", 2),
    TensorProto.INT64: ("int64_data", 1), TensorProto.UINT32: ("uint64_data", 1),
    TensorProto.UINT64: ("uint64_data", 1), TensorProto.STRING: ("string_data", 1),
    **{code: ("int32_data", 1) for code in (TensorProto.INT32, TensorProto.INT16, TensorProto.INT8,
                                            TensorProto.UINT16, TensorProto.UINT8, TensorProto.BOOL,
                                            TensorProto.FLOAT16, TensorProto.BFLOAT16)},
}
_TYPED_FIELDS = ("float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data")


def check_tensors(model: ModelProto, source: str, base_dir: str | Path | None,
                  raw: dict[str, bytes] | None = None, main_rows: list[tuple] | None = None,
                  nested: bool = True) -> None:
    """Data types, dims and data sizes of every tensor; graph I/O element types.

    ``raw`` (the importer's) receives the float32 initializers' ``raw_data`` bytes read for the
    size check (views of the mapped file for those ``mapped.load_hollow`` left there), so that the
    importer and emitter do not copy them out of the proto again. ``main_rows``: the main graph's
    nodes with their fields as the structure check read them (``structure._node_rows``), if any;
    ``nested=False``: the model has no subgraphs (the structure check found none), no attribute is
    asked for one.
    """
    base = Path(base_dir).resolve() if base_dir is not None else None
    walked = _walk(model.graph, "", [], main_rows, nested)  # every graph, and its nodes' tensors, in one walk
    for where, tensor, initializer in _labelled_tensors(walked):
        data = _check_tensor(tensor, where, source, base)
        if data is not None and raw is not None and initializer and tensor.data_type == TensorProto.FLOAT:
            raw[tensor.name] = data
    for vi in model.graph.input:
        tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
        if tt is not None and tt.elem_type not in VALID_CODES:
            what = "has no element type" if tt.elem_type == 0 else f"element type {tt.elem_type} is not an ONNX type"
            raise ConversionError(source, f"graph input {vi.name!r}", what)
    for g, path, _ in walked:
        io: dict[str, tuple[str, onnx.TypeProto]] = {}  # a value that is a graph input and output: one type
        for kind, seq in (("graph input", g.input), ("graph output", g.output), ("value_info", g.value_info)):
            for vi in seq:
                where = f"{kind} {vi.name!r}" + (f" of subgraph {path}" if path else "")
                tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
                if tt is None:
                    continue
                if tt.elem_type and tt.elem_type not in VALID_CODES:
                    raise ConversionError(source, where, f"element type {tt.elem_type} is not an ONNX type")
                dims = [d.dim_value for d in tt.shape.dim if d.HasField("dim_value")]
                if any(d < 0 for d in dims):
                    raise ConversionError(source, where, f"negative dimension {min(dims)} in its shape")
                if kind == "value_info":
                    continue
                if vi.name in io and _conflict(io[vi.name][1], vi.type):
                    raise ConversionError(source, where, f"declared as {_type_text(vi.type)} but as "
                                                         f"{io[vi.name][0]} {_type_text(io[vi.name][1])}")
                io.setdefault(vi.name, (kind, vi.type))


def _conflict(a: onnx.TypeProto, b: onnx.TypeProto) -> bool:
    ta, tb = a.tensor_type, b.tensor_type
    if ta.elem_type and tb.elem_type and ta.elem_type != tb.elem_type:
        return True
    if not (ta.HasField("shape") and tb.HasField("shape")):
        return False
    if len(ta.shape.dim) != len(tb.shape.dim):
        return True
    return any(x.HasField("dim_value") and y.HasField("dim_value") and x.dim_value != y.dim_value
               for x, y in zip(ta.shape.dim, tb.shape.dim))


def _type_text(t: onnx.TypeProto) -> str:
    tt = t.tensor_type
    name = TensorProto.DataType.Name(tt.elem_type).lower() if tt.elem_type in VALID_CODES else "?"
    if not tt.HasField("shape"):
        return name
    dims = [str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in tt.shape.dim]
    return f"{name}[{', '.join(dims)}]"


def _walk(g: GraphProto, path: str, found: list, rows: list[tuple] | None = None,
          nested: bool = True) -> list[tuple[GraphProto, str, list]]:
    """``[(graph, path, its nodes' attribute tensors as (label, tensor))]`` for ``g`` and every subgraph
    in ``structure.graphs``' order and paths: each node's attributes read once for both (``rows``:
    ``g``'s nodes with their attribute lists already read, ``structure._node_rows``; ``nested=False``:
    no attribute holds a graph)."""
    tensors: list[tuple[str, TensorProto]] = []
    found.append((g, path, tensors))
    suffix = f" of subgraph {path}" if path else ""
    nodes = ((row[0], row[4]) for row in rows) if rows is not None else ((node, node.attribute) for node in g.node)
    for idx, (node, attributes) in enumerate(nodes):
        for a in attributes:
            if a.HasField("t"):
                tensors.append((f"{node_label(node, idx)}{suffix} attribute {a.name!r}", a.t))
            for t in a.tensors:
                tensors.append((f"{node_label(node, idx)}{suffix} attribute {a.name!r}", t))
            if nested and (a.HasField("g") or a.graphs):
                subs = ([a.g] if a.HasField("g") else []) + list(a.graphs)
                for sub in subs:
                    _walk(sub, f"{path + '/' if path else ''}{node.name or node.op_type + str(idx)}.{a.name}", found)
    return found


def _labelled_tensors(walked: list) -> Iterator[tuple[str, TensorProto, bool]]:
    """(label, tensor, is an initializer) for every tensor of every graph (``_walk``)."""
    for g, path, node_tensors in walked:
        suffix = f" of subgraph {path}" if path else ""
        for t in g.initializer:
            yield f"initializer {t.name!r}{suffix}", t, True
        for s in g.sparse_initializer:
            yield f"sparse initializer {s.values.name!r}{suffix}", s.values, False
        for label, t in node_tensors:
            yield label, t, False


def _check_tensor(t: TensorProto, where: str, source: str, base: Path | None) -> bytes | memoryview | None:
    """Raises for a malformed tensor; returns its ``raw_data`` where it read it (a view of the mapped
    file for a tensor ``mapped.load_hollow`` left there)."""
    if t.data_type not in VALID_CODES:
        what = "has no data type" if t.data_type == 0 else f"data type {t.data_type} is not an ONNX data type"
        raise ConversionError(source, where, what)
    numel = 1
    for d in t.dims:
        if d < 0:
            raise ConversionError(source, where, f"negative dimension {d} in its shape {list(t.dims)}")
        numel *= d
    if is_external(t):
        if base is None:
            raise ConversionError(source, where, "external data is not loaded and no folder to read it from was "
                                                 "given (load the model with its data, or pass the model's path)")
        try:
            target, offset, length = external_range(t, base, source)
        except ConversionError as exc:
            raise ConversionError(source, where, exc.reason) from None
        return inline_view(target, offset, length) if is_inline(t) else None  # raw_data left in the mapped file
    type_name = TensorProto.DataType.Name(t.data_type).lower()
    if t.HasField("raw_data"):
        if t.data_type == TensorProto.STRING:
            raise ConversionError(source, where, "a string tensor cannot use raw_data")
        expected = tensor_nbytes(t)
        data = t.raw_data  # a copy (upb): handed back so that it is the only one
        have = len(data)
        if expected is not None and have != expected:
            raise ConversionError(source, where, f"raw_data holds {have} bytes but its shape {list(t.dims)} of "
                                                 f"{type_name} needs {expected}")
        return data
    present = [f for f in _TYPED_FIELDS if len(getattr(t, f))]
    if not present and numel:
        raise ConversionError(source, where, f"has no data (its shape {list(t.dims)} has {numel} elements)")
    if len(present) > 1:
        raise ConversionError(source, where, f"data is stored in several fields ({', '.join(present)})")
    layout = _TYPED_FIELD.get(t.data_type)
    if layout is None:
        return  # packed 4-bit / float8 layouts: onnx's checker checks those
    field, per = layout
    have = len(getattr(t, field))
    if present and present[0] != field:
        raise ConversionError(source, where, f"{type_name} data must be in {field}, not {present[0]}")
    if have != numel * per and (have or numel):
        raise ConversionError(source, where, f"{field} holds {have} values but its shape {list(t.dims)} needs "
                                             f"{numel * per}")

