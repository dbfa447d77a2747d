"""How many times one run of a model runs each subgraph: the cost model's weight on its ops.

A ``Loop`` body runs its trip count (``graph.trip_counts``: the constant ``M`` the file gives),
else the graph's default dim size, as an unknown dim is sized (``default_dim``, 8; the validation
inputs draw 8 iterations too); a ``Scan`` body once per slice of its scan inputs (their scan axis,
sized as any dim). An ``If`` runs one of its two branches, and the cost model cannot tell which: each
is priced at half a run, so the two together cost one run when they cost the same (a merged decoder's
steps with and without the cache), their mean otherwise; priced once each, a merged decoder's predicted
times came out twice its step's. Pricing only the dearer branch would leave the other's decisions
costing nothing. A body inside a body runs as often as both together. docs/architecture.md, "Cost model".
"""

from __future__ import annotations

from typing import Any

__all__ = ["body_runs", "body_runs_note", "scope_repeats"]

_IF_BRANCH_SHARE = 0.5  # one of an If's two branches runs


def scope_repeats(graph: Any) -> dict[str, float]:
    """Scope -> runs of it per run of the model, for every subgraph scope (none for the main graph)."""
    repeats: dict[str, float] = {}
    for scope, (owner, formals, _) in getattr(graph, "scopes", {}).items():  # a parent before its bodies
        op = graph.ops.get(owner)
        if op is None:
            repeats[scope] = 1
            continue
        runs, _ = body_runs(graph, op, formals)
        repeats[scope] = runs * repeats.get(op.scope, 1)
    return repeats


def body_runs(graph: Any, op: Any, formals: list[str]) -> tuple[float, str]:
    """(how many times one run of ``op`` runs its body, and why: ``known`` from the model, ``default``
    where a Loop's trip count or a Scan's length is not fixed, ``branch`` for one of an If's two
    branches (half a run each), ``once`` for any other body)."""
    if op.domain not in ("", "ai.onnx"):
        return 1, "once"
    if op.op_type == "If":
        return _IF_BRANCH_SHARE, "branch"
    if op.op_type == "Loop":
        if op.name in graph.trip_counts:
            return graph.trip_counts[op.name], "known"
        return graph.default_dim(), "default"
    if op.op_type == "Scan" and graph.opsets.get("", 0) >= 9:
        return _scan_length(graph, op, formals)
    return 1, "once"


def _scan_length(graph: Any, op: Any, formals: list[str]) -> tuple[int, str]:
    """A Scan's iterations: its first scan input's length along its scan axis."""
    n_scan = int(op.attrs.get("num_scan_inputs", 0) or 0)
    n_state = len(formals) - n_scan
    if n_scan < 1 or n_state < 0 or n_state >= len(op.inputs) or not op.inputs[n_state]:
        return graph.default_dim(), "default"
    axes = op.attrs.get("scan_input_axes") or [0]
    t = graph.tensors[op.inputs[n_state]]
    axis = int(axes[0])
    if t.shape is None or not -len(t.shape) <= axis < len(t.shape):
        return graph.default_dim(), "default"
    fixed = isinstance(t.shape[axis], int) and t.shape[axis] >= 0
    return graph.concrete_dims(t)[axis], "known" if fixed else "default"


def body_runs_note(graph: Any, shown: int = 3) -> str:
    """The report's line on how many times the Loop and Scan bodies were priced, or '' where the graph
    has none: 'bodies priced per run of the model: loop0 ×10 (its trip count); scan0 ×8 (not fixed ...)'.
    A nested body's count includes its enclosing loops' (``scope_repeats``)."""
    repeats = scope_repeats(graph)
    parts = []
    for scope, (owner, formals, _) in getattr(graph, "scopes", {}).items():
        op = graph.ops.get(owner)
        if op is None or op.op_type not in ("Loop", "Scan"):
            continue
        how = body_runs(graph, op, formals)[1]
        what = ("not fixed in the model: sized --default-dim" if how == "default"
                else "its trip count" if op.op_type == "Loop" else "its length")
        inside = f", inside {graph.scopes[op.scope][0]}" if op.scope in graph.scopes else ""
        parts.append(f"{owner} ×{_count(repeats[scope])} ({what}{inside})")
    if not parts:
        return ""
    more = f"; and {len(parts) - shown} more" if len(parts) > shown else ""
    return "bodies priced per run of the model: " + "; ".join(parts[:shown]) + more


def _count(runs: float) -> str:
    """'1,000' for a whole count, '1.5' for one a branch's half share made fractional."""
    return f"{int(runs):,}" if runs == int(runs) else f"{runs:g}"
