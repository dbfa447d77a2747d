"""Dtype names shared by the IR, the passes and both emitters.

The IR names dtypes with numpy-style strings ("float32", "float16", ...); the
importers translate from ONNX TensorProto codes or torch dtypes.
"""

from __future__ import annotations

from cost_model.dtypes import DTYPE_ALIASES, UNKNOWN_ITEMSIZE
from cost_model.dtypes import itemsize as _table_itemsize

FLOAT32 = "float32"
FLOAT16 = "float16"
BFLOAT16 = "bfloat16"
FLOAT64 = "float64"

#: The dtypes the planner chooses between (the high one and a low one).
LOW_PRECISION = (FLOAT16, BFLOAT16)
FLOAT_DTYPES = frozenset({FLOAT32, FLOAT16, BFLOAT16, FLOAT64})


def itemsize(dtype: str | None) -> int:
    """Bytes per element from ``cost_model.dtypes``' table; ``UNKNOWN_ITEMSIZE`` for a dtype the model leaves unknown."""
    return _table_itemsize(dtype, UNKNOWN_ITEMSIZE)


def is_float(dtype: str | None) -> bool:
    return dtype in FLOAT_DTYPES


def normalize_low_dtype(name: str) -> str:
    """Map a user's spelling ("fp16", "bf16", "float16", ...) to a low-precision dtype."""
    dtype = DTYPE_ALIASES.get(str(name).lower().replace("torch.", ""))
    if dtype not in LOW_PRECISION:
        raise ValueError(f"unsupported low-precision dtype {name!r}: use fp16 or bf16")
    return dtype


_SHORT = {FLOAT32: "fp32", FLOAT16: "fp16", BFLOAT16: "bf16", FLOAT64: "fp64"}


def short(dtype: str | None) -> str:
    """Short label for names and reports: fp32, fp16, bf16."""
    return _SHORT.get(dtype or "", str(dtype))
