"""Activation ranges from one FP32 run, so the planner never puts a tensor FP16 cannot hold in FP16.

Weights are checked statically (``numerics``); activations need data. ``activation_ranges``
runs the FP32 model once on ONNX Runtime with every float tensor of the main graph made
an output (the calibration inputs are the user's, or seeded random ones) and returns the
largest finite magnitude each tensor reached; the caller records it as ``Tensor.calibrated_peak``.
The numerics pass (``passes/numerics.py``) judges the peaks for the target dtype: those
that would overflow (above the dtype's max / margin) and those that would underflow (nonzero
but below its smallest normal, so every value would be subnormal -- the vanishing activations
of a deep network). The propagate pass keeps in FP32 every op that writes, or reads through a
unit port, a flagged tensor.
"""

from __future__ import annotations

import numpy as np
from onnx import ModelProto

from .ir import PrecisionGraph
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
