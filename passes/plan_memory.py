"""The report's memory measure for a plan not yet applied: the weights it stores plus the peak of
live activations, its casts' copies included (``docs/architecture.md``, "The objective").

The planner's memory term is a modular proxy (every output once, at its dtype; casts free). A
near-tie taken "for less memory" is checked here against the measure the report prints, which
the proxy can get wrong: ConvNeXt-V2's GRN reads its MLP's 4x-wide activation in FP32, so a
plan converting that MLP holds the activation twice (FP16 and its FP32 cast) at the peak; the
proxy counted the halved outputs elsewhere and took a plan slower than FP32 that needed more
memory than it. The measure is ``report_memory.activation_peaks``' walk (``storage_spans``) over the rows
the plan would give, its inserted casts among them. A plan changes only the dtypes of tensors, which
casts exist and where a view's storage lives (its source's, or the cast it reads), so the graph
is laid out as arrays once per energy (``_PlanMemory``) and each plan priced from them in
milliseconds: a walk of the graph per plan had cost 1.8 s of a 100k-node conversion.
"""

from __future__ import annotations

import numpy as np

from amp_compiler.dtypes import FLOAT32, is_float, itemsize
from amp_compiler.ir import CONSTANT, GRAPH_INPUT, PARAMETER, UNIT, PrecisionGraph
from amp_compiler.report_memory import closed_spans, is_view, peak_bytes, storage_spans

from .costs import PlanEnergy

__all__ = ["plan_memory"]

_NONE = -1  # no dtype: an op without float data reads its inputs as they come


def plan_memory(graph: PrecisionGraph, energy: PlanEnergy, plan: dict[int, int], low: str,
                keep_io_types: bool = True) -> float:
    """Bytes of the weights ``plan``'s units read plus its peak live activations: the report's mixed
    total less what no plan changes (weights only fixed ops read; the casts pass's merges), within
    a few bytes to about 1 % on real models, so it compares two plans, as the near-tie needs."""
    key = ("plan_memory", low, keep_io_types)
    walk = energy.derived.get(key)
    if walk is None:
        walk = energy.derived[key] = _PlanMemory(graph, energy, low, keep_io_types)
    return energy.weight_bytes(plan) + walk.activation_peak(plan)


