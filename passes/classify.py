"""Classify: give every op its class and every port its role.

Rewrite cases:

1. An op the registry knows gets the registry's class (allow/infer/clear/deny);
   an op it does not know gets class ``unknown`` and stays FP32.
2. User overrides win over the registry: ``ctx.allow`` / ``ctx.deny`` name op types
   or canonical ops, ``ctx.deny_nodes`` names single ops.
3. Port groups (from the importer: ONNX schemas or aten schemas) become roles:
   a group with an output or with two or more ports is a ``unit`` group (it takes the
   op's precision), and so is one whose type parameter types an output the node leaves
   out (Attention's V with no ``present_value``); a single input alone in its group,
   with a type parameter of its own, accepts ``any`` float dtype; a
   port whose schema type is one concrete dtype, or whose group cannot take both FP32
   and the low dtype, is ``fixed``; non-float ports are ``other``.
   An op the registry does not know but the user allows (``--allow MyOp``) is planned
   like a known op: its float ports form units (not ``fixed``, which left it "no float data").
4. Registry FP32-only ports (normalisation statistics, ...) become ``fixed``; registry
   ``unit_inputs`` (RMSNormalization's X, whose type inference follows Y) become ``unit``, and so
   does the input of RandomUniformLike, RandomNormalLike, Bernoulli and EyeLike written without a
   ``dtype`` attribute: their output then takes the input's dtype (``_DTYPE_FROM_INPUT``).
5. Control-flow ops (If/Loop/Scan) keep every port ``fixed``: their subgraphs' ops are
   planned on their own, with casts at the subgraph boundary.
6. Each op records the dtype its unit ports had in the source (``source_dtype``).
7. Attribute-dependent numerics (registry ``deny_attrs``): LayerNormalization with
   ``stash_type=0`` computes its statistics in the input dtype, ScatterND with
   ``reduction='add'`` accumulates in it, so they are ``deny``; linear/cubic Resize computes
   bounded weighted sums (``infer_attrs``), so it is ``infer`` where nearest is ``clear``.
8. An op whose schema (at the model's opset) does not accept the low dtype for its
   unit ports, or that the registry marks FP32-only (no runtime kernel), is marked
   ``forbid_low`` with that reason.
9. A ReduceSum over at most ``SMALL_SUM`` elements of static extent (a mixture of experts'
   top-k combination, two stacked branches) is ``infer``: it can exceed its largest input
   by no more than the chain of Adds it stands for, which are infer. Larger sums stay deny.
"""

from __future__ import annotations

from amp_compiler.dtypes import FLOAT32, short
from amp_compiler.ir import ANY, FIXED, OTHER, UNIT, Op, PrecisionGraph
from collections import Counter
from operator import attrgetter
from math import prod

from amp_compiler.registry import ALLOW, DEFAULT_REGISTRY, DENY, INFER, UNKNOWN, OpDef

from .base import Pass, PassResult, PlanContext, check, snapshot
from .user_rules import apply_user_rules

_CONVERTIBLE = frozenset({"float32", "float16", "bfloat16"})
#: rule 9: sums over at most this many elements are as safe as the Adds they stand for
SMALL_SUM = 8
#: ops whose output dtype is their input's where no ``dtype`` attribute says otherwise (rule 4): an input
#: planned FP16 had made a FP32 RandomUniformLike write FP16, and the converted model failed ONNX's check
_DTYPE_FROM_INPUT = frozenset({"RandomUniformLike", "RandomNormalLike", "Bernoulli", "EyeLike"})
_DECIDES = ("op_class", "reason", "input_roles", "output_roles", "tensor_core", "forbid_low", "source_dtype")


