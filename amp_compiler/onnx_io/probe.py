"""Run a model with chosen intermediate tensors exposed as graph outputs.

Calibration (the FP32 value ranges) and the fallback (the error each op adds) both
need every float tensor of a run, not only the graph outputs (docs/architecture.md,
"Numerics").
"""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np
from onnx import ModelProto, helper

from .seeded import seeded_random_ops


def run_exposed(model: ModelProto, names: Iterable[str], feeds: dict[str, np.ndarray], runner: Callable,
                label: str) -> dict[str, np.ndarray]:
    """Values by name of the graph outputs and ``names`` after one run of ``model`` (left as it was).

    ``runner(model, feeds, label=...)`` runs it (``validate.run_model`` or ``run_reference``). The
    outputs are added to ``model`` for the run and taken off after it, not added to a copy: a copy
    of a model with its weights inline doubled the memory validation's overflow check needed.
    """
    graph = model.graph
    kept = len(graph.output)
    have = {o.name for o in graph.output}
    for name in names:
        if name not in have:
            graph.output.append(helper.make_empty_tensor_value_info(name))
            have.add(name)
    try:
        with seeded_random_ops(model):  # both models' runs draw the same dropout masks
            return dict(zip([o.name for o in graph.output], runner(model, feeds, label=label)))
    finally:
        del graph.output[kept:]
