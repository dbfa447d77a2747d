"""Nodes an export left in training mode (docs/architecture.md, "Input handling").

A model exported while in train mode (torch's dynamo exporter writes a wrapper made after
``.eval()``, or a model never put in eval mode, as it runs) keeps ``Dropout`` with
``training_mode=True`` and ``BatchNormalization`` with ``training_mode=1``: ONNX Runtime really drops
values and normalises by the batch's statistics at inference. Stochastic depth (timm's and transformers'
``drop_path``: ``floor(keep_prob + rand(shape))``, no Dropout node) is written out as
RandomUniform(Like) -> Add -> Floor, and drops whole residual branches likewise (a CvT and a SegFormer
exported by the dynamo exporter through a wrapper left in train mode). A random op in an eval-mode
graph (ViT-MAE's patch shuffle) reaches no Floor that way and is not named. Conversion keeps that behaviour (it is
the model's), and validation passed, both sessions drawing the same mask; the report says it once.
"""

from __future__ import annotations

import numpy as np
from onnx import ModelProto, numpy_helper

from .annotate import walk_nodes


#: random ops whose draw stochastic depth shifts and floors into a keep mask
DRAWS = frozenset({"RandomUniform", "RandomUniformLike"})


def training_mode_nodes(model: ModelProto, nested: bool = True) -> list[str]:
    """Names (or op types) of the Dropout nodes whose ``training_mode`` input is a constant true, of
    the BatchNormalization nodes with ``training_mode=1`` and of the random draws a drop path floors
    (``_drop_path_draw``); ``nested=False`` where no node holds a subgraph (``walk_nodes``). One walk: a
    Constant comes before the nodes reading it."""
    constants = {t.name: t for t in model.graph.initializer}
    found = []
    draws: dict[str, str] = {}  # tensor -> the random node it is drawn by, through an Add
    for node in walk_nodes(model.graph, nested):
        op = node.op_type
        if (draw := _drop_path_draw(node, draws)) is not None:
            found.append(draw)
        elif op == "Constant" and node.output:
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


def _drop_path_draw(node, draws: dict[str, str]) -> str | None:
    """Follows random draws through one Add (``keep_prob + rand``) in ``draws``; for the Floor that
    makes the keep mask of one, the random node's name (first Floor only)."""
    if node.domain not in ("", "ai.onnx") or not node.output:
        return None
    if node.op_type in DRAWS:
        draws[node.output[0]] = node.name or node.op_type
    elif node.op_type == "Add" and (drawn := next((draws[i] for i in node.input if i in draws), None)):
        draws[node.output[0]] = drawn
    elif node.op_type == "Floor" and node.input and node.input[0] in draws:
        return draws.pop(node.input[0])
    return None


def training_mode_note(model: ModelProto, nested: bool = True) -> str:
    """The report's line for ``training_mode_nodes``; "" when there are none."""
    found = training_mode_nodes(model, nested)
    if not found:
        return ""
    shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
    return (f"exported in training mode: {len(found)} Dropout/BatchNormalization/drop-path nodes ({shown}) drop values or "
            "use the batch's statistics at inference, in FP32 and mixed alike; export after model.eval()")


__all__ = ["DRAWS", "training_mode_nodes", "training_mode_note"]
