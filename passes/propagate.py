"""Propagate: compute the region where the low dtype is allowed at all.

Rewrite cases:

1. Every op downstream of a tensor marked ``unscale_marker`` (gradients divided by
   the loss scale), and the op producing it, is ineligible: the optimizer and the
   master-weight update stay FP32.
2. An op whose float data is neither FP32 nor the low dtype (a BF16 op when planning
   FP16, a ``Cast(to=BFLOAT16)``) keeps its source dtype: converting it could overflow
   or double-round, and it is not what the user asked to lower.
3. ``deny`` and ``unknown`` ops, ops without float data, ops whose schema forbids
   the low dtype (``forbid_low``), and ops that read a constant or read/write an
   activation the low dtype cannot hold (``low_unsafe``, set by the numerics pass)
   are ineligible.
4. With ``ctx.deny_propagation`` (TF's rule), an infer op fed by a deny op through
   infer/clear ops is ineligible too, with the clear ops between them; a clear op on the
   way to an allow op is left to the cost model. The walk stops at ops whose output is
   bounded whatever their input (tanh, sigmoid, softmax, erf, normalisations: ``BOUNDED``, and the
   final Div/Mul of a written-out LayerNorm/RMSNorm: ``normalisations``, and a non-negative value over
   its own mean, GRN's: ``ratio_to_own_mean``); they stay candidates. An Exp whose argument a
   constant bounds (``bounded_exp``: SwinV2's clamped ``logit_scale``) writes a known range: no seed.
5. The remaining ops are linked wherever a float tensor flows from one's ``unit``
   output into another's ``unit``/``any`` input; a connected group of them that
   contains an ``allow`` op (or an op the user forced low) is eligible. Groups with
   no tensor-core op in reach stay FP32: converting them buys nothing.
6. With ``planner="all"`` every remaining op is eligible, connected to a tensor-core
   op or not (the "everything in the low dtype" plan), but for a group of constant ops alone
   (``Constant``, ``ConstantOfShape``), a group of clear ops that reads no graph input (a
   training step's ``detach`` of its loss), and a group of views alone (``Identity``, ``Reshape``,
   ...) that reads graph inputs kept FP32 (``keep_io_types``: an input passed to a graph output):
   their readers all stay FP32 and they compute nothing, so they would only be rounded.

The convert pass chooses inside the eligible region. Outside it, ops that are
unsafe in the low dtype (cases 1, 3 and 4) run in FP32; ops merely out of reach keep the
dtype they had in the source (a partly-FP16 model keeps its FP16 parts). Ops the source already
runs in the low dtype stay so, and ops an earlier run of ours annotated FP32 stay FP32
(``ctx.earlier_fp32``): neither is planned, so a second run over a converted model changes
nothing; it had re-planned them by cost (docs/architecture.md, "Passes").
"""

from __future__ import annotations

from collections import deque

from amp_compiler.dtypes import FLOAT32, FLOAT_DTYPES, short
from amp_compiler.ir import ANY, UNIT, Op, PrecisionGraph
from amp_compiler.numerics import RANGES
from amp_compiler.registry import ALLOW, CLEAR, DENY, INFER, UNKNOWN
from amp_compiler.report_memory import is_view

from .base import Pass, PassResult, PlanContext, check, snapshot, unclassified
from .numerics_chains import BOUNDED, bounded_exp, ratio_to_own_mean, writes_normalisation
from .user_rules import forced_low, kept_by_name

AFTER_UNSCALE = "after the gradient-unscale marker: the optimizer and master weights stay FP32"
NOT_CONNECTED = "not connected to a tensor-core op through infer/clear ops"
#: ops whose output is a constant: alone in a group they are not planned low, even under planner="all"
_CONSTANTS = frozenset({"constant", "constant_of_shape"})
MOVES_ONLY = ("planner 'all' leaves FP32 a group of data-movement ops between FP32 values: it computes "
              "nothing, and in the low dtype it would only round")
OTHER_DTYPE = "keeps its source dtype: only FP32 and low-precision ops are planned"
ALREADY_LOW = "already in the low dtype in the source model"
EARLIER_FP32 = "kept FP32 by the amp-compiler run that converted the source model"


