"""Say why tensor-core work stayed FP32, with the numbers and what would change it.

The report's summary carries the result as ``fp32_tensor_core_why`` (at most six lines,
empty when every GEMM/conv FLOP runs in the low dtype); the terminal table prints it first.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Callable

import numpy as np

from amp_compiler.dtypes import FLOAT32, FLOAT64, short
from amp_compiler.ir import CONSTANT, GRAPH_INPUT, PARAMETER, PrecisionGraph, Tensor

from .base import PlanContext
from .costs import OpTimer, PlanEnergy

__all__ = ["at_graph_io", "declared_by", "fp32_tensor_core_why", "near_tie_note", "unplanned_float"]

#: the op names a deny-propagation reason carries (``passes/propagate.py``): one reason per op,
#: which a count of reasons must read as one
#: integer GEMMs (dynamic quantization): not tensor-core ops of any plan
_INTEGER_GEMMS = frozenset({"MatMulInteger", "ConvInteger", "QLinearMatMul", "QLinearConv"})
_DOWNSTREAM_OF = re.compile(r"downstream of deny op \S+ through \S+:.*")


def unplanned_float(graph: PrecisionGraph, op) -> str | None:
    """``"float64"`` when ``op`` computes on a float64 value that is not a constant (a float64
    model: plans convert float32 ops only), else None."""
    for name in (*op.inputs, *op.outputs):
        t = graph.tensors.get(name) if name else None
        if t is not None and t.dtype == FLOAT64 and not t.is_constant:
            return t.dtype
    return None


def at_graph_io(t: Tensor) -> bool:
    """A main-graph input or output kept in its dtype by ``keep_io_types`` alone: not a value a
    subgraph returns (``Tensor.scope_output``: kept whatever the options)."""
    return not t.scope and (t.kind == GRAPH_INPUT or t.is_graph_output and not t.scope_output)


def declared_by(graph: PrecisionGraph, t: Tensor) -> str | None:
    """The If/Loop/Scan op whose subgraph declares ``t`` an input or output, else None: a body keeps
    those types so that its op stays well typed (``Tensor.scope_output``, ``passes/casts.py``)."""
    if not t.scope_output and not (t.kind == GRAPH_INPUT and t.scope):
        return None
    return next((owner for owner, ins, outs in graph.scopes.values()
                 if t.name in (outs if t.scope_output else ins)), None)


def _at_subgraph(graph: PrecisionGraph, t: Tensor) -> str | None:
    """The If/Loop/Scan op at whose subgraph boundary ``t`` is: one its subgraph declares
    (``declared_by``) or one the op itself reads or writes; None elsewhere."""
    owner = declared_by(graph, t)
    if owner is None:
        owner = next((n for n in (t.producer, *(c for c, _ in t.consumers))
                      if n and graph.ops[n].canonical == "control_flow"), None)
    return owner


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:+.1f} µs"


def fp32_tensor_core_why(graph: PrecisionGraph, ctx: PlanContext, energy: PlanEnergy, plan: dict[int, int],
                         plan_s: float, timer: OpTimer, io_matters: Callable[[], bool] | None = None) -> str:
    """Lines explaining the FP32 tensor-core ops of ``plan`` (predicted ``plan_s``, its energy's
    total); "" when there are none. ``io_matters``: whether dropping the I/O casts would change
    the plan (``convert.io_casts_matter``), asked only before advising ``--no-keep-io-types``."""
    tc = [op for op in graph.ops.values() if op.tensor_core and not op.inserted]
    total = sum(timer.flops(op) for op in tc)
    if total <= 0:
        return ""
    low = short(ctx.low_dtype)
    of = _gemm_flops_named(graph)
    lines = []
    kept = [u for u, names in energy.unit_ops.items() if not plan.get(u) and graph.ops[names[0]].tensor_core]
    if kept:
        flops = sum(timer.flops(graph.ops[n]) for u in kept for n in energy.unit_ops[u])
        flipped = {u: 1 for u in plan}  # the whole eligible region low: what "just convert it" would give
        d_total = energy.total(flipped)[0] - plan_s
        d_op = sum(energy.time_low[u] - energy.time_fp32[u] for u in plan if not plan[u])
        lines.append(f"FP32 by cost ({timer.runtime.name}): {len(kept)} tensor-core ops, {flops / total:.0%} of {of}")
        # the report adds the memory it predicts all-low (``plan_report.build_report``): weights plus peak
        # activations, where the cut's measure sums every output (-37,486 MiB on a 12 MiB model)
        lines.append(f"all-{low} would change compute by {_us(d_op)}, casts by {_us(d_total - d_op)}")
        border_lines, io, stored = _casts_needed_by(graph, energy, flipped)
        lines += border_lines
        advice = (_dim_advice(graph) + _io_advice(graph, ctx, io, io_matters) + _init_advice(ctx, stored)
                  + _options_not_in_effect(graph, ctx, timer)).rstrip(", ")
        if advice:
            lines.append(f"would change it: {advice}")
    unplanned = [op for op in tc if op.precision is None and unplanned_float(graph, op)]
    if unplanned:
        flops = sum(timer.flops(op) for op in unplanned)
        lines.append(f"not planned: {len(unplanned)} tensor-core ops, {flops / total:.0%} of {of}, run in "
                     f"{unplanned_float(graph, unplanned[0])}; plans convert float32 ops: cast the model to float32 "
                     f"first{'' if graph.inputs_retypable else ' (model.float())'}")
    ruled = [op for op in tc if op.unit is None and op.precision == FLOAT32]
    if ruled:
        flops = sum(timer.flops(op) for op in ruled)
        reason, n = Counter(op.reason for op in ruled).most_common(1)[0]
        lines.append(f"FP32 by a rule: {len(ruled)} tensor-core ops, {flops / total:.0%} of {of} ({n}x: {reason})")
    return "\n".join(lines)


def _gemm_flops_named(graph: PrecisionGraph) -> str:
    """What the shares are of: "GEMM/conv FLOPs", or, beside integer GEMMs (``quantize_dynamic``'s
    MatMulInteger, which no plan touches), "float GEMM/conv FLOPs (N integer GEMMs left int8)": a
    dynamic-quantized BERT's 4 attention MatMuls had read "100% of GEMM/conv FLOPs"."""
    n = sum(1 for op in graph.ops.values() if op.op_type in _INTEGER_GEMMS)
    return f"float GEMM/conv FLOPs ({n} integer GEMMs left int8)" if n else "GEMM/conv FLOPs"


