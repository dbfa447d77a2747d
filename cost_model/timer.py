"""Predicted time of one IR op in a given precision: FLOPs and traffic priced by the roofline.

``OpTimer`` is the one place op costs come from: the planner's energy (``passes/costs.py``),
the plan result's per-op costs in the report and the ``analysis`` ruler all read it.
A measured profile (``ctx.profile``) overrides the roofline per op key.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .flops import misaligned_dims, op_flops
from .roofline import Roofline
from .traffic import ALL, op_bytes

if TYPE_CHECKING:
    from amp_compiler.ir import Op, PrecisionGraph, Tensor

_FLOAT32 = "float32"


class OpTimer:
    """Per-op FLOPs, bytes and predicted seconds on ``ctx.target`` (cached per op and dtype).

    ``ctx`` is any object with ``target``, ``profile`` and ``registry`` (a ``PlanContext``).
    """

    def __init__(self, graph: PrecisionGraph, ctx: Any) -> None:
        if ctx.registry is None:
            from amp_compiler.registry import DEFAULT_REGISTRY

            self.registry = DEFAULT_REGISTRY
        else:
            self.registry = ctx.registry
        self.graph = graph
        self.roofline = Roofline(ctx.target, ctx.profile)
        self._flops: dict[str, float] = {}
        self._times: dict[tuple[str, str], float] = {}

    def _row(self, op: Op):
        return self.registry.by_canonical.get(op.canonical) if op.canonical else None

    def flops(self, op: Op) -> float:
        cached = self._flops.get(op.name)
        if cached is None:
            row = self._row(op)
            cached = op_flops(op, self.graph, row.flops, row.flops_per_element) if row else 0.0
            self._flops[op.name] = cached
        return cached

    def bytes(self, op: Op, dtype: str) -> float:
        row = self._row(op)
        return op_bytes(op, self.graph, dtype, row.traffic if row else ALL)

    def aligned(self, op: Op, dtype: str) -> bool:
        return not misaligned_dims(op, self.graph, dtype)

    def time(self, op: Op, dtype: str) -> float:
        key = (op.name, dtype)
        cached = self._times.get(key)
        if cached is None:
            cached = self._times[key] = self._time(op, dtype)
        return cached

    def _time(self, op: Op, dtype: str) -> float:
        if op.canonical == "cast" and op.inserted:
            t = self.graph.tensors[op.inputs[0]]
            return self.roofline.cast_time(self.graph.numel(t), t.dtype or _FLOAT32, dtype)
        return self.roofline.op_time(
            flops=self.flops(op), bytes_moved=self.bytes(op, dtype), dtype=dtype,
            tensor_core=op.tensor_core, aligned=self.aligned(op, dtype) if op.tensor_core else True,
            key=self.profile_key(op) if self.roofline.profile is not None else None)

    def profile_key(self, op: Op) -> str:
        shapes = ";".join("x".join(str(d) for d in (self.graph.tensors[i].shape or ())) for i in op.inputs if i)
        return f"{op.canonical}[{shapes}]"

    def cast_time(self, t: Tensor, low: str) -> float:
        return self.roofline.cast_time(self.graph.numel(t), _FLOAT32, low)


__all__ = ["OpTimer"]