class PropagatePass(Pass):
    name = "propagate"

    def requires(self, graph: PrecisionGraph, ctx: PlanContext) -> None:
        check(self.name, "requires", unclassified(graph), "every op has a class (run classify first)")

    def call(self, graph: PrecisionGraph, ctx: PlanContext) -> PassResult:
        before = snapshot(graph, "eligible", "precision", "reason")
        unscaled = after_unscale(graph)
        candidates, denied = _candidates(graph, ctx, unscaled)
        if ctx.deny_propagation and denied:
            tainted = _downstream_of_deny(graph, denied, {op.name for op in candidates}, ctx)
            for name, (source, via) in tainted.items():
                op = graph.ops[name]
                op.precision = FLOAT32
                op.reason = (f"{op.op_class}: downstream of deny op {source} through {via}: "
                             f"the range of what it reads is unknown in the low dtype")
            if tainted:
                candidates = [op for op in candidates if op.name not in tainted]
        roots = _group_roots(graph, candidates)
        forced = forced_low(graph, ctx)
        seeded = {root for op, root in zip(candidates, roots) if op.op_class == ALLOW or op.name in forced}
        moves_only = set()
        if ctx.planner == "all":
            names = [op.name for op in candidates]
            moves_only = _groups_only_moving_fp32_data(graph, names, dict(zip(names, roots)).__getitem__, ctx)
            seeded |= {root for op, root in zip(candidates, roots)
                       if op.canonical not in _CONSTANTS and root not in moves_only}
        eligible = 0
        for op, root in zip(candidates, roots):
            if root in seeded:
                op.eligible = True
                eligible += 1
            else:
                op.precision = op.source_dtype
                op.reason = f"{op.op_class}: {NOT_CONNECTED}"
                if root in moves_only:
                    op.reason += f"; {MOVES_ONLY}"
                if op.source_dtype != FLOAT32:
                    op.reason += f"; keeps its source dtype {op.source_dtype}"
        details = f"{eligible} of {len(graph.ops)} ops eligible"
        if unscaled:
            details += f", {len(unscaled)} after unscale markers"
        return PassResult(graph, snapshot(graph, "eligible", "precision", "reason") != before, details)


def _candidates(graph: PrecisionGraph, ctx: PlanContext, unscaled: set[str]) -> tuple[list[Op], list[Op]]:
    """Rules 1-3 in one walk over the ops: each op with unit ports gets its precision and reason, or is
    a candidate (precision None). Returns the candidates and the deny ops that seed rule 4, in graph
    order. Every op's ``eligible`` is reset."""
    near_unsafe = _near_unsafe_values(graph)
    candidates, denied = [], []
    for op in graph.ops.values():
        op.eligible = False
        if op.op_class == DENY:
            denied.append(op)
        if op.inserted or UNIT not in op.input_roles and UNIT not in op.output_roles:  # has_unit_ports, inlined
            continue
        if op.source_dtype not in (FLOAT32, ctx.low_dtype):
            op.precision = op.source_dtype  # e.g. a BF16 op when planning FP16: not ours to change
            op.reason = f"{op.op_class}: {OTHER_DTYPE} ({op.source_dtype})"
            continue
        op.precision = FLOAT32
        if op.name in unscaled:
            op.reason = AFTER_UNSCALE
        elif op.op_class in (DENY, UNKNOWN):
            pass  # classify already gave the reason
        elif op.forbid_low:
            op.reason = f"{op.op_class}: {op.forbid_low}"
        elif op.name in near_unsafe and (unsafe := _unsafe_constant(graph, op)) is not None:
            op.reason = f"{op.op_class}: {unsafe}; kept FP32 rather than clamped"
        elif ctx.earlier_fp32 and op.name in ctx.earlier_fp32:
            op.reason = f"{op.op_class}: {EARLIER_FP32}: {ctx.earlier_fp32[op.name]}"
        elif op.source_dtype == ctx.low_dtype:
            op.precision = ctx.low_dtype  # a model converted before (onnxconverter-common, ours): not undone
            op.reason = f"{op.op_class}: {ALREADY_LOW} ({short(ctx.low_dtype)})"
        else:
            op.precision = None
            candidates.append(op)
    return candidates, denied


def _group_roots(graph: PrecisionGraph, candidates: list[Op]) -> list[str]:
    """Rule 5's groups: each candidate's root (an op name), candidates linked wherever a float tensor
    flows from one's unit output into another's unit/any input (union-find over the candidates'
    outputs, so no other tensor is read)."""
    parent = {op.name: op.name for op in candidates}
    ops, tensors = graph.ops, graph.tensors

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for op in candidates:
        for out, role in zip(op.outputs, op.output_roles):
            if role != UNIT or not out or (t := tensors[out]).dtype not in FLOAT_DTYPES:
                continue
            for cons_name, cport in t.consumers:
                if cons_name in parent and ops[cons_name].input_roles[cport] in (UNIT, ANY):
                    a, b = find(op.name), find(cons_name)
                    if a != b:
                        parent[a] = b
    return [find(op.name) for op in candidates]


