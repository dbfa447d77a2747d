"""Align: report tensor-core ops whose dimensions miss the tensor-core granularity.

Rewrite cases (report only; the graph is not changed, so ``modified`` is always False):

1. A low-precision matmul/gemm whose N or K is not a multiple of 8 cannot use
   tensor cores at full rate (the cost model already charges it that way: the rule is
   ``cost_model.flops.misaligned_dims``, shared with the op timer).
2. A low-precision, ungrouped conv whose input or output channel count is not a
   multiple of 8 likewise.
Padding is left to the caller: the finding says which dims and to what size.
"""

from __future__ import annotations

from amp_compiler.dtypes import LOW_PRECISION
from amp_compiler.ir import Op, PrecisionGraph
from cost_model.flops import misaligned_dims, padded

from .base import Pass, PassResult, PlanContext
from .result import Alignment, AlignmentFinding


class AlignPass(Pass):
    name = "align"

    def call(self, graph: PrecisionGraph, ctx: PlanContext) -> PassResult:
        findings = []
        judged: dict[tuple, dict[str, int]] = {}  # per alike op: a transformer's GEMMs are a few kinds
        for op in graph.ops.values():
            if not op.tensor_core or op.precision not in LOW_PRECISION:
                continue
            key = _alike(graph, op)
            bad = judged.get(key)
            if bad is None:
                bad = judged[key] = misaligned_dims(op, graph, op.precision)
            if bad:
                dims = ", ".join(f"{k}={v} (pad to {padded(v, op.precision)})" for k, v in bad.items())
                findings.append(AlignmentFinding(op.name, op.op_type, dict(bad),
                                                 f"{dims}: not a multiple of 8, tensor cores run below peak"))
        return PassResult(graph, False, f"{len(findings)} misaligned tensor-core ops", Alignment(tuple(findings)))


def _alike(graph: PrecisionGraph, op: Op) -> tuple:
    """What ``misaligned_dims`` reads of ``op`` (``cost_model.flops.alignment_dims``: the kind, the
    resolved shapes of its inputs and first output, GEMM transposes and conv groups), so ops with one
    key get one answer."""
    tensors, attrs = graph.tensors, op.attrs
    shapes = tuple(graph.concrete_dims(tensors[name]) if name else None for name in (*op.inputs, *op.outputs[:1]))
    return (op.canonical, op.precision, len(op.inputs), shapes,
            attrs.get("transA"), attrs.get("transB"), attrs.get("group"))
