"""Nodes an export left in training mode (docs/architecture.md, "Input handling").

A model exported while in train mode (torch's dynamo exporter writes a wrapper made after
``.eval()``, or a model never put in eval mode, as it runs) keeps ``Dropout`` with
``training_mode=True`` and ``BatchNormalization`` with ``training_mode=1``: ONNX Runtime really drops
values and normalises by the batch's statistics at inference. Conversion keeps that behaviour (it is
the model's), and validation passed, both sessions drawing the same mask; the report says it once.
"""

from __future__ import annotations

import numpy as np
from onnx import ModelProto, numpy_helper

from .annotate import walk_nodes


def training_mode_nodes(model: ModelProto, nested: bool = True) -> list[str]:
    """Names (or op types) of the Dropout nodes whose ``training_mode`` input is a constant true and
    of the BatchNormalization nodes with ``training_mode=1``; ``nested=False`` where no node holds a
    subgraph (``walk_nodes``). One walk: a Constant comes before the nodes reading it."""
    constants = {t.name: t for t in model.graph.initializer}
    found = []
    for node in walk_nodes(model.graph, nested):
        op = node.op_type
        if op == "Constant" and node.output:
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            if value is not None:
                constants[node.output[0]] = value
        elif op == "Dropout" and node.domain in ("", "ai.onnx") and len(node.input) > 2 \
                and node.input[2] in constants:
            if bool(np.all(numpy_helper.to_array(constants[node.input[2]]))):
                found.append(node.name or op)
        elif op == "BatchNormalization" and node.domain in ("", "ai.onnx"):
            if any(a.name == "training_mode" and a.i == 1 for a in node.attribute):
                found.append(node.name or op)
    return found


def training_mode_note(model: ModelProto, nested: bool = True) -> str:
    """The report's line for ``training_mode_nodes``; "" when there are none."""
    found = training_mode_nodes(model, nested)
    if not found:
        return ""
    shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
    return (f"exported in training mode: {len(found)} Dropout/BatchNormalization nodes ({shown}) drop values or "
            "use the batch's statistics at inference, in FP32 and mixed alike; export after model.eval()")


__all__ = ["training_mode_nodes", "training_mode_note"]
