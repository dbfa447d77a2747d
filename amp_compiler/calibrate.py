"""Activation ranges from one FP32 run, so the planner never puts a tensor FP16 cannot hold in FP16.

Weights are checked statically (``numerics``); activations need data. ``activation_ranges``
runs the FP32 model once on ONNX Runtime with every float tensor of the main graph (and of
the ``If`` branches a boolean input chooses, ``onnx_io/taken_branches.py``, once per value)
made an output, and the values of its ``Loop``/``Scan`` bodies as per-iteration peaks
(``onnx_io/body_peaks.py``) (the calibration inputs are the user's, or seeded random ones) and returns the
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
from .onnx_io.body_peaks import body_peaks_exposed
from .onnx_io.probe import run_exposed
from .onnx_io.taken_branches import inline_taken_branches


def activation_ranges(model: ModelProto, graph: PrecisionGraph, feeds: dict[str, np.ndarray]) -> dict[str, float]:
    """Largest finite |value| of every float graph input and activation of the main graph, of the
    ``If`` branches a one-element boolean input chooses, run each way (a merged decoder's), and of
    the bodies of their ``Loop`` and ``Scan`` nodes."""
    from .validate import branch_feeds, run_model

    floats = [t.name for t in graph.tensors.values()
              if t.producer and t.dtype in ("float32", "float16", "bfloat16", "float64")]
    ranges: dict[str, float] = {}
    for _, variant in branch_feeds(model, feeds):
        probe = inline_taken_branches(model, variant)
        computed = {o for n in probe.graph.node for o in n.output}
        with body_peaks_exposed(probe, [t for t in floats if t not in computed]) as in_bodies:
            values = run_exposed(probe, [t for t in floats if t in computed] + list(in_bodies), variant, run_model,
                                 "calibration run of the FP32 model")
        for name, value in [*values.items(), *variant.items()]:
            arr = np.asarray(value)
            if arr.dtype.kind != "f" or arr.size == 0:
                continue
            name = in_bodies.get(name, name)  # a body value's peaks, one per iteration
            finite = arr[np.isfinite(arr)]
            ranges[name] = max(ranges.get(name, 0.0), float(np.max(np.abs(finite))) if finite.size else 0.0)
    return ranges
