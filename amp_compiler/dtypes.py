"""Dtype names shared by the IR, the passes and both emitters.

The IR names dtypes with numpy-style strings ("float32", "float16", ...); the
importers translate from ONNX TensorProto codes or torch dtypes.
"""

from __future__ import annotations

FLOAT32 = "float32"
FLOAT16 = "float16"
BFLOAT16 = "bfloat16"
FLOAT64 = "float64"

#: The dtypes the planner chooses between (the high one and a low one).
LOW_PRECISION = (FLOAT16, BFLOAT16)
FLOAT_DTYPES = frozenset({FLOAT32, FLOAT16, BFLOAT16, FLOAT64})

_ITEMSIZE = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1,
    "uint64": 8, "uint32": 4, "uint16": 2, "uint8": 1, "bool": 1,
    "complex64": 8, "complex128": 16, "string": 8,
    "float8e4m3fn": 1, "float8e5m2": 1, "float8e4m3fnuz": 1, "float8e5m2fnuz": 1,
    "int4": 1, "uint4": 1,
}

_ALIASES = {"fp32": FLOAT32, "fp16": FLOAT16, "bf16": BFLOAT16, "half": FLOAT16,
            "float": FLOAT32, "float32": FLOAT32, "float16": FLOAT16, "bfloat16": BFLOAT16}


def itemsize(dtype: str | None) -> int:
    """Bytes per element; 4 for an unknown dtype (a conservative guess)."""
    return _ITEMSIZE.get(dtype or "", 4)


def is_float(dtype: str | None) -> bool:
    return dtype in FLOAT_DTYPES


def normalize_low_dtype(name: str) -> str:
    """Map a user's spelling ("fp16", "bf16", "float16", ...) to a low-precision dtype."""
    dtype = _ALIASES.get(str(name).lower().replace("torch.", ""))
    if dtype not in LOW_PRECISION:
        raise ValueError(f"unsupported low-precision dtype {name!r}: use fp16 or bf16")
    return dtype


def short(dtype: str | None) -> str:
    """Short label for names and reports: fp32, fp16, bf16."""
    return {FLOAT32: "fp32", FLOAT16: "fp16", BFLOAT16: "bf16", FLOAT64: "fp64"}.get(dtype or "", str(dtype))
