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
    first: list[int] = []  # group -> topological index of its first member
    pointwise: list[int] = []
    gemms: list[int] = []
    joining = _joining_kinds(runtime)
    group_of, members = groups.group_of, groups.members
    for i, op in enumerate(_canonical_order(graph)):
        name = op.name
        index[name] = i
        k = kind[name] = op_kind(op, registry)
        norm = norm_of.get(name) if norm_of else None
        if norm is not None:  # one fused RMSNorm kernel, whatever its ops' kinds
            k = kind[name] = "norm"
            target = group_of.get(norm.members[0])
        else:
            target = _joinable(graph, op, k, kind, groups, index, first, pointwise, gemms, runtime) \
                if k in joining and not op.inserted else None
        if target is None:
            target = len(members)
            members[target] = []
            first.append(i)
            pointwise.append(0)
            gemms.append(0)
            if norm is not None:
                groups.norms[target] = norm
        elif norm is None and (k == "alias" or k == "cast"):
            kind[name] = _view_kind(graph, op, kind)
        group_of[name] = target
        members[target].append(name)
        if k == "pointwise":
            pointwise[target] += 1
        elif k == "gemm":
            gemms[target] += 1
    if runtime.pointwise_anchors:
        _dissolve_unanchored(graph, groups, kind, runtime.pointwise_anchors)
    return groups


def _joining_kinds(runtime: RuntimeProfile) -> frozenset[str]:
    """The kinds of op ``_joinable`` may let join a producer's group on ``runtime`` (none where it fuses
    nothing): a consumer kind of a fused edge, a view, a cast where casts fuse; the others are
    never asked."""
    if not runtime.fused_edges:
        return frozenset()
    return frozenset({consumer for _, consumer in runtime.fused_edges} | {"alias"}
                     | ({"cast"} if runtime.fuse_casts else set()))


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
    (longest path from the inputs), then name; so a model and a shuffled copy fuse alike.
    Each op's depth is handed to its outputs, so an input's producer's depth is one look-up;
    the ops are put in one list per depth, each sorted by name."""
    depth_of: dict[str, int] = {}  # tensor -> depth of its producer
    by_depth: list[list[str]] = []
    get = depth_of.get
    for op in graph.ops.values():  # already topological
        depth = max([get(n, 0) for n in op.inputs], default=0)  # "" (an absent input) is no tensor's
        for n in op.outputs:
            if n:
                depth_of[n] = depth + 1
        if depth == len(by_depth):
            by_depth.append([])
        elif depth > len(by_depth):
            by_depth.extend([] for _ in range(depth + 1 - len(by_depth)))
        by_depth[depth].append(op.name)
    ops = graph.ops
    return [ops[name] for names in by_depth for name in sorted(names)]


def _view_kind(graph: PrecisionGraph, op: Op, kind: dict[str, str]) -> str:
    src = graph.tensors[op.inputs[0]] if op.inputs and op.inputs[0] else None
    return kind.get(src.producer, "alias") if src is not None and src.producer else "alias"


def _joinable(graph, op, k, kind, groups, index, first, pointwise, gemms, runtime) -> int | None:
    """The group of a producer of ``op`` that ``op`` (of kind ``k``, one of ``_joining_kinds``) may join."""
    tensors, ops, group_of, norms = graph.tensors, graph.ops, groups.group_of, groups.norms
    as_view = k == "alias" or k == "cast"  # takes its input's kind: joins whatever fuses anything
    for name in op.inputs:
        if not name:
            continue
        t = tensors[name]
        prod = t.producer
        if prod is None or t.is_graph_output:
            continue
        g = group_of.get(prod)
        if g is None or g in norms or ops[prod].scope != op.scope:
            continue  # a fused RMSNorm takes nothing else
        pk = kind[prod]
        if not as_view and (pk, k) not in runtime.fused_edges:
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
