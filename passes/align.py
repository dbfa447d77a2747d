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
from amp_compiler.ir import PrecisionGraph
from cost_model.flops import misaligned_dims, padded

from .base import Pass, PassResult, PlanContext
from .result import Alignment, AlignmentFinding


class AlignPass(Pass):
    name = "align"

    def call(self, graph: PrecisionGraph, ctx: PlanContext) -> PassResult:
        findings = []
        for op in graph.ops.values():
            if not op.tensor_core or op.precision not in LOW_PRECISION:
                continue
            bad = misaligned_dims(op, graph, op.precision)
            if bad:
                dims = ", ".join(f"{k}={v} (pad to {padded(v, op.precision)})" for k, v in bad.items())
                findings.append(AlignmentFinding(op.name, op.op_type, bad,
                                                 f"{dims}: not a multiple of 8, tensor cores run below peak"))
        return PassResult(graph, False, f"{len(findings)} misaligned tensor-core ops", Alignment(tuple(findings)))
