"""User rules: node selection by pattern, forced op types, reduction depth, large initializers.

The options users bring from ModelOpt AutoCast and ORT's float16 tool (``docs/migrating.md``),
kept apart from the core passes; each hooks in where it acts (``docs/architecture.md``, Passes):

1. ``apply_user_rules`` runs at the end of classify. An op whose name matches an ``include_nodes``
   pattern, or whose type is in ``force_ops``, is forced into the low dtype where legal
   (a deny op becomes a candidate; the schema, a missing kernel and out-of-range weights
   still keep it FP32); otherwise one matching an ``exclude_nodes`` pattern is deny.
   Include wins over exclude, as in AutoCast. Patterns match the start of the node name
   (``re.match``, AutoCast's rule). ``forced_low`` recomputes the forced set from the
   options wherever it is needed (propagate seeds its region with it), so nothing is
   handed on through the IR or the context.
2. ``max_reduction_depth``: an op that accumulates over more than N elements (MatMul/Gemm K,
   Conv Cin/group x kernel, attention head size, a Reduce* over its reduced elements) may
   not take the low dtype. Shapes only: no data needed.
3. ``pin_forced`` (called by the convert pass) re-solves the plan with forced units fixed
   low; ``note_forced`` gives them their reason.
4. ``runtime_cast`` (called by the casts pass and the energy): a constant over
   ``init_max_bytes`` keeps its FP32 initializer and is cast at run time, never folded.
Custom-op tables (ops of a plugin library classified from a user table) are read by
``amp_compiler/custom_ops.py``, which the CLI loads without the heavy modules.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

from amp_compiler.dtypes import short
from amp_compiler.ir import CONSTANT, Op, PrecisionGraph, Tensor
from amp_compiler.registry import DENY, INFER, UNKNOWN

from .base import PlanContext

FORCED = "forced to the low dtype by the user"


@dataclass(frozen=True)
class UserRules:
    """The user's rules, validated once (``ValueError`` names the bad pattern or value)."""

    exclude_nodes: tuple[str, ...] = ()  # regex patterns: matching ops stay FP32
    include_nodes: tuple[str, ...] = ()  # regex patterns: matching ops forced low where legal
    force_ops: frozenset[str] = frozenset()  # op types forced low where legal
    max_reduction_depth: int | None = None
    init_max_bytes: int | None = None
    _compiled: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for option in ("exclude_nodes", "include_nodes", "force_ops"):
            if isinstance(getattr(self, option), str):
                raise ValueError(f"{option} takes a list, got the string {getattr(self, option)!r}")
        for option in ("exclude_nodes", "include_nodes"):
            patterns = tuple(getattr(self, option))
            object.__setattr__(self, option, patterns)
            try:
                self._compiled[option] = [re.compile(p) for p in patterns]
            except re.error as exc:
                raise ValueError(f"{option}: bad regular expression {exc.pattern!r}: {exc}") from None
        object.__setattr__(self, "force_ops", frozenset(self.force_ops))
        for option in ("max_reduction_depth", "init_max_bytes"):
            value = getattr(self, option)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{option} must be a positive integer, got {value!r}")

    def match(self, option: str, name: str) -> str | None:
        """The first pattern of ``option`` matching the start of ``name``, if any."""
        return next((r.pattern for r in self._compiled[option] if r.match(name)), None)

    @property
    def active(self) -> bool:
        return bool(self.exclude_nodes or self.include_nodes or self.force_ops or self.max_reduction_depth)


def _rules(ctx: PlanContext) -> UserRules:
    return getattr(ctx, "user_rules", None) or UserRules()


def kept_by_name(name: str, ctx: PlanContext) -> bool:
    """Whether the user keeps op ``name`` FP32 by name (``deny_nodes`` or an ``exclude_nodes`` pattern)."""
    return name in ctx.deny_nodes or _rules(ctx).match("exclude_nodes", name) is not None


def forced_low(graph: PrecisionGraph, ctx: PlanContext) -> dict[str, str]:
    """Op name -> why the user forced it low (``force_low_nodes``, ``force_ops``, ``include_nodes``).

    A pure function of the graph and the options, so no pass hands it on through the IR or
    the context; an unknown op's ports are fixed, so there is nothing to force in it.
    """
    rules = _rules(ctx)
    if not (rules.force_ops or rules.include_nodes or ctx.force_low_nodes):
        return {}
    return {op.name: why for op in graph.ops.values() if not op.inserted and op.op_class != UNKNOWN
            and (why := _forced_by(op, rules, ctx.force_low_nodes)) is not None}


