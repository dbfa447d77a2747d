"""Bytes an op moves, by the registry's ``traffic`` column (docs/architecture.md, "Cost model").

``all``: every input read and every output written; ``gather`` (Slice, Gather*, embedding):
the table is read only as far as the output is written; ``alias`` (views, reshapes): nothing
moves. Ports with role ``unit`` are sized in the dtype being costed, others in their own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

from .dtypes import UNKNOWN_ITEMSIZE, itemsize

if TYPE_CHECKING:
    from amp_compiler.ir import Op, PrecisionGraph

ALL, GATHER, ALIAS = "all", "gather", "alias"
_UNIT = "unit"  # amp_compiler.ir.UNIT (not imported: the cost model does not depend on the IR module)


def op_bytes(op: Op, graph: PrecisionGraph, dtype: str, traffic: str = ALL,
             internal: Callable[[str, bool], bool] | None = None) -> float:
    """Bytes ``op`` reads and writes when its unit ports are in ``dtype``; ``internal(tensor, read)``
    says which tensors never reach memory (intermediates of a fused kernel: ``cost_model/fusion.py``)."""
    return op_bytes_each(op, graph, (dtype,), traffic, internal)[0]


def op_bytes_each(op: Op, graph: PrecisionGraph, dtypes: Sequence[str], traffic: str = ALL,
                  internal: Callable[[str, bool], bool] | None = None) -> list[float]:
    """``op_bytes`` for each of ``dtypes``, walking the op's ports (and asking ``internal``) once."""
    if traffic == ALIAS:
        return [0.0] * len(dtypes)
    totals = [0] * len(dtypes)
    for names, roles, read in ((op.inputs, op.input_roles, True), (op.outputs, op.output_roles, False)):
        for name, role in zip(names, roles):
            if name and not (internal and internal(name, read)):
                t = graph.tensors[name]
                if role == _UNIT:
                    for i, dtype in enumerate(dtypes):
                        totals[i] += graph.nbytes(t, dtype)
                else:
                    own = graph.nbytes(t, t.dtype)
                    for i in range(len(totals)):
                        totals[i] += own
    if traffic == GATHER and op.inputs and op.inputs[0] and op.outputs and op.outputs[0]:
        table = graph.tensors[op.inputs[0]]
        role = op.input_roles[0] if op.input_roles else None
        rows_read = min(graph.numel(table), graph.numel(graph.tensors[op.outputs[0]]))
        for i, dtype in enumerate(dtypes):
            table_dtype = dtype if role == _UNIT else table.dtype
            totals[i] += (rows_read - graph.numel(table)) * itemsize(table_dtype, UNKNOWN_ITEMSIZE)
    return [float(total) for total in totals]
