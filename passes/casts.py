"""Casts: make every tensor's dtype agree with its consumers, with as few casts as legal.

Rewrite cases:

1. Each float tensor takes the dtype its producer now gives (the producer op's
   precision for ``unit`` ports, the source dtype otherwise).
2. For each tensor and each dtype some consumer needs that differs, **one** cast is
   inserted right after the producer (in the producer's scope, so consumers inside
   subgraphs see it too) and those consumers read it: sibling casts are merged by
   construction.
3. Constants are never cast at run time: the cast is folded into a new constant (one
   stored copy per dtype in use; a constant read in FP16 and FP32 gets two copies,
   never a dtype mismatch). Parameters (training graphs: FP32 master weights) get a
   run-time cast instead, which the convert pass has charged for every step.
4. An existing ``Cast`` whose input already has its target dtype is removed.
5. A chain ``Cast(widen) -> Cast`` reads the first cast's input directly when the
   first cast is lossless (FP16->FP32->FP16 is an identity). A narrowing first cast
   (FP32->FP16->FP32) rounds and can overflow, so that pair is kept.
6. Existing sibling casts of one tensor to one dtype are merged.
7. Casts left without consumers by these rewrites are removed (never one that writes
   a graph output).
8. A mask fill the numerics pass would store saturated (rule 10) keeps its exact value when
   the plan leaves its whole flow and the softmax it masks FP32.
Casts end up on the smaller side of data-movement ops because the convert pass
charges each cast by the bytes of the tensor it converts.
"""

from __future__ import annotations

from amp_compiler.dtypes import FLOAT32, FLOAT_DTYPES, is_float, itemsize, short
from amp_compiler.ir import ANY, CONSTANT, FIXED, OTHER, UNIT, Op, PrecisionGraph, Tensor

from .base import Pass, PassResult, PlanContext, check
from .numerics_chains import mask_flow
from .result import CastChanges
from .user_rules import runtime_cast


class CastPass(Pass):
    name = "casts"

    def ensures(self, graph: PrecisionGraph, ctx: PlanContext) -> None:
        check(self.name, "ensures", _mismatched_unit_ports(graph), "every op's unit ports carry its precision")

    def call(self, graph: PrecisionGraph, ctx: PlanContext) -> PassResult:
        original = {name: t.dtype for name, t in graph.tensors.items()}
        _keep_unconverted_masks(graph)
        _retype_outputs(graph)
        _retype_free_inputs(graph, ctx, original)
        inserted, folded = _insert_casts(graph, ctx, original)
        removed = _eliminate_casts(graph)
        retyped = any(t.dtype != original.get(name) for name, t in graph.tensors.items())
        details = f"{inserted} casts inserted, {folded} constants folded, {removed} casts removed"
        return PassResult(graph, bool(inserted or folded or removed or retyped), details,
                          CastChanges(original, inserted, folded, removed))


def _keep_unconverted_masks(graph: PrecisionGraph) -> None:
    """A mask fill (numerics rule 10) is stored saturated only where the plan puts its flow, or
    the softmax it masks, in the low dtype: an all-FP32 path keeps the source's value exactly."""
    for t in graph.tensors.values():
        if t.saturate_to is not None:
            ops = mask_flow(graph, t.name) or ()
            if all(graph.ops[name].precision in (None, FLOAT32) for name in ops):
                t.saturate_to = None


def _mismatched_unit_ports(graph: PrecisionGraph) -> list[str]:
    """``op.name/port`` of each float unit port whose tensor's dtype is not the op's precision (ports
    read by index: half the work of zipping names with roles, on every op of the graph)."""
    tensors, bad = graph.tensors, []
    for op in graph.ops.values():
        precision = op.precision
        if precision is None:
            continue
        for kind, names, roles in (("in", op.inputs, op.input_roles), ("out", op.outputs, op.output_roles)):
            if UNIT not in roles:
                continue
            for port, name in enumerate(names):
                if roles[port] == UNIT and name and tensors[name].dtype != precision and is_float(tensors[name].dtype):
                    bad.append(f"{op.name} {kind}[{port}]")
    return bad


def _retype_outputs(graph: PrecisionGraph) -> None:
    tensors = graph.tensors
    for op in graph.ops.values():
        if op.precision is None or UNIT not in op.output_roles:
            continue
        for port, name in enumerate(op.outputs):
            if name and op.output_roles[port] == UNIT:
                tensors[name].dtype = op.precision


