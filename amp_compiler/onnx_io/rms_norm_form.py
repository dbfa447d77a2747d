"""Write a decomposed RMSNorm in the form ONNX Runtime fuses into one kernel.

ONNX Runtime's ``SimplifiedLayerNormFusion`` (onnxruntime/core/optimizer/layer_norm_fusion.cc)
matches ``X -> Pow -> ReduceMean -> Add eps -> Sqrt -> Div(X, .) -> (Cast) -> Mul(scale)``, with
Pow and Div reading the same value; on the CUDA EP it also absorbs a leading ``Cast`` read only
by that Pow and Div, and the ``Cast`` before the scale Mul, into one
``SimplifiedLayerNormalization`` (FP16 in and out, FP32 inside). The dynamo exporter writes
``torch.rsqrt`` as ``Sqrt -> Reciprocal -> Mul(x, r)``, which it leaves as five kernels (plus
the casts a mixed plan puts around an FP32 eps chain).

Where the plan was priced on a profile that fuses it (``fuses_rms_norm``), the emitter rewrites
exactly the RMSNorms the cost model priced as one kernel (``cost_model/norm_pattern.py``):
their ``Sqrt -> Reciprocal -> Mul(x, r)`` or ``Sqrt -> Div(x, s)`` into ``Div(x', s)``, x' being
what the Pow reads (x or the plan's cast of it), in the eps chain's dtype; then one ``Cast`` to
the dtype the scale Mul reads where that differs. The plan's casts of r or s, of x for the
normalising op alone, and of its output go (a Div form the plan left as ORT fuses it stays).
``x * (1 / s)`` and ``x / s`` agree up to rounding, and the Div runs in the chain's (wider)
dtype. See docs/architecture.md, "ONNX emitter".
"""

from __future__ import annotations

from dataclasses import dataclass

from onnx import GraphProto, NodeProto, helper

from ..ir import Op, PrecisionGraph
from .dtypes import dtype_to_onnx

__all__ = ["DivForm", "div_forms", "div_nodes", "drop_value_info"]


@dataclass(frozen=True)
class DivForm:
    """One rewrite: ``Div(x, sqrt)`` writes ``out`` (via a Cast to ``cast_to`` when set);
    ``drop`` are the planned ops it replaces (the normalising Mul or Div, a Reciprocal, casts)."""

    x: str
    sqrt: str
    out: str
    cast_to: str | None
    mul: str
    drop: frozenset[str]


def div_forms(graph: PrecisionGraph, timer) -> dict[str, DivForm]:
    """The rewrites for ``graph`` as planned (after the casts pass), keyed by the op each one
    replaces: the RMSNorms ``timer`` (an ``OpTimer``, or None) priced as fused kernels, where
    the plan's casts or the Reciprocal form would keep ONNX Runtime from fusing them."""
    out = {}
    for norm in timer.groups.norms.values() if timer is not None else ():
        form = _match(graph, norm)
        if form is not None:
            out[form.mul] = form
    return out


def _match(graph: PrecisionGraph, norm) -> DivForm | None:
    tensors = graph.tensors
    ops = [graph.ops[n] for n in norm.members if n in graph.ops]  # the casts pass drops a no-op model Cast
    power = next(op for op in ops if op.op_type == "Pow")
    sqrt = next(op for op in ops if op.op_type == "Sqrt")
    x, s = power.inputs[0], sqrt.outputs[0]
    drop = set()
    root = norm.reciprocal or sqrt.name  # what the normalising op divides or multiplies by
    readers = _readers(graph, graph.ops[root].outputs[0])
    if len(readers) == 1 and readers[0].inserted and readers[0].op_type == "Cast":  # the plan's cast of it
        drop.add(readers[0].name)
        readers = _readers(graph, readers[0].outputs[0])
    if len(readers) != 1 or readers[0].inserted or readers[0].op_type not in ("Mul", "Div"):
        return None
    op = readers[0]
    others = [n for n in op.inputs if _source(graph, n) != graph.ops[root].outputs[0]]
    if len(others) != 1 or _source(graph, others[0]) != _source(graph, x) or tensors[x].dtype != tensors[s].dtype:
        return None
    side = tensors[others[0]].producer  # the plan's cast of x for this op alone goes too
    if side and graph.ops[side].inserted and [r.name for r in _readers(graph, others[0])] == [op.name]:
        drop.add(side)
    y = op.outputs[0]
    after = _readers(graph, y)
    if len(after) == 1 and after[0].inserted and after[0].op_type == "Cast":  # the plan's cast of the norm
        drop.add(after[0].name)
        y = after[0].outputs[0]
    cast_to = tensors[y].dtype if tensors[y].dtype != tensors[x].dtype else None
    if op.op_type == "Div" and not drop and cast_to is None and op.inputs[:2] == [x, s]:
        return None  # already the form ONNX Runtime fuses
    drop |= {op.name} | ({norm.reciprocal} if norm.reciprocal else set())
    return DivForm(x, s, y, cast_to, op.name, frozenset(drop))


def div_nodes(graph: PrecisionGraph, form: DivForm) -> list[NodeProto]:
    """The nodes that replace ``form.drop``: the Div, and the Cast to the Mul's dtype if any."""
    if form.cast_to is None:
        return [helper.make_node("Div", [form.x, form.sqrt], [form.out], name=graph.fresh_name(f"{form.mul}_div"))]
    n = graph.fresh_name(f"{form.out}_div")
    return [helper.make_node("Div", [form.x, form.sqrt], [n], name=graph.fresh_name(f"{form.mul}_div")),
            helper.make_node("Cast", [n], [form.out], name=graph.fresh_name(f"{form.mul}_cast"),
                             to=dtype_to_onnx(form.cast_to))]


def drop_value_info(graph: PrecisionGraph, g: GraphProto, forms: dict[str, DivForm]) -> None:
    """Forget the types of the values the rewrites no longer produce (r and its casts)."""
    gone = {o for f in forms.values() for d in f.drop for o in graph.ops[d].outputs} - {f.out for f in forms.values()}
    for vi in [vi for vi in g.value_info if vi.name in gone]:
        g.value_info.remove(vi)


def _readers(graph: PrecisionGraph, name: str) -> list[Op]:
    return [graph.ops[c] for c, _ in graph.tensors[name].consumers]


def _source(graph: PrecisionGraph, name: str) -> str:
    """The value behind the plan's inserted casts."""
    t = graph.tensors[name]
    while t.producer and graph.ops[t.producer].inserted and graph.ops[t.producer].op_type == "Cast":
        t = graph.tensors[graph.ops[t.producer].inputs[0]]
    return t.name
