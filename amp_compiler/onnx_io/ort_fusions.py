"""Cast shapes that ONNX Runtime's graph fusions would turn into an invalid model.

ONNX Runtime's ``LayerNormFusion`` (onnxruntime/core/optimizer/layer_norm_fusion.cc) rewrites a
written-out LayerNorm (ReduceMean -> Sub -> Pow -> ReduceMean -> Add -> Sqrt -> Div -> Mul -> Add)
into one ``LayerNormalization``. When the first ReduceMean reads a ``Cast`` whose only readers are
that ReduceMean and the Sub(s) (an "Apex O2" leading cast), the fusion absorbs the cast: the fused
node reads the cast's *input*. From opset 17 the fusion runs at level 1, before ops are assigned to
a provider, so its "no FP16 on CPU" check does not apply; and ONNX's ``LayerNormalization`` binds
X, Scale and B to one type. A plan that keeps the written-out LayerNorm FP32 (scale and bias FP32)
behind an FP16 producer therefore becomes ``LayerNormalization(X: fp16, Scale: fp32)``, which
ONNX Runtime refuses to load ("Type parameter (T) ... bound to different types").

The emitter writes such a widening cast as ``CastLike(x, <scalar of the target dtype>)``: the same
values, but not a ``Cast`` to the matcher, so ONNX Runtime fuses an all-FP32 LayerNormalization
behind it (and lowers the CastLike to a Cast afterwards). Where the plan puts the affine tail
(Mul, Add) in the producer's dtype the absorbed cast is type-correct and the Cast stays.
See docs/architecture.md, "ONNX emitter".
"""

from __future__ import annotations

from ..dtypes import is_float
from ..ir import Op, PrecisionGraph

#: ONNX Runtime fuses written-out LayerNorms before provider assignment from this opset on
_LEVEL1_LAYER_NORM_OPSET = 17


def castlike_casts(graph: PrecisionGraph) -> set[str]:
    """Names of inserted casts to write as CastLike: the leading cast of a written-out LayerNorm
    whose affine tail is not in the cast's source dtype (ONNX Runtime would fuse it into an
    ill-typed LayerNormalization)."""
    if graph.opsets.get("", 0) < _LEVEL1_LAYER_NORM_OPSET:
        return set()
    out = set()
    for op in graph.ops.values():
        if not op.inserted or op.op_type != "Cast" or not op.inputs or not op.inputs[0]:
            continue
        src = graph.tensors[op.inputs[0]].dtype
        tail = _layer_norm_tail(graph, op)
        if tail is not None and is_float(src) and graph.tensors[tail.outputs[0]].dtype != src:
            out.add(op.name)
    return out


def _layer_norm_tail(graph: PrecisionGraph, cast: Op) -> Op | None:
    """The scale ``Mul`` of the written-out LayerNorm that ONNX Runtime would fuse with ``cast``
    absorbed, or None when its matcher would not absorb the cast."""
    out = graph.tensors[cast.outputs[0]]
    if out.is_graph_output:
        return None
    readers = [graph.ops[name] for name, _ in out.consumers]
    means = [r for r in readers if r.op_type == "ReduceMean"]
    subs = [r for r in readers if r.op_type == "Sub"]
    if len(means) != 1 or not 1 <= len(subs) <= 2 or len(readers) != len(subs) + 1:
        return None
    mean_readers = {name for name, _ in graph.tensors[means[0].outputs[0]].consumers}
    if mean_readers != {s.name for s in subs}:
        return None
    for sub in subs:
        div = _only_reader(graph, sub, "Div", through_cast=True, single=False)
        if div is not None:
            return _only_reader(graph, div, "Mul", through_cast=True)
    return None


def _only_reader(graph: PrecisionGraph, op: Op, op_type: str, through_cast: bool, single: bool = True) -> Op | None:
    """The reader of ``op``'s output of type ``op_type`` (past one Cast when ``through_cast``); with
    ``single``, only when it is the output's sole reader."""
    readers = [graph.ops[name] for name, _ in graph.tensors[op.outputs[0]].consumers]
    if through_cast and len(readers) == 1 and readers[0].op_type == "Cast":
        readers = [graph.ops[name] for name, _ in graph.tensors[readers[0].outputs[0]].consumers]
    found = [r for r in readers if r.op_type == op_type]
    if not found or single and len(readers) != 1:
        return None
    return found[0]


__all__ = ["castlike_casts"]