def _groups_only_moving_fp32_data(graph: PrecisionGraph, candidates: list[str], find, ctx: PlanContext) -> set[str]:
    """Roots of the groups of clear ops (data movement: reshape, transpose, an aliasing detach) that
    read no graph input: they sit between FP32 ops, compute nothing, and in the low dtype would only
    round what they carry (a training step's returned loss to 8 bits under BF16). Also the groups of
    views alone (the registry's ``traffic: alias``: Identity, Reshape, Squeeze, ...) whose graph
    inputs stay FP32 (``keep_io_types``): a graph input passed through an Identity to a graph output
    had been cast to FP16 and back, its value rounded for no kernel at all. Other data movement
    reading a graph input (a lone Transpose, Gather, Where) stays eligible: the conformance suite's
    single-op models still run their FP16 kernels."""
    computing = {find(n) for n in candidates if graph.ops[n].op_class != CLEAR}
    inputs = set(graph.inputs)
    reads_input = {find(n) for n in candidates if any(i in inputs for i in graph.ops[n].inputs if i)}
    if ctx.keep_io_types or not graph.inputs_retypable:  # graph inputs keep their dtype
        moving = {find(n) for n in candidates if not is_view(graph.ops[n].canonical)}
        low_input = {find(n) for n in candidates
                     if any(i in inputs and graph.tensors[i].dtype != FLOAT32 for i in graph.ops[n].inputs if i)}
        reads_input &= moving | low_input  # views alone of FP32 graph inputs: as if they read none
    return {find(n) for n in candidates} - computing - reads_input


def _downstream_of_deny(graph: PrecisionGraph, denied: list[Op], candidates: set[str], ctx: PlanContext
                        ) -> dict[str, tuple[str, str]]:
    """Infer ops fed by a deny op through infer/clear ops, and the clear ops between them (TF's rule).

    ``deny -> infer -> clear -> infer -> clear -> allow`` taints the two infer ops and the
    clear op between them; the clear op in front of the allow op stays a candidate. The walk
    passes through ops already FP32 for another rule (an add-eps the numerics pass kept). Returns
    each tainted op with the deny op behind it and the op that led there. A node the user kept FP32
    by name (``deny_nodes``, ``exclude_nodes``) is no seed: that says where to keep FP32, not that
    its values are of unknown range; nor is an Exp whose output is bounded within the low dtype's range
    (``bounded_exp``).
    """
    reached: dict[str, tuple[str, str]] = {}
    rng = RANGES.get(ctx.low_dtype)
    queue = deque((op.name, op.name) for op in denied
                  if not kept_by_name(op.name, ctx) and not (rng is not None and bounded_exp(graph, op, rng)))
    while queue:
        name, source = queue.popleft()
        op = graph.ops[name]
        for port, out in enumerate(op.outputs):
            if not out or op.output_roles[port] != UNIT:
                continue
            for cons, cport in graph.tensors[out].consumers:
                c = graph.ops[cons]
                passes_through = cons in candidates or c.precision == FLOAT32  # FP32 for another rule
                if passes_through and cons not in reached and c.op_class in (INFER, CLEAR) \
                        and c.canonical not in BOUNDED and c.input_roles[cport] in (UNIT, ANY) \
                        and not writes_normalisation(graph, c) and not ratio_to_own_mean(graph, c):  # asked last
                    reached[cons] = (source, name)
                    queue.append((cons, source))
    tainted = {n: v for n, v in reached.items() if graph.ops[n].op_class == INFER and n in candidates}
    # a clear op stays tainted only on the way to a tainted infer op
    stack = list(tainted)
    while stack:
        op = graph.ops[stack.pop()]
        for port, inp in enumerate(op.inputs):
            prod = graph.tensors[inp].producer if inp else None
            if prod in reached and prod not in tainted and graph.ops[prod].op_class == CLEAR and prod in candidates:
                tainted[prod] = reached[prod]
                stack.append(prod)
    return tainted


def _near_unsafe_values(graph: PrecisionGraph) -> set[str]:
    """Ops that read or write a value the numerics pass found the low dtype cannot hold: the only
    ones ``_unsafe_constant`` can answer for (few or none: no need to ask every op)."""
    near: set[str] = set()
    for t in graph.tensors.values():
        if t.low_unsafe:
            near.update(name for name, _ in t.consumers)
            if t.producer:
                near.add(t.producer)
    return near


def _unsafe_constant(graph: PrecisionGraph, op) -> str | None:
    """Why a tensor this op reads or writes in its precision cannot be held in the low dtype."""
    for port, name in enumerate(op.inputs):
        if name and op.input_roles[port] == UNIT:
            t = graph.tensors[name]
            if t.low_unsafe:
                return t.low_unsafe
    for port, name in enumerate(op.outputs):  # a Constant node whose value FP16 cannot hold, say
        if name and op.output_roles[port] == UNIT:
            t = graph.tensors[name]
            if t.low_unsafe:
                return t.low_unsafe
    return None


def after_unscale(graph: PrecisionGraph) -> set[str]:
    """Names of ops that produce or (transitively) consume a tensor marked as unscaled."""
    seen: set[str] = set()
    queue: deque[str] = deque()
    for t in graph.tensors.values():
        if t.unscale_marker:
            if t.producer:
                seen.add(t.producer)
            queue.extend(c for c, _ in t.consumers)
    while queue:
        name = queue.popleft()
        if name in seen:
            continue
        seen.add(name)
        for out in graph.ops[name].outputs:
            if out:
                queue.extend(c for c, _ in graph.tensors[out].consumers)
    return seen
