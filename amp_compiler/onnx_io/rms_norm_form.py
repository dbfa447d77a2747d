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
dtype. The rewrite is made on the IR (``rewrite``) before the nodes are written, so the report
and the annotations, built from the IR, describe the file as written. See docs/architecture.md,
"ONNX emitter".
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from onnx import GraphProto

from passes.casts import make_cast

from ..dtypes import short
from ..ir import Op, PrecisionGraph, Tensor

__all__ = ["DivForm", "div_forms", "drop_value_info", "rewrite"]


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


def rewrite(graph: PrecisionGraph, forms: dict[str, DivForm]) -> set[str]:
    """Apply ``forms`` to ``graph`` in one rebuild: each normalising op becomes ``Div(x', s)`` under
    its own name, in the chain's dtype (then an inserted Cast to the scale Mul's dtype where that
    differs); the other ops of ``form.drop`` go. Returns the names of the values no op produces any
    more (their ``value_info`` is stale)."""
    if not forms:
        return set()
    dropped = {d for form in forms.values() for d in form.drop}
    before = {o for d in dropped for o in graph.ops[d].outputs if o}
    replacements: dict[str, list[Op]] = {}
    for name, form in forms.items():
        op = graph.ops[name]
        chain = graph.tensors[form.x].dtype
        div = replace(op, op_type="Div", canonical="div", inputs=[form.x, form.sqrt], precision=chain,
                      input_roles=list(op.input_roles[:2]), output_roles=list(op.output_roles[:1]),
                      reason=f"{op.reason}; written as Div(x, sqrt(mean(x^2) + eps)) in {short(chain)}, the "
                             f"form ONNX Runtime fuses into one RMSNorm kernel (FP32 inside)")
        replacements[name] = [div]
        if form.cast_to is None:
            div.outputs = [form.out]
            continue
        inner = graph.add_tensor(Tensor(graph.fresh_name(f"{form.out}_div"), chain, graph.tensors[form.out].shape,
                                        scope=op.scope))
        div.outputs = [inner.name]
        replacements[name].append(make_cast(graph, inner, form.cast_to, out_name=form.out)[1])
    graph.replace_ops(dropped, replacements)
    return {o for o in before if graph.tensors[o].producer is None}


def drop_value_info(g: GraphProto, gone: set[str]) -> None:
    """Forget the types of the values the rewrites no longer produce (r and its casts)."""
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
