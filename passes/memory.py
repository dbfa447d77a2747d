"""Predicted memory of a plan: stored weights plus the peak of live activations.

Weights: one stored copy per dtype the plan's readers use (``PlanEnergy.weight_bytes``).
Activations: a liveness scan over the ops in topological order; a tensor is allocated
by its producer and freed after its last reader, views share their source's storage,
graph inputs live until their last reader and graph outputs to the end. A tensor's dtype
under a plan is its producer unit's label (or its fixed dtype). Casts the plan adds are
transient and not counted. The planner's objective uses the sum of unit outputs instead
of this peak (a sum is modular, a peak is not; see ``docs/architecture.md``).
"""

from __future__ import annotations

from amp_compiler.dtypes import FLOAT32, is_float, itemsize
from amp_compiler.ir import GRAPH_INPUT, UNIT, PrecisionGraph
from amp_compiler.registry import DEFAULT_REGISTRY

from .costs import PlanEnergy

__all__ = ["Liveness", "plan_memory"]


class Liveness:
    """When each activation is allocated and freed: computed once per graph, priced per plan."""

    def __init__(self, graph: PrecisionGraph) -> None:
        self.graph = graph
        ops = [op for op in graph.ops.values() if not op.inserted]
        position = {op.name: i for i, op in enumerate(ops)}
        end = len(ops)

        def last_use(name: str, born: int) -> int:
            t = graph.tensors[name]
            if t.is_graph_output:
                return end
            return max([born, *(position.get(c, end) for c, _ in t.consumers)])

        #: (tensor, allocated before op i, freed after op j)
        self.spans = [(n, 0, last_use(n, 0)) for n in graph.inputs if graph.tensors[n].kind == GRAPH_INPUT]
        for i, op in enumerate(ops):
            row = DEFAULT_REGISTRY.by_canonical.get(op.canonical) if op.canonical else None
            if row is None or row.traffic != "alias":  # a view holds no storage of its own
                self.spans += [(n, i, last_use(n, i)) for n in op.outputs if n]
        self.n_ops = end
        #: per span: (born, dies, the producer whose unit label sizes it or None, numel, own bytes)
        self._sized = []
        for name, born, dies in self.spans:
            t = graph.tensors[name]
            op = graph.ops.get(t.producer) if t.producer is not None else None
            unit_port = (op is not None and is_float(t.dtype) and bool(op.output_roles)
                         and op.output_roles[t.producer_port] == UNIT)
            self._sized.append((born, dies, t.producer if unit_port else None, graph.numel(t),
                                float(graph.nbytes(t, t.dtype))))

    def peak(self, energy: PlanEnergy, plan: dict[int, int]) -> float:
        unit_of = {name: u for u, names in energy.unit_ops.items() for name in names}
        size_low, size32 = itemsize(energy.low), itemsize(FLOAT32)
        delta = [0.0] * (self.n_ops + 2)
        for born, dies, producer, numel, own in self._sized:
            u = unit_of.get(producer) if producer is not None else None
            b = own if u is None else float(numel * (size_low if plan[u] else size32))
            delta[born] += b
            delta[dies + 1] -= b
        live = peak = 0.0
        for d in delta:
            live += d
            if live > peak:  # max() as a call per op costs more than the walk
                peak = live
        return peak


def plan_memory(graph: PrecisionGraph, energy: PlanEnergy, plan: dict[int, int],
                liveness: Liveness | None = None) -> float:
    """Predicted bytes: weights the plan stores plus peak live activations (module docstring)."""
    liveness = liveness or Liveness(graph)
    return energy.fixed_memory + energy.weight_bytes(plan) + liveness.peak(energy, plan)
