"""FX emitter: apply a planned ``PrecisionGraph`` back onto the imported ``GraphModule``.

Rewrite cases:

1. Every op's tensor arguments are rewired to what the plan says it reads (the source
   value, a cast of it, or a folded weight); its other arguments are left as they were.
2. A cast the casts pass inserted becomes ``aten._to_copy(x, dtype=...)`` right after the
   value it converts (after the last weight read for parameters and inputs).
3. A folded constant becomes a ``get_attr`` of a low-precision buffer in the module's
   ``FoldedWeights`` container, cast once at compile time and recast only when its FP32
   master changes (``weights.py``).
4. An op whose output dtype the plan changed and whose schema has a ``dtype`` argument
   (``full``, ``scalar_tensor``, an existing ``_to_copy``) gets that argument rewritten;
   ``_assert_tensor_metadata`` is kept equal to its input's new dtype. A mask fill in a scalar
   argument (numerics rule 10: ``masked_fill(..., finfo.min)``) is written saturated.
5. Ops the casts pass removed (identity casts) are erased once nothing reads them, and
   so are weight reads the plan left unread (folded); everything else stays as it was.
6. Training graphs: a buffer the graph writes back (``copy_``, BatchNorm running
   statistics) is read through a clone, so autograd's saved copy is not the tensor
   ``copy_`` overwrites (torch.export's decomposed training graphs fail backward otherwise),
   and is written a ``detach`` of its new value, as eager writes it under ``no_grad`` (a
   spectral norm's power-iteration vectors had become part of the autograd graph).
7. The graph is checked by propagating fake tensors: a kernel whose output dtype differs
   from the plan's (e.g. CPU ``native_layer_norm`` returns FP16 statistics for an FP16
   input) gets a cast to the planned dtype in front of its readers, added to the IR too
   (``PlanResult.emitter_casts``), so the report built afterwards counts it; a dtype error
   raised by a kernel is reported as a ``ConversionError`` naming the op.

Then ``lint()`` and ``recompile()``.
"""

from __future__ import annotations

import math
import operator
from typing import TYPE_CHECKING

import torch
from torch import fx
from torch._dispatch.python import enable_python_dispatcher
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from ..dtypes import short
from ..errors import ConversionError
from ..ir import ANY, FIXED, Op, PrecisionGraph, Tensor
from ..registry import DEFAULT_REGISTRY
from .dtypes import dtype_to_torch
from .importer import FxImport
from .schemas import writes_arguments
from .weights import FoldedWeights

if TYPE_CHECKING:
    from passes.result import PlanResult

FOLDED_ATTR = "_amp_folded"
_WEIGHT_OPS = ("placeholder", "get_attr")