def _wanted(graph: PrecisionGraph, t: Tensor, original: str | None, unless: str | None = None) -> dict[str, list]:
    """dtype -> consumer ports wanting it, leaving out ``unless`` and None (what needs no cast).

    Most tensors' readers all want the dtype the tensor has: they get an empty dict, with no list
    or dict built along the way (one call per tensor of the graph)."""
    want = _NOTHING
    ops = graph.ops
    for consumer in t.consumers:
        op = ops[consumer[0]]
        roles, port = op.input_roles, consumer[1]
        role = roles[port] if port < len(roles) else FIXED
        if role == UNIT and op.precision:
            dtype = op.precision
        elif role == ANY or role == OTHER:
            continue
        else:
            dtype = original
        if dtype == unless or dtype is None:
            continue
        if want is _NOTHING:
            want = {dtype: [consumer]}
        elif dtype in want:
            want[dtype].append(consumer)
        else:
            want[dtype] = [consumer]
    return want


_NOTHING: dict = {}  # _wanted's answer when no reader needs a cast (never written to)


def _retype_free_inputs(graph: PrecisionGraph, ctx: PlanContext, original: dict) -> None:
    """Without keep_io_types a float graph input takes the dtype all its consumers want (where the
    graph's inputs can be retyped: ``PrecisionGraph.inputs_retypable``)."""
    if ctx.keep_io_types or not graph.inputs_retypable:
        return
    for name in graph.inputs:
        t = graph.tensors[name]
        if t.dtype in FLOAT_DTYPES:
            want = _wanted(graph, t, t.dtype)
            if len(want) == 1:
                t.dtype = next(iter(want))


def _insert_casts(graph: PrecisionGraph, ctx: PlanContext, original: dict) -> tuple[int, int]:
    new_ops: dict[str | None, list[Op]] = {}  # anchor op (insert after) or scope start -> casts
    inserted = folded = 0
    for t in list(graph.tensors.values()):
        if not is_float(t.dtype) or not t.consumers and not t.is_graph_output:
            continue
        source_dtype = original.get(t.name, t.dtype)
        if t.is_graph_output and (ctx.keep_io_types or t.scope_output) and t.dtype != source_dtype and t.producer:
            # the output keeps its name and dtype: the producer writes a renamed tensor, a cast the output
            inner = _rename(graph, t, graph.fresh_name(f"{t.name}_{short(t.dtype)}"))
            out_cast = make_cast(graph, inner, source_dtype, out_name=t.name)[1]
            new_ops.setdefault(_anchor(graph, inner), []).append(out_cast)
            inserted += 1
            t = inner
        for dtype, ports in _wanted(graph, t, source_dtype, unless=t.dtype).items():
            if t.kind == CONSTANT and not runtime_cast(graph, t, ctx):
                new = _fold_constant(graph, t, dtype)
                folded += 1
            else:
                new, cast = make_cast(graph, t, dtype)
                new_ops.setdefault(_anchor(graph, t), []).append(cast)
                inserted += 1
            for cname, port in ports:
                graph.set_input(cname, port, new.name)
    _place(graph, new_ops)
    return inserted, folded


def _rename(graph: PrecisionGraph, t: Tensor, new_name: str) -> Tensor:
    """Give the value ``t`` carries a new tensor name; ``t`` keeps its name, with no producer."""
    inner = graph.add_tensor(Tensor(new_name, t.dtype, t.shape, t.kind, scope=t.scope))
    producer = graph.ops[t.producer]
    producer.outputs[t.producer_port] = new_name
    inner.producer, inner.producer_port = t.producer, t.producer_port
    t.producer, t.dtype = None, None
    for cname, port in list(t.consumers):
        graph.set_input(cname, port, new_name)
    return inner


def _fold_constant(graph: PrecisionGraph, t: Tensor, dtype: str) -> Tensor:
    name = graph.fresh_name(f"{t.name}_{short(dtype)}")
    return graph.add_tensor(Tensor(name, dtype, t.shape, CONSTANT, scope=t.scope, folded_from=t.name))


def make_cast(graph: PrecisionGraph, t: Tensor, dtype: str, out_name: str | None = None) -> tuple[Tensor, Op]:
    """An inserted Cast of ``t`` to ``dtype`` (not yet in the graph) and the tensor it writes: a new one,
    or the existing ``out_name`` retyped."""
    if out_name is not None:  # an existing (graph output) tensor that the cast now writes
        out = graph.tensors[out_name]
        out.dtype = dtype
    else:
        out = graph.add_tensor(Tensor(graph.fresh_name(f"{t.name}_to_{short(dtype)}"), dtype, t.shape,
                                      scope=t.scope))
    cast = Op(graph.fresh_name(f"{t.name}_cast_{short(dtype)}"), "Cast", [t.name], [out.name], scope=t.scope,
              attrs={"to": dtype}, canonical="cast", op_class="clear", input_roles=[ANY],
              output_roles=[FIXED], precision=dtype, inserted=True,
              reason=f"cast {short(t.dtype)}->{short(dtype)} of {t.name}")
    return out, cast


