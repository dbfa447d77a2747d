"""Decomposed RMSNorms that ONNX Runtime runs as one ``SimplifiedLayerNormalization`` kernel.

ONNX Runtime's ``SimplifiedLayerNormFusion`` (onnxruntime/core/optimizer/layer_norm_fusion.cc)
fuses ``x -> Pow -> ReduceMean -> Add eps -> Sqrt -> Div(x, .) -> Mul(scale)`` (each
intermediate read once, the scale 1-D, one reduced axis) into one kernel that computes in FP32
whatever its input and output dtypes; on the CUDA EP it also folds a leading ``Cast`` read by
exactly the Pow and the Div, and a ``Cast`` between the Div and the scale Mul, into that kernel.

``rms_norms`` finds these groups on a graph. With ``rsqrt_form`` it also accepts the dynamo
exporter's ``Sqrt -> Reciprocal -> Mul(x, r)`` tail and the TorchScript exporter's
``Sqrt -> Div(1, .) -> Mul(x, r)`` (which ONNX Runtime leaves unfused): the ONNX
emitter rewrites exactly those into the Div form (``amp_compiler/onnx_io/rms_norm_form.py``),
so a plan is priced as it will run, while a model priced as written (``analysis``) is not.
See docs/architecture.md, "Runtime profiles".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the cost model does not import the IR at run time (docs/architecture.md, "Cost model")
    from amp_compiler.ir import Op, PrecisionGraph

__all__ = ["RmsNorm", "reciprocal_of", "rms_norms"]

_CONST_KINDS = ("constant", "parameter")  # amp_compiler.ir.CONSTANT, PARAMETER


@dataclass(frozen=True)
class RmsNorm:
    """One fusable RMSNorm: its ops (model casts included), the value it normalises (``x``,
    the input of its leading cast if it has one), its scale Mul, and its Reciprocal if any."""

    members: tuple[str, ...]
    x: str
    scale_mul: str
    reciprocal: str | None


def rms_norms(graph: PrecisionGraph, rsqrt_form: bool) -> list[RmsNorm]:
    """The fusable RMSNorms of ``graph`` (see module docstring), none sharing an op."""
    found = []
    for op in graph.ops.values():
        if op.op_type == "Pow" and not op.inserted:
            norm = _match(graph, op, rsqrt_form)
            if norm is not None:
                found.append(norm)
    return found


def _match(graph: PrecisionGraph, power: Op, rsqrt_form: bool) -> RmsNorm | None:
    x = power.inputs[0]
    mean = _sole_reader(graph, power, "ReduceMean")
    add = _sole_reader(graph, mean, "Add") if mean is not None and _reduces_last_axis(graph, mean) else None
    sqrt = _sole_reader(graph, add, "Sqrt") if add is not None else None
    if sqrt is None:
        return None
    members = [power, mean, add, sqrt]
    recip = None
    div = _sole_reader(graph, sqrt, "Div")
    if div is not None and div.inputs[:2] == [x, sqrt.outputs[0]]:
        norm = div
    elif rsqrt_form and (recip := _sole_reader(graph, sqrt, "Reciprocal") or _one_over(graph, sqrt)) is not None:
        norm = _sole_reader(graph, recip, "Mul")
        if norm is None or sorted(norm.inputs) != sorted([x, recip.outputs[0]]):
            return None
        members.append(recip)
    else:
        return None
    members.append(norm)
    after = _sole_reader(graph, norm, "Cast")
    if after is not None:
        members.append(after)
    scale = _sole_reader(graph, after or norm, "Mul")
    if scale is None or not _scaled(graph, scale, (after or norm).outputs[0]):
        return None
    members.append(scale)
    lead = graph.ops[graph.tensors[x].producer] if graph.tensors[x].producer else None
    readers = {c for c, _ in graph.tensors[x].consumers}
    if lead is not None and lead.op_type == "Cast" and not lead.inserted and readers == {power.name, norm.name} \
            and not graph.tensors[x].is_graph_output:
        members.insert(0, lead)
        x = lead.inputs[0]
    return RmsNorm(tuple(op.name for op in members), x, scale.name, recip.name if recip else None)


def _one_over(graph: PrecisionGraph, sqrt: Op) -> Op | None:
    """``Div(1, sqrt)``, the TorchScript exporter's ``torch.rsqrt`` tail (before ``Mul(x, r)``)."""
    div = _sole_reader(graph, sqrt, "Div")
    return div if div is not None and reciprocal_of(graph, div) == sqrt.outputs[0] else None


def reciprocal_of(graph: PrecisionGraph, op: Op) -> str | None:
    """What ``op`` takes the reciprocal of, when it is ``Div(1, d)``: ``d``; else None."""
    if op.op_type != "Div" or len(op.inputs) != 2 or not all(op.inputs):
        return None
    stats = graph.tensors[op.inputs[0]].stats  # recorded for constants only
    return op.inputs[1] if stats is not None and stats.value == 1.0 else None


def _sole_reader(graph: PrecisionGraph, op: Op, op_type: str) -> Op | None:
    """``op``'s output's only reader, if it is a source op of ``op_type`` and the value is no graph output."""
    t = graph.tensors[op.outputs[0]]
    if len(t.consumers) != 1 or t.is_graph_output:
        return None
    reader = graph.ops[t.consumers[0][0]]
    return reader if reader.op_type == op_type and not reader.inserted and reader.scope == op.scope else None


def _reduces_last_axis(graph: PrecisionGraph, mean: Op) -> bool:
    """Keeps dims and reduces exactly the last axis (read off the shapes: opset 18 passes axes as an input)."""
    src, out = graph.tensors[mean.inputs[0]].shape, graph.tensors[mean.outputs[0]].shape
    return bool(src and out and len(src) == len(out) and out[-1] == 1 and src[-1] != 1
                and tuple(src[:-1]) == tuple(out[:-1]))


def _scaled(graph: PrecisionGraph, scale: Op, normed: str) -> bool:
    """The scale Mul multiplies the norm by a stored (or constant-folded) 1-D weight."""
    others = [n for n in scale.inputs if n != normed]
    if len(others) != 1:
        return False
    w = graph.tensors[others[0]]
    return w.shape is not None and len(w.shape) == 1 and _constant(graph, w.name)


def _constant(graph: PrecisionGraph, name: str) -> bool:
    """A stored value, or one op of stored values (the TorchScript exporter leaves Gemma's
    ``1 + weight`` as an Add): ONNX Runtime folds constants before it fuses."""
    t = graph.tensors[name]
    if t.kind in _CONST_KINDS or t.stats is not None:
        return True
    op = graph.ops[t.producer] if t.producer else None
    return op is not None and bool(op.inputs) and all(
        i and (graph.tensors[i].kind in _CONST_KINDS or graph.tensors[i].stats is not None) for i in op.inputs)
