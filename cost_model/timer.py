"""Predicted time of one IR op in a given precision, as the deployment runtime runs it.

``OpTimer`` is the one place op costs come from: the planner's energy (``passes/costs.py``),
the plan result's per-op costs in the report and the ``analysis`` ruler all read it. Each
op is priced as part of the fusion group the runtime profile runs it in
(``cost_model/fusion.py``, ``cost_model/runtime.py``): only bytes crossing the group's
boundary count, and the group's first priced op pays its launch. A fused RMSNorm
(``cost_model/norm_pattern.py``) is priced whole on its scale Mul, its other ops and the casts
the kernel absorbs cost nothing, so its Reciprocal form (planned) and Div form (emitted) agree. A measured profile
(``ctx.profile``) overrides the roofline per op key (docs/architecture.md, "Cost model").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .dtypes import UNKNOWN_ITEMSIZE, itemsize
from .flops import alignment_dims, misaligned, op_flops
from .fusion import form_groups, op_kind
from .repeats import scope_repeats
from .roofline import Roofline
from .runtime import get_runtime
from .traffic import ALIAS, ALL, op_bytes_each

if TYPE_CHECKING:
    from amp_compiler.ir import Op, PrecisionGraph, Tensor

_FLOAT32 = "float32"
_UNIT = "unit"  # amp_compiler.ir.UNIT
_NORM_FLOPS = 4  # an RMSNorm per element: square, sum, normalise, scale


class OpTimer:
    """Per-op FLOPs, bytes and predicted seconds on ``ctx.target`` (cached per op and dtype).

    ``ctx`` is any object with ``target``, ``profile``, ``registry`` and ``runtime`` (a ``PlanContext``).
    """

    def __init__(self, graph: PrecisionGraph, ctx: Any, as_written: bool = False) -> None:
        """``as_written``: price the graph as it is, without the ONNX emitter's RMSNorm rewrite."""
        if ctx.registry is None:
            from amp_compiler.registry import DEFAULT_REGISTRY

            self.registry = DEFAULT_REGISTRY
        else:
            self.registry = ctx.registry
        self.graph = graph
        self.roofline = Roofline(ctx.target, ctx.profile)
        self.runtime = get_runtime(getattr(ctx, "runtime", "eager"))
        self.groups = form_groups(graph, self.runtime, self.registry, rsqrt_form=not as_written)
        self.launch = self.roofline.launch_overhead * self.runtime.launch_scale
        self._leaders = self._group_leaders()
        self._flops: dict[str, float] = {}
        self._times: dict[str, dict[str, float]] = {}  # dtype -> op name -> value (see _memo)
        self._bytes: dict[str, dict[str, float]] = {}
        self._cast_costs: dict[object, float] = {}
        self._internal: dict[str, bool] = {}
        self._align_dims: dict[str, dict[str, int]] = {}
        self._out_bytes: dict[str, dict[str, float]] = {}
        self._by_signature: dict[tuple, _Priced] = {}  # see ``costs``
        self._size_codes: dict[tuple, int] = {}  # (dtype, resolved shape) -> its number (``_port_fact``)
        self._port_facts: dict[str, tuple[int, int, bool, bool]] = {}  # tensor -> ``_port_fact``
        self._cast_classes: dict[tuple, float] = {}  # see ``cast_time``
        self._facts_filled = False  # every tensor's, in one walk (``_fill_port_facts``)
        #: scope -> how many times a run runs it (a Loop body its trip count): its ops and casts cost that
        #: many times over (``cost_model/repeats.py``)
        self.repeats = scope_repeats(graph)
        self._priced_of: dict[str, _Priced] = {}  # op name -> its signature's numbers (``costs``)

    def _row(self, op: Op):
        return self.registry.by_canonical.get(op.canonical) if op.canonical else None

    def _group_leaders(self) -> set[str]:
        """The first op of each group that is priced (float data, not a view): it pays the launch."""
        leaders = set()
        for members in self.groups.members.values():
            for name in members:
                op = self.graph.ops[name]
                if op.has_unit_ports and not op.inserted and op_kind(op, self.registry) != "alias":
                    leaders.add(name)
                    break
        return leaders

    def internal(self, t: Tensor) -> bool:
        """True if ``t`` never reaches memory: produced and read only inside one fusion group
        (cached: the graph as planned, before the casts pass rewires readers)."""
        cached = self._internal.get(t.name)
        if cached is None:
            cached = self._internal[t.name] = self._stays_inside(t)
        return cached

    def _stays_inside(self, t: Tensor) -> bool:
        """``internal``'s answer: every reader in the producer's group (``groups.same_group``)."""
        if not t.producer or not t.consumers or t.is_graph_output:
            return False
        group_of = self.groups.group_of
        mine = group_of.get(t.producer, -1)
        for reader, _ in t.consumers:
            if group_of.get(reader, -2) != mine:
                return False
        return True

    def output_bytes(self, op: Op, dtype: str) -> float:
        """Bytes the op's unit outputs hold in ``dtype`` (views hold none of their own)."""
        shared = self._shared(op, "out_bytes", dtype)
        return shared if shared is not None else _memo(self._out_bytes, op, dtype, self._output_bytes)

    def _output_bytes(self, op: Op, dtype: str) -> float:
        row = self._row(op)
        if row is not None and row.traffic == ALIAS:
            return 0.0
        return float(sum(self.graph.nbytes(self.graph.tensors[n], dtype)
                         for n, r in zip(op.outputs, op.output_roles) if n and r == _UNIT))

    def flops(self, op: Op) -> float:
        priced = self._priced_of.get(op.name)
        if priced is not None and priced.flops is not None:
            return priced.flops
        cached = self._flops.get(op.name)
        if cached is None:
            row = self._row(op)
            cached = op_flops(op, self.graph, row.flops, row.flops_per_element) if row else 0.0
            self._flops[op.name] = cached
        return cached

    def bytes(self, op: Op, dtype: str) -> float:
        """Bytes ``op`` moves across its fusion group's boundary (cached: planning-time graph)."""
        shared = self._shared(op, "bytes", dtype)
        return shared if shared is not None else _memo(self._bytes, op, dtype, self._boundary_bytes)

    def _shared(self, op: Op, quantity: str, dtype: str) -> float | None:
        """``quantity`` (a ``_Priced`` field) in ``dtype`` as priced for another op of ``op``'s
        signature (``costs``), or None where not priced that way yet."""
        priced = self._priced_of.get(op.name)
        return None if priced is None else getattr(priced, quantity).get(dtype)

    def _boundary_bytes(self, op: Op, dtype: str) -> float:
        return self._boundary_bytes_each(op, (dtype,))[0]

    def _boundary_bytes_each(self, op: Op, dtypes: tuple[str, ...]) -> list[float]:
        row = self._row(op)
        same, tensors = self.groups.same_group, self.graph.tensors

        def internal(name: str, read: bool) -> bool:  # an intermediate of the fused kernel
            return same(tensors[name].producer, op.name) if read else self.internal(tensors[name])

        return op_bytes_each(op, self.graph, dtypes, row.traffic if row else ALL, internal)

    def times(self, op: Op, dtypes: tuple[str, ...]) -> list[float]:
        """``[time(op, d) for d in dtypes]``, the op's ports walked once for the bytes of all of them."""
        missing = tuple(d for d in dtypes if op.name not in self._bytes.get(d, ()))
        if len(missing) > 1 and not (op.canonical == "cast" and op.inserted):
            for dtype, value in zip(missing, self._boundary_bytes_each(op, missing)):
                self._bytes.setdefault(dtype, {})[op.name] = value
        return [self.time(op, d) for d in dtypes]

    def costs(self, op: Op, dtypes: tuple[str, ...]) -> tuple[list[float], list[float]]:
        """``([time(op, d) ...], [output_bytes(op, d) ...])`` for ``dtypes``, priced once per op
        signature: a graph of repeated blocks holds a few dozen distinct ops, each priced once;
        every op of a signature then reads its numbers (``_priced_of``), which the per-op
        queries (``time``, ``bytes``, ...) read too, for the report later."""
        priced = self._priced_of.get(op.name)
        if priced is None:
            self.classify((op,))
            priced = self._priced_of.get(op.name)
            if priced is None:  # priced on its own (``classify``)
                return self.times(op, dtypes), [self.output_bytes(op, d) for d in dtypes]
        try:
            return [priced.times[d] for d in dtypes], [priced.out_bytes[d] for d in dtypes]
        except KeyError:  # this op prices its signature in ``dtypes``
            times, out = self.times(op, dtypes), [self.output_bytes(op, d) for d in dtypes]
            self._remember(priced, op, dtypes)
            return times, out

    def costs_each(self, ops: list[Op], dtypes: tuple[str, ...]) -> list[tuple[float, ...]]:
        """``(*times, *output_bytes)`` in ``dtypes`` (``costs``) of each of ``ops``: the ops'
        signatures found in one walk (``classify``), each signature priced once, every op of it
        then given that one row."""
        self.classify(ops)
        priced_of, rows, out = self._priced_of, {}, []
        for op in ops:
            priced = priced_of.get(op.name)
            row = rows.get(id(priced)) if priced is not None else None
            if row is None:
                times, held = self.costs(op, dtypes)
                row = (*times, *held)
                if priced is not None:
                    rows[id(priced)] = row
            out.append(row)
        return out

    def _remember(self, priced: _Priced, op: Op, dtypes: tuple[str, ...]) -> None:
        """Record under ``op``'s signature what ``costs`` just computed for it."""
        name = op.name
        if priced.flops is None:
            priced.flops, priced.align_dims = self.flops(op), self._align_dims.get(name)
        for d in dtypes:
            if d not in priced.times:  # the others this op read from the signature
                priced.times[d] = self._times[d][name]
                priced.bytes[d] = self._bytes[d][name]
                priced.out_bytes[d] = self._out_bytes[d][name]

    def classify(self, ops) -> None:
        """File each of ``ops`` not filed yet under its signature's ``_Priced`` (``_priced_of``).

        The signature is everything ``_time``, ``bytes``, ``flops``, ``aligned`` and
        ``output_bytes`` read of an op: its canonical op (the registry row), tensor-core flag,
        attributes, port roles, whether it pays its group's launch, its scope's repeats, and per
        port the tensor's dtype and resolved shape (one interned number, ``_port_facts``),
        complemented where the byte count asks and the tensor stays inside the op's fused kernel.
        An op whose pricing reads more (a fused RMSNorm, an inserted cast, a measured profile keyed
        by symbolic shapes) or with an attribute that is not a plain value stays unfiled: it is
        priced on its own."""
        if self.roofline.profile is not None:
            return
        priced_of, by_signature, leaders, repeats = self._priced_of, self._by_signature, self._leaders, self.repeats
        group_of, norms, by_canonical = self.groups.group_of, self.groups.norms, self.registry.by_canonical
        facts = self._port_facts if self._facts_filled else self._fill_port_facts()
        fact = self._port_fact
        for op in ops:
            name = op.name
            if name in priced_of or (op.inserted and op.canonical == "cast"):
                continue
            mine = group_of.get(name, -2)  # ``groups.same_group(producer, op)``, the op's side looked up once
            if norms and mine in norms:
                continue
            attrs = _attrs_key(op.attrs) if op.attrs else ()
            if attrs is None:
                continue
            row = by_canonical.get(op.canonical) if op.canonical else None
            asks = row is None or row.traffic != ALIAS  # ``op_bytes_each`` asks nothing of a view's ports
            key: list = [op.canonical, op.tensor_core, name in leaders, attrs, tuple(op.input_roles),
                         tuple(op.output_roles), repeats.get(op.scope, 1), len(op.inputs)]
            n_roles = len(op.input_roles) if asks else 0
            for i, port in enumerate(op.inputs):  # read inside the op's kernel: ``_boundary_bytes_each``
                if port:
                    code, group, _, _ = facts.get(port) or fact(port)
                    key.append(~code if i < n_roles and group == mine else code)
                else:
                    key.append(None)
            key.append(len(op.outputs))
            n_roles = len(op.output_roles) if asks else 0
            for i, port in enumerate(op.outputs):
                if port:
                    code, _, inside, _ = facts.get(port) or fact(port)
                    key.append(~code if i < n_roles and inside else code)
                else:
                    key.append(None)
            key = tuple(key)
            priced = by_signature.get(key)
            if priced is None:
                priced = by_signature[key] = _Priced()
            priced_of[name] = priced

    def _fill_port_facts(self) -> dict[str, tuple[int, int, bool, bool]]:
        """``_port_fact`` of every tensor in one walk (and ``internal``'s answers with them)."""
        facts, codes, internal = self._port_facts, self._size_codes, self._internal
        group_of, concrete = self.groups.group_of, self.graph.concrete_dims
        for name, t in self.graph.tensors.items():
            size = (t.dtype, concrete(t))
            code = codes.get(size)
            if code is None:
                code = codes[size] = len(codes)
            producer = t.producer
            group = group_of.get(producer, -1) if producer else -1
            readers = [group_of.get(r, -2) == group for r, _ in t.consumers] if producer else ()
            inside = internal.get(name)
            if inside is None:  # ``_stays_inside``, inlined
                inside = internal[name] = bool(readers and not t.is_graph_output and all(readers))
            facts[name] = (code, group, inside, any(readers))  # ``_splits_group``, inlined
        self._facts_filled = True
        return facts

    def _port_fact(self, name: str) -> tuple[int, int, bool, bool]:
        """``(size code, producer's group, internal, splits)`` of tensor ``name`` (cached in
        ``_port_facts``): its dtype and resolved shape as one number (equal numbers, equal pair),
        the fusion group of its producer (-1: none), ``internal`` and ``_splits_group``."""
        t = self.graph.tensors[name]
        size = (t.dtype, self.graph.concrete_dims(t))
        code = self._size_codes.get(size)
        if code is None:
            code = self._size_codes[size] = len(self._size_codes)
        group = self.groups.group_of.get(t.producer, -1) if t.producer else -1
        found = self._port_facts[name] = (code, group, self.internal(t), self._splits_group(t))
        return found

    def aligned(self, op: Op, dtype: str) -> bool:
        """``not flops.misaligned_dims(op, graph, dtype)``, the op's dims found once for every dtype
        (a cast the casts pass inserts keeps its input's shape, so they hold after it too)."""
        priced = self._priced_of.get(op.name)
        dims = priced.align_dims if priced is not None and priced.align_dims is not None else \
            self._align_dims.get(op.name)
        if dims is None:
            dims = self._align_dims[op.name] = alignment_dims(op, self.graph)
        return not misaligned(dims, dtype)

    def time(self, op: Op, dtype: str) -> float:
        shared = self._shared(op, "times", dtype)
        return shared if shared is not None else _memo(self._times, op, dtype, self._time)

    def _time(self, op: Op, dtype: str) -> float:
        once = self._time_once(op, dtype)
        return once * self.repeats[op.scope] if op.scope in self.repeats else once

    def _time_once(self, op: Op, dtype: str) -> float:
        norm = self.groups.norms.get(self.groups.group_of.get(op.name, -1))
        if norm is not None:
            return self._norm_time(norm, dtype) if op.name == norm.scale_mul else 0.0
        if op.canonical == "cast" and op.inserted:
            t = self.graph.tensors[op.inputs[0]]
            return self.roofline.cast_time(self.graph.numel(t), t.dtype or _FLOAT32, dtype)
        kernel = self.roofline.op_time(
            flops=self.flops(op), bytes_moved=self.bytes(op, dtype), dtype=dtype,
            tensor_core=op.tensor_core, aligned=self.aligned(op, dtype) if op.tensor_core else True,
            key=self.profile_key(op) if self.roofline.profile is not None else None)
        launch = self.launch if op.name in self._leaders else 0.0
        return max(kernel - self.roofline.launch_overhead, 0.0) + launch

    def _norm_time(self, norm, dtype: str) -> float:
        """One fused RMSNorm kernel: ``_NORM_FLOPS`` per element of ``x`` (whatever form the ops
        are written in), ``x`` read and the output written in the scale Mul's dtype (``dtype``),
        the 1-D scale read (stored in that dtype too), one launch."""
        graph = self.graph
        scale = graph.ops[norm.scale_mul]
        moved = graph.nbytes(graph.tensors[norm.x], dtype) + graph.nbytes(graph.tensors[scale.outputs[0]], dtype)
        moved += sum(graph.nbytes(graph.tensors[n], dtype) for n in scale.inputs if graph.tensors[n].producer is None)
        flops = _NORM_FLOPS * graph.numel(graph.tensors[norm.x])
        kernel = self.roofline.op_time(flops=flops, bytes_moved=moved, dtype=dtype, tensor_core=False, aligned=True,
                                       key=None)
        return max(kernel - self.roofline.launch_overhead, 0.0) + self.launch

    def absorbed_read(self, t: Tensor, reader: str) -> bool:
        """True if a fused RMSNorm's kernel reads ``t`` in whatever dtype it is stored in: a cast
        of its input (or of an intermediate) for ``reader`` folds into the kernel."""
        norms = self.groups.norms
        if not norms:
            return False
        norm = norms.get(self.groups.group_of.get(reader, -1))
        return norm is not None and (t.name == norm.x or self.groups.same_group(t.producer, reader))

    def absorbed_cast(self, op: Op) -> bool:
        """True for a cast the plan inserted that a fused RMSNorm's kernel absorbs (all its readers)."""
        src = self.graph.tensors[op.inputs[0]]
        readers = self.graph.tensors[op.outputs[0]].consumers
        return bool(readers) and all(self.absorbed_read(src, c) for c, _ in readers)

    def profile_key(self, op: Op) -> str:
        shapes = ";".join("x".join(str(d) for d in (self.graph.tensors[i].shape or ())) for i in op.inputs if i)
        return f"{op.canonical}[{shapes}]"

    def _traffic(self, t: Tensor, src: str, dst: str) -> float:
        return self.roofline.bytes_time(self.graph.numel(t) * (itemsize(src, UNKNOWN_ITEMSIZE)
                                                               + itemsize(dst, UNKNOWN_ITEMSIZE)))

    def cast_op_time(self, op: Op, src: str, dst: str) -> float:
        """A ``Cast`` already in the graph (a converted model priced as it is), by the same
        rule as ``cast_time``: free inside a fused kernel, traffic where casts fuse, else a kernel."""
        t = self.graph.tensors[op.inputs[0]]
        traffic = self._traffic(t, src, dst)
        if self.groups.group_of.get(op.name, -1) in self.groups.norms:
            return 0.0  # folded into the fused RMSNorm
        runs = self.repeats.get(op.scope, 1)
        if not self.runtime.fuse_casts:
            return (traffic + self.launch) * runs
        out = self.graph.tensors[op.outputs[0]]
        inside = self.groups.same_group(t.producer, op.name) and self.internal(out)
        return 0.0 if inside else traffic * runs

    def cast_time(self, t: Tensor, low: str) -> float:
        """What converting ``t`` between FP32 and ``low`` costs on the runtime: nothing inside a
        fused kernel that converts in registers, its traffic where casts fold into a
        neighbour's kernel, traffic plus a launch where a cast is a kernel of its own (twice that
        where a reader shares the producer's fused kernel, which the cast splits). Keyed by
        the producing port, so the casts pass's renamed graph outputs price the same."""
        key = (t.producer, t.producer_port) if t.producer else t.name
        cached = self._cast_costs.get(key)
        if cached is None:
            fact = self._port_facts.get(t.name)
            if fact is None:
                inside = self.internal(t)
                cached = self._cast_cost(t, low, inside, self._splits_group(t),
                                         inside and self.groups.group_of.get(t.producer) in self.groups.norms)
            else:  # tensors alike (size, fusion boundary, scope) cost alike: priced once
                code, group, inside, splits = fact
                alike = (code, inside, splits, inside and group in self.groups.norms, t.scope, low)
                cached = self._cast_classes.get(alike)
                if cached is None:
                    cached = self._cast_classes[alike] = self._cast_cost(t, low, *alike[1:4])
            self._cast_costs[key] = cached
        return cached

    def _cast_cost(self, t: Tensor, low: str, inside: bool, splits: bool, in_norm: bool) -> float:
        """``cast_time``'s number for ``t``: ``inside`` (``internal``), ``splits`` (``_splits_group``),
        ``in_norm`` (an intermediate of a fused RMSNorm)."""
        traffic = self._traffic(t, _FLOAT32, low)
        if in_norm:
            cost = 0.0  # an intermediate of a fused RMSNorm: converted in registers
        elif self.runtime.fuse_casts:
            cost = 0.0 if inside else traffic
        elif splits:
            # the cast splits the fused kernel: its own kernel, one more launch, and the
            # value written and read back (an upper bound when only an outside reader differs)
            cost = 2 * (traffic + self.launch)
        else:
            cost = traffic + self.launch
        if t.scope in self.repeats:  # a cast runs where its value is made (``passes/casts.py``)
            cost *= self.repeats[t.scope]
        return cost

    def _splits_group(self, t: Tensor) -> bool:
        """A reader of ``t`` shares its producer's fused kernel (``groups.same_group``)."""
        if t.producer is None:
            return False
        group_of = self.groups.group_of
        mine = group_of.get(t.producer, -1)
        for reader, _ in t.consumers:
            if group_of.get(reader, -2) == mine:
                return True
        return False


