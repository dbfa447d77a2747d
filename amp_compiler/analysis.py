"""Measure any ONNX model with amp-compiler's cost model: a common ruler for every converter.

``analyze_model(model)`` imports a model -- ours, a peer tool's, or the FP32 original --
with the ONNX importer, gives every op its roles with the classify pass (so the ruler
knows which ports take the op's precision), then prices each op **at the dtype it
actually has in the file** with the planner's own ``cost_model.timer.OpTimer``:

* an op with float ports is charged ``OpTimer.time(op, dtype)``, where ``dtype`` is the
  dtype of its unit ports in the model (a converter that left a Softmax in FP32 pays
  the FP32 time, one that made it FP16 pays the FP16 time);
* every Cast between two float dtypes present in the model is charged as the
  planner charges the casts it inserts (``OpTimer.cast_op_time``: on the ``deploy``
  runtime's fusion groups, free inside a fused kernel, memory traffic where casts fuse,
  traffic plus a launch where a cast is a kernel of its own);
* ops without float data (shape arithmetic, integer casts) are not charged, as in
  the planner's own prediction.

The same pass also gives the FP16 share of GEMM/conv FLOPs (tensor-core ops whose
unit ports are in a low-precision dtype) and the counts of nodes and casts. Applied
to amp-compiler's own output it reproduces the report's ``predicted_time_mixed_s``
(the planner charges the same op times and the same casts).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

from onnx import AttributeProto, GraphProto, ModelProto

from .dtypes import FLOAT32, LOW_PRECISION, is_float
from .ir import UNIT, Op, PrecisionGraph
from .onnx_io.order import replace_nodes, stable_topological_order

__all__ = ["ModelAnalysis", "analyze_model", "predicted_time", "sort_nodes", "topologically_sorted"]


@dataclass
class ModelAnalysis:
    """What the ruler measured on one model (times in seconds, on ``target``)."""

    target: str
    nodes: int  # every node of the model, subgraphs included
    float_ops: int  # ops with float data (the ones the ruler charges)
    low_precision_ops: int  # of those, ops whose float ports are FP16/BF16
    casts: int  # Cast nodes between two float dtypes
    cast_bytes: int  # bytes those casts read and write
    gemm_flops: float
    low_gemm_flops: float
    predicted_time_s: float
    predicted_cast_time_s: float

    @property
    def fp16_gemm_flop_fraction(self) -> float:
        return self.low_gemm_flops / self.gemm_flops if self.gemm_flops else 1.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fp16_gemm_flop_fraction": self.fp16_gemm_flop_fraction}


def analyze_model(model: ModelProto | str | os.PathLike, *, target: str = "h100", default_dim: int = 8,
                  dim_values: dict[str, int] | None = None, profile=None,
                  deploy: str = "ort-cuda") -> ModelAnalysis:
    """Price every op of ``model`` at its actual dtype on ``target``, fused as the ``deploy``
    runtime fuses (``cost_model/runtime.py``; default as ``convert_onnx``); see the module docstring."""
    from passes import ClassifyPass
    from cost_model.timer import OpTimer

    from .onnx_io.files import load_model
    from .onnx_io.importer import import_model
    from .plan import make_context

    proto = model if isinstance(model, ModelProto) else load_model(model)
    # ONNX requires topological order but ONNX Runtime sorts what it loads, and some converters
    # append their casts at the end; the importer reads nodes in file order, so sort a copy.
    if not topologically_sorted(proto.graph):
        sorted_copy = ModelProto()
        sorted_copy.CopyFrom(proto)
        sort_nodes(sorted_copy.graph)
        proto = sorted_copy
    imp = import_model(proto, source="model" if isinstance(model, ModelProto) else os.path.basename(str(model)),
                       default_dim=default_dim)
    graph = imp.graph
    graph.set_dim_sizes(default_dim, dim_values)
    ctx = make_context(target=target, default_dim=default_dim, profile=profile, runtime=deploy)
    ClassifyPass()(graph, ctx)
    timer = OpTimer(graph, ctx, as_written=True)  # what ONNX Runtime fuses in this very file
    total = cast_time = 0.0
    gemm = low_gemm = 0.0
    float_ops = low_ops = casts = cast_bytes = 0
    for op in graph.ops.values():
        if op.canonical == "cast" and op.op_type in ("Cast", "CastLike"):  # CastLike: onnx_io/ort_fusions.py
            src, dst = _cast_dtypes(graph, op)
            if src is None:
                continue
            if src != dst:  # an identity cast costs nothing: ONNX Runtime removes it
                t = graph.tensors[op.inputs[0]]
                seconds = timer.cast_op_time(op, src, dst)
                total += seconds
                cast_time += seconds
                casts += 1
                cast_bytes += graph.nbytes(t) + graph.nbytes(op.outputs[0])
            continue
        dtype = _unit_dtype(graph, op)
        if dtype is None:
            continue
        float_ops += 1
        low = dtype in LOW_PRECISION
        low_ops += low
        total += timer.time(op, dtype)
        if op.tensor_core:
            flops = timer.flops(op)
            gemm += flops
            if low:
                low_gemm += flops
    return ModelAnalysis(target=target, nodes=len(graph.ops), float_ops=float_ops, low_precision_ops=low_ops,
                         casts=casts, cast_bytes=int(cast_bytes), gemm_flops=gemm, low_gemm_flops=low_gemm,
                         predicted_time_s=total, predicted_cast_time_s=cast_time)


def predicted_time(model: ModelProto | str | os.PathLike, *, target: str = "h100", **kw: Any) -> float:
    """Seconds the cost model predicts for ``model`` as it is (each op at its own dtype)."""
    return analyze_model(model, target=target, **kw).predicted_time_s


def topologically_sorted(graph: GraphProto) -> bool:
    """Whether every node of ``graph`` reads only values defined before it (outer names aside)."""
    known = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {""}
    for node in graph.node:
        if any(name not in known for name in node.input):
            return False
        known.update(node.output)
    return True


def sort_nodes(graph: GraphProto) -> None:
    """Reorder the main graph's nodes topologically (stable; names from outer scopes or subgraph
    captures that no node produces are taken as available)."""
    produced = {out: i for i, node in enumerate(graph.node) for out in node.output if out}
    deps: list[set[int]] = []
    for i, node in enumerate(graph.node):
        names = set(node.input)
        for a in node.attribute:  # subgraphs may read main-graph values
            for sub in ([a.g] if a.type == AttributeProto.GRAPH else list(a.graphs)):
                names.update(inp for n in sub.node for inp in n.input)
        deps.append({produced[n] for n in names if n in produced and produced[n] != i})
    order, stuck = stable_topological_order(deps)
    if stuck:  # a cycle: leave the graph as it is, the importer will say what is wrong
        return
    replace_nodes(graph, [graph.node[i] for i in order])


def _cast_dtypes(graph: PrecisionGraph, op: Op) -> tuple[str | None, str | None]:
    if not op.inputs or not op.inputs[0] or not op.outputs or not op.outputs[0]:
        return None, None
    src = graph.tensors[op.inputs[0]].dtype
    dst = graph.tensors[op.outputs[0]].dtype
    if not is_float(src) or not is_float(dst):
        return None, None
    return src, dst


def _unit_dtype(graph: PrecisionGraph, op: Op) -> str | None:
    """The dtype the op computes in: that of its first float unit port (outputs first)."""
    for names, roles in ((op.outputs, op.output_roles), (op.inputs, op.input_roles)):
        for name, role in zip(names, roles):
            if name and role == UNIT:
                dtype = graph.tensors[name].dtype
                if is_float(dtype):
                    return dtype
    return None if not op.has_unit_ports else FLOAT32
