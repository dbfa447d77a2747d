"""torch dtypes <-> the IR's dtype names ("float32", "float16", ...)."""

from __future__ import annotations

import torch


def torch_to_dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_to_torch(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"no torch dtype named {name!r}")
    return dtype