class _Priced:
    """One op signature's numbers (``OpTimer.costs``): FLOPs, alignment dims (None until the first
    op of the signature is priced), and per dtype the op's time, the bytes it moves and the bytes
    its outputs hold."""

    __slots__ = ("flops", "align_dims", "times", "bytes", "out_bytes")

    def __init__(self) -> None:
        self.flops: float | None = None
        self.align_dims: dict[str, int] | None = None
        self.times: dict[str, float] = {}
        self.bytes: dict[str, float] = {}
        self.out_bytes: dict[str, float] = {}


_PLAIN = (int, float, str, bytes, bool, type(None))


def _attrs_key(attrs: dict) -> tuple | None:
    """The attributes as a hashable key (lists of plain values become tuples); None when one
    holds anything else (a tensor, a graph): the op is then priced on its own."""
    if not attrs:
        return ()
    items = []
    for name, value in attrs.items():
        if isinstance(value, (list, tuple)):
            if not all(isinstance(v, _PLAIN) for v in value):
                return None
            value = (type(value).__name__, *value)
        elif not isinstance(value, _PLAIN):
            return None
        items.append((name, value))
    return tuple(sorted(items))


def _memo(cache: dict, op: Op, dtype: str, compute) -> float:
    """``compute(op, dtype)``, cached per dtype then op name (no key tuple to build and hash per call)."""
    per_dtype = cache.get(dtype)
    if per_dtype is None:
        per_dtype = cache[dtype] = {}
    cached = per_dtype.get(op.name)
    if cached is None:
        cached = per_dtype[op.name] = compute(op, dtype)
    return cached


__all__ = ["OpTimer"]
