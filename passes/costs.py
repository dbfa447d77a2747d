"""The planning energy: per-unit op times and per-tensor cast costs, built once per graph.

A *plan* gives each eligible unit 0 (FP32) or 1 (low dtype). Its predicted time is
the sum of each op's time in its precision plus, for every float tensor whose
consumers want another dtype than its producer gives, **one** cast (two dtypes: at
most one cast per producer output). ``PlanEnergy`` evaluates any plan, so the
min-cut planner, the greedy planner and the report's "all FP32" / "all low"
predictions are measured with one ruler.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from amp_compiler.dtypes import FLOAT32, itemsize
from amp_compiler.ir import ANY, CONSTANT, FIXED, GRAPH_INPUT, PARAMETER, UNIT, Op, PrecisionGraph, Tensor
from cost_model.timer import OpTimer

from .base import PlanContext
from .user_rules import runtime_cast

__all__ = ["Endpoint", "OpTimer", "PlanEnergy", "TensorTerm", "all_low_time", "build_energy"]  # OpTimer: from cost_model.timer

#: producer/consumer endpoint: ("var", unit id) | ("fixed", 0 or 1) | ("free", None) (a constant:
#: stored in whatever dtype each reader wants) | ("choose", None) (a graph input without
#: keep_io_types: it takes the dtype its readers agree on, else it is cast once)
Endpoint = tuple[str, int | None]


@dataclass
class TensorTerm:
    tensor: str
    cast_cost: float
    producer: Endpoint
    consumers: list[Endpoint]


@dataclass
class MemoryTerm:
    """A constant's storage: one copy per dtype its readers use (FP32 copy if any reads FP32,
    low copy if any reads low). Both indicators are submodular (``docs/architecture.md``)."""

    tensor: str
    bytes_fp32: float
    bytes_low: float
    consumers: list[Endpoint]


@dataclass
class PlanEnergy:
    """Unary times per unit and cast terms per tensor; see module docstring."""

    unit_ops: dict[int, list[str]]
    time_fp32: dict[int, float]
    time_low: dict[int, float]
    fixed_time: float  # ops outside the eligible region, at their fixed precision
    terms: list[TensorTerm]
    by_unit: dict[int, list[int]] = field(default_factory=dict)  # unit -> indices of terms touching it
    forbidden_low: set[int] = field(default_factory=set)  # units that may not go low (all-low ruler)
    mem_terms: list[MemoryTerm] = field(default_factory=list)  # weights read by units
    act_fp32: dict[int, float] = field(default_factory=dict)  # bytes a unit's outputs hold in FP32
    act_low: dict[int, float] = field(default_factory=dict)  # ... and in the low dtype
    tc_flops: dict[int, float] = field(default_factory=dict)  # a unit's tensor-core FLOPs (GEMM/conv work)
    low: str = "float16"  # the plan's low dtype (sizes a unit's outputs in memory)
    fixed_memory: float = 0.0  # weights and outputs of ops whose dtype no plan changes
    #: arrays derived from the terms on first use (the min-cut's edges, ``convert.solve_mincut``;
    #: the cast table, ``total``): an energy is not changed once built (``replace`` makes a new
    #: one, with an empty cache)
    derived: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def value(self, end: Endpoint, plan: dict[int, int]) -> int | None:
        kind, v = end
        if kind == "var":
            return plan[v]
        return v if kind == "fixed" else None

    def term_cost(self, term: TensorTerm, plan: dict[int, int]) -> float:
        if term.producer[0] == "choose":
            used = {self.value(c, plan) for c in term.consumers}
            return term.cast_cost if {0, 1} <= used else 0.0
        kind, src = term.producer  # ``value`` inlined: this runs per term for every plan priced
        if kind == "var":
            src = plan[src]
        elif kind != "fixed":
            return 0.0  # constants are stored in whatever dtype their consumers want
        for ckind, v in term.consumers:
            if ckind == "var":
                v = plan[v]
            elif ckind != "fixed":
                continue
            if v != src:
                return term.cast_cost
        return 0.0

    def total(self, plan: dict[int, int]) -> tuple[float, int, float]:
        """(predicted time, number of casts, cast seconds) of ``plan``."""
        ops = self.fixed_time + sum(self.time_low[u] if plan[u] else self.time_fp32[u] for u in self.unit_ops)
        table = self.derived.get("casts")
        if table is None and self.derived.setdefault("totals", 0):  # worth its arrays from the second plan on
            table = self.cast_table()
        self.derived["totals"] = self.derived.get("totals", 0) + 1
        # ``table.costs``: ``[term_cost(t, plan) for t in terms]``, the same floats
        casts = [self.term_cost(t, plan) for t in self.terms] if table is None else table.costs(plan)
        cast_time = sum(casts)
        return ops + cast_time, sum(1 for c in casts if c), cast_time

    def weight_bytes(self, plan: dict[int, int]) -> float:
        """Bytes of the stored weights the plan's units read (one copy per dtype in use)."""
        total = 0.0
        for m in self.mem_terms:
            used = {self.value(c, plan) for c in m.consumers}
            total += m.bytes_fp32 * (0 in used) + m.bytes_low * (1 in used)
        return total

    def memory(self, plan: dict[int, int]) -> float:
        """The memory objective: weights plus the unit outputs' bytes (a modular activation proxy)."""
        act = sum(self.act_low[u] if plan[u] else self.act_fp32[u] for u in self.unit_ops)
        return self.fixed_memory + self.weight_bytes(plan) + act

    def low_tc_flops(self, plan: dict[int, int]) -> float:
        """Tensor-core FLOPs ``plan`` runs in the low dtype."""
        return sum(f for u, f in self.tc_flops.items() if plan[u])

    def cast_costs(self, plan: dict[int, int]) -> list[float]:
        """``[term_cost(t, plan) for t in terms]``, the same floats, priced at once (``_CastTable``)."""
        return self.cast_table().costs(plan)

    def cast_table(self) -> _CastTable:
        """The cast terms as arrays (made once per energy): what pricing many plans and laying out
        the cut's edges (``passes/convert.py``) read instead of walking the terms."""
        table = self.derived.get("casts")
        if table is None:
            table = self.derived["casts"] = _CastTable(self.terms)
        return table

    def flip_deltas(self, plan: dict[int, int]) -> list[tuple[float, float]]:
        """Per unit, in ``unit_ops`` order: (change in op time, change in cast time) if it alone
        switched precision. The terms touching it (``by_unit``) are priced before and after the
        flip all at once (``_CastTable.flipped``) and summed in term order, as one by one."""
        pairs = self.derived.get("flip_pairs")
        if pairs is None:
            pairs = self.derived["flip_pairs"] = _UnitTerms(list(self.unit_ops), self.by_unit)
        sign = np.array([-1.0 if plan[u] else 1.0 for u in self.unit_ops])
        low = np.array([self.time_low[u] for u in self.unit_ops], dtype=np.float64)
        fp32 = np.array([self.time_fp32[u] for u in self.unit_ops], dtype=np.float64)
        d_op = ((low - fp32) * sign).tolist()
        if not pairs.term.size:
            return [(d, 0) for d in d_op]  # ``sum(())`` of no terms: 0
        before, after = self.cast_table().flipped(plan, pairs.unit, pairs.term)
        d_cast = (pairs.sums(after) - pairs.sums(before)).tolist()
        return list(zip(d_op, d_cast))