def near_tie_note(graph: PrecisionGraph, t32: float, t: float, launches: int) -> str:
    """One line when the plan (predicted ``t``) is predicted slower than all-FP32 (``t32``): the
    near-tie the ``time`` objective took for memory (``docs/architecture.md``, "The objective");
    "" otherwise."""
    if t <= t32 or t32 <= 0:
        return ""
    fastest = "--objective fastest" if graph.inputs_retypable else 'objective="fastest"'
    return (f"{_us(t - t32)} ({(t - t32) / t32:.1%}) over FP32: a tie within 1% or {launches} launches for less memory "
            f"({fastest} gives the plan never predicted slower than FP32)")


def _options_not_in_effect(graph: PrecisionGraph, ctx: PlanContext, timer: OpTimer) -> str:
    """The options that make casts cheap or weigh memory, as the entry point spells them (a torch
    graph's inputs arrive as the caller passes them, ``PrecisionGraph.inputs_retypable``, an ONNX
    file's do not), less those already in effect: under ``--deploy tensorrt`` the advice was to
    pass ``--deploy tensorrt``."""
    cli = graph.inputs_retypable
    options = []
    if not timer.runtime.fuse_casts:
        options.append("--deploy tensorrt|inductor (casts fuse)" if cli else 'backend="inductor" (casts fuse)')
    if ctx.objective != "memory":
        options.append("--objective memory" if cli else 'objective="memory"')
    return ", ".join(options)


