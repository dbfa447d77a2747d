"""Align: report tensor-core ops whose dimensions are not multiples of 8.

Rewrite cases (report only; the graph is not changed):

1. A low-precision matmul/gemm whose N or K is not a multiple of 8 cannot use
   tensor cores at full rate (the cost model already charges it that way).
2. A low-precision, ungrouped conv whose input or output channel count is not a
   multiple of 8 likewise.
Padding is left to the caller: the report says which dims and by how much.
"""

from __future__ import annotations

from amp_compiler.dtypes import LOW_PRECISION
from amp_compiler.flops import alignment_dims
from amp_compiler.ir import PrecisionGraph

from .base import Pass, PassResult, PlanContext


class AlignPass(Pass):
    name = "align"

    def call(self, graph: PrecisionGraph, ctx: PlanContext) -> PassResult:
        ctx.alignment.clear()
        for op in graph.ops.values():
            if not op.tensor_core or op.precision not in LOW_PRECISION:
                continue
            bad = {k: v for k, v in alignment_dims(op, graph).items() if v % 8}
            if bad:
                dims = ", ".join(f"{k}={v} (pad to {-(-v // 8) * 8})" for k, v in bad.items())
                ctx.alignment.append({"op": op.name, "op_type": op.op_type, "dims": bad,
                                      "message": f"{dims}: not a multiple of 8, tensor cores run below peak"})
        return PassResult(graph, False, f"{len(ctx.alignment)} misaligned tensor-core ops")