class _UnitTerms:
    """``by_unit`` as arrays: one (unit, term) pair per term a unit touches, units in order, each
    unit's terms in order (``pos``: the pair's place among its unit's)."""

    def __init__(self, units: list[int], by_unit: dict[int, list[int]]) -> None:
        lengths = np.array([len(by_unit.get(u, ())) for u in units], dtype=np.int64)
        self.n = len(units)
        self.row = np.repeat(np.arange(self.n), lengths)
        self.unit = np.repeat(np.array(units, dtype=np.int64), lengths)
        self.term = np.array([i for u in units for i in by_unit.get(u, ())], dtype=np.int64)
        self.pos = np.arange(self.term.size) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        self.by_pos = np.argsort(self.pos, kind="stable")
        self.bounds = np.searchsorted(self.pos[self.by_pos], np.arange(int(self.pos.max(initial=0)) + 2))

    def sums(self, values: np.ndarray) -> np.ndarray:
        """Per unit, the sum of its pairs' ``values`` added left to right (as ``sum``): one
        addition per place, every unit at once."""
        total = np.zeros(self.n, dtype=np.float64)
        for start, stop in zip(self.bounds[:-1], self.bounds[1:]):
            at = self.by_pos[start:stop]
            total[self.row[at]] += values[at]
        return total