class _PlanMemory:
    """What no plan changes, as arrays: each tensor's sizes and where it is written, which unit
    sets its dtype, every read of it, and the views (whose readers keep their source alive, or
    the cast in between when the plan casts the view's input).

    Tensors are rows; a plan's casts are targets after them, one per (row, dtype) read. Dtypes
    are codes: 0 FP32, 1 the low dtype (so a unit's code is its plan value), 2.. any other;
    ``_NONE`` where an op has no precision (it reads its inputs as they come)."""

    def __init__(self, graph: PrecisionGraph, energy: PlanEnergy, low: str, keep_io_types: bool) -> None:
        self.units = list(energy.unit_ops)
        unit_index = {u: i for i, u in enumerate(self.units)}
        unit_of = {name: unit_index[u] for u, names in energy.unit_ops.items() for name in names}
        self.dtypes = [FLOAT32, low]
        codes = {FLOAT32: 0, low: 1}

        def code(dtype: str | None) -> int:
            if dtype is None:
                return _NONE
            if dtype not in codes:
                codes[dtype] = len(self.dtypes)
                self.dtypes.append(dtype)
            return codes[dtype]

        def op_dtype(op) -> tuple[int, int]:
            """(unit index or -1, fixed code): the op's dtype is its unit's plan value, else fixed."""
            u = unit_of.get(op.name)
            return (-1, code(op.precision)) if u is None else (u, 0)

        rows: list[tuple] = []  # (name, numel, unit, fixed code, native code, graph output, input)
        for t in graph.tensors.values():  # every float tensor ops write or read, but weights
            if not is_float(t.dtype) or t.kind in (CONSTANT, PARAMETER) or not (t.producer or t.consumers
                                                                                or t.is_graph_output):
                continue
            unit, fixed = -1, code(t.dtype)
            if t.producer is not None and fixed in (0, 1):
                op = graph.ops[t.producer]
                if op.output_roles and op.output_roles[t.producer_port] == UNIT:
                    unit, op_fixed = op_dtype(op)
                    fixed = fixed if op_fixed == _NONE else op_fixed
            rows.append((t.name, graph.numel(t), unit, fixed, code(t.dtype), t.is_graph_output,
                         t.kind == GRAPH_INPUT))
        row_of = {r[0]: i for i, r in enumerate(rows)}
        reads: list[tuple[int, int, int, int]] = []  # (row, op position, reader unit, reader code)
        written = [-1] * len(rows)  # the op position that writes a row (views' outputs: none)
        parent = [-1] * len(rows)  # a view's output row -> the index of its read of its source
        for i, op in enumerate(graph.ops.values()):
            unit, fixed = op_dtype(op) if op.input_roles else (-1, _NONE)
            first_read = len(reads)
            for port, name in enumerate(op.inputs):
                r = row_of.get(name)
                if r is not None:  # a read that needs a cast where the reader's dtype differs
                    castable = bool(op.input_roles) and op.input_roles[port] == UNIT
                    reads.append((r, i, unit, fixed) if castable else (r, i, -1, _NONE))
            if is_view(op.canonical) and op.outputs and op.inputs and op.inputs[0] in row_of:
                if op.outputs[0] in row_of:
                    parent[row_of[op.outputs[0]]] = first_read
                continue
            for name in op.outputs:
                if name in row_of and written[row_of[name]] < 0:
                    written[row_of[name]] = i
        self.steps, self.keep_io_types = len(graph.ops), keep_io_types
        self.last = max(self.steps - 1, 0)
        self.itemsizes = np.array([itemsize(d) for d in self.dtypes], dtype=np.int64)
        self.numel, self.unit, self.fixed, self.native = (np.array([r[k] for r in rows], dtype=np.int64)
                                                         for k in (1, 2, 3, 4))
        self.graph_output = np.array([r[5] for r in rows], dtype=bool)
        self.written = np.array(written, dtype=np.int64)
        self.first = np.array([0 if r[6] else w for r, w in zip(rows, written)], dtype=np.int64)
        self.parent = np.array(parent, dtype=np.int64)
        self.views = np.flatnonzero(self.parent >= 0)
        arr = np.array(reads, dtype=np.int64).reshape(-1, 4)
        self.read_row, self.read_at, self.read_unit, self.read_fixed = arr.T

    def activation_peak(self, plan: dict[int, int]) -> int:
        """The mixed plan's peak live activation bytes: ``report_memory.activation_peaks`` over
        the rows, ops and inserted casts ``plan`` would give."""
        n = len(self.numel)
        values = np.array([plan[u] for u in self.units] + [0], dtype=np.int64)  # unit -1 -> unused 0
        dtype = np.where(self.unit >= 0, values[self.unit], self.fixed)
        cast_out = self.graph_output & (dtype != self.native) & self.keep_io_types
        reader = np.where(self.read_unit >= 0, values[self.read_unit], self.read_fixed)
        held = dtype[self.read_row]
        cast = (reader != _NONE) & (held <= 1) & (reader != held)
        # targets: the rows, then one cast per (row, dtype) read or an output cast to its declared dtype
        out_rows = np.flatnonzero(cast_out)
        n_codes = len(self.dtypes)
        keys, inverse = np.unique(np.concatenate([self.read_row[cast] * n_codes + reader[cast],
                                                  out_rows * n_codes + self.native[out_rows]]),
                                  return_inverse=True)
        n_read_casts = int(cast.sum())
        via = np.full(len(self.read_row), -1, dtype=np.int64)  # each read's cast target, or -1
        via[cast] = n + inverse[:n_read_casts]
        out_casts = n + inverse[n_read_casts:]
        view_row, view_via = np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64)
        link = self.parent[self.views]
        view_row[self.views], view_via[self.views] = self.read_row[link], via[link]
        root, first, end = storage_spans(n, len(keys), self.read_row, self.read_at, via, view_row, view_via,
                                         self.written)
        first[:n] = self.first  # graph inputs live from the start
        outputs = np.concatenate([self.graph_output & ~cast_out, np.zeros(len(keys), dtype=bool)])
        outputs[out_casts] = True
        alive, final = closed_spans(root, first, end, outputs, self.views, out_casts, out_rows, self.last)
        keep = np.concatenate([self.parent < 0, np.ones(len(keys), dtype=bool)]) & alive
        rows, codes = np.divmod(keys, n_codes)
        nbytes = np.concatenate([self.numel * self.itemsizes[dtype], self.numel[rows] * self.itemsizes[codes]])
        return peak_bytes(first[keep], final[keep], nbytes[keep], self.steps)