class ClassifyPass(Pass):
    name = "classify"

    def __init__(self) -> None:
        self._decided: tuple[PrecisionGraph, dict] | None = None  # the roles ``call`` worked out, per kind

    def ensures(self, graph: PrecisionGraph, ctx: PlanContext) -> None:
        """Every op has a class and a role per port. After ``call``, the roles are checked where they
        were worked out, once per kind of op (``_assign_roles``' memo: a kind's key holds its port
        dtypes, one per port), and the classes in C; on any other graph, op by op."""
        decided, self._decided = self._decided, None
        if decided is not None and decided[0] is graph and None not in map(_OP_CLASS, graph.ops.values()):
            bad = [f"{key[_KEY_OP_TYPE]} ({len(key[_KEY_INPUTS])} inputs, {len(key[_KEY_OUTPUTS])} outputs)"
                   for key, (ins, outs, *_) in decided[1].items()
                   if len(ins) != len(key[_KEY_INPUTS]) or len(outs) != len(key[_KEY_OUTPUTS])]
        else:
            bad = _unclassified_ports(graph)
        check(self.name, "ensures", bad, "every op has a class and a role per port")

    def call(self, graph: PrecisionGraph, ctx: PlanContext) -> PassResult:
        registry = ctx.registry or DEFAULT_REGISTRY
        fresh = _unclassified(graph)
        before = None if fresh else snapshot(graph, *_DECIDES)
        counts: dict[str, int] = {}
        roles: dict[tuple, tuple] = {}  # what _assign_roles decided, per everything it reads
        self._decided = (graph, roles)
        reasons: dict[int, str] = {}  # each registry row's reason, written once (rows by identity)
        dtype_of = {name: t.dtype for name, t in graph.tensors.items()}  # each port's dtype, one lookup
        dtype_of[""] = None  # an absent optional port
        for op in graph.ops.values():
            if op.inserted:
                continue
            row = registry.by_canonical.get(op.canonical) if op.canonical else None
            op.op_class, op.reason = _class_of(op, row, ctx, reasons)
            if op.canonical == "reduce_sum" and op.op_class == DENY and op.reason == _registry_reason(row):
                op.op_class, op.reason = _small_sum(graph, op) or (op.op_class, op.reason)
            op.tensor_core = bool(row and row.tensor_core)
            _assign_roles(dtype_of, op, row, ctx, roles)
            counts[op.op_class] = counts.get(op.op_class, 0) + 1
        details = ", ".join(f"{counts[c]} {c}" for c in sorted(counts)) + apply_user_rules(graph, ctx)
        modified = bool(counts) if fresh else snapshot(graph, *_DECIDES) != before
        return PassResult(graph, modified, details)


def _unclassified(graph: PrecisionGraph) -> bool:
    """Whether no op has a class yet (a graph fresh from an importer): then classifying any op changes
    the graph, and no before/after snapshot of every op is needed to say so."""
    return not any(map(attrgetter("op_class"), graph.ops.values()))


def _unclassified_ports(graph: PrecisionGraph) -> list[str]:
    """Source ops (not inserted by a pass) without a class or a role per port."""
    return [op.name for op in graph.ops.values() if not op.inserted and (
        op.op_class is None or len(op.input_roles) != len(op.inputs) or len(op.output_roles) != len(op.outputs))]


_OP_CLASS = attrgetter("op_class")


def _class_of(op: Op, row: OpDef | None, ctx: PlanContext, reasons: dict[int, str]) -> tuple[str, str]:
    if op.name in ctx.deny_nodes:  # the fallback names its own (amp_compiler/fallback.py)
        return DENY, (ctx.deny_node_reasons or {}).get(op.name, "deny: node named by the user (--deny-node)")
    if ctx.deny or ctx.allow:  # the op's names are built only when the user named op types
        names = {op.op_type, op.canonical or "", f"{op.domain}::{op.op_type}" if op.domain else op.op_type}
        if names & ctx.deny:
            return DENY, "deny: op type named by the user (--deny)"
        if names & ctx.allow:
            return ALLOW, "allow: op type named by the user (--allow)"
    if row is None:
        domain = f"{op.domain}::" if op.domain else ""
        return UNKNOWN, f"unknown op {domain}{op.op_type}: not in the registry, kept FP32"
    for attr, values, why in row.deny_attrs:
        if op.attrs.get(attr) in values:
            return DENY, f"deny: {why}"
    for attr, values, why in row.infer_attrs:
        if op.attrs.get(attr) in values:
            return INFER, f"infer: {why}"
    reason = reasons.get(id(row))
    if reason is None:
        reason = reasons[id(row)] = _registry_reason(row)
    return row.op_class, reason


def _registry_reason(row: OpDef | None) -> str | None:
    return None if row is None else f"{row.op_class}: {row.note}" if row.note else row.op_class


def _small_sum(graph: PrecisionGraph, op: Op) -> tuple[str, str] | None:
    """Rule 9: (infer, reason) for a sum over at most ``SMALL_SUM`` elements, else None.

    The reduced extent is what the input's dims have that the output's lack (dims of 1 left
    out, so keepdims does not matter); every such dim must be a number."""
    if not op.inputs or not op.inputs[0] or not op.outputs or not op.outputs[0]:
        return None
    shape_in, shape_out = graph.tensors[op.inputs[0]].shape, graph.tensors[op.outputs[0]].shape
    if shape_in is None or shape_out is None:
        return None
    have, keep = Counter(d for d in shape_in if d != 1), Counter(d for d in shape_out if d != 1)
    if None in have or keep - have:
        return None
    removed = list((have - keep).elements())
    if not removed or not all(isinstance(d, int) for d in removed) or prod(removed) > SMALL_SUM:
        return None  # nothing seen reduced (shapes that say nothing): the registry's class
    n = prod(removed)
    return INFER, (f"infer: a sum of {n} elements, as safe as the {n - 1} Adds it stands for "
                   f"(sums of more than {SMALL_SUM} stay deny)")


