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

from amp_compiler.dtypes import FLOAT32, is_float
from amp_compiler.ir import GRAPH_INPUT, UNIT, PrecisionGraph
from amp_compiler.registry import DEFAULT_REGISTRY

from .costs import PlanEnergy

__all__ = ["plan_memory"]


def plan_memory(graph: PrecisionGraph, energy: PlanEnergy, plan: dict[int, int]) -> float:
    """Predicted bytes: weights the plan stores plus peak live activations (module docstring)."""
    return energy.fixed_memory + energy.weight_bytes(plan) + _peak_activations(graph, energy, plan)


def _peak_activations(graph: PrecisionGraph, energy: PlanEnergy, plan: dict[int, int]) -> float:
    ops = [op for op in graph.ops.values() if not op.inserted]
    unit_of = {name: u for u, names in energy.unit_ops.items() for name in names}
    position = {op.name: i for i, op in enumerate(ops)}
    end = len(ops)

    def nbytes(name: str) -> float:
        t = graph.tensors[name]
        dtype = t.dtype
        if t.producer in unit_of and is_float(dtype):
            op = graph.ops[t.producer]
            if op.output_roles and op.output_roles[t.producer_port] == UNIT:
                dtype = energy.low if plan[unit_of[t.producer]] else FLOAT32
        return float(graph.nbytes(t, dtype))

    def last_use(name: str) -> int:
        t = graph.tensors[name]
        if t.is_graph_output:
            return end
        return max((position.get(c, end) for c, _ in t.consumers), default=-1)

    frees: dict[int, float] = {}
    live = 0.0
    for name in graph.inputs:
        if graph.tensors[name].kind == GRAPH_INPUT:
            b = nbytes(name)
            live += b
            at = max(last_use(name), 0)
            frees[at] = frees.get(at, 0.0) + b
    peak = live
    for i, op in enumerate(ops):
        row = DEFAULT_REGISTRY.by_canonical.get(op.canonical) if op.canonical else None
        if row is None or row.traffic != "alias":  # a view holds no storage of its own
            for name in op.outputs:
                if name:
                    b = nbytes(name)
                    live += b
                    at = max(last_use(name), i)
                    frees[at] = frees.get(at, 0.0) + b
        peak = max(peak, live)
        live -= frees.pop(i, 0.0)
    return peak