def emit(imp: FxImport, result: PlanResult, *, check: bool = True) -> FoldedWeights:
    """Apply ``result``'s plan onto ``imp.gm`` in place; returns the container of folded weights (maybe empty)."""
    gm, graph, g = imp.gm, imp.graph, imp.gm.graph
    folded = getattr(gm, FOLDED_ATTR, None)
    if not isinstance(folded, FoldedWeights):
        folded = FoldedWeights()
        gm.add_submodule(FOLDED_ATTR, folded)
    first_compute = next(n for n in g.nodes if n.op not in _WEIGHT_OPS)
    value: dict[str, fx.Node] = {}
    results: dict[str, tuple[fx.Node, int]] = {}
    items: dict[tuple[fx.Node, int], fx.Node] = {}
    for node in g.nodes:
        if node.op == "call_function" and node.target is operator.getitem and isinstance(node.args[0], fx.Node):
            items.setdefault((node.args[0], node.args[1]), node)

    def item(node: fx.Node, index: int | None) -> fx.Node:
        if index is None:
            return node
        if (node, index) not in items:
            with g.inserting_after(node):
                items[(node, index)] = g.call_function(operator.getitem, (node, index))
        return items[(node, index)]

    def get(name: str) -> fx.Node:
        if name in value:
            return value[name]
        t = graph.tensors[name]
        if name in results:  # an output of a multi-output op: its getitem, made when first read
            node = item(*results.pop(name))
        elif t.folded_from:  # 3
            master, fqn, index = imp.weights[t.folded_from]
            attr = folded.add(master, dtype_to_torch(t.dtype), fqn if index is None else "", index)
            with g.inserting_before(first_compute):
                node = g.get_attr(f"{FOLDED_ATTR}.{attr}")
        elif t.producer is None:
            node = item(*imp.values[name])
        else:
            raise ConversionError(graph.name, f"tensor {name}", "read before the op producing it (emitter bug)")
        value[name] = node
        return node

    # erased at the end if nothing reads them: weights the plan folded, then (reversed) bypassed ops
    removed = [n for n in g.nodes if n.op == "get_attr" and n.users]
    removed += [node for name, node in imp.nodes.items() if name not in graph.ops]
    for op in graph.ops.values():
        node = imp.nodes.get(op.name)
        if node is not None:  # 1
            leaves: list[fx.Node] = []
            fx.node.map_arg((node.args, node.kwargs), lambda n: leaves.append(n) or n)
            for port, leaf in enumerate(imp.ports[op.name]):
                leaves[leaf] = get(op.inputs[port])
            it = iter(leaves)
            node.args, node.kwargs = fx.node.map_arg((node.args, node.kwargs), lambda _: next(it))
            multi = isinstance(node.meta.get("val"), (tuple, list))
            for port, name in enumerate(op.outputs):
                if name and multi:
                    results[name] = (node, port)
                elif name:
                    value[name] = node
            _retarget_dtype(node, op, graph)  # 4
            _saturate_fill(node, op, graph)
        elif op.inserted and op.canonical == "cast":  # 2
            src = get(op.inputs[0])
            where = g.inserting_before(first_compute) if src.op in _WEIGHT_OPS else g.inserting_after(src)
            with where:
                cast = g.call_function(torch.ops.aten._to_copy.default, (src,),
                                       {"dtype": dtype_to_torch(op.attrs["to"])})
            cast.meta["amp_inserted"] = True
            value[op.outputs[0]] = cast
        else:
            raise ConversionError(graph.name, f"op {op.name}", f"no FX node for {op.op_type} (emitter bug)")
    out = next(n for n in g.nodes if n.op == "output")
    leaves = iter(imp.output_leaves)
    out.args = fx.node.map_arg(out.args, lambda n: (lambda name: get(name) if name else n)(next(leaves)))
    _erase_unused(g, removed)  # 5
    if imp.training:
        _clone_written(g, first_compute)  # 6
    if check:
        check_dtypes(imp, value, result.emitter_casts)  # 7
    g.lint()
    gm.recompile()
    return folded


def _saturate_fill(node: fx.Node, op, graph) -> None:
    """A mask fill in a scalar argument (numerics rule 10) is written at the saturated magnitude."""
    fill = next((graph.tensors[o].saturate_to for o in op.outputs if o and graph.tensors[o].saturate_to), None)
    if fill is not None:
        node.args, node.kwargs = fx.node.map_aggregate(
            (node.args, node.kwargs),
            lambda a: math.copysign(fill, a) if type(a) is float and fill < abs(a) < math.inf else a)


def _retarget_dtype(node: fx.Node, op, graph) -> None:
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return
    row = DEFAULT_REGISTRY.by_canonical.get(op.canonical) if op.canonical else None
    names = {"dtype", *(row.dtype_attrs if row else ())}  # e.g. _softmax_backward_data's input_dtype
    index = next((i for i, a in enumerate(schema.arguments) if a.name in names), None)
    if index is None:
        return
    if op.outputs:
        val = node.meta.get("val")
        val = val[0] if isinstance(val, (tuple, list)) else val
        new = graph.tensors[op.outputs[0]].dtype
        if not isinstance(val, torch.Tensor) or str(val.dtype)[6:] == new or not val.dtype.is_floating_point:
            return
    elif op.inputs:  # _assert_tensor_metadata: the dtype it checks is its input's
        new = graph.tensors[op.inputs[0]].dtype
        current = node.args[index] if index < len(node.args) else node.kwargs.get("dtype")
        if current is None or not isinstance(current, torch.dtype) or not current.is_floating_point:
            return
    else:
        return
    dtype = dtype_to_torch(new)
    if index < len(node.args):
        args = list(node.args)
        args[index] = dtype
        node.args = tuple(args)
    else:
        node.kwargs = {**node.kwargs, "dtype": dtype}


def _erase_unused(g: fx.Graph, candidates: list[fx.Node]) -> None:
    for node in reversed(candidates):
        if not node.users:
            g.erase_node(node)


