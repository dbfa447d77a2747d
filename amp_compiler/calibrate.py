"""Activation ranges from one FP32 run, so the planner never puts a tensor FP16 cannot hold in FP16.

Weights are checked statically (``numerics``); activations need data. ``activation_ranges``
runs the FP32 model once on ONNX Runtime with every float tensor of the main graph made
an output (the calibration inputs are the user's, or seeded random ones) and returns the
largest finite magnitude each tensor reached. ``mark_ranges`` flags, for FP16, the tensors
that would overflow (magnitude above ``FP16_MAX / margin``) and those that would underflow:
nonzero but never reaching FP16's smallest normal number (6.1e-5), so every value would be
subnormal, losing precision or flushing to zero -- the vanishing activations of a deep
network. The propagate pass keeps in FP32 every op that writes, or reads through a unit
port, a flagged tensor. BF16 has FP32's exponent range: nothing to flag.
"""

from __future__ import annotations

import numpy as np
from onnx import ModelProto

from .ir import PrecisionGraph
from .numerics import FP16_MAX, FP16_MIN_NORMAL
from .onnx_io.probe import run_exposed


def activation_ranges(model: ModelProto, graph: PrecisionGraph, feeds: dict[str, np.ndarray]) -> dict[str, float]:
    """Largest finite |value| of every float graph input and activation of the main graph."""
    from .validate import run_model

    names = [t.name for t in graph.tensors.values()
             if t.producer and not t.scope and t.dtype in ("float32", "float16", "bfloat16", "float64")]
    values = run_exposed(model, names, feeds, run_model, "calibration run of the FP32 model")
    ranges = {}
    for name, value in [*values.items(), *feeds.items()]:
        arr = np.asarray(value)
        if arr.dtype.kind != "f" or arr.size == 0:
            continue
        finite = arr[np.isfinite(arr)]
        ranges[name] = float(np.max(np.abs(finite))) if finite.size else 0.0
    return ranges


def mark_ranges(graph: PrecisionGraph, ranges: dict[str, float], margin: float = 2.0,
                low_dtype: str = "float16") -> int:
    """Flag tensors whose calibrated magnitude FP16 cannot hold (overflow with ``margin``, or underflow)."""
    if low_dtype != "float16":
        return 0
    limit = FP16_MAX / margin
    flagged = 0
    for name, peak in ranges.items():
        t = graph.tensors.get(name)
        if t is None:
            continue
        if peak > limit:
            t.range_unsafe = f"activation {name} reaches {peak:.3g} on the calibration data (FP16 max 65504)"
        elif 0 < peak < FP16_MIN_NORMAL:
            t.range_unsafe = (f"activation {name} peaks at {peak:.3g} on the calibration data: in FP16 every "
                              f"value would be subnormal (below 6.1e-05), losing precision or flushing to zero")
        else:
            continue
        flagged += 1
    return flagged
