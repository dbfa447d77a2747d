"""Activation ranges from one FP32 run, so the planner never puts an overflowing tensor in FP16.

Weights are checked statically (``numerics``); activations need data. ``activation_ranges``
runs the FP32 model once on ONNX Runtime with every float tensor of the main graph made
an output (the calibration inputs are the user's, or seeded random ones) and returns the
largest finite magnitude each tensor reached. ``mark_ranges`` stores them on the IR; the
propagate pass then keeps in FP32 every op that writes, or reads through a unit port, a
tensor whose magnitude exceeds ``FP16_MAX / margin``.
"""

from __future__ import annotations

import numpy as np
from onnx import ModelProto, TensorProto, helper

from .ir import PrecisionGraph
from .numerics import FP16_MAX

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


def mark_ranges(graph: PrecisionGraph, ranges: dict[str, float], margin: float = 2.0) -> int:
    """Flag tensors whose calibrated magnitude leaves no ``margin`` below FP16's maximum."""
    limit = FP16_MAX / margin
    flagged = 0
    for name, peak in ranges.items():
        t = graph.tensors.get(name)
        if t is not None and peak > limit:
            t.range_unsafe = f"activation {name} reaches {peak:.3g} on the calibration data (FP16 max 65504)"
            flagged += 1
    return flagged
