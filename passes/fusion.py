"""Fusion groups: which ops the deployment runtime runs as one kernel.

Groups depend on the graph and the runtime profile (``cost_model/runtime.py``), never on
precision labels, so they are formed once, before planning, and the planner's energy
prices them (``passes/costs.py``): memory traffic only at group boundaries, one launch per
group, a cast inside a group converts in registers. See ``docs/architecture.md``,
"Runtime profiles".

Rules, walking the ops in topological order; an op joins the group of one producer when:

1. both are in one scope and the runtime fuses the edge (producer kind -> consumer kind;
   a view takes the kind of what it views and joins its producer's group whenever the
   runtime fuses anything);
2. the tensor between them is not a graph output (it must reach memory anyway);
3. the group stays under the profile's caps (pointwise ops, tensor-core ops per kernel);
4. the group stays convex: every other input of the op comes from the group or from an
   op earlier than every member of the group, so no path leaves the group and re-enters
   it (a fused kernel cannot wait for a kernel that waits for it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from amp_compiler.ir import Op, PrecisionGraph
from amp_compiler.registry import CLEAR
from cost_model.runtime import RuntimeProfile

__all__ = ["FusionGroups", "form_groups", "op_kind"]

_FLOPS_KIND = {"reduction": "reduction", "softmax": "softmax", "norm": "norm", "pool": "reduction"}


def op_kind(op: Op, registry) -> str:
    """The op's kind for fusion rules: gemm, pointwise, reduction, norm, softmax, movement, alias, other."""
    if op.tensor_core:
        return "gemm"
    row = registry.by_canonical.get(op.canonical) if op.canonical else None
    if row is None:
        return "other"
    if row.traffic == "alias":
        return "alias"
    if op.canonical == "cast":
        return "pointwise"
    if row.flops in _FLOPS_KIND:
        return _FLOPS_KIND[row.flops]
    if row.op_class == CLEAR:
        return "movement" if row.flops == "elementwise" else "other"
    return "pointwise" if row.flops == "elementwise" else "other"


@dataclass
class FusionGroups:
    """op name -> group id, and per group its members in topological order."""

    group_of: dict[str, int] = field(default_factory=dict)
    members: dict[int, list[str]] = field(default_factory=dict)

    def same_group(self, a: str | None, b: str | None) -> bool:
        return a is not None and b is not None and self.group_of.get(a, -1) == self.group_of.get(b, -2)

    def __len__(self) -> int:
        return len(self.members)


def form_groups(graph: PrecisionGraph, runtime: RuntimeProfile, registry) -> FusionGroups:
    """Group the graph's ops into the kernels ``runtime`` would run (see module docstring)."""
    groups = FusionGroups()
    index: dict[str, int] = {}
    kind: dict[str, str] = {}
    first: dict[int, int] = {}  # group -> topological index of its first member
    pointwise: dict[int, int] = {}
    gemms: dict[int, int] = {}
    fuses_anything = bool(runtime.fused_edges)
    for i, op in enumerate(graph.ops.values()):
        index[op.name] = i
        k = kind[op.name] = op_kind(op, registry)
        target = _joinable(graph, op, k, kind, groups, index, first, pointwise, gemms, runtime) \
            if fuses_anything and not op.inserted else None
        if target is None:
            target = len(groups.members)
            groups.members[target] = []
            first[target], pointwise[target], gemms[target] = i, 0, 0
        else:
            kind[op.name] = kind[op.name] if k != "alias" else _view_kind(graph, op, kind)
        groups.group_of[op.name] = target
        groups.members[target].append(op.name)
        pointwise[target] += k == "pointwise"
        gemms[target] += k == "gemm"
    return groups


def _view_kind(graph: PrecisionGraph, op: Op, kind: dict[str, str]) -> str:
    src = graph.tensors[op.inputs[0]] if op.inputs and op.inputs[0] else None
    return kind.get(src.producer, "alias") if src is not None and src.producer else "alias"


def _joinable(graph, op, k, kind, groups, index, first, pointwise, gemms, runtime) -> int | None:
    for name in op.inputs:
        if not name:
            continue
        t = graph.tensors[name]
        prod = t.producer
        if prod is None or t.is_graph_output or graph.ops[prod].scope != op.scope or prod not in groups.group_of:
            continue
        g = groups.group_of[prod]
        pk = kind[prod]
        if k != "alias" and not runtime.fuses(pk, k):
            continue
        if k == "pointwise" and pointwise[g] >= runtime.max_pointwise:
            continue
        if k == "gemm" and gemms[g] >= runtime.max_gemms:
            continue
        if _convex(graph, op, g, groups, index, first):
            return g
    return None


def _convex(graph, op, g, groups, index, first) -> bool:
    for name in op.inputs:
        if not name:
            continue
        prod = graph.tensors[name].producer
        if prod is None or groups.group_of.get(prod) == g:
            continue
        if index.get(prod, -1) >= first[g]:
            return False
    return True
