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

from functools import partial
from itertools import compress, count, islice, repeat
from operator import attrgetter, eq, is_not, itemgetter
from typing import Iterable, Iterator

from amp_compiler.dtypes import FLOAT32, FLOAT_DTYPES, is_float, itemsize, short
from amp_compiler.ir import ANY, CONSTANT, FIXED, OTHER, UNIT, Op, PrecisionGraph, Tensor

from .base import Pass, PassResult, PlanContext, check
from .numerics_chains import mask_flow
from .result import CastChanges
from .user_rules import runtime_cast


class CastPass(Pass):
    name = "casts"

    def __init__(self) -> None:
        self._rewired: tuple[PrecisionGraph, list] | None = None  # what ``call`` rewired, for ``ensures``

    def ensures(self, graph: PrecisionGraph, ctx: PlanContext) -> None:
        """Every op's unit ports carry its precision. After ``call``, the input ports it rewired are
        checked again: its own walk (``_tensors_to_cast``) found every other port agreeing before the
        rewrite, and it retyped the outputs (docs/architecture.md, "The plan result"); on any other
        graph, every port of every op."""
        planned, self._rewired = self._rewired, None
        if planned is not None and planned[0] is graph:
            ports = [(graph.ops[name], "in", port) for name, port in planned[1] if name in graph.ops]
        else:
            ports = _every_port(graph)
        check(self.name, "ensures", _off_precision(graph, ports), "every op's unit ports carry its precision")

    def call(self, graph: PrecisionGraph, ctx: PlanContext) -> PassResult:
        tensors = graph.tensors
        original = dict(zip(tensors, map(_DTYPE, tensors.values())))  # read in C: every tensor, once
        _keep_unconverted_masks(graph)
        retyped, outputs = _retype_outputs(graph)
        inputs = _retype_free_inputs(graph, ctx, original)
        rewired: list[tuple[str, int]] = []  # (op, input port) the rewrite moved to another tensor
        to_cast = _tensors_to_cast(graph, original, outputs + inputs)
        inserted, folded = _insert_casts(graph, ctx, original, to_cast, rewired)
        removed = _eliminate_casts(graph, rewired)
        self._rewired = (graph, rewired)
        details = f"{inserted} casts inserted, {folded} constants folded, {removed} casts removed"
        return PassResult(graph, bool(inserted or folded or removed or retyped or inputs), details,
                          CastChanges(original, inserted, folded, removed))


_DTYPE = attrgetter("dtype")
_SATURATE_TO = attrgetter("saturate_to")


def _keep_unconverted_masks(graph: PrecisionGraph) -> None:
    """A mask fill (numerics rule 10) is stored saturated only where the plan puts its flow, or
    the softmax it masks, in the low dtype: an all-FP32 path keeps the source's value exactly."""
    if not any(map(partial(is_not, None), map(_SATURATE_TO, graph.tensors.values()))):
        return  # no mask fill (most models): asked in C
    for t in graph.tensors.values():
        if t.saturate_to is not None:
            ops = mask_flow(graph, t.name) or ()
            if all(graph.ops[name].precision in (None, FLOAT32) for name in ops):
                t.saturate_to = None


def _every_port(graph: PrecisionGraph) -> Iterator[tuple[Op, str, int]]:
    for op in graph.ops.values():
        yield from zip(repeat(op), repeat("in"), range(len(op.inputs)))
        yield from zip(repeat(op), repeat("out"), range(len(op.outputs)))


def _off_precision(graph: PrecisionGraph, ports: Iterable[tuple[Op, str, int]]) -> Iterator[str]:
    """``op.name in[port]`` (or ``out[port]``) of each listed float unit port whose tensor's dtype is
    not the op's precision."""
    tensors = graph.tensors
    for op, kind, port in ports:
        names, roles = (op.inputs, op.input_roles) if kind == "in" else (op.outputs, op.output_roles)
        if op.precision and port < len(roles) and roles[port] == UNIT and names[port]:
            dtype = tensors[names[port]].dtype
            if dtype != op.precision and is_float(dtype):
                yield f"{op.name} {kind}[{port}]"


def _retype_outputs(graph: PrecisionGraph) -> tuple[int, list[str]]:
    """Rule 1 for unit outputs: how many tensors it retyped, and those of them that are graph outputs."""
    tensors, retyped, outputs = graph.tensors, 0, []
    for op in graph.ops.values():
        precision = op.precision
        if precision is None or UNIT not in op.output_roles:
            continue
        for port, name in enumerate(op.outputs):
            if name and op.output_roles[port] == UNIT and (t := tensors[name]).dtype != precision:
                t.dtype = precision
                retyped += 1
                if t.is_graph_output:
                    outputs.append(name)
    return retyped, outputs


def _tensors_to_cast(graph: PrecisionGraph, original: dict[str, str | None], retyped: list[str]) -> set[str]:
    """The tensors some reader wants in another dtype than they now carry, read off every op's input
    ports in one walk (``_wanted``'s test, port by port), and the graph inputs and outputs retyped
    (``retyped``): ``_wanted`` finds nothing to do for any other tensor, so the pass asks it about
    these alone."""
    tensors = graph.tensors
    to_cast = set(retyped)
    for op in graph.ops.values():
        precision, roles = op.precision, op.input_roles
        for port, name in enumerate(op.inputs):
            if not name:
                continue
            role = roles[port] if port < len(roles) else FIXED
            if role == UNIT and precision:
                want = precision
            elif role == ANY or role == OTHER:
                continue
            else:
                want = original[name]  # a fixed port, or an op without a precision: the source dtype
            if want is not None and want != tensors[name].dtype:
                to_cast.add(name)
    return to_cast


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


