"""Value checks both importers share: can a stored FP32 weight be held in FP16?

DESIGN.md section 5: weights outside the FP16 range, or that would flush to zero,
keep FP32 -- never clamp silently. The importers call ``low_unsafe_reason`` on each
FP32 constant and store the answer in ``Tensor.low_unsafe``; the propagate pass keeps
the ops reading such a constant in FP32.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

FP16_MAX = 65504.0
FP16_TINY = 2.0 ** -24  # smallest FP16 subnormal: nonzero magnitudes below it flush to zero
FP16_MIN_NORMAL = 2.0 ** -14  # below it FP16 values are subnormal: fewer than 11 significant bits


def low_unsafe_reason(label: str, values: np.ndarray | Iterable[np.ndarray]) -> str | None:
    """Why ``values`` (float32) cannot be stored in FP16, or None; ``label`` names the weight.

    ``values`` is one array or its chunks (``onnx_io.tensors.iter_chunks``: external
    data is never loaded whole); non-finite values are left out of the range.
    """
    big = 0.0
    below = zeros = size = 0
    for chunk in [values] if isinstance(values, np.ndarray) else values:
        if not chunk.size:
            continue
        size += chunk.size
        finite_mask = np.isfinite(chunk)
        finite = chunk if finite_mask.all() else chunk[finite_mask]
        if finite.size:
            big = max(big, float(np.max(np.abs(finite))))
        below += int(np.count_nonzero(np.abs(chunk) < FP16_TINY))
        zeros += int(np.count_nonzero(chunk == 0))
    if big > FP16_MAX:
        return f"{label} has values beyond the FP16 range (max |w| = {big:.3g})"
    tiny, nonzero = below - zeros, size - zeros
    if tiny and tiny * 100 >= nonzero:
        return (f"{label}: {tiny} of {nonzero} nonzero values are below the "
                f"smallest FP16 subnormal and would flush to zero")
    return None


def scalar_low_unsafe(value: object) -> bool:
    """A finite Python float beyond the FP16 range (an op argument such as a fill value)."""
    return isinstance(value, float) and np.isfinite(value) and abs(value) > FP16_MAX


__all__ = ["FP16_MAX", "FP16_MIN_NORMAL", "FP16_TINY", "low_unsafe_reason", "scalar_low_unsafe"]