def _anchor(graph: PrecisionGraph, t: Tensor) -> str | None:
    """Insert after the producer; tensors without one (inputs) at the start of their scope."""
    return t.producer if t.producer else f"scope:{t.scope}"


def _place(graph: PrecisionGraph, new_ops: dict) -> None:
    if not new_ops:
        return
    ordered: dict[str, Op] = {}
    started: set[str] = set()
    placed: list[Op] = []  # the casts, in their new order

    def put(casts: list[Op]) -> None:
        placed.extend(casts)
        ordered.update((cast.name, cast) for cast in casts)

    for name, op in graph.ops.items():
        if op.scope not in started:
            started.add(op.scope)
            put(new_ops.pop(f"scope:{op.scope}", ()))
        ordered[name] = op
        casts = new_ops.pop(name, None)  # most ops have none
        if casts:
            put(casts)
    for casts in new_ops.values():  # scopes without ops of their own (an empty subgraph body)
        put(casts)
    graph.ops = ordered
    for cast in placed:
        graph._link(cast)


def _is_cast(op: Op) -> bool:
    return op.canonical == "cast" and len(op.inputs) >= 1 and bool(op.inputs[0])


def _eliminate_casts(graph: PrecisionGraph) -> int:
    """Rules 4-7 (module docstring); they rewire and remove casts only, so they walk the cast ops
    alone (listed once, in graph order) rather than the whole graph."""
    removed = 0
    outputs = {t.name for t in graph.tensors.values() if t.is_graph_output}
    cast_names = [name for name, op in graph.ops.items() if op.canonical == "cast"]
    for name in cast_names:
        op = graph.ops.get(name)
        if op is None or not _is_cast(op) or op.op_type not in ("Cast", "aten._to_copy.default"):
            continue
        src = graph.tensors[op.inputs[0]]
        out = graph.tensors[op.outputs[0]]
        # 5. read through a lossless widening cast
        prev = graph.producer(src.name)
        if prev is not None and _is_cast(prev) and prev.op_type == op.op_type:
            first_in = graph.tensors[prev.inputs[0]]
            if _lossless(first_in.dtype, src.dtype):
                graph.set_input(op.name, 0, first_in.name)
                if not src.consumers and src.name not in outputs:  # the widening cast is now dead
                    graph.remove_op(prev.name)
                    removed += 1
                src = first_in
        # 4. identity cast
        if src.dtype == out.dtype and out.name not in outputs:
            _bypass(graph, op, src)
            removed += 1
    removed += _merge_siblings(graph, outputs, cast_names)
    removed += _drop_dead_casts(graph, outputs, cast_names)
    return removed


def _lossless(src: str | None, mid: str | None) -> bool:
    return is_float(src) and is_float(mid) and itemsize(mid) > itemsize(src) and mid != "bfloat16"


def _bypass(graph: PrecisionGraph, op: Op, src: Tensor) -> None:
    out = op.outputs[0]
    for cname, port in list(graph.tensors[out].consumers):
        graph.set_input(cname, port, src.name)
    graph.remove_op(op.name)


def _merge_siblings(graph: PrecisionGraph, outputs: set[str], cast_names: list[str]) -> int:
    """Rule 6: per tensor (in graph order), its sibling casts to one dtype become the first one.
    Only tensors a cast reads can have any: they are tracked as merges move readers around."""
    merged = 0
    read_by_casts = {op.inputs[0] for op in map(graph.ops.get, cast_names) if op is not None and _is_cast(op)}
    for t in list(graph.tensors.values()):
        if t.name not in read_by_casts:
            continue
        seen: dict[str, Op] = {}
        for cname, port in list(t.consumers):
            op = graph.ops.get(cname)
            if op is None or not _is_cast(op) or port != 0 or op.op_type != "Cast":
                continue
            dtype = graph.tensors[op.outputs[0]].dtype
            keep = seen.get(dtype)
            if keep is None:
                seen[dtype] = op
            elif op.outputs[0] not in outputs and op.scope == keep.scope:
                for c2, p2 in list(graph.tensors[op.outputs[0]].consumers):
                    graph.set_input(c2, p2, keep.outputs[0])
                read_by_casts.add(keep.outputs[0])  # it may now feed sibling casts of its own
                graph.remove_op(op.name)
                merged += 1
    return merged


def _drop_dead_casts(graph: PrecisionGraph, outputs: set[str], cast_names: list[str]) -> int:
    """Rule 7, last op first: dropping a cast can leave the cast that feeds it without readers."""
    dropped = 0
    for name in reversed(cast_names):
        op = graph.ops.get(name)
        if op is not None and _is_cast(op) and op.inserted and not graph.tensors[op.outputs[0]].consumers \
                and op.outputs[0] not in outputs:
            graph.remove_op(name)
            dropped += 1
    return dropped


__all__ = ["CastPass", "make_cast"]
