"""The output types of ONNX Runtime's contrib ops (``com.microsoft``), from ONNX Runtime's own schemas.

onnx has no schema for them, so ``untyped.py`` typed only their first output (as their first float
input). A ``SkipLayerNormalization`` that ONNX Runtime's transformer optimizer wrote with its
fourth output, ``input_skip_bias_sum`` (the residual a GPT-NeoX's next LayerNormalization reads),
left that value untyped: the plan ran the fused op in FP16 and the LayerNormalization in FP32
with no cast between, and ONNX Runtime refused the written file ("Type parameter (T) of
LayerNormalization bound to different types"). ONNX Runtime registers every contrib schema with
its type constraints (``get_all_operator_schema``); read lazily, only for such an output, and
only where ONNX Runtime is installed (without it, the first-output rule stands).
"""

from __future__ import annotations

from functools import lru_cache

__all__ = ["contrib_output_type"]


@lru_cache(maxsize=1)
def _schemas() -> dict:
    """(domain, op type) -> ONNX Runtime's schema of its newest version; empty without ONNX Runtime."""
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as ort_c
        found = {}
        for s in ort_c.get_all_operator_schema():
            key = (s.domain, s.name)
            if key not in found or s.since_version > found[key].since_version:
                found[key] = s
        return found
    except Exception:  # noqa: BLE001 - no ONNX Runtime, or a build without schema access
        return {}


def contrib_output_type(op_type: str, domain: str, port: int) -> tuple[int | None, str | None]:
    """How output ``port`` of ONNX Runtime's ``domain::op_type`` is typed: (input port, None) where it
    takes that input's type, (None, dtype) where its type is fixed (an IR name: "float32",
    "int32"), (None, None) where ONNX Runtime is missing, knows no such op or port, or allows it
    several types bound to no input."""
    schema = _schemas().get((domain, op_type))
    if schema is None or port >= len(schema.outputs):
        return None, None
    type_str = schema.outputs[port].typeStr
    for k, formal in enumerate(schema.inputs):
        if formal.typeStr == type_str:
            return k, None
    allowed = next((c.allowed_type_strs for c in schema.type_constraints if c.type_param_str == type_str),
                   [type_str])  # a formal may name its type itself: "tensor(int32)"
    return (None, _ir_dtype(allowed[0])) if len(allowed) == 1 else (None, None)


def _ir_dtype(type_str: str) -> str | None:
    """"tensor(float)" -> "float32" (the IR's name), None for a type that is not a tensor's."""
    from onnx import TensorProto

    from .dtypes import onnx_to_dtype

    if not (type_str.startswith("tensor(") and type_str.endswith(")")):
        return None
    code = getattr(TensorProto, type_str[len("tensor("):-1].upper(), None)
    return onnx_to_dtype(code) if isinstance(code, int) else None
