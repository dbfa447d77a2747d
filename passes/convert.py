"""Convert: choose FP32 or the low dtype for every precision unit in the eligible region.

Rewrite cases:

1. ``planner="optimal"``: the plan minimises predicted time *including casts*
   exactly, by an s-t minimum cut (binary labelling, submodular energy). Source side
   is FP32, sink side the low dtype. Unary terms: edge s->u costs the unit's low-
   precision time, u->t its FP32 time. A tensor's cast is charged once per producer
   output with two auxiliary nodes (solved by ``maxflow``): ``a`` pays when the producer is FP32 and some
   consumer low (p->a, a->c = inf), ``b`` when the producer is low and some consumer
   FP32 (b->p, c->b = inf). Fixed endpoints tie auxiliary nodes to s or t.
2. ``planner="greedy"``: the TF Grappler-style painter, kept as a baseline: allow ops
   go low, infer/clear ops go low when they lie between low ops (reachable forward
   from one and backward from another), then clear ops next to low ops follow.
3. ``planner="all"``: every eligible unit takes the low dtype, whatever the cost
   (the propagate pass then makes every op eligible that may legally and safely run
   in it, not only those connected to a tensor-core op). This is the "everything
   FP16" plan: the reference the report compares with, and the mode conformance
   runs use to exercise every op's conversion.
4. Outside the eligible region ops keep the precision the propagate pass gave them;
   ops without float data get no precision.
5. Every op records why: the rule that fixed it, or the cost-model numbers.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace
from typing import Callable

import numpy as np
from .maxflow import CutNetwork  # scipy only for large graphs: its import costs more than a small cut

from amp_compiler.dtypes import FLOAT32, short
from amp_compiler.ir import UNIT, PrecisionGraph
from amp_compiler.registry import ALLOW, CLEAR

from .base import PLANNERS, Pass, PassResult, PlanContext, check, snapshot
from .costs import OpTimer, PlanEnergy, all_low_time, build_energy
from .explain import at_graph_io, fp32_tensor_core_why, near_tie_note, unplanned_float
from .plan_memory import plan_memory
from .result import Costs, Prediction
from .user_rules import note_forced, pin_forced

#: near-ties: a plan at most this much slower (relative) than the fastest is taken when it
#: needs less memory (objective "time"); under objective "memory", time breaks ties
TIE_TOLERANCE = 0.01
#: ... or at most this many of the runtime's kernel launches slower, whichever is more: on a
#: launch-bound model the only difference between FP32 and FP16 is a few cast kernels
#: (docs/architecture.md, "The objective")
TIE_LAUNCHES = 4

_SOURCE, _SINK = 0, 1
_TIE_CUTS = 3  # weighted cuts tried for a near-tie, mu halving each time


class ConvertPass(Pass):
    name = "convert"

    def ensures(self, graph: PrecisionGraph, ctx: PlanContext) -> None:
        check(self.name, "ensures", (op.name for op in graph.ops.values() if op.eligible and op.precision is None),
              "every eligible op has a precision")

    def call(self, graph: PrecisionGraph, ctx: PlanContext) -> PassResult:
        before = snapshot(graph, "precision", "reason")
        timer = OpTimer(graph, ctx)
        energy = build_energy(graph, ctx, timer)
        if ctx.planner == "greedy":
            plan = solve_greedy(graph, energy)
        elif ctx.planner == "optimal":
            plan = solve_objective(energy, ctx.objective, TIE_LAUNCHES * timer.launch,
                                   lambda tie, best: plan_memory(graph, energy, tie, ctx.low_dtype, ctx.keep_io_types)
                                   < plan_memory(graph, energy, best, ctx.low_dtype, ctx.keep_io_types))
            chosen = dict(plan)
        elif ctx.planner == "all":
            plan = {u: 1 for u in energy.unit_ops}
        else:
            raise ValueError(f"unknown planner {ctx.planner!r}: use one of {', '.join(PLANNERS)}")
        plan = pin_forced(graph, ctx, energy, plan, solve_mincut if ctx.planner == "optimal" else None)
        mixed, n_casts, cast_s = energy.total(plan)  # each plan priced once: 40 ms a plan on a 100k-op graph
        fp32 = energy.total({u: 0 for u in energy.unit_ops})[0]
        tie = ""
        if ctx.planner == "optimal" and ctx.objective == "time" and plan == chosen:  # not a user's pin
            tie = near_tie_note(graph, fp32, mixed, TIE_LAUNCHES)
        _apply(graph, ctx, energy, plan)
        note_forced(graph, ctx)
        prediction = Prediction(fp32, mixed, predict_all_low(graph, ctx, timer), n_casts, cast_s)
        floor = TIE_LAUNCHES * timer.launch
        why = fp32_tensor_core_why(graph, ctx, energy, plan, mixed, timer,
                                   lambda: io_casts_matter(graph, ctx, timer, energy, plan, mixed, floor))
        n_low = sum(plan.values())
        return PassResult(graph, snapshot(graph, "precision", "reason") != before,
                          f"{n_low} of {len(plan)} eligible units in {short(ctx.low_dtype)} "
                          f"({ctx.planner}), {n_casts} casts planned",
                          Costs(prediction, timer, timer.runtime.name, len(timer.groups), ctx.objective, why, tie))


def io_casts_matter(graph: PrecisionGraph, ctx: PlanContext, timer: OpTimer, energy: PlanEnergy,
                    plan: dict[int, int], mixed_s: float, floor_s: float) -> bool:
    """Whether ``ctx.objective``'s plan under ``keep_io_types=False`` runs more GEMM/conv FLOPs low
    than ``plan``. The why-line advises ``--no-keep-io-types`` only then: it had advised it for a
    GPT-2 and a ViT whose output cast changed nothing (``docs/architecture.md``, "The objective").
    Casts at the graph's inputs and outputs costing under ``TIE_TOLERANCE`` of the plan's time in
    all are not worth the advice, and no second energy and cut are made for them (they had cost
    1.5 s on a 100k-node graph for one output cast)."""
    io = sum(term.cast_cost for term in energy.terms if at_graph_io(graph.tensors[term.tensor]))
    if io < TIE_TOLERANCE * mixed_s:
        return False
    other = build_energy(graph, replace(ctx, keep_io_types=False), timer)  # same units, same order
    return other.low_tc_flops(solve_objective(other, ctx.objective, floor_s)) > other.low_tc_flops(plan)


def tie_tolerance(t_best: float, floor_s: float = 0.0) -> float:
    """Seconds a plan may be slower than the fastest ``t_best`` and still tie with it."""
    return max(TIE_TOLERANCE * t_best, floor_s)


def solve_objective(energy: PlanEnergy, objective: str = "time", floor_s: float = 0.0,
                    holds_less: Callable[[dict, dict], bool] | None = None) -> dict[int, int]:
    """The plan for ``objective`` (``docs/architecture.md``, "The objective").

    ``time``: the exact time minimum ``T*``; then cuts of ``time + mu * memory``, the first with
    ``mu = tol / (M(T*'s plan) - M(all low))`` (``tol = tie_tolerance(T*, floor_s)``: what
    converting what the fastest plan leaves FP32 saves is worth the whole tolerance, a part of
    it pro rata), kept only if its time is within ``T* + tol`` and it needs less memory; where
    that cut is slower, ``mu`` halves (at most ``_TIE_CUTS`` cuts); once one is within, ``mu``
    doubles while the cut stays within and needs less memory (at most ``_TIE_CUTS`` more). A tie
    beyond the relative tolerance (spending the floor of launches) must also run more GEMM/conv
    FLOPs in the low dtype; else the relative tolerance alone is tried. So
    ``T(chosen) <= T* + tol <= T_fp32 + tol``. A tie must also hold less than the fastest plan by
    ``holds_less(tie, fastest)`` where given (the report's measure, peak activations and casts
    included: ``plan_memory``), not only by the proxy the cuts weigh.
    ``memory``: the exact minimum of ``memory + nu * time``, ``nu = TIE_TOLERANCE * M_fp32 / T_fp32``.
    ``fastest``: ``T*``'s plan, no tie-break (never predicted slower than all-FP32).
    """
    if not energy.unit_ops:
        return {}
    if objective == "fastest":
        return solve_mincut(energy)
    if objective == "memory":
        all32 = {u: 0 for u in energy.unit_ops}
        t32, m32 = energy.total(all32)[0], energy.memory(all32)
        nu = TIE_TOLERANCE * m32 / t32 if t32 > 0 else 0.0
        return solve_mincut(energy, time_weight=nu, mem_weight=1.0)
    best = solve_mincut(energy)
    priced = _Priced(energy)
    t_best = priced.time(best)
    if t_best <= 0:
        return best
    m_best = priced.memory(best)
    m_low = priced.memory({u: 1 for u in energy.unit_ops})
    if m_best <= m_low:
        return best
    relative = TIE_TOLERANCE * t_best
    for tol in dict.fromkeys((tie_tolerance(t_best, floor_s), relative)):
        # what is left to save beyond the fastest plan is worth the whole tolerance: measured from
        # all-FP32 instead, a plan already converting most of the model (a launch-bound decoder's
        # blocks) priced its last GEMM (the LM head behind one output cast) at a fraction of it
        tie = _near_tie(priced, t_best, tol, tol / (m_best - m_low), m_best, again=tol <= relative)
        # the floor of launches is for plans that put more GEMM/conv work in the low dtype (a
        # launch-bound model converting), not for storing FP32 work's weights low and casting them
        if tie is not None and (priced.time(tie) <= t_best + relative
                                or energy.low_tc_flops(tie) > energy.low_tc_flops(best)) \
                and (holds_less is None or holds_less(tie, best)):
            return tie
    return best


class _Priced:
    """Time and memory of the plans one ``solve_objective`` weighs, each distinct plan priced once:
    the weighted cuts often return the same plan again (on a 112k-node graph, four cuts one plan),
    and ``PlanEnergy.total`` / ``memory`` cost tens of milliseconds each there. The plans are
    ``solve_mincut``'s and the all-low plan, all keyed in ``unit_ops`` order, so their values
    identify them."""

    def __init__(self, energy: PlanEnergy) -> None:
        self.energy = energy
        self._times: dict[bytes, float] = {}
        self._memories: dict[bytes, float] = {}

    def time(self, plan: dict[int, int]) -> float:
        key = bytes(plan.values())
        if key not in self._times:
            self._times[key] = self.energy.total(plan)[0]
        return self._times[key]

    def memory(self, plan: dict[int, int]) -> float:
        key = bytes(plan.values())
        if key not in self._memories:
            self._memories[key] = self.energy.memory(plan)
        return self._memories[key]


def _near_tie(priced: _Priced, t_best: float, tol: float, mu: float, m_best: float,
              again: bool = True) -> dict[int, int] | None:
    """The cut of ``time + mu * memory`` (``mu`` halving while it is slower than ``t_best + tol``,
    then doubling while it stays within: ``_spend_rest``), if it needs less memory than ``m_best``;
    else None. With ``again``, a first cut that is the fastest plan again still doubles: the
    pro-rata ``mu`` can fall just short of the price at which a group of weights pays for its
    casts (a Mamba's projections around its FP32 scan, 0.9 % slower). Not when ``tol`` is the
    floor of launches: there doubling would spend up to four launches on a toy graph of a few
    kernels (1.7x slower) that the pro-rata price found not worth it."""
    for _ in range(_TIE_CUTS):
        tie = solve_mincut(priced.energy, mem_weight=mu)
        if priced.time(tie) <= t_best + tol:
            if again or priced.memory(tie) < m_best:
                tie = _spend_rest(priced, t_best + tol, mu, tie)
            return tie if priced.memory(tie) < m_best else None
        mu /= 2
    return None


def _spend_rest(priced: _Priced, bound: float, mu: float, tie: dict[int, int]) -> dict[int, int]:
    """``tie`` or, ``mu`` doubling (at most ``_TIE_CUTS`` cuts), the last cut still within ``bound``:
    a pro-rata ``mu`` can leave most of the tolerance unspent on units it prices one by one
    (a wav2vec2's 18 GEMMs at 1 launch together)."""
    for _ in range(_TIE_CUTS):
        mu *= 2
        more = solve_mincut(priced.energy, mem_weight=mu)
        if priced.time(more) > bound:
            break
        if priced.memory(more) < priced.memory(tie):
            tie = more
    return tie


def solve_mincut(energy: PlanEnergy, time_weight: float = 1.0, mem_weight: float = 0.0) -> dict[int, int]:
    """Exact minimum of ``time_weight * time + mem_weight * memory`` by one s-t minimum cut
    (``maxflow``); every term is submodular, so the cut is exact. The edges are laid out once per
    energy (``_CutEdges``); each cut only weighs their capacities."""
    if not energy.unit_ops:
        return {}
    edges = energy.derived.get("edges")
    if edges is None:
        edges = energy.derived["edges"] = _CutEdges(energy)
    _, _, _, per_time, per_memory, infinite = edges.layout(mem_weight > 0)
    caps = time_weight * per_time + mem_weight * per_memory  # as ``tw * t + mw * m`` per edge
    caps[infinite] = -1.0  # maxflow's "infinite"
    keep = caps != 0  # zero edges are left out, the others keep their order
    source_side = edges.network(mem_weight > 0, keep).source_side(caps[keep])
    n = len(energy.unit_ops)
    return dict(zip(energy.unit_ops, np.where(source_side[2:2 + n], 0, 1).tolist()))


class _CutEdges:
    """The s-t graph of an energy (``solve_mincut``), capacities left as ``tw * per_time +
    mw * per_memory`` (``infinite`` edges apart).

    Units are nodes 2.. in order (0 = source, FP32 side; 1 = sink, low side). A tensor's cast is
    charged once per producer output with two auxiliary nodes: ``a`` pays when the producer is
    FP32 and some consumer low (p->a, a->c = inf), ``b`` when the producer is low and some
    consumer FP32 (b->p, c->b = inf); fixed endpoints tie them to the source or sink. With the
    memory objective each weight read by units adds two nodes the same way (bytes_low when some
    reader is low, bytes_fp32 when some reader is FP32), numbered before the cast nodes. The three
    blocks (units, weights, casts) are built once; a layout with or without the weights joins them.
    """

    def __init__(self, energy: PlanEnergy) -> None:
        self.index = {u: i + 2 for i, u in enumerate(energy.unit_ops)}
        self.units = self._units(energy)
        self.casts = self._casts(energy)
        self._mem_terms = energy.mem_terms  # laid out only for a memory-weighted cut (pin_forced's
        self._layouts: dict[bool, tuple] = {}  # energy pins the terms, not the weights)
        self._networks: dict[bool, tuple[np.ndarray, CutNetwork]] = {}

    def layout(self, with_memory: bool) -> tuple:
        """(nodes, rows, cols, per_time, per_memory, infinite) of the graph with or without the weights."""
        found = self._layouts.get(with_memory)
        if found is None:
            weights = [self._weights(self._mem_terms)] if with_memory else []
            blocks = [self.units, *weights, self.casts]
            first = 2 + len(self.index)  # the blocks' auxiliary nodes are numbered on from here, in turn
            parts = []
            for rows, cols, per_time, per_memory, infinite, n_aux in blocks:
                parts.append((_absolute(rows, first), _absolute(cols, first), per_time, per_memory, infinite))
                first += n_aux
            found = self._layouts[with_memory] = (first, *(np.concatenate(p) for p in zip(*parts)))
        return found

    def network(self, with_memory: bool, keep: np.ndarray) -> CutNetwork:
        """The layout's edges where ``keep`` (those of nonzero capacity) made ready for cuts
        (``maxflow.CutNetwork``), made again only when ``keep`` changes: the weighted cuts of one
        solve leave out the same edges (a capacity is ``tw * t + mw * m``, both terms >= 0)."""
        found = self._networks.get(with_memory)
        if found is None or not np.array_equal(found[0], keep):
            n_nodes, rows, cols = self.layout(with_memory)[:3]
            found = self._networks[with_memory] = (keep, CutNetwork(n_nodes, rows[keep], cols[keep], _SOURCE, _SINK))
        return found[1]

    def _units(self, energy: PlanEnergy) -> tuple:
        """Per unit in order: source -> unit (its low time and bytes), unit -> sink (FP32's)."""
        units = list(energy.unit_ops)
        nodes = np.fromiter(self.index.values(), dtype=np.int64, count=len(units))
        low_time, fp32_time, low_bytes, fp32_bytes = (np.fromiter(map(table.__getitem__, units), dtype=np.float64,
                                                                  count=len(units))
                                                      for table in (energy.time_low, energy.time_fp32,
                                                                    energy.act_low, energy.act_fp32))
        rows = np.stack([np.full_like(nodes, _SOURCE), nodes], axis=1).ravel()
        cols = np.stack([nodes, np.full_like(nodes, _SINK)], axis=1).ravel()
        per_time = np.stack([low_time, fp32_time], axis=1).ravel()
        per_memory = np.stack([low_bytes, fp32_bytes], axis=1).ravel()
        return rows, cols, per_time, per_memory, np.zeros(rows.size, dtype=bool), 0

    def _tie(self, block: _EdgeBlock, a: int, b: int, consumers) -> None:
        """Readers pull ``a`` to the low side and ``b`` to the FP32 side with them."""
        index, tied = self.index, block.tied
        for ckind, cv in consumers:
            if ckind == "var":
                node = index[cv]
                tied += (a, node, node, b)
            elif cv == 1:
                tied += (a, _SINK)  # a consumer fixed low: ``a`` takes the low side
            else:
                tied += (_SOURCE, b)  # a consumer fixed FP32: ``b`` takes the FP32 side

    def _weights(self, mem_terms) -> tuple:
        block = _EdgeBlock()
        for m in mem_terms:  # bytes_low * [some reader low] + bytes_fp32 * [some reader FP32]
            a, b = block.aux(), block.aux()
            block.add(_SOURCE, a, 0.0, m.bytes_low)
            block.add(b, _SINK, 0.0, m.bytes_fp32)
            self._tie(block, a, b, m.consumers)
        return block.arrays()

    def _casts(self, energy: PlanEnergy) -> tuple:
        """The cast terms' block, from the energy's arrays of their endpoints (``PlanEnergy``'s cast
        table, which pricing a plan builds anyway: the terms are not walked twice). In term order, as
        ``_EdgeBlock`` lists them: ``a``, ``b`` and, for a chosen graph input, its free node (no unary
        cost) are each term's auxiliary nodes; a term whose producer is a node (a unit or that free
        node) has the priced edges p -> a, b -> p, one of a fixed producer s -> a (FP32) or b -> t
        (low); each read ties ``a`` and ``b`` to its unit, or one of them to its fixed side."""
        table = energy.cast_table()
        units = np.fromiter(self.index, dtype=np.int64, count=len(self.index))
        node_of = np.zeros(max(table.n_units, int(units.max()) + 1), dtype=np.int64)
        node_of[units] = np.arange(2, 2 + units.size)
        var, free = table.producer_unit >= 0, table.choose
        n_aux = 2 + free.astype(np.int64)
        a = ~(np.cumsum(n_aux) - n_aux)  # each term's first auxiliary node (``~k``, as ``_EdgeBlock.aux``)
        b = a - 1
        node = np.where(var, node_of[table.producer_unit], a - 2)  # a unit, or a chosen input's free node
        from_node = var | free
        fp32 = table.producer_value == 0
        first = np.stack([np.where(from_node, node, np.where(fp32, _SOURCE, b)), np.where(fp32 | from_node, a, _SINK)])
        second = np.stack([b, node])
        priced = _interleave(first, second, from_node)
        reads = table.term_of
        by_unit = table.unit_of >= 0
        reader = node_of[np.where(by_unit, table.unit_of, 0)]
        low = table.value_of == 1
        first = np.stack([np.where(by_unit | low, a[reads], _SOURCE),
                          np.where(by_unit, reader, np.where(low, _SINK, b[reads]))])
        second = np.stack([reader, b[reads]])
        tied = _interleave(first, second, by_unit)
        n_priced = priced.shape[1]
        return (np.concatenate([priced[0], tied[0]]), np.concatenate([priced[1], tied[1]]),
                np.concatenate([np.repeat(table.cost, np.where(from_node, 2, 1)), np.zeros(tied.shape[1])]),
                np.zeros(n_priced + tied.shape[1]), np.arange(n_priced + tied.shape[1]) >= n_priced,
                int(n_aux.sum()))


def _interleave(first: np.ndarray, second: np.ndarray, both: np.ndarray) -> np.ndarray:
    """Edges as (2, n) arrays of ends: each item's ``first`` edge, then its ``second`` where ``both``."""
    count = np.where(both, 2, 1)
    start = np.cumsum(count) - count
    edges = np.empty((2, int(count.sum())), dtype=np.int64)
    edges[:, start] = first
    edges[:, start[both] + 1] = second[:, both]
    return edges


class _EdgeBlock:
    """Edges being listed, priced ones and infinite ones apart (a cut does not depend on the
    order of the edges, only the sum of the finite capacities on the order of those); auxiliary
    nodes are numbered within the block as ``~k`` (-1, -2, ...)."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.cols: list[int] = []
        self.per_time: list[float] = []
        self.per_memory: list[float] = []
        self.tied: list[int] = []  # the infinite edges, their ends two by two (``a, b``: a -> b)
        self.n_aux = 0

    def aux(self) -> int:
        self.n_aux += 1
        return ~(self.n_aux - 1)

    def add(self, a: int, b: int, t: float, m: float) -> None:
        self.rows.append(a)
        self.cols.append(b)
        self.per_time.append(t)
        self.per_memory.append(m)

    def arrays(self) -> tuple:
        """(rows, cols, per_time, per_memory, infinite, n_aux): the priced edges, then the infinite ones."""
        n_tied = len(self.tied) // 2
        tied = np.array(self.tied, dtype=np.int64).reshape(-1, 2)
        zeros = np.zeros(n_tied, dtype=np.float64)
        return (np.concatenate([np.array(self.rows, dtype=np.int64), tied[:, 0]]),
                np.concatenate([np.array(self.cols, dtype=np.int64), tied[:, 1]]),
                np.concatenate([np.array(self.per_time, dtype=np.float64), zeros]),
                np.concatenate([np.array(self.per_memory, dtype=np.float64), zeros]),
                np.arange(len(self.rows) + n_tied) >= len(self.rows), self.n_aux)


def _absolute(nodes: np.ndarray, first: int) -> np.ndarray:
    """A block's node ids with its auxiliary ones (``~k``) numbered from ``first``."""
    return np.where(nodes < 0, first + ~nodes, nodes)


def solve_greedy(graph: PrecisionGraph, energy: PlanEnergy) -> dict[int, int]:
    """TF Grappler-style painting of the eligible region (no cost model)."""
    unit_of = {name: u for u, names in energy.unit_ops.items() for name in names}

    def neighbours(name: str, forward: bool):
        op = graph.ops[name]
        if forward:
            for port, out in enumerate(op.outputs):
                if out and op.output_roles[port] == UNIT:
                    for cname, cport in graph.tensors[out].consumers:
                        if cname in unit_of and graph.ops[cname].input_roles[cport] == UNIT:
                            yield cname
        else:
            for port, inp in enumerate(op.inputs):
                if inp and op.input_roles[port] == UNIT:
                    prod = graph.tensors[inp].producer
                    if prod in unit_of:
                        yield prod

    def reach(starts: list[str], forward: bool) -> set[str]:
        seen, queue = set(starts), deque(starts)
        while queue:
            for n in neighbours(queue.popleft(), forward):
                if n not in seen:
                    seen.add(n)
                    queue.append(n)
        return seen

    allow = [n for n in unit_of if graph.ops[n].op_class == ALLOW]
    low = set(allow) | (reach(allow, True) & reach(allow, False))
    frontier = deque(low)
    while frontier:  # clear ops follow their low neighbours, both directions
        name = frontier.popleft()
        for n in (*neighbours(name, True), *neighbours(name, False)):
            if n not in low and graph.ops[n].op_class == CLEAR:
                low.add(n)
                frontier.append(n)
    return {u: int(any(n in low for n in names)) for u, names in energy.unit_ops.items()}


def predict_all_low(graph: PrecisionGraph, ctx: PlanContext, timer: OpTimer) -> float:
    """Predicted time with every op that can take the low dtype in it (the 'all FP16' ceiling):
    the energy of that eligibility priced all low, without building it (``costs.all_low_time``)."""
    return all_low_time(graph, ctx, timer)


def _why(ctx: PlanContext, decided: tuple) -> str:
    """Why a unit got its dtype: the planner's rule, or the cost model's numbers ``(low?, t32,
    tlow, d_op, d_cast)`` (``flip_deltas``: what switching it alone would change)."""
    low = short(ctx.low_dtype)
    if ctx.planner == "greedy":
        return "greedy painter: " + ("allow op or between low ops" if decided[0] else "not between low ops")
    if ctx.planner == "all":
        return f"planner 'all': every eligible op in {low}"
    is_low, t32, tlow, d_op, d_cast = decided
    if is_low:
        return (f"cost model: {_fmt_us(tlow)} in {low} vs {_fmt_us(t32)} in fp32"
                + (f", FP32 would add {_fmt_us(d_cast)} of casts" if d_cast > 0 else ""))
    return (f"kept FP32 by the cost model: {low} would save {_fmt_us(max(-d_op, 0.0))} "
            f"of compute but add {_fmt_us(d_cast)} of casts" if d_cast > 0 else
            f"kept FP32 by the cost model: {_fmt_us(t32)} in fp32 vs {_fmt_us(tlow)} in {low}")


def _fmt_us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} µs"


def _apply(graph: PrecisionGraph, ctx: PlanContext, energy: PlanEnergy, plan: dict[int, int]) -> None:
    low = ctx.low_dtype
    reasons: dict[tuple, str] = {}  # units alike (repeated layers) share their wording
    deltas = energy.flip_deltas(plan) if ctx.planner == "optimal" else None
    for k, (u, names) in enumerate(energy.unit_ops.items()):
        precision = low if plan[u] else FLOAT32
        op = graph.ops[names[0]]
        if deltas is not None:
            key = (op.op_class, plan[u], energy.time_fp32[u], energy.time_low[u], *deltas[k])
        else:
            key = (op.op_class, plan[u])
        reason = reasons.get(key)
        if reason is None:
            reason = reasons[key] = f"{op.op_class}: {_why(ctx, key[1:])}"
        for name in names:
            graph.ops[name].precision = precision
            graph.ops[name].reason = reason
    for op in graph.ops.values():
        if not op.inserted and not op.has_unit_ports:
            op.precision = None
            if not op.reason.startswith(("deny", "unknown")):
                other = unplanned_float(graph, op)
                op.reason = (f"{op.op_class}: runs in {other}, which plans leave as it is (they convert float32 ops)"
                             if other else f"{op.op_class}: no float data")
