"""The one IR both importers build and every pass works on: ``PrecisionGraph``.

Ops and tensors are plain dataclasses kept in insertion (topological) order;
``PrecisionGraph.nx()`` builds a networkx view when a pass needs a graph
algorithm (reachability, components, min-cut). Nothing in here knows about
ONNX protobufs or FX nodes: importers fill it in, emitters read it back.

Port roles (set by the classify pass from the op registry):

* ``unit``  -- the port takes the op's chosen precision (FP32 or low precision);
* ``fixed`` -- the port keeps the dtype it had in the source whatever the op's
  precision (Resize scales, normalisation statistics, subgraph boundaries, ...);
* ``any``   -- the port accepts whatever float dtype arrives, no cast needed
  (Cast's input, Shape's input);
* ``other`` -- not a float port (indices, shapes, bools).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator

from .dims import DimSizes
from .dtypes import FLOAT32, is_float, itemsize

if TYPE_CHECKING:
    import networkx as nx

    from .numerics import ValueStats

UNIT, FIXED, ANY, OTHER = "unit", "fixed", "any", "other"
_ITEMSIZES: dict[str | None, int] = {}  # dtype -> itemsize, filled as dtypes are met

# Tensor kinds.
ACTIVATION, GRAPH_INPUT, CONSTANT, PARAMETER = "activation", "input", "constant", "parameter"


@dataclass(frozen=True)
class PortGroup:
    """Ports of one op bound to one type parameter (their dtypes must agree).

    ``allowed`` lists the float dtypes the source schema accepts for the group;
    ``fixed_type`` marks a port that keeps its source dtype: its schema type is one
    concrete dtype, or its dtype flows through a sequence/optional value;
    ``binds_output`` says the type parameter also types an output of the schema,
    present on this node or not (so the group's dtype flows into the op's results);
    ``later_opsets``: (low dtype, opset) for each low dtype the schema refuses here and a later
    opset's accepts (ONNX's Conv takes bfloat16 from opset 22), for the reason to say so.
    """

    param: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    allowed: frozenset[str]
    fixed_type: bool = False
    binds_output: bool = False
    later_opsets: tuple[tuple[str, int], ...] = ()


@dataclass(slots=True)
class Tensor:
    """A value: produced by at most one op (or a graph input / constant), read by many."""

    name: str
    dtype: str | None
    shape: tuple | None = None  # ints, symbolic names (str) or None per dim
    kind: str = ACTIVATION
    producer: str | None = None
    producer_port: int = 0
    consumers: list[tuple[str, int]] = field(default_factory=list)
    is_graph_output: bool = False
    scope: str = ""  # "" for the main graph, else the path of the owning subgraph
    #: for a constant folded from another constant: the source tensor's name
    folded_from: str | None = None
    #: training graphs: gradients are divided by the loss scale here (propagation stops)
    unscale_marker: bool = False
    #: an output of a subgraph: keeps its dtype so the owning If/Loop/Scan stays consistent
    scope_output: bool = False
    #: raw value statistics of a float constant (importers record them; no policy)
    stats: ValueStats | None = None
    #: what the source calls the value, for reasons: "initializer", "constant", "parameter", "buffer"
    origin: str = ""
    #: largest finite magnitude seen on calibration data (``calibrate.activation_ranges``)
    calibrated_peak: float | None = None
    #: set by the numerics pass: why this value cannot be held in the target low dtype, if so
    low_unsafe: str | None = None
    #: set by the numerics pass: a mask sentinel (finfo.min) the emitter stores clamped to this
    #: magnitude, the low dtype's largest finite value (docs/architecture.md, "Numerics")
    saturate_to: float | None = None
    #: ``PrecisionGraph``'s memo of this value's resolved sizes: (shape, dim sizes token, numel,
    #: concrete shape); valid while ``shape`` and the graph's dim sizes are the same objects
    size_memo: tuple | None = field(default=None, repr=False, compare=False)

    @property
    def is_constant(self) -> bool:
        return self.kind in (CONSTANT, PARAMETER)

    def numel(self, default_dim: int = 1, dim_values: dict[str, int] | None = None) -> int:
        """Element count; symbolic dims take ``dim_values[name]``, unknown ones ``default_dim``."""
        if self.shape is None:
            return default_dim
        n = 1
        for d in self.shape:
            if isinstance(d, int) and d >= 0:
                n *= d
            else:
                n *= dim_values.get(d, default_dim) if dim_values and isinstance(d, str) else default_dim
        return n

    def nbytes(self, dtype: str | None = None, default_dim: int = 1, dim_values: dict[str, int] | None = None) -> int:
        return self.numel(default_dim, dim_values) * itemsize(dtype or self.dtype)


@dataclass(slots=True)
class Op:
    """One operation, with what the source artifact called it and what the passes decided."""

    name: str
    op_type: str  # source op type: "MatMul", "aten.mm.default", ...
    inputs: list[str]  # tensor names; "" for an absent optional input
    outputs: list[str]
    domain: str = ""
    attrs: dict[str, object] = field(default_factory=dict)
    #: float scalars among the op's arguments (FX: a ``full(..., -3.4e38)`` fill value)
    scalars: tuple[float, ...] = ()
    scope: str = ""
    canonical: str | None = None
    op_class: str | None = None  # allow / infer / clear / deny / unknown
    port_groups: list[PortGroup] = field(default_factory=list)
    input_roles: list[str] = field(default_factory=list)
    output_roles: list[str] = field(default_factory=list)
    #: registry facts the cost model and reports read
    tensor_core: bool = False
    #: the dtype the op's unit ports had in the source model
    source_dtype: str | None = None
    #: set by passes
    eligible: bool = False
    precision: str | None = None  # float32 / float16 / bfloat16; None = no float data
    reason: str = ""
    unit: int | None = None
    inserted: bool = False  # created by a pass (a cast), not in the source
    #: low-precision dtype forbidden for this op, with why (schema, user, numerics)
    forbid_low: str | None = None

    @property
    def has_unit_ports(self) -> bool:
        return UNIT in self.input_roles or UNIT in self.output_roles


class PrecisionGraph:
    """Ops and tensors of one model, in topological order, and the dim sizes the cost model uses."""

    def __init__(self, name: str = "model") -> None:
        self.name = name
        self.ops: dict[str, Op] = {}
        self.tensors: dict[str, Tensor] = {}
        self.inputs: list[str] = []
        self.outputs: list[str] = []
        #: subgraph boundaries: scope -> (owner op name, formal input names, output names)
        self.scopes: dict[str, tuple[str, list[str], list[str]]] = {}
        self.opsets: dict[str, int] = {}  # ONNX: domain -> opset version of the source model
        #: ONNX: Loop op name -> its trip count, where the file gives it as a constant (``onnx_io/trip_counts.py``)
        self.trip_counts: dict[str, int] = {}
        #: whether a plan may change a graph input's dtype (``keep_io_types=False``): an ONNX file
        #: declares its inputs' types, so yes; a torch graph runs on the caller's tensors as they
        #: come, so no: they are cast inside the graph (docs/architecture.md, "Capture routes and shapes")
        self.inputs_retypable = True
        self._default_dim = 1
        self._dim_values = DimSizes({}, 1)
        self._fresh = itertools.count()
        self._reserved: set[str] = set()
        self._dims_token = object()  # replaced when dim sizes change: tensors' size memos go stale

    # -- building ---------------------------------------------------------------------------
    def add_tensor(self, tensor: Tensor) -> Tensor:
        existing = self.tensors.get(tensor.name)
        if existing is not None:
            return existing
        self.tensors[tensor.name] = tensor
        return tensor

    def add_op(self, op: Op, *, index_after: str | None = None) -> Op:
        """Add ``op`` (at the end, or right after op ``index_after``) and link its tensors."""
        if op.name in self.ops:
            raise ValueError(f"duplicate op name {op.name!r}")
        if index_after is None:
            self.ops[op.name] = op
        else:
            items = list(self.ops.items())
            pos = next(i for i, (n, _) in enumerate(items) if n == index_after) + 1
            items.insert(pos, (op.name, op))
            self.ops = dict(items)
        self._link(op)
        return op

    def insert_ops_before(self, anchor: str | None, new_ops: list[Op]) -> None:
        """Insert ``new_ops`` in order, before op ``anchor`` (at the end when None); one rebuild."""
        items = list(self.ops.items())
        pos = len(items) if anchor is None else next(i for i, (n, _) in enumerate(items) if n == anchor)
        items[pos:pos] = [(o.name, o) for o in new_ops]
        self.ops = dict(items)
        for op in new_ops:
            self._link(op)

    def replace_ops(self, drop: set[str], replacements: dict[str, list[Op]]) -> None:
        """Remove the ops in ``drop`` and put each list of ``replacements`` where its key op stood
        (the key op among them); one rebuild of the op order."""
        order = list(self.ops)
        for name in drop:
            self.remove_op(name)
        ops: dict[str, Op] = {}
        for name in order:
            for op in replacements.get(name, ()):
                ops[op.name] = op
            if name in self.ops and name not in replacements:
                ops[name] = self.ops[name]
        self.ops = ops
        for new_ops in replacements.values():
            for op in new_ops:
                self._link(op)

    def _link(self, op: Op) -> None:
        tensors, op_name = self.tensors, op.name
        for port, name in enumerate(op.inputs):
            if name:
                tensors[name].consumers.append((op_name, port))
        for port, name in enumerate(op.outputs):
            if name:
                t = tensors[name]
                t.producer, t.producer_port = op_name, port

    def remove_op(self, name: str) -> None:
        op = self.ops.pop(name)
        for port, tname in enumerate(op.inputs):
            if tname and tname in self.tensors:
                self.tensors[tname].consumers.remove((name, port))
        for tname in op.outputs:
            t = self.tensors.get(tname)
            if t is not None and t.producer == name:
                t.producer = None

    def set_input(self, op_name: str, port: int, tensor_name: str) -> None:
        """Rewire one input port of an op to another tensor."""
        op = self.ops[op_name]
        old = op.inputs[port]
        if old:
            self.tensors[old].consumers.remove((op_name, port))
        op.inputs[port] = tensor_name
        self.tensors[tensor_name].consumers.append((op_name, port))

    def fresh_name(self, base: str) -> str:
        """A tensor/op name not used nor handed out yet, derived from ``base``."""
        name = base
        while name in self.tensors or name in self.ops or name in self._reserved:
            name = f"{base}_{next(self._fresh)}"
        self._reserved.add(name)  # ops made now may join the graph later: never hand a name out twice
        return name

    # -- queries ------------------------------------------------------------------------------
    def producer(self, tensor: str) -> Op | None:
        p = self.tensors[tensor].producer
        return self.ops.get(p) if p else None

    def consumers(self, tensor: str) -> Iterator[tuple[Op, int]]:
        for name, port in self.tensors[tensor].consumers:
            yield self.ops[name], port

    def float_tensors(self) -> Iterator[Tensor]:
        return (t for t in self.tensors.values() if is_float(t.dtype))

    def nx(self) -> nx.DiGraph:
        """Op-level dependency graph (edges producer -> consumer, tensor name on the edge)."""
        import networkx as nx  # imported here: no conversion needs it, and it costs 0.5 s of start-up

        g = nx.DiGraph()
        g.add_nodes_from(self.ops)
        for t in self.tensors.values():
            if t.producer:
                for c, _ in t.consumers:
                    g.add_edge(t.producer, c, tensor=t.name)
        return g

    def set_dim_sizes(self, default_dim: int, dim_values: dict[str, int] | None = None) -> None:
        """Sizes the cost model uses for symbolic dims: names and expressions of them (``dims.py``)."""
        self._default_dim = int(default_dim)
        declared = {d for name in self.inputs for d in (self.tensors[name].shape or ()) if isinstance(d, str)}
        self._dim_values = DimSizes(dim_values, default_dim, declared)
        self._dims_token = object()

    def default_dim(self) -> int:
        return self._default_dim

    def dim_values(self) -> DimSizes:
        return self._dim_values

    def _sizes(self, t: Tensor) -> tuple:
        """``t``'s (shape, token, numel, concrete shape), memoised on the tensor: the cost model,
        memory walks and reports ask for the same sizes many times per tensor."""
        memo = t.size_memo
        if memo is None or memo[0] is not t.shape or memo[1] is not self._dims_token:
            d, values = self._default_dim, self._dim_values
            concrete = None if t.shape is None else tuple(
                x if isinstance(x, int) and x >= 0 else values.get(x, d) if isinstance(x, str) else d
                for x in t.shape)
            memo = t.size_memo = (t.shape, self._dims_token, t.numel(d, values), concrete)
        return memo

    def numel(self, tensor: str | Tensor) -> int:
        """Element count for cost estimates (symbolic dims resolved from the graph's dim sizes)."""
        t = self.tensors[tensor] if isinstance(tensor, str) else tensor
        memo = t.size_memo  # _sizes' check, inlined: the cost model asks this per port of every op
        if memo is None or memo[0] is not t.shape or memo[1] is not self._dims_token:
            memo = self._sizes(t)
        return memo[2]

    def nbytes(self, tensor: str | Tensor, dtype: str | None = None) -> int:
        t = self.tensors[tensor] if isinstance(tensor, str) else tensor
        dtype = dtype or t.dtype
        size = _ITEMSIZES.get(dtype)
        if size is None:
            size = _ITEMSIZES[dtype] = itemsize(dtype)
        memo = t.size_memo
        if memo is None or memo[0] is not t.shape or memo[1] is not self._dims_token:
            memo = self._sizes(t)
        return memo[2] * size

    def concrete_dims(self, t: Tensor) -> tuple[int, ...] | None:
        """``t``'s resolved shape as the memoised tuple (no copy: a hashable key), or None when unknown."""
        memo = t.size_memo
        if memo is None or memo[0] is not t.shape or memo[1] is not self._dims_token:
            memo = self._sizes(t)
        return memo[3]

    def concrete_shape(self, tensor: str) -> list[int] | None:
        """The tensor's shape with symbolic dims resolved, or None when unknown."""
        concrete = self._sizes(self.tensors[tensor])[3]
        return None if concrete is None else list(concrete)

__all__ = [
    "ACTIVATION", "ANY", "CONSTANT", "FIXED", "FLOAT32", "GRAPH_INPUT", "OTHER", "PARAMETER", "UNIT",
    "Op", "PortGroup", "PrecisionGraph", "Tensor",
]