class _CastTable:
    """The terms' endpoints as arrays, to price every term of a plan at once (``PlanEnergy.total``
    prices several plans of one energy: the optimum, near-ties, all FP32, all low).

    Per term: its cast cost and producer (a unit, a fixed value, or none for a free constant and
    for a chosen graph input); per endpoint read as a value (units and fixed dtypes), its term,
    unit and fixed value. A term pays its cast when a consumer's value differs from the
    producer's, or for a chosen input, when its consumers use both dtypes (``term_cost``).
    """

    def __init__(self, terms: list[TensorTerm]) -> None:
        n = len(terms)
        self.cost = np.array([t.cast_cost for t in terms], dtype=np.float64)
        producer_unit, producer_value = np.full(n, -1, dtype=np.int64), np.zeros(n, dtype=np.int64)
        self.priced = np.zeros(n, dtype=bool)  # producer is a unit or a fixed dtype
        self.choose = np.zeros(n, dtype=bool)
        term_of: list[int] = []
        unit_of: list[int] = []
        value_of: list[int] = []
        for i, t in enumerate(terms):
            kind, v = t.producer
            if kind == "var":
                producer_unit[i], self.priced[i] = v, True
            elif kind == "fixed":
                producer_value[i], self.priced[i] = v, True
            elif kind == "choose":
                self.choose[i] = True
            for ckind, cv in t.consumers:
                if ckind == "var" or ckind == "fixed":
                    term_of.append(i)
                    unit_of.append(cv if ckind == "var" else -1)
                    value_of.append(cv if ckind == "fixed" else 0)
        self.n = n
        self.producer_unit, self.producer_value = producer_unit, producer_value
        self.term_of = np.array(term_of, dtype=np.int64)
        self.unit_of, self.value_of = np.array(unit_of, dtype=np.int64), np.array(value_of, dtype=np.int64)
        units = np.concatenate([producer_unit, self.unit_of])
        self.n_units = int(units.max()) + 1 if units.size else 0
        self.read_keys: np.ndarray | None = None  # (term, unit) of each read by a unit (``reads``)

    def costs(self, plan: dict[int, int]) -> list[float]:
        """Each term's cast seconds under ``plan`` (0.0 where no cast is needed), in term order."""
        if not self.n:
            return []
        source, n_low, n_fp32 = self._counts(self._values(plan))
        return np.where(self._paid(slice(None), source, n_low, n_fp32), self.cost, 0.0).tolist()

    def flipped(self, plan: dict[int, int], unit: np.ndarray, term: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Cast seconds of each ``term[k]`` under ``plan``, and with ``unit[k]`` alone switched."""
        values = self._values(plan)
        source, n_low, n_fp32 = self._counts(values)
        before = np.where(self._paid(term, source[term], n_low[term], n_fp32[term]), self.cost[term], 0.0)
        reads = self.reads(unit, term) * (1 - 2 * values[unit])  # its reads move from FP32 to low (or back)
        flipped = np.where(self.producer_unit[term] == unit, 1 - source[term], source[term])
        paid = self._paid(term, flipped, n_low[term] + reads, n_fp32[term] - reads)
        return before, np.where(paid, self.cost[term], 0.0)

    def reads(self, unit: np.ndarray, term: np.ndarray) -> np.ndarray:
        """How many times ``unit[k]`` is among the consumers of ``term[k]``."""
        keys = self.read_keys
        if keys is None:
            by_unit = self.unit_of >= 0
            keys = self.read_keys = np.sort(self.term_of[by_unit] * self.n_units + self.unit_of[by_unit])
        wanted = term * self.n_units + unit
        return np.searchsorted(keys, wanted, side="right") - np.searchsorted(keys, wanted)

    def _values(self, plan: dict[int, int]) -> np.ndarray:
        """Each unit's value under ``plan``, by unit id."""
        values = np.zeros(max(self.n_units, 1), dtype=np.int64)
        if plan:
            keys = np.fromiter(plan.keys(), dtype=np.int64, count=len(plan))
            inside = keys < values.size
            values[keys[inside]] = np.fromiter(plan.values(), dtype=np.int64, count=len(plan))[inside]
        return values

    def _counts(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per term: its producer's value, and how many of its reads are low and FP32."""
        source = np.where(self.producer_unit >= 0, values[self.producer_unit], self.producer_value)
        read = np.where(self.unit_of >= 0, values[self.unit_of], self.value_of)
        return (source, np.bincount(self.term_of, weights=read == 1, minlength=self.n),
                np.bincount(self.term_of, weights=read == 0, minlength=self.n))

    def _paid(self, term, source: np.ndarray, n_low: np.ndarray, n_fp32: np.ndarray) -> np.ndarray:
        """Whether ``term`` pays its cast: a read differs from its producer, or a chosen input is read both ways."""
        differs = np.where(source == 1, n_fp32, n_low) > 0
        return np.where(self.choose[term], (n_low > 0) & (n_fp32 > 0), self.priced[term] & differs)


def chosen_input(graph: PrecisionGraph, t: Tensor, ctx: PlanContext) -> bool:
    """A graph input whose dtype the plan chooses (no keep_io_types, and a graph whose inputs can be
    retyped: ``PrecisionGraph.inputs_retypable``)."""
    return t.kind == GRAPH_INPUT and not t.scope and not ctx.keep_io_types and graph.inputs_retypable


def tensor_endpoints(graph: PrecisionGraph, ctx: PlanContext, timer: OpTimer, units: dict[str, int]):
    """``(tensor, producer endpoint, reader endpoints)`` of each float tensor in the planned dtypes,
    in graph order, with ``units`` (op name -> unit id) the ops whose dtype is the plan's: the one walk
    ``build_energy`` terms come from and ``all_low_time`` prices. Readers that read the same value
    twice (x * x) are one endpoint; a fused RMSNorm's read of its input is none."""
    low = ctx.low_dtype
    fixed = (("fixed", 0), ("fixed", 1))  # the endpoints of a fixed FP32 / low dtype, made once
    ops = graph.ops

    def producer_end(t: Tensor) -> Endpoint:
        if t.producer is not None:
            op = ops[t.producer]
            role = op.output_roles[t.producer_port] if op.output_roles else FIXED
            if role == UNIT:
                return ("var", units[op.name]) if op.name in units else fixed[op.precision == low]
            return fixed[t.dtype == low]
        # stored in whatever dtype its consumers want (PARAMETERs and run-time-cast constants are not)
        if t.kind == CONSTANT and not runtime_cast(graph, t, ctx):
            return ("free", None)
        if chosen_input(graph, t, ctx):
            return ("choose", None)
        return fixed[t.dtype == low]

    absorbed = timer.absorbed_read if timer.groups.norms else None  # no fused RMSNorm: no read absorbed
    for t in graph.tensors.values():
        if t.dtype != FLOAT32 and t.dtype != low:  # float tensors in the planned dtypes only
            continue
        own = fixed[t.dtype == low]  # the tensor's dtype is float: any role but unit/any keeps it
        ends: list[Endpoint] = []
        for cname, port in t.consumers:
            if absorbed is not None and absorbed(t, cname):
                continue  # a fused RMSNorm reads it as stored: no cast (cost_model/norm_pattern.py)
            op = ops[cname]
            role = op.input_roles[port] if op.input_roles else FIXED
            if role == UNIT:
                uid = units.get(cname)
                ends.append(("var", uid) if uid is not None else fixed[op.precision == low])
            elif role != ANY:
                ends.append(own)
        if t.is_graph_output and (ctx.keep_io_types or t.scope_output):
            ends.append(own)
        if len(ends) > 1:
            ends = list(dict.fromkeys(ends))
        yield t, producer_end(t), ends


def priced_ops(graph: PrecisionGraph) -> list[Op]:
    """The ops a plan prices, in graph order: float data (unit ports), not a cast a pass inserted."""
    return [op for op in graph.ops.values() if op.has_unit_ports and not op.inserted]


def _at_precision(timer: OpTimer, op: Op, low: str, t32: float, tlow: float, held32: float,
                  held_low: float) -> tuple[float, float]:
    """(seconds, bytes held) of ``op`` at its own precision, from its FP32 and low numbers where it is one of those."""
    precision = op.precision or FLOAT32
    if precision == FLOAT32:
        return t32, held32
    if precision == low:
        return tlow, held_low
    (seconds,), (held,) = timer.costs(op, (precision,))
    return seconds, held


def build_energy(graph: PrecisionGraph, ctx: PlanContext, timer: OpTimer) -> PlanEnergy:
    """Collect units (one per eligible op), their times, and one cast term per float tensor."""
    low = ctx.low_dtype
    units: dict[str, int] = {}
    energy = PlanEnergy({}, {}, {}, 0.0, [], low=ctx.low_dtype)
    ops = priced_ops(graph)
    for op, (t32, tlow, held32, held_low) in zip(ops, timer.costs_each(ops, (FLOAT32, low))):
        if op.eligible:
            uid = len(units)
            units[op.name] = uid
            op.unit = uid
            energy.unit_ops[uid] = [op.name]
            energy.time_fp32[uid], energy.time_low[uid] = t32, tlow
            energy.act_fp32[uid], energy.act_low[uid] = held32, held_low
            energy.tc_flops[uid] = timer.flops(op) if op.tensor_core else 0.0
        else:
            op.unit = None
            seconds, held = _at_precision(timer, op, low, t32, tlow, held32, held_low)
            energy.fixed_time += seconds
            energy.fixed_memory += held

    terms, by_unit = energy.terms, energy.by_unit
    for t, prod, ends in tensor_endpoints(graph, ctx, timer, units):
        if t.kind in (CONSTANT, PARAMETER) and ends:
            _weight_memory(graph, energy, t, prod, ends, low)
        if not ends or prod[0] == "free":
            continue
        if prod[0] in ("fixed", "choose") and all(e[0] == "fixed" for e in ends):
            if any(e[1] != (prod[1] if prod[0] == "fixed" else ends[0][1]) for e in ends):
                energy.fixed_time += timer.cast_time(t, low)  # a cast nobody can avoid
            continue
        idx = len(terms)
        terms.append(TensorTerm(t.name, timer.cast_time(t, low), prod, ends))
        _index_term(by_unit, idx, prod)
        for end in ends:
            _index_term(by_unit, idx, end)
    return energy


def _index_term(by_unit: dict[int, list[int]], idx: int, end: Endpoint) -> None:
    """List term ``idx`` under ``end``'s unit, once (terms are indexed in order: a repeat is last)."""
    if end[0] == "var":
        touching = by_unit.get(end[1])
        if touching is None:
            by_unit[end[1]] = [idx]
        elif touching[-1] != idx:
            touching.append(idx)


def all_low_time(graph: PrecisionGraph, ctx: PlanContext, timer: OpTimer) -> float:
    """The 'all FP16' ceiling: ``build_energy(...).total(all low)[0]`` with every op that may take the
    low dtype eligible (``has_unit_ports and not inserted and not forbid_low``), without making that
    energy or touching the ops: ``build_energy``'s walk (``tensor_endpoints``), each endpoint read as
    its value under the all-low plan (a unit: 1; a fixed dtype: its own), and the same floats summed
    in the same order: op seconds outside the units then unavoidable casts (``fixed_time``), the
    units' low times (``sum`` from 0), the terms' casts in term order. Tested against the rebuilt
    energy (``tests/test_energy_tables.py``)."""
    low = ctx.low_dtype
    units: dict[str, int] = {}
    # units' and casts' seconds summed by ``sum``, as ``PlanEnergy.total`` does: from Python 3.12 it
    # compensates, and a ``+=`` loop would differ from it in the last bits
    fixed_time, unit_times, cast_times = 0.0, [], []
    ops = priced_ops(graph)
    for op, (t32, tlow, held32, held_low) in zip(ops, timer.costs_each(ops, (FLOAT32, low))):
        if not op.forbid_low:
            units[op.name] = len(units)
            unit_times.append(tlow)
        else:
            fixed_time += _at_precision(timer, op, low, t32, tlow, held32, held_low)[0]

    for t, prod, ends in tensor_endpoints(graph, ctx, timer, units):
        if not ends or prod[0] == "free":
            continue
        values = [1 if kind == "var" else v for kind, v in ends]
        if prod[0] in ("fixed", "choose") and all(kind == "fixed" for kind, _ in ends):
            if any(v != (prod[1] if prod[0] == "fixed" else values[0]) for v in values):
                fixed_time += timer.cast_time(t, low)  # a cast nobody can avoid
        elif prod[0] == "choose":
            if 0 in values and 1 in values:  # a chosen input read in both dtypes
                cast_times.append(timer.cast_time(t, low))
        elif any(v != (1 if prod[0] == "var" else prod[1]) for v in values):
            cast_times.append(timer.cast_time(t, low))
    return fixed_time + sum(unit_times) + sum(cast_times)


def _weight_memory(graph: PrecisionGraph, energy: PlanEnergy, t: Tensor, prod: Endpoint,
                   ends: list[Endpoint], low: str) -> None:
    """A constant is stored once per dtype its readers want. A parameter (or a constant cast at run
    time) keeps its stored copy, the master, whatever the plan; a reader in the other dtype
    materialises a second copy by its cast (``docs/architecture.md``, "The objective"), priced
    like a constant's copy: once if any reader wants it."""
    numel = graph.numel(t)
    b32, blow = float(numel * itemsize(FLOAT32)), float(numel * itemsize(low))
    if prod[0] != "free":
        energy.fixed_memory += graph.nbytes(t)
        if prod[0] == "fixed" and any(e[0] == "var" for e in ends):
            master_low = prod[1] == 1
            energy.mem_terms.append(MemoryTerm(t.name, b32 if master_low else 0.0, 0.0 if master_low else blow, ends))
    elif all(e[0] == "fixed" for e in ends):
        used = {e[1] for e in ends}
        energy.fixed_memory += b32 * (0 in used) + blow * (1 in used)
    else:
        energy.mem_terms.append(MemoryTerm(t.name, b32, blow, ends))


def realised_time(graph: PrecisionGraph, timer: OpTimer, low: str) -> tuple[float, int]:
    """(predicted time, casts) of the graph *after* the casts pass, priced op by op: each op
    at its precision, each FP32<->low cast it holds at ``timer.cast_time`` of the value it
    converts. Equal to the plan's energy when the realised casts are those the energy charged."""
    total, casts = 0.0, 0
    for op in graph.ops.values():
        if op.inserted and op.canonical == "cast":
            if timer.absorbed_cast(op):
                continue
            src = graph.tensors[op.inputs[0]]
            if {src.dtype, graph.tensors[op.outputs[0]].dtype} == {FLOAT32, low}:
                total += timer.cast_time(src, low)
                casts += 1
        elif op.has_unit_ports and not op.inserted:
            total += timer.time(op, op.precision or FLOAT32)
    return total, casts
