"""The trip counts of a model's ``Loop`` nodes, where the file states them.

A Loop's first input ``M`` bounds its iterations. When it is an initializer or the output of a
``Constant`` node (a scripted loop over a fixed range, a decoder unrolled to a set length), the
body runs that many times per run of the model, at most (its condition may stop it earlier), and
the cost model prices the body that many times (``cost_model/repeats.py``). A count computed at
run time, or given as a graph input, is not known here. docs/architecture.md, "Cost model".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from onnx import TensorProto, numpy_helper

if TYPE_CHECKING:
    from .importer import OnnxImport

__all__ = ["loop_trip_counts"]

_INTS = (TensorProto.INT64, TensorProto.INT32)


def loop_trip_counts(imp: OnnxImport) -> dict[str, int]:
    """Loop op name -> its constant trip count ``M``, for the Loops whose ``M`` is one."""
    counts: dict[str, int] = {}
    for name, op in imp.graph.ops.items():
        if op.op_type != "Loop" or op.domain not in ("", "ai.onnx") or not op.inputs or not op.inputs[0]:
            continue
        value = _constant_scalar(imp, op.inputs[0])
        if value is not None:
            counts[name] = max(value, 0)
    return counts


def _constant_scalar(imp: OnnxImport, name: str) -> int | None:
    """The integer a one-element initializer or ``Constant`` output holds, else None."""
    tensor = imp.initializers.get(name)
    if tensor is None:
        t = imp.graph.tensors.get(name)
        node = imp.nodes.get(t.producer) if t is not None and t.producer else None
        if node is None or node.op_type != "Constant" or node.domain not in ("", "ai.onnx"):
            return None
        for attr in node.attribute:
            if attr.name == "value_int":
                return int(attr.i)
            if attr.name == "value":
                tensor = attr.t
        if tensor is None:
            return None
    if tensor.data_type not in _INTS or int(np.prod(tensor.dims, dtype=np.int64)) != 1 \
            or tensor.data_location == TensorProto.EXTERNAL:
        return None
    return int(numpy_helper.to_array(tensor).reshape(-1)[0])
