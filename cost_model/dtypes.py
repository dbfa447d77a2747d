"""Dtype names and sizes shared by the cost model."""

from __future__ import annotations

__all__ = ["itemsize", "canonical_dtype", "DTYPE_ALIASES"]

# alias -> canonical name
DTYPE_ALIASES: dict[str, str] = {
    "float32": "float32", "fp32": "float32", "float": "float32", "f32": "float32",
    "float16": "float16", "fp16": "float16", "half": "float16", "f16": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float64": "float64", "fp64": "float64", "double": "float64", "f64": "float64",
    "int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64",
    "uint8": "uint8", "bool": "bool",
}

_ITEMSIZE: dict[str, int] = {
    "float32": 4, "float16": 2, "bfloat16": 2, "float64": 8,
    "int8": 1, "int16": 2, "int32": 4, "int64": 8, "uint8": 1, "bool": 1,
}
_ITEMSIZE.update({alias: _ITEMSIZE[canon] for alias, canon in DTYPE_ALIASES.items()})


def canonical_dtype(dtype: str) -> str:
    """Canonical name of a dtype alias ("fp16" -> "float16"); ValueError if unknown."""
    try:
        return DTYPE_ALIASES[dtype]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown dtype {dtype!r}; known: {', '.join(sorted(set(DTYPE_ALIASES.values())))}"
        ) from None


def itemsize(dtype: str) -> int:
    """Bytes per element of ``dtype`` (aliases accepted); ValueError if unknown."""
    try:
        return _ITEMSIZE[dtype]
    except (KeyError, TypeError):
        canonical_dtype(dtype)  # raises the descriptive error
        raise
