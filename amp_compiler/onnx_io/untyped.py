"""Types for values onnx's shape inference leaves untyped behind ops it has no schema for.

onnx knows no ``com.microsoft`` op, so in a model ONNX Runtime saved after its own fusions
(``optimized_model_filepath`` at ``ORT_ENABLE_EXTENDED``: ``FusedMatMul``, ``FusedGemm``,
``BiasGelu``) every value after the first fused op that the file does not declare was untyped,
and the Softmax or Where reading it was taken for "no float data": a BERT so saved had its
masked scores' Where bound to FP16 and FP32 at once, which ONNX Runtime refused to load.
Walking the ops in order, an untyped output of a standard op takes the dtype of the input its
schema binds to the same type parameter (Softmax's ``T``, Where's ``T`` at port 1), and the
outputs of ONNX Runtime's contrib ops the type its own schema gives them (``contrib_schemas.py``;
without ONNX Runtime, the first output the dtype of the first float input: its contrib ops compute
in their inputs' type). docs/architecture.md, "Input handling".
"""

from __future__ import annotations

import onnx

from ..dtypes import is_float
from ..ir import Op, PrecisionGraph
from .contrib_schemas import contrib_output_type
from .ort_onnx_ops import schema as onnx_schema

__all__ = ["type_untyped"]


def type_untyped(graph: PrecisionGraph) -> int:
    """Give each untyped op output the dtype its op implies (see module docstring); returns how
    many were typed."""
    typed = 0
    for op in graph.ops.values():
        for port, name in enumerate(op.outputs):
            tensor = graph.tensors.get(name) if name else None
            if tensor is None or tensor.dtype is not None:
                continue
            dtype = _implied_dtype(graph, op, port)
            if dtype is not None:
                tensor.dtype = dtype
                typed += 1
    return typed


def _implied_dtype(graph: PrecisionGraph, op: Op, port: int) -> str | None:
    """The dtype output ``port`` of ``op`` has, if its schema (ONNX Runtime's, for a contrib op) says so."""
    if op.domain not in ("", "ai.onnx"):
        k, fixed = contrib_output_type(op.op_type, op.domain, port)
        if k is not None and k < len(op.inputs) and op.inputs[k]:
            return graph.tensors[op.inputs[k]].dtype
        if fixed is not None:
            return fixed
        floats = (i for i in op.inputs if i and is_float(graph.tensors[i].dtype))
        first = next(floats, None) if port == 0 else None  # no schema: contrib ops compute in their inputs' type
        return graph.tensors[first].dtype if first else None
    source = _same_typed_input(graph, op, port)
    return graph.tensors[source].dtype if source else None


def _same_typed_input(graph: PrecisionGraph, op: Op, port: int) -> str | None:
    """The input whose dtype output ``port`` of a standard op has, if its schema says so."""
    schema = onnx_schema(op.op_type, graph.opsets.get("", 0))  # ONNX Runtime's LayerNorm below 17 too
    if schema is None:
        return None
    formals = schema.outputs
    variadic = bool(formals) and formals[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic
    if port >= len(formals) and not variadic:
        return None
    type_str = formals[min(port, len(formals) - 1)].type_str  # Split's outputs 1.. are its variadic formal
    for k, formal in enumerate(schema.inputs):
        if formal.type_str == type_str and k < len(op.inputs) and op.inputs[k]:
            return op.inputs[k]
    return None

