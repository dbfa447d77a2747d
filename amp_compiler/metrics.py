"""The one error measure between an FP32 reference and a mixed-precision result.

``max |got - ref| / max |ref|`` over the reference's finite values: relative to the
output's magnitude, so values near zero do not blow the measure up. A shape mismatch,
or non-finite values where the reference has finite ones (or the reverse), is an
infinite error. Used by validation, the fallback, the benchmarks and the tests
(docs/architecture.md, "Numerics"). NumPy only: torch tensors go in as ``.numpy()``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["error_stats", "max_rel_error", "rel_error"]


def error_stats(ref, got) -> tuple[float, float]:
    """(max absolute error, max relative error) of ``got`` against ``ref``."""
    ref64, got64 = np.asarray(ref, dtype=np.float64), np.asarray(got, dtype=np.float64)
    if ref64.shape != got64.shape:
        return float("inf"), float("inf")
    finite = np.isfinite(ref64)
    if np.any(np.isfinite(got64) != finite):
        return float("inf"), float("inf")
    if not finite.any():
        return 0.0, 0.0
    scale = float(np.max(np.abs(ref64[finite])))
    max_abs = float(np.max(np.abs(ref64[finite] - got64[finite])))
    return max_abs, (max_abs / scale if scale > 0 else max_abs)


def rel_error(ref, got) -> float:
    """``max |got - ref| / max |ref|`` (see the module docstring)."""
    return error_stats(ref, got)[1]


def max_rel_error(expected: Sequence, actual: Sequence) -> float:
    """The worst ``rel_error`` over paired outputs (0.0 for none)."""
    return max((rel_error(a, b) for a, b in zip(expected, actual, strict=True)), default=0.0)