def _io_advice(graph: PrecisionGraph, ctx: PlanContext, io: int, io_matters: Callable[[], bool] | None) -> str:
    """``--no-keep-io-types (...), `` when casts at graph inputs/outputs are charged, the file's
    inputs and outputs could take the low dtype and, without those casts, the plan would change
    (``io_matters``): a decoder's KV cache (``past_key_values.*`` in, ``present.*`` out) cast both
    ways every step had kept a GPT-2 FP32 with no word of it."""
    if not io or not ctx.keep_io_types or not graph.inputs_retypable or (io_matters and not io_matters()):
        return ""
    return f"--no-keep-io-types ({io} I/O casts), "


def _init_advice(ctx: PlanContext, stored: int) -> str:
    """``--init-max-bytes`` advice when the all-low plan casts weights that option keeps FP32 in the
    file: a BERT under ``--init-max-bytes 1000`` stayed FP32 for 13 such casts and the line named
    every option but that one."""
    limit = getattr(getattr(ctx, "user_rules", None), "init_max_bytes", None)
    if not stored or limit is None:
        return ""
    return f"a larger --init-max-bytes than {limit} ({stored} weights stored FP32 and cast every call), "


def _dim_advice(graph: PrecisionGraph) -> str:
    """``--dim NAME=SIZE (...), `` naming the symbolic dims the cost model sized with the default (no
    ``--dim`` value, no example) that the graph's inputs declare (sizing them sizes the expressions
    made of them); symbols shape inference made up (TorchScript's ``unk__3``, which no user can
    name) are only counted; "" when every dim has a size."""
    sizes = graph.dim_values()
    dims = {d for t in graph.tensors.values() if t.shape for d in t.shape if isinstance(d, str)}
    unsized = set().union(*(sizes.unsized(d) for d in dims))
    declared = sorted(unsized & sizes.declared)
    others = len(unsized) - len(declared)
    advice = ""
    if declared:
        advice = (f"--dim NAME=SIZE ({len(declared)} input dims sized {graph.default_dim()}: "
                  f"{', '.join(declared[:3])}{', …' if len(declared) > 3 else ''}), ")
    if others:
        advice += f"--default-dim N ({others} dims no input declares sized {graph.default_dim()}), "
    return advice


#: the places where the numerics rules' reasons quote an op's name (``numerics_centring``,
#: ``numerics_attention`` twice, ``numerics_chains``' trig chains and eps chains, ``numerics`` rule 2);
#: a word anywhere else is the rule's own, whatever op shares it
_QUOTED_OP = re.compile(r"(?<=centring \(x - mean\(x\)\): )\S+(?= subtracts )"
                        r"|(?<=unscaled attention scores: )\S+?(?='s product )"
                        r"|(?<= reaches )\S+(?= with no 1/sqrt\(d\) scale)"
                        r"|(?<=computes the argument of )\S+?(?=: )"
                        r"|(?:^|(?<=: ))\S+?(?=: argument | can reach )")


def _named_apart(graph: PrecisionGraph, reason: str) -> str:
    """``reason`` with the op names it quotes written as those ops' types, so that one rule counts
    once: "centring (x - mean(x)): /h.0/ln_1/Sub subtracts ..." named each of GPT-2's five
    LayerNorms apart, and the line read "(2 ops)" twice for the ten ops the rule holds. Only where
    a rule quotes a name (``_QUOTED_OP``), in one pass: replacing every occurrence of each name
    turned a Sub named "sub" into "its Sub its Subtracts this mean"."""
    def typed(m: re.Match) -> str:
        op = graph.ops.get(m.group())
        return f"its {op.op_type}" if op is not None else m.group()
    return _QUOTED_OP.sub(typed, reason)


def _held_by(graph: PrecisionGraph, op, worded: dict[str, str]) -> str:
    """The rule holding ``op`` FP32, worded so that one rule counts once (``_named_apart``); each
    wording made once, in ``worded`` (16k ops held by deny propagation share one)."""
    reason = _DOWNSTREAM_OF.sub("downstream of a deny op (deny propagation)", op.reason.split(": ", 1)[-1])
    found = worded.get(reason)
    if found is None:
        found = worded[reason] = _named_apart(graph, reason)
    return found


