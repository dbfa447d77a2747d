"""User rules: node selection by pattern, forced op types, reduction depth, large initializers, custom ops.

The options users bring from ModelOpt AutoCast and ORT's float16 tool (``docs/migrating.md``),
kept apart from the core passes; each hooks in where it acts (``docs/architecture.md``, Passes):

1. ``apply_user_rules`` runs at the end of classify. An op whose name matches an ``include_nodes``
   pattern, or whose type is in ``force_ops``, is forced into the low dtype where legal
   (a deny op becomes a candidate; the schema, a missing kernel and out-of-range weights
   still keep it FP32); otherwise one matching an ``exclude_nodes`` pattern is deny.
   Include wins over exclude, as in AutoCast. Patterns match the start of the node name
   (``re.match``, AutoCast's rule). Forced ops seed the propagate pass's region.
2. ``max_reduction_depth``: an op that accumulates over more than N elements (MatMul/Gemm K,
   Conv Cin/group x kernel, attention head size, a Reduce* over its reduced elements) may
   not take the low dtype. Shapes only: no data needed.
3. ``pin_forced`` (called by the convert pass) re-solves the plan with forced units fixed
   low; ``note_forced`` gives them their reason.
4. ``runtime_cast`` (called by the casts pass and the energy): a constant over
   ``init_max_bytes`` keeps its FP32 initializer and is cast at run time, never folded.
5. ``custom_registry``: ops of a plugin library classified from a user table.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field, replace

from amp_compiler.dtypes import short
from amp_compiler.flops import gemm_dims
from amp_compiler.ir import CONSTANT, Op, PrecisionGraph, Tensor
from amp_compiler.registry import CLASSES, DEFAULT_REGISTRY, DENY, INFER, UNKNOWN, OpDef, Registry

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


def apply_user_rules(graph: PrecisionGraph, ctx: PlanContext) -> str:
    """Run by classify once every op has its class; returns what it did for the pass record."""
    rules: UserRules | None = getattr(ctx, "user_rules", None)
    if rules is None or not rules.active:
        return ""
    forced, excluded, deep = set(), 0, 0
    for op in graph.ops.values():
        if op.inserted:
            continue
        if (why := _forced_by(op, rules)) is not None:
            if op.op_class != UNKNOWN:  # an unknown op's ports are fixed: nothing to force
                op.force_low = why
                if op.op_class == DENY:
                    op.op_class = INFER
                op.reason = f"{op.op_class}: {FORCED} ({why})"
                forced.add(op.name)
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
    ctx.force_low_nodes = frozenset(ctx.force_low_nodes) | forced
    return f"; user rules: {len(forced)} forced low, {excluded} excluded by pattern, {deep} over the reduction depth"


def _forced_by(op: Op, rules: UserRules) -> str | None:
    if op.op_type in rules.force_ops or (op.domain and f"{op.domain}::{op.op_type}" in rules.force_ops):
        return f"--force-op {op.op_type}"
    pattern = rules.match("include_nodes", op.name)
    return None if pattern is None else f"--include-nodes {pattern!r}"


def reduction_depth(graph: PrecisionGraph, op: Op) -> int | None:
    """How many products or elements one output element accumulates; None when unknown."""
    if op.canonical in ("matmul", "gemm", "gemm_fast_gelu"):
        dims = gemm_dims(op, graph)
        return dims[3] if dims else None
    if op.canonical in ("conv", "conv_transpose") and len(op.inputs) > 1:
        w = graph.concrete_shape(op.inputs[1]) if op.inputs[1] else None
        return math.prod(w[1:]) if w and len(w) > 2 else None
    if op.canonical == "attention":
        q = graph.concrete_shape(op.inputs[0]) if op.inputs and op.inputs[0] else None
        return q[-1] if q else None
    if op.canonical and op.canonical.startswith("reduce_") and op.inputs and op.inputs[0] and op.outputs:
        n_in, n_out = graph.numel(op.inputs[0]), graph.numel(op.outputs[0])
        return n_in // max(n_out, 1)
    return None


def pin_forced(graph: PrecisionGraph, energy, plan: dict[int, int], solve=None) -> dict[int, int]:
    """``plan`` with every forced unit low; with ``solve``, the other units re-solved around them."""
    forced = {op.unit for op in graph.ops.values() if op.force_low and op.unit is not None}
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


def note_forced(graph: PrecisionGraph, low_dtype: str) -> None:
    """The reason of every op the user forced and that now runs low."""
    for op in graph.ops.values():
        if op.force_low and op.precision == low_dtype:
            op.reason = f"{op.op_class}: {FORCED} ({op.force_low}), in {short(low_dtype)}"


def runtime_cast(graph: PrecisionGraph, t: Tensor, ctx: PlanContext) -> bool:
    """A constant over ``init_max_bytes``: keep its FP32 initializer and cast it at run time."""
    rules: UserRules | None = getattr(ctx, "user_rules", None)
    return (t.kind == CONSTANT and rules is not None and rules.init_max_bytes is not None
            and graph.nbytes(t) > rules.init_max_bytes)


# -- custom-op tables --------------------------------------------------------------------------------

_OP_KEYS = {"op_type", "domain", "class", "tensor_core", "fp32_inputs", "fp32_outputs", "note"}


def load_custom_ops(path: str) -> list[OpDef]:
    """Rows of a custom-op table (JSON); ``ValueError`` says ``<file>: <where>: <reason>`` in one line.

    ``{"ops": [{"op_type": "MyGelu", "domain": "my.plugins", "class": "infer",
    "tensor_core": false, "fp32_inputs": [1], "fp32_outputs": []}]}``: ``class`` is one of
    allow/infer/clear/deny; the other keys but ``op_type`` are optional.
    """
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the custom-op table: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON: {exc}") from None
    return custom_ops_from_dict(data, path)


def custom_ops_from_dict(data: object, source: str = "custom ops") -> list[OpDef]:
    if not isinstance(data, dict) or not isinstance(data.get("ops"), list):
        raise ValueError(f"{source}: expected an object with a list \"ops\"")
    rows = []
    for i, entry in enumerate(data["ops"]):
        where = f"{source}: ops[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: expected an object, got {type(entry).__name__}")
        if unknown := sorted(set(entry) - _OP_KEYS):
            raise ValueError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(_OP_KEYS))})")
        op_type, domain, op_class = entry.get("op_type"), entry.get("domain", ""), entry.get("class", INFER)
        if not isinstance(op_type, str) or not op_type or not isinstance(domain, str):
            raise ValueError(f"{where}: \"op_type\" (and \"domain\", if given) must be non-empty strings")
        if op_class not in CLASSES or op_class == UNKNOWN:
            raise ValueError(f"{where}: \"class\" must be one of allow, infer, clear, deny, got {op_class!r}")
        if not isinstance(entry.get("tensor_core", False), bool):
            raise ValueError(f"{where}: \"tensor_core\" must be true or false")
        ports = {}
        for key in ("fp32_inputs", "fp32_outputs"):
            value = entry.get(key, [])
            if not isinstance(value, list) or not all(isinstance(p, int) and not isinstance(p, bool) and p >= 0
                                                      for p in value):
                raise ValueError(f"{where}: \"{key}\" must be a list of port indices")
            ports[key] = tuple(value)
        name = f"{domain}::{op_type}" if domain else op_type
        rows.append(OpDef(f"custom:{name}", op_class, onnx=(name,), tensor_core=entry.get("tensor_core", False),
                          flops="matmul" if entry.get("tensor_core") else "elementwise",
                          note=str(entry.get("note", f"from the custom-op table {source}")), **ports))
    return rows


def custom_registry(rows: list[OpDef], base: Registry = DEFAULT_REGISTRY) -> Registry:
    """``base`` plus ``rows``; a row for an op the base knows replaces it (the user's table wins)."""
    reg = Registry(dict(base.by_canonical), dict(base.by_onnx), dict(base.by_aten))
    for row in rows:
        reg.by_canonical[row.canonical] = row
        domain, _, op = row.onnx[0].rpartition("::")
        reg.by_onnx[(domain, op)] = row
    return reg


__all__ = ["UserRules", "apply_user_rules", "custom_registry", "load_custom_ops", "note_forced", "pin_forced",
           "reduction_depth", "runtime_cast"]
