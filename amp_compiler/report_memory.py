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


NEVER = np.iinfo(np.int64).max  # the first read of a cast nobody reads (``storage_spans``)


def storage_spans(n_rows: int, n_casts: int, read_row: np.ndarray, read_at: np.ndarray, read_via: np.ndarray,
                  view_row: np.ndarray, view_via: np.ndarray, written: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The walk both memory measures share (the report's, ``activation_peaks``; the planner's for a
    plan not yet applied, ``passes/plan_memory.py``), over arrays: (root, first, end).

    Targets are ``n_rows`` tensors, then ``n_casts`` inserted casts. Read ``k`` reads row
    ``read_row[k]`` (-1: none) at op position ``read_at[k]``, through cast target ``read_via[k]``
    (-1: directly). A view's output row ``r`` reads row ``view_row[r]`` through ``view_via[r]``
    (both -1: not a view); ``written[r]``: the position that writes row ``r`` (-1: none). A view
    holds no storage: ``root[r]`` is whose it shares, its source's or, where the view reads a cast,
    the cast's. A row lives from its write, a cast from its first reader (``NEVER`` if unread), to
    the last read of it or of a view of it (-1 if none); a read through a cast counts for its
    source too (without the cast, FP32 and all-FP16 read the source)."""
    root = np.where(view_via >= 0, view_via, np.where(view_row >= 0, view_row, np.arange(n_rows)))
    while True:  # pointer jumping: view chains are short, each round halves them
        inner = root < n_rows
        jumped = root.copy()
        jumped[inner] = root[root[inner]]
        if np.array_equal(jumped, root):
            break
        root = jumped
    first = np.concatenate([written, np.full(n_casts, NEVER, dtype=np.int64)])
    end = np.concatenate([written, np.full(n_casts, -1, dtype=np.int64)])
    via = read_via >= 0
    np.minimum.at(first, read_via[via], read_at[via])
    np.maximum.at(end, read_via[via], read_at[via])
    direct = read_row >= 0
    np.maximum.at(end, root[read_row[direct]], read_at[direct])
    return root, first, end


def peak_bytes(first: np.ndarray, final: np.ndarray, nbytes: np.ndarray, steps: int) -> int:
    """The largest sum of ``nbytes`` alive at once, each alive from ``first`` to ``final``
    (inclusive) of ``steps`` op positions; 0 for none. A graph without ops (its outputs its inputs)
    still has position 0, where its outputs live."""
    if len(nbytes) == 0:
        return 0
    deltas = np.zeros(max(steps, 1) + 1, dtype=np.int64)
    np.add.at(deltas, first, nbytes)
    np.add.at(deltas, final + 1, -nbytes)
    return max(int(np.cumsum(deltas).max()), 0)


def closed_spans(root: np.ndarray, first: np.ndarray, end: np.ndarray, output: np.ndarray, views: np.ndarray,
                 casts: np.ndarray, cast_sources: np.ndarray, last: int) -> tuple[np.ndarray, np.ndarray]:
    """``storage_spans``' (first, end) made into the spans the peak counts, for both memory measures:
    a view that is a graph output (``output``) keeps its storage to the end, a cast among ``casts``
    nobody reads (it writes a graph output) starts at the last read of its source row
    (``cast_sources``, -1: none). Updates ``end`` and ``first``; returns (alive, final): which
    targets hold storage at some position, and the last position each holds it."""
    end[root[views[output[views]]]] = last
    unread = (first[casts] == NEVER) & (cast_sources >= 0)
    first[casts[unread]] = end[root[cast_sources[unread]]]
    alive = (first >= 0) & (first != NEVER) & ((end >= 0) | output)
    return alive, np.where(output, last, np.where(end >= 0, end, first))


def activation_peaks(table: Mapping[str, Mapping], ops: list, casts: list) -> dict[str, int]:
    """Peak live bytes in each scenario (``SCENARIOS``) over the op order (``storage_spans``); a view
    that is a graph output keeps its storage to the end, an inserted cast nobody reads (it writes a
    graph output) starts where its source was last read."""
    cast_outputs = {c.get("output"): c.get("tensor") for c in casts  # inserted ones: the source's are ops
                    if _is_mapping(c) and c.get("output") and c.get("inserted", True)}
    names = [name for name in table if name not in cast_outputs]
    row = {name: i for i, name in enumerate(names)}
    cast_ids = {name: len(names) + k for k, name in enumerate(cast_outputs)}
    get_row, get_cast = row.get, cast_ids.get
    direct_row: list[int] = []  # reads of rows: row, position
    direct_at: list[int] = []
    via_reads: list[tuple[int, int, int]] = []  # reads of casts: the cast's source row, position, cast
    written = [-1] * len(names)
    view_row, view_via = [-1] * len(names), [-1] * len(names)
    for i, op in enumerate(ops):
        inputs = op.get("inputs") or ()
        for name in inputs:
            r = get_row(name)
            if r is not None:
                direct_row.append(r)
                direct_at.append(i)
            elif name in cast_ids:
                via_reads.append((get_row(cast_outputs[name], -1), i, cast_ids[name]))
        outputs = op.get("outputs") or ()
        if outputs and inputs and inputs[0] in table and is_view(op.get("canonical")):
            out = get_row(outputs[0])
            if out is not None:
                view_row[out], view_via[out] = get_row(inputs[0], -1), get_cast(inputs[0], -1)
            continue
        for name in outputs:
            r = get_row(name)
            if r is not None and written[r] < 0:
                written[r] = i
    cast_reads = np.array(via_reads, dtype=np.int64).reshape(-1, 3)
    root, first, end = storage_spans(
        len(names), len(cast_ids), np.concatenate([np.array(direct_row, dtype=np.int64), cast_reads[:, 0]]),
        np.concatenate([np.array(direct_at, dtype=np.int64), cast_reads[:, 1]]),
        np.concatenate([np.full(len(direct_row), -1, dtype=np.int64), cast_reads[:, 2]]),
        np.array(view_row, dtype=np.int64), np.array(view_via, dtype=np.int64), np.array(written, dtype=np.int64))
    is_view_row = np.array([v != (-1, -1) for v in zip(view_row, view_via)], dtype=bool)
    rows_of = [table[name] for name in names] + [table.get(name) for name in cast_outputs]  # None: not in the table
    go = np.array([bool(t and t.get("graph_output")) for t in rows_of], dtype=bool)
    last = max(len(ops) - 1, 0)
    kind = [t.get("kind") if t else WEIGHT for t in rows_of]
    dtypes = [t.get("dtype") if t else None for t in rows_of]
    numel = np.array([int(t.get("numel") or 0) if t else 0 for t in rows_of], dtype=np.int64)
    item = np.array([itemsize(t.get("dtype")) if t else 0 for t in rows_of], dtype=np.int64)
    first[np.array([k == INPUT for k in kind], dtype=bool)] = 0  # graph inputs live from the start
    alive, final = closed_spans(root, first, end, go, np.flatnonzero(is_view_row),
                                np.array(list(cast_ids.values()), dtype=np.int64),
                                np.array([row.get(src, -1) for src in cast_outputs.values()], dtype=np.int64), last)
    stored = ~np.concatenate([is_view_row, np.zeros(len(cast_ids), dtype=bool)])
    counted = np.array([k != WEIGHT for k in kind], dtype=bool) & stored & alive
    # without the casts (FP32, all-FP16) what a graph output's cast reads is that output: its storage
    # (a view's source's) lives to the end there too
    uncast = final.copy()
    outputs_read = [root[row[src]] for name, src in cast_outputs.items()
                    if src in row and (table.get(name) or {}).get("graph_output")]
    uncast[np.array(outputs_read, dtype=np.int64)] = last
    source = np.arange(len(rows_of)) < len(names)  # a cast's copy exists in the mixed plan only
    planned = np.array([d in _PLANNED for d in dtypes], dtype=bool)
    sizes = {"fp32": (counted & source, 4 * numel, uncast), "mixed": (counted, numel * item, final),
             "all_fp16": (counted & source, np.where(planned, 2, item) * numel, uncast)}
    return {s: peak_bytes(first[keep], ends[keep], nbytes[keep], len(ops)) for s, (keep, nbytes, ends) in sizes.items()}


def is_view(canonical: str | None) -> bool:
    """Whether the op holds no storage of its own (the registry's ``traffic: alias``: reshape, ...)."""
    row = DEFAULT_REGISTRY.by_canonical.get(canonical or "")
    return row is not None and row.traffic == "alias"


__all__ = ["MEMORY_KEYS", "TOTAL_KEYS", "activation_peaks", "closed_spans", "NEVER", "fill_memory", "is_view", "peak_bytes",
           "predicted_memory", "storage_spans", "tensor_table"]
