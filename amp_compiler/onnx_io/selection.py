"""Outputs chosen by an index (TopK, ArgMax, ArgMin), and whether the FP32 choice is determined.

A detector's boxes are gathered at the indices of the top-k scores. Where scores tie closer than
the error validation allows, rounding in the converted model legitimately swaps their order, and
the gathered output then differs by whole rows: a YOLO-style head failed ``--validate`` at
relative error 0.9 on boxes whose scores agreed to 2e-5, and ``--fallback`` moved every Conv to
FP32 chasing the swap. The selection margin (the smallest gap between the scores the choice
depends on, relative to their magnitude) says whether the FP32 choice is determined within a
tolerance; an output chosen by an undetermined selection is not evidence either way
(docs/architecture.md, "Validation inputs").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import ModelProto, numpy_helper

__all__ = ["Selector", "index_selected_outputs", "selection_margin"]

_SELECTORS = ("TopK", "ArgMax", "ArgMin")


@dataclass(frozen=True)
class Selector:
    """An op choosing indices: its name, type, the scores it reads, and how it chooses."""

    node: str
    op_type: str
    scores: str
    k: str | None  # TopK's k input (a value name); None: one index (ArgMax/ArgMin)
    axis: int
    largest: bool


def index_selected_outputs(model: ModelProto) -> dict[str, Selector]:
    """Main-graph output -> the first selector (in node order) whose indices it depends on."""
    readers: dict[str, list] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    outputs = {o.name for o in model.graph.output}
    found: dict[str, Selector] = {}
    for index, node in enumerate(model.graph.node):
        if node.op_type not in _SELECTORS or node.domain not in ("", "ai.onnx") or not node.input:
            continue
        attrs = {a.name: a.i for a in node.attribute}
        top = node.op_type == "TopK"
        selector = Selector(node.name or f"{node.op_type}_{index}", node.op_type, node.input[0],
                            node.input[1] if top and len(node.input) > 1 else None, attrs.get("axis", -1 if top else 0),
                            bool(attrs.get("largest", 1)) if top else node.op_type == "ArgMax")
        indices = node.output[1] if top and len(node.output) > 1 else node.output[0]
        frontier, seen = [indices], {indices}
        while frontier:
            name = frontier.pop()
            if name in outputs:
                found.setdefault(name, selector)
            for reader in readers.get(name, ()):
                for out in reader.output:
                    if out and out not in seen:
                        seen.add(out)
                        frontier.append(out)
    return found


def selection_margin(selector: Selector, values: dict[str, np.ndarray], model: ModelProto) -> float | None:
    """The smallest gap between consecutive scores among the k + 1 best along the axis (the order
    of the k chosen, and the k-th against the first left out), relative to the largest |score|
    there; None where the scores or k are unknown."""
    scores = values.get(selector.scores)
    if scores is None or not np.issubdtype(np.asarray(scores).dtype, np.floating) or np.ndim(scores) == 0:
        return None
    k = 1
    if selector.k is not None:
        k_value = values.get(selector.k)
        if k_value is None:
            k_value = next((numpy_helper.to_array(t) for t in model.graph.initializer if t.name == selector.k), None)
        if k_value is None:
            return None
        k = int(np.asarray(k_value).reshape(-1)[0])
    ranked = np.sort(np.moveaxis(np.asarray(scores, dtype=np.float64), selector.axis, -1), axis=-1)
    if selector.largest:
        ranked = ranked[..., ::-1]
    ranked = ranked[..., :k + 1]
    if ranked.shape[-1] < 2:
        return None
    scale = float(np.max(np.abs(ranked))) or 1.0
    return float(np.min(np.abs(np.diff(ranked, axis=-1)))) / scale
