"""``NonZero`` of a ``ConstantOfShape`` filled with a non-zero value, as a ``Range`` in the copy that
ONNX Runtime's symbolic inference shapes.

The TorchScript exporter writes ``torch.arange(n)`` (and the index maths of ``as_strided``) as
``NonZero(ConstantOfShape([n], value=1))``: its count depends on data to that inference, which
names it anew (``NonZero_301_o0__d1``). A Longformer exported with ``dynamo=False`` lost every dim
of its sliding-window attention so, and its Einsums were priced at ``--default-dim``. For a
one-element shape the count is ``n``: ``Unsqueeze(Range(0, n, 1), 0)`` has the same shape, and that
inference sizes it from ``n``. docs/architecture.md, "Input handling".
"""

from __future__ import annotations

import numpy as np
from onnx import GraphProto, NodeProto, helper, numpy_helper


def nonzero_as_range(graph: GraphProto) -> int:
    """Rewrite each such ``NonZero`` of ``graph`` (a shape-model copy) in place; returns how many."""
    producer = {o: n for n in graph.node for o in n.output if o}
    rewritten = []
    for node in graph.node:
        source = producer.get(node.input[0]) if node.op_type == "NonZero" else None
        if source is not None and source.op_type == "ConstantOfShape" and _one_nonzero_value(source):
            rewritten.append((node, _as_range(node, source.input[0])))
    for node, replacement in rewritten:
        at = list(graph.node).index(node)
        del graph.node[at]
        for i, new in enumerate(replacement):
            graph.node.insert(at + i, new)
    return len(rewritten)


def _one_nonzero_value(node: NodeProto) -> bool:
    """Whether ``node`` (a ConstantOfShape) fills with a non-zero value (its default is 0)."""
    value = next((a.t for a in node.attribute if a.name == "value"), None)
    return value is not None and bool(numpy_helper.to_array(value).any())


def _as_range(node: NodeProto, shape: str) -> list[NodeProto]:
    """Nodes computing ``Unsqueeze(Range(0, n, 1), 0)`` into ``node``'s output, ``shape`` being ``[n]``;
    the shape must have one element (the inference checks the Squeeze)."""
    out, tag = node.output[0], f"{node.output[0]}__amp_range"
    ints = {name: numpy_helper.from_array(np.array(v, dtype=np.int64))
            for name, v in ((f"{tag}_zero", 0), (f"{tag}_one", 1), (f"{tag}_axes", [0]))}
    return [*(helper.make_node("Constant", [], [name], value=t) for name, t in ints.items()),
            helper.make_node("Squeeze", [shape, f"{tag}_axes"], [f"{tag}_n"]),
            helper.make_node("Range", [f"{tag}_zero", f"{tag}_n", f"{tag}_one"], [f"{tag}_values"]),
            helper.make_node("Unsqueeze", [f"{tag}_values", f"{tag}_axes"], [out])]


__all__ = ["nonzero_as_range"]
