"""The one dtype table: canonical names, aliases and bytes per element.

Used by the cost model, the IR (``amp_compiler.ir``) and the passes alike, so a tensor's
size is computed one way everywhere. ``itemsize`` raises ``ValueError`` for a name it
does not know unless the caller passes ``default`` (the IR does: a tensor whose dtype the
source model leaves unknown is sized as 4 bytes per element, a conservative guess).
"""

from __future__ import annotations

__all__ = ["DTYPE_ALIASES", "UNKNOWN_ITEMSIZE", "canonical_dtype", "itemsize"]

#: canonical name -> bytes per element
_SIZES: dict[str, int] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1,
    "uint64": 8, "uint32": 4, "uint16": 2, "uint8": 1, "bool": 1,
    "complex64": 8, "complex128": 16, "string": 8,
    "float8e4m3fn": 1, "float8e5m2": 1, "float8e4m3fnuz": 1, "float8e5m2fnuz": 1,
    "int4": 1, "uint4": 1,
}

#: alias -> canonical name (every canonical name is its own alias)
DTYPE_ALIASES: dict[str, str] = {
    **{name: name for name in _SIZES},
    "fp32": "float32", "float": "float32", "f32": "float32",
    "fp16": "float16", "half": "float16", "f16": "float16",
    "bf16": "bfloat16",
    "fp64": "float64", "double": "float64", "f64": "float64",
}

#: the size the IR assumes for a tensor of unknown dtype
UNKNOWN_ITEMSIZE = 4

_ITEMSIZE: dict[str, int] = {alias: _SIZES[canon] for alias, canon in DTYPE_ALIASES.items()}
_MISSING = object()


def canonical_dtype(dtype: str) -> str:
    """Canonical name of a dtype alias ("fp16" -> "float16"); ValueError if unknown."""
    try:
        return DTYPE_ALIASES[dtype]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown dtype {dtype!r}; known: {', '.join(sorted(set(DTYPE_ALIASES.values())))}"
        ) from None


def itemsize(dtype: str | None, default: int | object = _MISSING) -> int:
    """Bytes per element of ``dtype`` (aliases accepted); ``default`` for an unknown one, else ValueError."""
    size = _ITEMSIZE.get(dtype) if isinstance(dtype, str) else None
    if size is not None:
        return size
    if default is not _MISSING:
        return default  # type: ignore[return-value]
    canonical_dtype(dtype)  # raises the descriptive error
    raise AssertionError("unreachable")