def _clone_written(g: fx.Graph, first_compute: fx.Node) -> None:
    for node in [n for n in g.nodes if n.op in _WEIGHT_OPS]:
        writers = [u for u in node.users if writes_arguments(u.target) and u.args and u.args[0] is node]
        readers = [u for u in node.users if u not in writers]
        for w in writers:  # written as eager writes buffers (under no_grad): not a node of the autograd graph
            if len(w.args) > 1 and isinstance(w.args[1], fx.Node):
                with g.inserting_before(w):
                    detached = g.call_function(torch.ops.aten.detach.default, (w.args[1],))
                detached.meta.update(w.args[1].meta)
                w.args = (w.args[0], detached, *w.args[2:])
        if not writers or not readers:
            continue
        with g.inserting_before(first_compute) if node.op == "placeholder" else g.inserting_after(node):
            clone = g.call_function(torch.ops.aten.clone.default, (node,))
        clone.meta.update(node.meta)
        for r in readers:
            r.replace_input_with(node, clone)


def check_dtypes(imp: FxImport, value: dict[str, fx.Node], added: list[str]) -> None:
    """Propagate fake tensors; cast kernel outputs whose dtype differs from the plan (case 7).

    Each cast is made in the IR as well and its op name appended to ``added``.
    """
    gm, graph = imp.gm, imp.graph
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    vals = [n.meta.get("val", n.meta.get("example_value")) for n in placeholders]
    mode = detect_fake_mode(vals) or FakeTensorMode(allow_non_fake_inputs=True)
    saved = mode.allow_non_fake_inputs, mode.allow_scalar_outputs
    # .item() of an unspecialised float (dynamo turns a module's float attribute into an input)
    mode.allow_non_fake_inputs = mode.allow_scalar_outputs = True
    prop = _Prop(gm, mode)
    try:
        inputs = [v if not isinstance(v, torch.Tensor) or detect_fake_mode([v]) else mode.from_tensor(v)
                  for v in vals]
        # the python dispatcher runs the symbolic meta kernels, as the capture did: a C++ kernel (constant_pad_nd)
        # reads a symbolic size as an int, which specialised it in dynamo's shape env (a recompile per size)
        with enable_python_dispatcher():
            prop.propagate_dont_convert_inputs(*inputs)
    except Exception as exc:  # a kernel rejected the dtypes the plan gave it
        node = prop.current
        raise ConversionError(graph.name, f"op {_op_of(imp, node)}" if node else "converted graph",
                              f"does not run with the planned dtypes: {str(exc).splitlines()[0]}") from exc
    finally:
        mode.allow_non_fake_inputs, mode.allow_scalar_outputs = saved
    g = gm.graph
    for name, node in value.items():
        t = graph.tensors.get(name)
        val = node.meta.get("val")
        if t is None or not isinstance(val, torch.Tensor) or not t.dtype or str(val.dtype)[6:] == t.dtype:
            continue
        users = [u for u in node.users]
        if not users:
            continue
        added.append(_ir_cast(graph, t, str(val.dtype)[6:]))
        with g.inserting_after(node):
            cast = g.call_function(torch.ops.aten._to_copy.default, (node,), {"dtype": dtype_to_torch(t.dtype)})
        cast.meta["amp_inserted"] = True
        cast.meta["val"] = val.to(dtype_to_torch(t.dtype))
        for u in users:
            u.replace_input_with(node, cast)


def _ir_cast(graph: PrecisionGraph, t: Tensor, actual: str) -> str:
    """Record in the IR that ``t``'s producer writes ``actual`` and a cast makes the planned dtype."""
    if t.producer is None:
        raise ConversionError(graph.name, f"tensor {t.name}", f"is {actual} at run time, not {t.dtype} (emitter bug)")
    producer = graph.ops[t.producer]
    real = graph.add_tensor(Tensor(graph.fresh_name(f"{t.name}_{short(actual)}"), actual, t.shape, scope=t.scope))
    producer.outputs[t.producer_port] = real.name
    real.producer, real.producer_port = producer.name, t.producer_port
    t.producer = None
    cast = Op(graph.fresh_name(f"{t.name}_cast_{short(t.dtype)}"), "aten._to_copy.default", [real.name], [t.name],
              scope=t.scope, attrs={"to": t.dtype}, canonical="cast", op_class="clear", input_roles=[ANY],
              output_roles=[FIXED], precision=t.dtype, inserted=True,
              reason=f"the {producer.name} kernel returns {short(actual)} where the plan has {short(t.dtype)}: "
                     f"cast added by the FX emitter")
    graph.add_op(cast, index_after=producer.name)
    return cast.name


class _Prop(FakeTensorProp):
    """Fake-tensor propagation that remembers the node it is running."""

    current: fx.Node | None = None

    def run_node(self, n: fx.Node):
        self.current = n
        return super().run_node(n)


def _op_of(imp: FxImport, node: fx.Node) -> str:
    return next((name for name, n in imp.nodes.items() if n is node), node.name)


__all__ = ["FOLDED_ATTR", "check_dtypes", "emit"]
