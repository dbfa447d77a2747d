"""The one memory estimate: weights stored and peak live activations, in FP32, mixed and all-FP16.

The report's totals ``predicted_memory_{fp32,mixed,all_fp16}_bytes`` are weights plus
activations of the same walk. Works on the report dict alone (schema 1.1: ``ops[].inputs/
outputs``, ``casts[].output`` and the ``tensors`` table), so a saved JSON report can be
re-read; ``tensor_table`` builds that table from the planned IR. See docs/report-schema.md
and docs/architecture.md (Report). (The planner's memory *objective* is a modular proxy of
this, ``passes/costs.py``: a peak is not a sum of per-op terms.)

* weights: every float constant once, at 4 bytes (FP32) or 2 (all-FP16); in the mixed plan
  each stored copy at its dtype (a weight read by FP32 and FP16 ops is stored twice).
* activations: the peak over the op order of the float tensors alive at once (a tensor
  lives from its producer to its last reader; graph outputs to the end). A view (the
  registry's ``traffic: alias``: reshape, squeeze, ...) holds no storage: its readers keep
  its source alive. Inserted casts exist only in the mixed plan; their output lives from its
  first reader on.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .dtypes import FLOAT32, LOW_PRECISION, is_float, itemsize
from .ir import CONSTANT, GRAPH_INPUT, PARAMETER, PrecisionGraph
from .registry import DEFAULT_REGISTRY

WEIGHT, ACTIVATION, INPUT = "weight", "activation", "input"
SCENARIOS = ("fp32", "mixed", "all_fp16")
_PLANNED = (FLOAT32, *LOW_PRECISION)  # the dtypes a plan chooses between (float64 stays as it is)
MEMORY_KEYS = tuple(f"predicted_memory_{part}_{s}_bytes" for part in ("weights", "activations")
                    for s in SCENARIOS)
TOTAL_KEYS = tuple(f"predicted_memory_{s}_bytes" for s in SCENARIOS)  # weights + activations


def tensor_table(graph: PrecisionGraph) -> list[dict[str, Any]]:
    """The float tensors ops read or write: name, dtype, element count, kind (schema 1.1)."""
    rows = []
    for t in graph.tensors.values():
        if not is_float(t.dtype) or not (t.producer or t.consumers or t.is_graph_output):
            continue
        kind = WEIGHT if t.kind in (CONSTANT, PARAMETER) else INPUT if t.kind == GRAPH_INPUT else ACTIVATION
        row = {"name": t.name, "dtype": t.dtype, "numel": graph.numel(t), "kind": kind}
        if t.folded_from:
            row["folded_from"] = t.folded_from
        if t.is_graph_output:
            row["graph_output"] = True
        rows.append(row)
    return rows


def predicted_memory(data: Mapping[str, Any]) -> dict[str, int] | None:
    """``MEMORY_KEYS`` and ``TOTAL_KEYS`` -> bytes, from a schema >= 1.1 report dict; None when it
    lacks the tensors."""
    tensors = data.get("tensors")
    ops = data.get("ops")
    if not isinstance(tensors, list) or not isinstance(ops, list):
        return None
    table = {t["name"]: t for t in tensors if _is_mapping(t) and "name" in t}
    out = _weights(table)
    out.update(_activations(table, ops, data.get("casts") or []))
    for s in SCENARIOS:
        out[f"predicted_memory_{s}_bytes"] = (out[f"predicted_memory_weights_{s}_bytes"]
                                              + out[f"predicted_memory_activations_{s}_bytes"])
    return out


def fill_memory(data: dict[str, Any]) -> None:
    """Add the ``predicted_memory_*`` keys to ``data["summary"]`` where they are absent."""
    mem = predicted_memory(data)
    if mem:
        summary = data.setdefault("summary", {})
        for key, value in mem.items():
            summary.setdefault(key, value)


def _is_mapping(x: Any) -> bool:
    """``isinstance(x, Mapping)`` with a fast path for dicts (typing's check costs a few µs per row)."""
    return type(x) is dict or isinstance(x, Mapping)


def _weights(table: dict[str, Mapping]) -> dict[str, int]:
    mixed = 0
    origins: dict[str, int] = {}
    for t in table.values():
        if t.get("kind") != WEIGHT:
            continue
        numel = int(t.get("numel") or 0)
        mixed += numel * itemsize(t.get("dtype"))
        origins[t.get("folded_from") or t["name"]] = numel
    stored = sum(origins.values())
    return {"predicted_memory_weights_fp32_bytes": 4 * stored, "predicted_memory_weights_mixed_bytes": mixed,
            "predicted_memory_weights_all_fp16_bytes": 2 * stored}


def _activations(table: dict[str, Mapping], ops: list, casts: list) -> dict[str, int]:
    return {f"predicted_memory_activations_{s}_bytes": peak for s, peak in activation_peaks(table, ops, casts).items()}


def peak_bytes(first: list[int], final: list[int], nbytes: list[int], steps: int) -> int:
    """The largest sum of ``nbytes`` alive at once, each alive from ``first`` to ``final``
    (inclusive) of ``steps`` op positions; 0 for none."""
    if len(nbytes) == 0:
        return 0
    deltas = np.zeros(steps + 1, dtype=np.int64)
    sizes = np.asarray(nbytes, dtype=np.int64)
    np.add.at(deltas, np.asarray(first, dtype=np.int64), sizes)
    np.add.at(deltas, np.asarray(final, dtype=np.int64) + 1, -sizes)
    return max(int(np.cumsum(deltas).max()), 0)


def activation_peaks(table: Mapping[str, Mapping], ops: list, casts: list) -> dict[str, int]:
    """Peak live bytes in each scenario (``SCENARIOS``), sweeping the op order once (the planner
    prices a plan not yet applied with the same rules: ``passes/plan_memory.py``)."""
    cast_outputs = {c.get("output"): c.get("tensor") for c in casts  # inserted ones: the source's are ops
                    if _is_mapping(c) and c.get("output") and c.get("inserted", True)}
    start: dict[str, int] = {}
    end: dict[str, int] = {}
    view_of: dict[str, str] = {}  # a view's output -> the tensor whose storage it shares

    def root(name: str) -> str:
        while name in view_of:
            name = view_of[name]
        return name

    last = max(len(ops) - 1, 0)
    for i, op in enumerate(ops):
        for name in op.get("inputs") or ():
            if name in cast_outputs:
                start.setdefault(name, i)  # an inserted cast sits right before its first reader
                end[root(cast_outputs[name])] = i  # without the cast (FP32, all-FP16) the op reads the source
            end[root(name)] = i
        outputs = op.get("outputs") or ()
        if is_view(op.get("canonical")) and outputs and op.get("inputs") and op["inputs"][0] in table:
            view_of[outputs[0]] = op["inputs"][0]
            continue
        for name in outputs:
            start.setdefault(name, i)
            end.setdefault(name, i)
    for name in view_of:
        if table.get(name, {}).get("graph_output"):
            end[root(name)] = last  # a view that is a graph output keeps its storage to the end
    for name, src in cast_outputs.items():
        if name not in start and root(src) in end:  # a cast nobody reads: it writes a graph output
            start[name] = end[root(src)]
    spans: dict[str, tuple[list, list, list]] = {s: ([], [], []) for s in SCENARIOS}
    for name, t in table.items():
        if t.get("kind") == WEIGHT or name in view_of or name not in end and not t.get("graph_output"):
            continue
        first = 0 if t.get("kind") == INPUT else start.get(name)
        if first is None:
            continue
        final = last if t.get("graph_output") else end.get(name, first)
        numel = int(t.get("numel") or 0)
        sizes = {"mixed": numel * itemsize(t.get("dtype"))}
        if name not in cast_outputs:  # a cast's copy exists in the mixed plan only
            sizes["fp32"] = 4 * numel
            sizes["all_fp16"] = 2 * numel if t.get("dtype") in _PLANNED else numel * itemsize(t.get("dtype"))
        for s, nbytes in sizes.items():
            firsts, finals, sizes_of = spans[s]
            firsts.append(first)
            finals.append(final)
            sizes_of.append(nbytes)
    return {s: peak_bytes(*spans[s], steps=len(ops)) for s in SCENARIOS}


def is_view(canonical: str | None) -> bool:
    """Whether the op holds no storage of its own (the registry's ``traffic: alias``: reshape, ...)."""
    row = DEFAULT_REGISTRY.by_canonical.get(canonical or "")
    return row is not None and row.traffic == "alias"


__all__ = ["MEMORY_KEYS", "TOTAL_KEYS", "activation_peaks", "fill_memory", "is_view", "peak_bytes",
           "predicted_memory", "tensor_table"]
