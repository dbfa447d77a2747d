"""Input validation of the ONNX importer: a model is either well formed or a one-line ``ConversionError``.

The importer calls ``validate_model`` before it builds the IR. Checks, in order, each
naming the file, the node or tensor, and the reason:

1. Header: an IR version and opsets this onnx knows, an opset for every domain used.
2. Structure, per graph and subgraph: unique value names (SSA; a name reused by a
   sibling subgraph is renamed, which ONNX allows and the IR does not), every input
   produced by a node, a graph input or an initializer of the graph or an enclosing
   one, graph outputs produced, no cycles. A graph whose nodes are out of
   topological order but acyclic is sorted (ONNX Runtime accepts such graphs too).
3. Tensors: a known data type, no negative dims, stored data of the size the shape
   and type need (raw, typed fields or external data), external data inside the
   model's folder.
4. onnx's structural checker (attributes, op schemas) on a copy without tensor data.
5. Strict type and shape inference on that copy. Type errors and shape errors are
   fatal (ONNX Runtime would refuse the model too); a declared ``value_info`` shape
   that disagrees with the inferred one is tolerated (stale shapes are common and
   harmless), and inference then runs again in non-strict mode.

Returns the types inference found, which the importer uses where the model declares
none. ``weight_range_reason`` is the FP16 range check over a tensor read in chunks,
for external data that is never loaded whole.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import onnx
from onnx import AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto

from ..errors import ConversionError
from ..numerics import FP16_MAX, FP16_TINY
from .files import INLINE_BYTES, _external_range, is_external, iter_chunks, skeleton_copy, tensor_nbytes
from .order import replace_nodes, stable_topological_order

_PLACEHOLDER = "__amp_compiler_no_data__"
#: Cast-1 takes its target type as a string; the Casts the conversion inserts need Cast-6 or newer
_OLDEST_OPSET = 6
#: tensors the inference copy keeps with their data: small ones (shape inputs of Reshape, ...)
_KEEP_INT_BYTES = 64 << 10
_FLOAT_CODES = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE})
_VALID_CODES = frozenset(v for v in TensorProto.DataType.values() if v != TensorProto.UNDEFINED)
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
#: "(op_type:Add, node name: add): [TypeInferenceError] msg" or "[ShapeInferenceError] (op_type:...): msg"
_INFERENCE_LINE = re.compile(r"(?:\[(\w+)\] )?\(op_type:([^,)]*)(?:, node name: ([^)]*))?\): (?:\[(\w+)\] )?(.*)")
_CHECKER_CONTEXT = re.compile(r"Name: (.*?) OpType: (\S+)")


def validate_model(model: ModelProto, *, source: str = "model",
                   base_dir: str | Path | None = None) -> dict[str, tuple[int, tuple | None]]:
    """Check ``model`` (steps 1-5 above); returns inferred ``{value name: (elem_type, shape)}``.

    May rename values reused by sibling subgraphs and sort out-of-order nodes, in place.
    """
    opsets = check_header(model, source)
    check_structure(model, source, opsets)
    check_tensors(model, source, base_dir)
    light = skeleton_copy(model, _strip)
    _run_checker(light, source)
    _infer(light, source)
    return _inferred_types(light)


def infer_types(model: ModelProto) -> dict[str, tuple[int, tuple | None]]:
    """Best-effort, non-strict inference without any check (the importer's ``validate=False`` path)."""
    light = skeleton_copy(model, _strip)
    try:
        light = onnx.shape_inference.infer_shapes(light, check_type=False, strict_mode=False)
    except Exception:  # best effort: values without a type are handled downstream
        pass
    return _inferred_types(light)


# -- 1. header ------------------------------------------------------------------------------------

def check_header(model: ModelProto, source: str) -> dict[str, int]:
    """Known IR version and opsets; returns ``{domain: version}`` ('' for the default domain)."""
    if not model.HasField("graph"):
        raise ConversionError(source, "", "not a valid ONNX model: it has no graph")
    if not model.ir_version:
        raise ConversionError(source, "", "not a valid ONNX model: it has no IR version")
    if model.ir_version < 3:
        raise ConversionError(source, "", f"IR version {model.ir_version} is not supported (3 or newer is needed)")
    if model.ir_version > onnx.IR_VERSION:
        raise ConversionError(source, "", f"IR version {model.ir_version} is newer than onnx {onnx.__version__} "
                                          f"supports (up to {onnx.IR_VERSION})")
    opsets: dict[str, int] = {}
    newest = onnx.defs.onnx_opset_version()
    for o in model.opset_import:
        domain = "" if o.domain in ("", "ai.onnx") else o.domain
        label = f"opset_import {o.domain or 'ai.onnx'}"
        if domain in opsets:
            raise ConversionError(source, label, "is listed twice")
        if o.version < 1:
            raise ConversionError(source, label, f"version {o.version} is not a valid opset version")
        if domain == "" and o.version > newest:
            raise ConversionError(source, label, f"version {o.version} is newer than onnx {onnx.__version__} "
                                                 f"supports (up to {newest})")
        if domain == "" and o.version < _OLDEST_OPSET:
            raise ConversionError(source, label, f"version {o.version} is older than {_OLDEST_OPSET}, the first "
                                                 "whose Cast takes a numeric type; upgrade the model with "
                                                 "onnx.version_converter")
        opsets[domain] = o.version
    if "" not in opsets and _uses_default_domain(model.graph):
        raise ConversionError(source, "", "the model uses ONNX ops but has no opset_import for the default domain")
    return opsets


def _uses_default_domain(g: GraphProto) -> bool:
    for node in g.node:
        if node.domain in ("", "ai.onnx"):
            return True
        if any(_uses_default_domain(sub) for sub in _subgraphs(node)):
            return True
    return False


# -- 2. structure ---------------------------------------------------------------------------------

def _subgraphs(node: NodeProto) -> Iterator[GraphProto]:
    for a in node.attribute:
        if a.type == AttributeProto.GRAPH or a.HasField("g"):
            yield a.g
        yield from a.graphs


def _label(node: NodeProto, idx: int) -> str:
    return f"node {node.name!r} ({node.op_type})" if node.name else f"node #{idx} ({node.op_type})"


def check_structure(model: ModelProto, source: str, opsets: dict[str, int]) -> None:
    """SSA names, no dangling inputs, graph outputs produced, no cycles; sorts acyclic out-of-order graphs."""
    _check_text(model, source)
    functions = {(f.domain, f.name) for f in model.functions}
    _Structure(source, opsets, functions).graph(model.graph, frozenset(), "")


def _check_text(model: ModelProto, source: str) -> None:
    """Names must be valid UTF-8: protobuf hands invalid ones to Python as bytes, and onnx chokes on them."""

    def bad(value) -> bool:
        return not isinstance(value, str)

    for o in model.opset_import:
        if bad(o.domain):
            raise ConversionError(source, "opset_import", f"domain {o.domain!r} is not valid UTF-8")
    for g, path in _graphs(model.graph, ""):
        where_g = f" of subgraph {path}" if path else ""
        for kind, seq in (("graph input", g.input), ("graph output", g.output), ("value_info", g.value_info),
                          ("initializer", g.initializer)):
            for item in seq:
                if bad(item.name):
                    raise ConversionError(source, f"{kind} {item.name!r}{where_g}", "its name is not valid UTF-8")
        for idx, node in enumerate(g.node):
            texts = [node.name, node.op_type, node.domain, *node.input, *node.output,
                     *(a.name for a in node.attribute)]
            if any(bad(t) for t in texts):
                label = f"node #{idx}" + (f" ({node.op_type})" if isinstance(node.op_type, str) else "")
                raise ConversionError(source, label + where_g, "a name, op type, domain or attribute name is not "
                                                                "valid UTF-8")


class _Structure:
    def __init__(self, source: str, opsets: dict[str, int], functions: set) -> None:
        self.source, self.opsets, self.functions = source, opsets, functions
        self.seen: set[str] = set()  # every name defined so far, in any scope (for sibling renames)
        self.fresh = 0

    def graph(self, g: GraphProto, outer: frozenset[str], path: str) -> set[str]:
        """Check ``g`` (names in ``outer`` are visible from enclosing graphs); returns the outer names it uses."""
        where_g = f"subgraph {path}" if path else "the main graph"
        self._rename_sibling_clashes(g, outer)
        defined: dict[str, str] = {}  # name -> what defines it

        def define(name: str, what: str) -> None:
            if not name:
                return
            if name in outer:
                raise ConversionError(self.source, f"tensor {name!r}", f"defined by {what} in {where_g} shadows a "
                                                                       "value of an enclosing graph; ONNX names "
                                                                       "must be unique (SSA)")
            if name in defined:
                raise ConversionError(self.source, f"tensor {name!r}", f"defined twice in {where_g}: by "
                                                                       f"{defined[name]} and by {what}; ONNX names "
                                                                       "must be unique (SSA)")
            defined[name] = what

        initializers = set()
        for t in g.initializer:
            if not t.name:
                raise ConversionError(self.source, where_g, "an initializer has no name")
            if t.name in initializers:
                raise ConversionError(self.source, f"initializer {t.name!r}", f"defined twice in {where_g}")
            initializers.add(t.name)
            define(t.name, "an initializer")
        for s in g.sparse_initializer:
            define(s.values.name, "a sparse initializer")
        for inp in g.input:
            if not inp.name:
                raise ConversionError(self.source, where_g, "a graph input has no name")
            if inp.name not in initializers:  # IR < 4 lists initializers among the inputs as well
                define(inp.name, "a graph input")
        producer: dict[str, int] = {}
        for idx, node in enumerate(g.node):
            for out in node.output:
                define(out, _label(node, idx))
                if out:
                    producer[out] = idx
        visible = outer | frozenset(defined)
        free: set[str] = set()
        deps: list[set[int]] = []
        for idx, node in enumerate(g.node):
            label = _label(node, idx) + (f" in {where_g}" if path else "")
            self._check_domain(node, label)
            uses = {n for n in node.input if n}
            for n in uses:
                if n not in visible:
                    raise ConversionError(self.source, label, f"input {n!r} is not produced by any node, graph input "
                                                              "or initializer")
            for a in node.attribute:
                subs = ([a.g] if a.HasField("g") else []) + list(a.graphs)
                for k, sub in enumerate(subs):
                    sub_path = f"{path + '/' if path else ''}{node.name or node.op_type + str(idx)}.{a.name}" + \
                               (f"[{k}]" if len(subs) > 1 else "")
                    uses |= self.graph(sub, visible, sub_path)
            mine = set()
            for n in uses:
                if n in producer:
                    mine.add(producer[n])
                elif n not in defined:
                    free.add(n)
            deps.append(mine)
        for out in g.output:
            if not out.name or out.name not in visible:
                raise ConversionError(self.source, f"graph output {out.name!r}" + (f" of {where_g}" if path else ""),
                                      "is not produced by any node, graph input or initializer")
            if out.name not in defined:
                free.add(out.name)
        self._sort(g, deps, path)
        self.seen.update(defined)
        return free

    def _check_domain(self, node: NodeProto, label: str) -> None:
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        if domain not in self.opsets:
            what = "the domain of a model function" if (node.domain, node.op_type) in self.functions else "domain"
            raise ConversionError(self.source, label, f"{what} {node.domain!r} has no opset_import entry")

    def _sort(self, g: GraphProto, deps: list[set[int]], path: str) -> None:
        if all(d < i for i, ds in enumerate(deps) for d in ds):
            return
        order, stuck = stable_topological_order(deps)
        if stuck:
            cycle = _find_cycle(deps, stuck)
            names = [g.node[i].name or f"#{i}" for i in cycle]
            first = g.node[cycle[0]]
            raise ConversionError(self.source, _label(first, cycle[0]) + (f" in subgraph {path}" if path else ""),
                                  f"the graph has a cycle: {' -> '.join(names + names[:1])}")
        replace_nodes(g, [g.node[i] for i in order])

    def _rename_sibling_clashes(self, g: GraphProto, outer: frozenset[str]) -> None:
        """Names this subgraph defines that another, non-enclosing graph already defined get fresh names."""
        local = [t.name for t in g.initializer] + [i.name for i in g.input] + \
                [o for n in g.node for o in n.output if o]
        clashes = {n for n in local if n in self.seen and n not in outer}
        for old in clashes:
            new = old
            while new in self.seen or new in outer or new in local:
                self.fresh += 1
                new = f"{old}__{self.fresh}"
            _rename(g, old, new)


def _rename(g: GraphProto, old: str, new: str) -> None:
    """Rename value ``old`` to ``new`` everywhere in ``g`` and the subgraphs that capture it."""
    for seq in (g.input, g.output, g.value_info, g.initializer):
        for item in seq:
            if item.name == old:
                item.name = new
    for s in g.sparse_initializer:
        if s.values.name == old:
            s.values.name = new
    for node in g.node:
        for i, n in enumerate(node.input):
            if n == old:
                node.input[i] = new
        for i, n in enumerate(node.output):
            if n == old:
                node.output[i] = new
        for sub in _subgraphs(node):
            _rename(sub, old, new)


def _find_cycle(deps: list[set[int]], stuck: set[int]) -> list[int]:
    """One cycle among the nodes that topological sorting could not place, in execution order."""
    start = min(stuck)
    path, index, node = [], {}, start
    while node not in index:
        index[node] = len(path)
        path.append(node)
        node = min(d for d in deps[node] if d in stuck)  # every stuck node waits on a stuck node
    cycle = list(reversed(path[index[node]:]))
    first = cycle.index(min(cycle))
    return cycle[first:] + cycle[:first]


# -- 3. tensors -----------------------------------------------------------------------------------

def check_tensors(model: ModelProto, source: str, base_dir: str | Path | None) -> None:
    """Data types, dims and data sizes of every tensor; graph I/O element types."""
    base = Path(base_dir).resolve() if base_dir is not None else None
    for where, tensor in _labelled_tensors(model):
        _check_tensor(tensor, where, source, base)
    for vi in model.graph.input:
        tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
        if tt is not None and tt.elem_type not in _VALID_CODES:
            what = "has no element type" if tt.elem_type == 0 else f"element type {tt.elem_type} is not an ONNX type"
            raise ConversionError(source, f"graph input {vi.name!r}", what)
    for g, path in _graphs(model.graph, ""):
        io: dict[str, tuple[str, onnx.TypeProto]] = {}  # a value that is a graph input and output: one type
        for kind, seq in (("graph input", g.input), ("graph output", g.output), ("value_info", g.value_info)):
            for vi in seq:
                where = f"{kind} {vi.name!r}" + (f" of subgraph {path}" if path else "")
                tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
                if tt is None:
                    continue
                if tt.elem_type and tt.elem_type not in _VALID_CODES:
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
    name = TensorProto.DataType.Name(tt.elem_type).lower() if tt.elem_type in _VALID_CODES else "?"
    if not tt.HasField("shape"):
        return name
    dims = [str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in tt.shape.dim]
    return f"{name}[{', '.join(dims)}]"


def _graphs(g: GraphProto, path: str) -> Iterator[tuple[GraphProto, str]]:
    yield g, path
    for idx, node in enumerate(g.node):
        for a in node.attribute:
            subs = ([a.g] if a.HasField("g") else []) + list(a.graphs)
            for sub in subs:
                yield from _graphs(sub, f"{path + '/' if path else ''}{node.name or node.op_type + str(idx)}.{a.name}")


def _labelled_tensors(model: ModelProto) -> Iterator[tuple[str, TensorProto]]:
    for g, path in _graphs(model.graph, ""):
        suffix = f" of subgraph {path}" if path else ""
        for t in g.initializer:
            yield f"initializer {t.name!r}{suffix}", t
        for s in g.sparse_initializer:
            yield f"sparse initializer {s.values.name!r}{suffix}", s.values
        for idx, node in enumerate(g.node):
            for a in node.attribute:
                if a.HasField("t"):
                    yield f"{_label(node, idx)}{suffix} attribute {a.name!r}", a.t
                for t in a.tensors:
                    yield f"{_label(node, idx)}{suffix} attribute {a.name!r}", t


def _check_tensor(t: TensorProto, where: str, source: str, base: Path | None) -> None:
    if t.data_type not in _VALID_CODES:
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
            _external_range(t, base, source)
        except ConversionError as exc:
            raise ConversionError(source, where, exc.reason) from None
        return
    type_name = TensorProto.DataType.Name(t.data_type).lower()
    if t.HasField("raw_data"):
        if t.data_type == TensorProto.STRING:
            raise ConversionError(source, where, "a string tensor cannot use raw_data")
        expected = tensor_nbytes(t)
        have = len(t.raw_data)
        if expected is not None and have != expected:
            raise ConversionError(source, where, f"raw_data holds {have} bytes but its shape {list(t.dims)} of "
                                                 f"{type_name} needs {expected}")
        return
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


# -- 4./5. checker and inference on a copy without tensor data ------------------------------------

def _strip(t: TensorProto) -> list[tuple[str, str]] | None:
    """Placeholder external entries for tensors inference does not need the values of."""
    if is_external(t):
        return [("location", _PLACEHOLDER)]
    size = t.ByteSize()
    if size >= _KEEP_INT_BYTES or (size >= INLINE_BYTES and t.data_type in _FLOAT_CODES):
        return [("location", _PLACEHOLDER)]
    return None


def _run_checker(light: ModelProto, source: str) -> None:
    checked = ModelProto()
    checked.CopyFrom(light)
    for t in _placeholders(checked):  # the checker looks for external files: make the stand-ins empty tensors
        del t.external_data[:]
        t.ClearField("data_location")
        del t.dims[:]
        t.dims.append(0)
    try:
        onnx.checker.check_model(checked)
    except onnx.checker.ValidationError as exc:
        text = str(exc)
        context = _CHECKER_CONTEXT.search(text)
        where = ""
        if context:
            name, op = context.group(1).strip(), context.group(2)
            where = f"node {name!r} ({op})" if name else f"a {op} node"
        raise ConversionError(source, where, f"invalid ONNX model: {text.strip().splitlines()[0]}") from None


def _placeholders(model: ModelProto) -> Iterable[TensorProto]:
    from .files import iter_tensors
    return [t for t in iter_tensors(model) if is_external(t)
            and any(e.key == "location" and e.value == _PLACEHOLDER for e in t.external_data)]


def _infer(light: ModelProto, source: str) -> None:
    """Strict type/shape inference into ``light``'s value_info; fatal errors become ``ConversionError``."""
    try:
        inferred = onnx.shape_inference.infer_shapes(light, check_type=True, strict_mode=True)
    except Exception as exc:  # onnx raises InferenceError, or ValueError/RuntimeError for bad input
        fatal = _fatal_inference_error(str(exc))
        if fatal is not None:
            raise ConversionError(source, *fatal) from None
        try:  # only stale declared shapes disagreed: keep what non-strict inference can tell
            inferred = onnx.shape_inference.infer_shapes(light, check_type=False, strict_mode=False)
        except Exception:  # inference is best effort from here on
            return
    light.CopyFrom(inferred)


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
        return where, f"{what} inference failed: {message}"
    return None


def _inferred_types(light: ModelProto) -> dict[str, tuple[int, tuple | None]]:
    types: dict[str, tuple[int, tuple | None]] = {}
    for g, _ in _graphs(light.graph, ""):
        for vi in (*g.value_info, *g.output):
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
                tt = vi.type.tensor_type
                shape = None
                if tt.HasField("shape"):
                    shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                                  for d in tt.shape.dim)
                types[vi.name] = (tt.elem_type, shape)
    return types


