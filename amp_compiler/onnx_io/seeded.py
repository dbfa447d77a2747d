"""Random ops run with a fixed seed while validation compares two models.

An unseeded ``Dropout`` left in training mode (``onnx_io/train_mode.py``) or a ``RandomNormal``
draws from a generator ONNX Runtime seeds per session, and the overflow check's runs, which
expose every value as an output, drew different masks for the FP32 and the converted model: an
MLP exported with ``TrainingMode.TRAINING`` failed validation at 0.58 relative error under
``--planner all`` with its precision error at 4e-4. With a seed on each such op, both models draw
the same values, so what validation measures is the plan's rounding, not the dice.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from onnx import ModelProto, helper

from .annotate import walk_nodes

# the standard ops with a ``seed`` attribute, and its type: Dropout's is an int, the others' a float
SEEDS = {"Dropout": 0, "RandomNormal": 0.0, "RandomUniform": 0.0, "RandomNormalLike": 0.0,
         "RandomUniformLike": 0.0, "Bernoulli": 0.0, "Multinomial": 0.0}


@contextlib.contextmanager
def seeded_random_ops(model: ModelProto) -> Iterator[int]:
    """``model`` with a ``seed`` on every unseeded random op (in subgraphs too) for the block, taken
    off after it (changed in place, as ``probe.run_exposed`` adds its outputs: no copy of the
    weights); yields how many ops were seeded."""
    added = []
    for node in walk_nodes(model.graph):
        if node.op_type in SEEDS and node.domain in ("", "ai.onnx") \
                and not any(a.name == "seed" for a in node.attribute):
            node.attribute.append(helper.make_attribute("seed", SEEDS[node.op_type]))
            added.append(node)
    try:
        yield len(added)
    finally:
        for node in added:
            seed = next(i for i, a in enumerate(node.attribute) if a.name == "seed")
            del node.attribute[seed]