def _casts_needed_by(graph: PrecisionGraph, energy: PlanEnergy, plan: dict[int, int]) -> tuple[list[str], int, int]:
    """(lines, casts at graph inputs/outputs, casts of weights stored FP32): what the casts of ``plan``
    border: ops that stay FP32 whatever the plan (deny, a numerics rule, out of the eligible region;
    casts and ops by op type, the commonest first: "8 casts at 4 Resize", two per interpolation, had
    read "8x Resize", 8 ops; a cast bordering two op types counts once, "5 casts at 5 ReduceMean +
    5 Sub", which had read as 10), weights, the subgraph boundaries of If/Loop/Scan ops
    (``_at_subgraph``) and the main graph's inputs/outputs (``at_graph_io``: only these casts
    ``--no-keep-io-types`` removes; a Loop's had been counted with them), then the rules that hold
    those ops FP32 (their reasons, the commonest first); no lines when no cast is charged."""
    borders: Counter = Counter()
    held: dict[str, str] = {}  # bordering op -> why it stays FP32
    io = other = 0
    weights: Counter = Counter()  # PARAMETER / CONSTANT -> casts at weights no op holds FP32
    subgraphs: Counter = Counter()  # If/Loop/Scan op -> casts at its subgraph's declared types
    worded: dict[str, str] = {}
    costs = energy.cast_costs(plan)
    for i in np.flatnonzero(costs).tolist():  # the terms that pay a cast
        t = graph.tensors[energy.terms[i].tensor]
        fixed = [graph.ops[n] for n in (t.producer, *(c for c, _ in t.consumers))
                 if n and graph.ops[n].unit is None and graph.ops[n].precision == FLOAT32]
        if fixed:  # one cast read by a LayerNorm's ReduceMean and Sub is one cast at both
            borders[tuple(sorted({op.op_type for op in fixed}))] += 1
            for op in fixed:  # each op's rule worded once, however many casts it borders
                if op.name not in held:
                    held[op.name] = _held_by(graph, op, worded)
        elif t.producer is None and t.kind in (PARAMETER, CONSTANT):
            weights[t.kind] += 1  # a parameter (training) or a constant kept FP32 in the file (init_max_bytes)
        elif (owner := _at_subgraph(graph, t)) is not None:
            subgraphs[owner] += 1
        elif at_graph_io(t):
            io += 1
        else:
            other += 1  # a port the schema or the registry keeps in its dtype
    kinds = Counter(graph.ops[name].op_type for name in held)  # distinct ops: 2 casts at 1 Resize read "1 Resize"
    parts = [f"{n} {'casts ' if not i else ''}at {' + '.join(f'{kinds[k]} {k}' for k in key)}"
             for i, (key, n) in enumerate(borders.most_common(4))]
    if weights[PARAMETER]:
        parts.append(f"{weights[PARAMETER]} at parameters cast every call (training mode keeps their FP32 master copy)")
    if weights[CONSTANT]:
        parts.append(f"{weights[CONSTANT]} at weights stored FP32 and cast every call")
    if subgraphs:
        owners = Counter(graph.ops[name].op_type for name in subgraphs)  # "of 1 Loop + 2 If"
        parts.append(f"{sum(subgraphs.values())} at subgraph boundaries of "
                     f"{' + '.join(f'{n} {k}' for k, n in owners.most_common())} "
                     f"(declared types, which no option changes)")
    if io:
        parts.append(f"{io} at graph inputs/outputs")
    if other:
        parts.append(f"{other} at ports of a fixed dtype")
    if not parts:
        return [], io, 0
    # "its": the all-low plan's casts, priced on the line before (not the chosen plan's, which the report lists)
    lines = [("its casts border ops that stay FP32 whatever the plan: " if borders else "its casts: ")
             + ", ".join(parts)]
    reasons = Counter(held.values()).most_common(2)
    if reasons:
        lines.append("held FP32 by: " + "; ".join(f"{why} ({n} op{'s' if n > 1 else ''})" for why, n in reasons))
    return lines, io, weights[CONSTANT]