# -- FP16 range of weights read in chunks ---------------------------------------------------------

def weight_range_reason(label: str, tensor: TensorProto, base_dir: str | Path | None) -> str | None:
    """``numerics.low_unsafe_reason`` for a float32 tensor read chunk by chunk (external data too).

    Same rule and wording: values beyond the FP16 range, or 1% or more of the
    nonzero values below the smallest FP16 subnormal.
    """
    big = 0.0
    below = zeros = size = 0
    for chunk in iter_chunks(tensor, base_dir):
        if not chunk.size:
            continue
        size += chunk.size
        with np.errstate(invalid="ignore"):
            finite = chunk[np.isfinite(chunk)] if not np.isfinite(chunk).all() else chunk
        if finite.size:
            big = max(big, float(np.max(np.abs(finite))))
        magnitude = np.abs(chunk)
        below += int(np.count_nonzero(magnitude < FP16_TINY))
        zeros += int(np.count_nonzero(chunk == 0))
    if size == 0:
        return None
    if big > FP16_MAX:
        return f"{label} has values beyond the FP16 range (max |w| = {big:.3g})"
    tiny, nonzero = below - zeros, size - zeros
    if tiny and tiny * 100 >= nonzero:
        return (f"{label}: {tiny} of {nonzero} nonzero values are below the "
                f"smallest FP16 subnormal and would flush to zero")
    return None
