"""Value checks both importers share: can a stored FP32 weight be held in FP16?

DESIGN.md section 5: weights outside the FP16 range, or that would flush to zero,
keep FP32 -- never clamp silently. The importers call ``low_unsafe_reason`` on each
FP32 constant and store the answer in ``Tensor.low_unsafe``; the propagate pass keeps
the ops reading such a constant in FP32.
"""

from __future__ import annotations

import numpy as np

FP16_MAX = 65504.0
FP16_TINY = 2.0 ** -24  # smallest FP16 subnormal: nonzero magnitudes below it flush to zero
FP16_MIN_NORMAL = 2.0 ** -14  # below it FP16 values are subnormal: fewer than 11 significant bits


def low_unsafe_reason(label: str, values: np.ndarray) -> str | None:
    """Why ``values`` (float32) cannot be stored in FP16, or None; ``label`` names the weight."""
    if values.size == 0:
        return None
    with np.errstate(invalid="ignore"):
        big = max(abs(float(np.nanmin(values))), abs(float(np.nanmax(values))))
    if big > FP16_MAX and np.isfinite(big):
        return f"{label} has values beyond the FP16 range (max |w| = {big:.3g})"
    below = np.count_nonzero(np.abs(values) < FP16_TINY)
    if not below:
        return None
    zeros = np.count_nonzero(values == 0)
    tiny, nonzero = below - zeros, values.size - zeros
    if tiny and tiny * 100 >= nonzero:
        return (f"{label}: {tiny} of {nonzero} nonzero values are below the "
                f"smallest FP16 subnormal and would flush to zero")
    return None


def scalar_low_unsafe(value: object) -> bool:
    """A finite Python float beyond the FP16 range (an op argument such as a fill value)."""
    return isinstance(value, float) and np.isfinite(value) and abs(value) > FP16_MAX


__all__ = ["FP16_MAX", "FP16_MIN_NORMAL", "FP16_TINY", "low_unsafe_reason", "scalar_low_unsafe"]