def apply_user_rules(graph: PrecisionGraph, ctx: PlanContext) -> str:
    """Run by classify once every op has its class; returns what it did for the pass record."""
    rules = _rules(ctx)
    if not (rules.active or ctx.force_low_nodes):
        return ""
    forced = forced_low(graph, ctx)
    excluded = deep = 0
    for op in graph.ops.values():
        if op.inserted:
            continue
        if op.name in forced:
            if op.op_class == DENY:
                op.op_class = INFER
            op.reason = f"{op.op_class}: {FORCED} ({forced[op.name]})"
            continue
        if (pattern := rules.match("exclude_nodes", op.name)) is not None:
            op.op_class, op.reason = DENY, f"deny: node name matches --exclude-nodes {pattern!r}"
            excluded += 1
        elif rules.max_reduction_depth and op.forbid_low is None:
            depth = reduction_depth(graph, op)
            if depth is not None and depth > rules.max_reduction_depth:
                op.forbid_low = (f"accumulates over {depth} elements, more than "
                                 f"--max-reduction-depth {rules.max_reduction_depth}")
                deep += 1
    return f"; user rules: {len(forced)} forced low, {excluded} excluded by pattern, {deep} over the reduction depth"


def _forced_by(op: Op, rules: UserRules, names: frozenset[str]) -> str | None:
    if op.name in names:
        return "force_low_nodes"
    if op.op_type in rules.force_ops or (op.domain and f"{op.domain}::{op.op_type}" in rules.force_ops):
        return f"--force-op {op.op_type}"
    pattern = rules.match("include_nodes", op.name)
    return None if pattern is None else f"--include-nodes {pattern!r}"


def reduction_depth(graph: PrecisionGraph, op: Op) -> int | None:
    """How many products or elements one output element accumulates; None when unknown."""
    if op.canonical in ("matmul", "gemm", "gemm_fast_gelu"):  # K: A's last dim (its first, transposed)
        a = graph.concrete_shape(op.inputs[0]) if op.inputs and op.inputs[0] else None
        return (a[0] if op.canonical == "gemm" and op.attrs.get("transA") else a[-1]) if a else None
    if op.canonical in ("conv", "conv_transpose") and len(op.inputs) > 1:
        w = graph.concrete_shape(op.inputs[1]) if op.inputs[1] else None
        return math.prod(w[1:]) if w and len(w) > 2 else None
    if op.canonical in ("attention", "fused_attention"):
        q = graph.concrete_shape(op.inputs[0]) if op.inputs and op.inputs[0] else None
        return q[-1] if q else None
    if op.canonical and op.canonical.startswith("reduce_") and op.inputs and op.inputs[0] and op.outputs:
        n_in, n_out = graph.numel(op.inputs[0]), graph.numel(op.outputs[0])
        return n_in // max(n_out, 1)
    return None


def pin_forced(graph: PrecisionGraph, ctx: PlanContext, energy, plan: dict[int, int], solve=None) -> dict[int, int]:
    """``plan`` with every forced unit low; with ``solve``, the other units re-solved around them."""
    forced = {graph.ops[n].unit for n in forced_low(graph, ctx) if graph.ops[n].unit is not None}
    if not forced or all(plan[u] for u in forced):
        return plan
    if solve is None:
        return {u: 1 if u in forced else v for u, v in plan.items()}
    pinned = replace(energy, unit_ops={u: n for u, n in energy.unit_ops.items() if u not in forced},
                     fixed_time=energy.fixed_time + sum(energy.time_low[u] for u in forced),
                     terms=[replace(t, producer=_pin(t.producer, forced),
                                    consumers=[_pin(c, forced) for c in t.consumers]) for t in energy.terms])
    return {**solve(pinned), **{u: 1 for u in forced}}


def _pin(end: tuple, forced: set[int]) -> tuple:
    return ("fixed", 1) if end[0] == "var" and end[1] in forced else end


def note_forced(graph: PrecisionGraph, ctx: PlanContext) -> None:
    """The reason of every op the user forced and that now runs low."""
    for name, why in forced_low(graph, ctx).items():
        op = graph.ops[name]
        if op.precision == ctx.low_dtype:
            op.reason = f"{op.op_class}: {FORCED} ({why}), in {short(ctx.low_dtype)}"


def runtime_cast(graph: PrecisionGraph, t: Tensor, ctx: PlanContext) -> bool:
    """A constant over ``init_max_bytes``: keep its FP32 initializer and cast it at run time."""
    rules: UserRules | None = getattr(ctx, "user_rules", None)
    return (t.kind == CONSTANT and rules is not None and rules.init_max_bytes is not None
            and graph.nbytes(t) > rules.init_max_bytes)


__all__ = ["kept_by_name", "UserRules", "apply_user_rules", "forced_low", "note_forced", "pin_forced", "reduction_depth",
           "runtime_cast"]