def _assign_roles(dtype_of: dict[str, str | None], op: Op, row: OpDef | None, ctx: PlanContext,
                  memo: dict[tuple, tuple]) -> None:
    """Set the op's port roles, ``forbid_low`` and ``source_dtype`` (rules 3-6 and 8). They depend
    only on the key below, so ops alike (a graph of repeated layers) are worked out once in ``memo``
    (rows and port groups are shared objects alive for the pass: keyed by identity, as a frozen
    dataclass hashes field by field in Python). ``dtype_of``: tensor name -> dtype, "" -> None."""
    known = row is not None or op.op_class == ALLOW  # an unknown op the user allows: plan its float ports
    in_dtypes = tuple(map(dtype_of.__getitem__, op.inputs))  # read once per op
    out_dtypes = tuple(map(dtype_of.__getitem__, op.outputs))
    key = (id(row), known, tuple(map(id, op.port_groups)), in_dtypes, out_dtypes, op.forbid_low, op.op_type,
           ctx.low_dtype, op.op_type in _DTYPE_FROM_INPUT and "dtype" not in op.attrs)
    decided = memo.get(key)  # ClassifyPass.ensures reads the key's port dtypes and op type (_KEY_*)
    if decided is None:
        decided = memo[key] = _roles(op, row, ctx, known, in_dtypes, out_dtypes)
    in_roles, out_roles, op.forbid_low, op.source_dtype = decided
    op.input_roles, op.output_roles = list(in_roles), list(out_roles)


_KEY_INPUTS, _KEY_OUTPUTS, _KEY_OP_TYPE = 3, 4, 6  # positions in _assign_roles' memo key


def _roles(op: Op, row: OpDef | None, ctx: PlanContext, known: bool, in_dtypes: tuple, out_dtypes: tuple
           ) -> tuple[tuple, tuple, str | None, str | None]:
    """(input roles, output roles, forbid_low, source_dtype) of ``op`` (``_assign_roles``)."""

    def dtype_in(port: int) -> str | None:
        return in_dtypes[port] if port < len(in_dtypes) else None

    def dtype_out(port: int) -> str | None:
        return out_dtypes[port] if port < len(out_dtypes) else None

    in_roles = [OTHER] * len(op.inputs)
    out_roles = [OTHER] * len(op.outputs)
    control_flow = row is not None and row.canonical == "control_flow"
    refused = []  # unit groups whose schema has no low dtype: (group, float inputs, float outputs)
    for group in op.port_groups:
        floats_in = [i for i in group.inputs if dtype_in(i) in _CONVERTIBLE]
        floats_out = [o for o in group.outputs if dtype_out(o) in _CONVERTIBLE]
        if not floats_in and not floats_out:
            continue
        can_switch = FLOAT32 in group.allowed and ctx.low_dtype in group.allowed
        if control_flow or group.fixed_type or not known:
            role = FIXED
        elif not group.outputs and len(group.inputs) == 1 and not group.binds_output:
            role = ANY if can_switch else FIXED
        else:
            role = UNIT
            if not can_switch:
                refused.append((group, floats_in, floats_out))
        for i in floats_in:
            in_roles[i] = role
        for o in floats_out:
            out_roles[o] = role
    if not op.port_groups:
        # No schema (e.g. com.microsoft ops): float ports of a known op share one unit.
        default = UNIT if known and not control_flow else FIXED
        in_roles = [default if dtype_in(i) in _CONVERTIBLE else OTHER for i in range(len(op.inputs))]
        out_roles = [default if dtype_out(o) in _CONVERTIBLE else OTHER for o in range(len(op.outputs))]
    if row is not None:  # registry FP32-only ports, and inputs the schema's inference ties to the output
        tied = (*row.unit_inputs, 0) if op.op_type in _DTYPE_FROM_INPUT and "dtype" not in op.attrs else row.unit_inputs
        for i in tied:
            if i < len(in_roles) and in_roles[i] == ANY and not control_flow:
                in_roles[i] = UNIT
        for i in row.fp32_inputs:
            if i < len(in_roles) and in_roles[i] != OTHER:
                in_roles[i] = FIXED
        for o in row.fp32_outputs:
            if o < len(out_roles) and out_roles[o] != OTHER:
                out_roles[o] = FIXED
    forbid_low = op.forbid_low
    for group, ins, outs in refused:  # only where the registry left the ports in the unit
        if forbid_low is None and (any(in_roles[i] == UNIT for i in ins) or any(out_roles[o] == UNIT for o in outs)):
            later = dict(group.later_opsets).get(ctx.low_dtype)
            forbid_low = (f"the {op.op_type} schema (opset {group.param.rpartition('@v')[2]}) "
                          f"does not accept {short(ctx.low_dtype)} for {group.param.partition('@')[0]}"
                          + (f" (opset {later} does: re-export at it)" if later else ""))
    if row is not None and row.fp32_only and forbid_low is None:
        forbid_low = row.fp32_only
    unit_dtypes = [dtype_out(o) for o, r in enumerate(out_roles) if r == UNIT] + \
                  [dtype_in(i) for i, r in enumerate(in_roles) if r == UNIT]
    return tuple(in_roles), tuple(out_roles), forbid_low, unit_dtypes[0] if unit_dtypes else None