def _retype_free_inputs(graph: PrecisionGraph, ctx: PlanContext, original: dict) -> list[str]:
    """Without keep_io_types a float graph input takes the dtype all its consumers want (where the
    graph's inputs can be retyped: ``PrecisionGraph.inputs_retypable``); returns those retyped."""
    if ctx.keep_io_types or not graph.inputs_retypable:
        return []
    changed = []
    for name in graph.inputs:
        t = graph.tensors[name]
        if t.dtype in FLOAT_DTYPES:
            want = _wanted(graph, t, t.dtype)
            if len(want) == 1 and next(iter(want)) != t.dtype:
                t.dtype = next(iter(want))
                changed.append(name)
    return changed


def _insert_casts(graph: PrecisionGraph, ctx: PlanContext, original: dict, to_cast: set[str],
                  rewired: list[tuple[str, int]]) -> tuple[int, int]:
    """Rules 2 and 3 for the tensors of ``to_cast`` (in graph order); the ops whose inputs move to a
    cast or a folded constant join ``rewired`` (op name, port)."""
    new_ops: dict[str | None, list[Op]] = {}  # anchor op (insert after) or scope start -> casts
    inserted = folded = 0
    for t in [t for name, t in graph.tensors.items() if name in to_cast]:
        if not is_float(t.dtype) or not t.consumers and not t.is_graph_output:
            continue
        source_dtype = original.get(t.name, t.dtype)
        if t.is_graph_output and (ctx.keep_io_types or t.scope_output) and t.dtype != source_dtype and t.producer:
            # the output keeps its name and dtype: the producer writes a renamed tensor, a cast the output
            rewired += t.consumers
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
            rewired += ports
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
    """Put each list of casts right after its anchor op, or at the start of its scope (before the
    scope's first op; at the end for a scope without ops), and link them. The anchors are found and
    the op order rebuilt in C, from runs of the old order between insertion points."""
    if not new_ops:
        return
    wanted = new_ops.__contains__
    points = list(zip(compress(count(1), map(wanted, graph.ops)), repeat(0), filter(wanted, graph.ops)))
    unplaced = []
    if len(points) < len(new_ops):  # casts of inputs and constants: at the start of their scope
        scopes = list(map(_SCOPE, graph.ops.values()))
        for anchor in new_ops:
            if anchor.startswith("scope:") and anchor not in graph.ops:
                scope = anchor[len("scope:"):]
                if scope in scopes:
                    points.append((scopes.index(scope), 1, anchor))  # after the casts of the op before it
                else:
                    unplaced.append(anchor)  # a scope without ops of its own (an empty subgraph body)
        points.sort(key=itemgetter(0, 1))
    rest, ordered, at = iter(graph.ops.items()), {}, 0
    placed: list[Op] = []  # the casts, in their new order
    for position, _, anchor in points + [(None, 2, name) for name in unplaced]:
        if position is not None:
            ordered.update(islice(rest, position - at))
            at = position
        placed += new_ops[anchor]
        ordered.update((cast.name, cast) for cast in new_ops[anchor])
    ordered.update(rest)
    graph.ops = ordered
    for cast in placed:
        graph._link(cast)


_SCOPE = attrgetter("scope")


def _is_cast(op: Op) -> bool:
    return op.canonical == "cast" and len(op.inputs) >= 1 and bool(op.inputs[0])


def _eliminate_casts(graph: PrecisionGraph, rewired: list[tuple[str, int]] | None = None) -> int:
    """Rules 4-7 (module docstring); they rewire and remove casts only, so they walk the cast ops
    alone (listed once, in graph order) rather than the whole graph. The ops whose inputs they move
    join ``rewired`` (op name, port)."""
    rewired = [] if rewired is None else rewired
    removed = 0
    outputs = {t.name for t in graph.tensors.values() if t.is_graph_output}
    cast_names = list(compress(graph.ops, map(partial(eq, "cast"), map(_CANONICAL, graph.ops.values()))))
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
                rewired.append((op.name, 0))
                if not src.consumers and src.name not in outputs:  # the widening cast is now dead
                    graph.remove_op(prev.name)
                    removed += 1
                src = first_in
        # 4. identity cast
        if src.dtype == out.dtype and out.name not in outputs:
            rewired += out.consumers
            _bypass(graph, op, src)
            removed += 1
    removed += _merge_siblings(graph, outputs, cast_names, rewired)
    removed += _drop_dead_casts(graph, outputs, cast_names)
    return removed


_CANONICAL = attrgetter("canonical")


def _lossless(src: str | None, mid: str | None) -> bool:
    return is_float(src) and is_float(mid) and itemsize(mid) > itemsize(src) and mid != "bfloat16"


def _bypass(graph: PrecisionGraph, op: Op, src: Tensor) -> None:
    out = op.outputs[0]
    for cname, port in list(graph.tensors[out].consumers):
        graph.set_input(cname, port, src.name)
    graph.remove_op(op.name)


def _merge_siblings(graph: PrecisionGraph, outputs: set[str], cast_names: list[str],
                    rewired: list[tuple[str, int]]) -> int:
    """Rule 6: per tensor (in graph order), its sibling casts to one dtype become the first one.
    Only a tensor two casts read can have any (none: nothing to walk); tensors are tracked as
    merges move readers around."""
    merged = 0
    read = [op.inputs[0] for op in map(graph.ops.get, cast_names) if op is not None and _is_cast(op)]
    read_by_casts = set(read)
    if len(read_by_casts) == len(read):
        return 0  # no tensor read by two casts
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
                    rewired.append((c2, p2))
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
