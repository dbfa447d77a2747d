"""Fusion groups: which ops the deployment runtime runs as one kernel.

Groups depend on the graph and the runtime profile (``cost_model/runtime.py``), never on
precision labels, so they are formed once, before planning, and the planner's energy
prices them (``passes/costs.py``): memory traffic only at group boundaries, one launch per
group, a cast inside a group converts in registers. See ``docs/architecture.md``,
"Runtime profiles".

Rules, walking the ops in a canonical topological order (depth, then name: the groups do
not depend on the order a file lists its nodes in); an op joins one producer's group when:

1. both are in one scope and the runtime fuses the edge (producer kind -> consumer kind;
   a view, or a cast where casts fuse, takes the kind of its input and joins its
   producer's group whenever the runtime fuses anything);
2. the tensor between them is not a graph output (it must reach memory anyway);
3. the group stays under the profile's caps (pointwise ops, tensor-core ops per kernel);
   where the profile fuses pointwise ops only around an anchor (ORT's activation patterns),
   a pointwise-only group without one is split back into single ops at the end;
4. the group stays convex: every other input of the op comes from the group or from an
   op earlier than every member of the group, so no path leaves the group and re-enters
   it (a fused kernel cannot wait for a kernel that waits for it).

Where the profile fuses RMSNorms (``fuses_rms_norm``: ONNX Runtime's SimplifiedLayerNormFusion),
each RMSNorm ``cost_model/norm_pattern.py`` finds is one group of its own, of kind ``norm``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import itemgetter
from typing import TYPE_CHECKING

from .norm_pattern import RmsNorm, rms_norms
from .runtime import RuntimeProfile

if TYPE_CHECKING:  # the cost model does not import the IR at run time (docs/architecture.md, "Cost model")
    from amp_compiler.ir import Op, PrecisionGraph

CLEAR = "clear"  # amp_compiler.registry.CLEAR

__all__ = ["FusionGroups", "form_groups", "op_kind"]

_FLOPS_KIND = {"reduction": "reduction", "softmax": "softmax", "norm": "norm", "pool": "reduction"}


def op_kind(op: Op, registry) -> str:
    """The op's kind for fusion rules: gemm, pointwise, reduction, norm, softmax, movement, alias,
    cast (a cast already in the model: it joins its producer's kernel where casts fuse), other."""
    if op.tensor_core:
        return "gemm"
    row = registry.by_canonical.get(op.canonical) if op.canonical else None
    if row is None:
        return "other"
    if row.traffic == "alias":
        return "alias"
    if op.canonical == "cast":
        return "cast"
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
    norms: dict[int, RmsNorm] = field(default_factory=dict)  # group -> the fused RMSNorm it runs

    def same_group(self, a: str | None, b: str | None) -> bool:
        return a is not None and b is not None and self.group_of.get(a, -1) == self.group_of.get(b, -2)

    def __len__(self) -> int:
        return len(self.members)


def form_groups(graph: PrecisionGraph, runtime: RuntimeProfile, registry, rsqrt_form: bool = True) -> FusionGroups:
    """Group the graph's ops into the kernels ``runtime`` would run (see module docstring);
    ``rsqrt_form``: RMSNorms in the Reciprocal form fuse too (the ONNX emitter rewrites them)."""
    groups = FusionGroups()
    norm_of = {name: norm for norm in (rms_norms(graph, rsqrt_form) if runtime.fuses_rms_norm else ())
               for name in norm.members}
    index: dict[str, int] = {}
    kind: dict[str, str] = {}
    first: dict[int, int] = {}  # group -> topological index of its first member
    pointwise: dict[int, int] = {}
    gemms: dict[int, int] = {}
    fuses_anything = bool(runtime.fused_edges)
    for i, op in enumerate(_canonical_order(graph)):
        index[op.name] = i
        k = kind[op.name] = op_kind(op, registry)
        norm = norm_of.get(op.name)
        if norm is not None:  # one fused RMSNorm kernel, whatever its ops' kinds
            k = kind[op.name] = "norm"
            target = groups.group_of.get(norm.members[0])
        else:
            target = _joinable(graph, op, k, kind, groups, index, first, pointwise, gemms, runtime) \
                if fuses_anything and not op.inserted else None
        if target is None:
            target = len(groups.members)
            groups.members[target] = []
            first[target], pointwise[target], gemms[target] = i, 0, 0
            if norm is not None:
                groups.norms[target] = norm
        elif norm is None:
            kind[op.name] = k if k not in ("alias", "cast") else _view_kind(graph, op, kind)
        groups.group_of[op.name] = target
        groups.members[target].append(op.name)
        pointwise[target] += k == "pointwise"
        gemms[target] += k == "gemm"
    if runtime.pointwise_anchors:
        _dissolve_unanchored(graph, groups, kind, runtime.pointwise_anchors)
    return groups


def _dissolve_unanchored(graph: PrecisionGraph, groups: FusionGroups, kind: dict[str, str], anchors) -> None:
    """A pattern fuser fuses pointwise ops only around an anchor (an activation): split the
    pointwise-only groups without one back into one kernel per op."""
    new = max(groups.members, default=-1)  # ids handed out from here (no max() per split: quadratic)
    for g, members in list(groups.members.items()):
        if len(members) < 2 or any(kind[n] not in ("pointwise", "alias", "cast") for n in members):
            continue
        if any(graph.ops[n].canonical in anchors for n in members):
            continue
        for n in members[1:]:
            new += 1
            groups.members[new] = [n]
            groups.group_of[n] = new
        groups.members[g] = members[:1]


def _canonical_order(graph: PrecisionGraph) -> list[Op]:
    """A topological order independent of the order the file lists its nodes in: by depth
    (longest path from the inputs), then name; so a model and a shuffled copy fuse alike."""
    tensors = graph.tensors
    level: dict[str, int] = {}
    for op in graph.ops.values():  # already topological
        deepest = 0
        for n in op.inputs:
            producer = tensors[n].producer if n else None
            if producer:
                deepest = max(deepest, level.get(producer, 0))
        level[op.name] = deepest + 1
    ops = graph.ops
    return [ops[name] for name, _ in sorted(level.items(), key=itemgetter(1, 0))]  # by (level, name)


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
        if g in groups.norms:
            continue  # a fused RMSNorm takes nothing else
        pk = kind[prod]
        if k == "cast" and not runtime.fuse_casts:
            continue  # a cast kernel of its own (ONNX Runtime, eager)
        if k not in ("alias", "cast") and not runtime.fuses(pk, k):
            continue
        if k == "pointwise" and pointwise[g] >= runtime.max_pointwise:
            continue
        if pk == "gemm" and runtime.epilogue_ops and op.canonical not in runtime.epilogue_ops:
            continue
        if k == "pointwise" and gemms[g] and pointwise[g] >= runtime.max_epilogue:
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
