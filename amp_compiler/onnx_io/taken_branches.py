"""A model with the ``If`` branches its feeds take written into the main graph, for probed runs.

Calibration and validation's overflow check read values by exposing them as graph outputs, which
only a main-graph value can be. A merged decoder (optimum's ``decoder_model_merged``: an ``If`` on
``use_cache_branch`` around two whole decoders) has every GEMM in a branch, so neither saw any of
them: a T5 whose FFN overflows FP16 in both branches was neither kept FP32 by ``--calibrate`` nor
failed by ``--validate``. Where the condition is a one-element boolean graph input that the feeds
give, the branch it takes replaces the ``If`` (its outputs renamed to the ``If``'s through
``Identity``); value names are unique across scopes, so the branch's values keep theirs.
docs/architecture.md, "Numerics".
"""

from __future__ import annotations

import numpy as np
from onnx import ModelProto, helper


def inline_taken_branches(model: ModelProto, feeds: dict) -> ModelProto:
    """``model`` itself where no main-graph ``If`` is conditioned on a fed boolean input, else a copy
    with each such ``If`` replaced by the branch its condition takes."""
    taken = {name: bool(np.asarray(value).reshape(-1)[0]) for name, value in feeds.items()
             if isinstance(value, np.ndarray) and value.dtype == np.bool_ and value.size == 1}
    if not any(n.op_type == "If" and n.input and n.input[0] in taken for n in model.graph.node):
        return model
    out = ModelProto()
    out.CopyFrom(model)
    nodes = []
    for node in out.graph.node:
        if node.op_type != "If" or node.input[0] not in taken:
            nodes.append(node)
            continue
        branch = next(a.g for a in node.attribute if a.name == ("then_branch" if taken[node.input[0]] else "else_branch"))
        nodes.extend(branch.node)
        out.graph.initializer.extend(branch.initializer)
        nodes.extend(helper.make_node("Identity", [formal.name], [actual], name=f"{node.name}/{actual}")
                     for formal, actual in zip(branch.output, node.output) if actual)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


__all__ = ["inline_taken_branches"]
