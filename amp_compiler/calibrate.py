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
from onnx import ModelProto, TensorProto, helper

from .ir import PrecisionGraph

_FLOAT_CODES = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE)


def activation_ranges(model: ModelProto, graph: PrecisionGraph, feeds: dict[str, np.ndarray]) -> dict[str, float]:
    """Largest finite |value| of every float graph input and activation of the main graph."""
    from .validate import run_model

    probe = ModelProto()
    probe.CopyFrom(model)
    existing = {o.name for o in probe.graph.output}
    names = [t.name for t in graph.tensors.values()
             if t.producer and not t.scope and t.dtype in ("float32", "float16", "bfloat16", "float64")]
    for name in names:
        if name not in existing:
            probe.graph.output.append(helper.make_empty_tensor_value_info(name))
    all_names = [o.name for o in probe.graph.output]
    values = run_model(probe, feeds, label="calibration run of the FP32 model")
    ranges = {}
    for name, value in [*zip(all_names, values), *feeds.items()]:
        arr = np.asarray(value)
        if arr.dtype.kind != "f" or arr.size == 0:
            continue
        finite = arr[np.isfinite(arr)]
        ranges[name] = float(np.max(np.abs(finite))) if finite.size else 0.0
    return ranges
