"""Build the per-op precision report (schema 1.0) from a ``PlanResult``, after emission.

Shared by the ONNX and FX paths: both emit the plan first (an emitter routes every cast
it adds through the IR), then hand over the result, so the report counts the casts the
emitted graph holds. The summary built here is the report's one derivation of its totals;
``amp_compiler.report.Report`` renders it (docs/architecture.md, "Report").
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import TYPE_CHECKING, Any

from cost_model.repeats import body_runs_note
from passes.explain import declared_by

from . import __version__
from .dtypes import FLOAT32, LOW_PRECISION, is_float
from .ir import GRAPH_INPUT, PrecisionGraph
from .registry import UNKNOWN
from .report import SCHEMA_VERSION, Report
from .report_memory import fill_memory, tensor_table

if TYPE_CHECKING:
    from passes.result import PlanResult


def build_report(result: PlanResult, defer_costs: bool = False) -> Report:
    """The schema-1.0 report of ``result`` (call it after the emitter ran). ``defer_costs``: the ops'
    per-op costs, which only the full report shows, are filled in when it is first read whole
    (``Report.data``), for a caller whose IR nothing changes after this call (``convert_onnx``)."""
    graph, ctx, timer, pred = result.graph, result.ctx, result.timer, result.prediction
    default_dim = graph.default_dim()
    ops, casts, casts_caused, tensor_core, unknown = _op_and_cast_rows(result)
    gemm_flops = sum((flops for _, flops in tensor_core), 0.0)
    low_gemm_flops = sum((flops for o, flops in tensor_core if o["precision"] in LOW_PRECISION), 0.0)
    precisions = Counter(o["precision"] for o in ops)
    n_low = sum(n for precision, n in precisions.items() if precision in LOW_PRECISION)
    fp32_t, mixed_t, all_low_t = pred.fp32_s, pred.mixed_s, pred.all_low_s
    summary = {
        "nodes": len(ops), "fp16_nodes": n_low, "fp32_nodes": precisions[FLOAT32],
        "casts": len(casts), "inserted_casts": sum(1 for c in casts if c["inserted"]),
        "cast_bytes": sum(c["bytes"] for c in casts),
        "gemm_flops": gemm_flops,
        "fp16_gemm_flop_fraction": (low_gemm_flops / gemm_flops) if gemm_flops else 1.0,
        "predicted_time_fp32_s": fp32_t, "predicted_time_mixed_s": mixed_t,
        "predicted_time_all_fp16_s": all_low_t,
        "predicted_speedup_vs_fp32": fp32_t / mixed_t if mixed_t else 1.0,
        "predicted_speedup_vs_all_fp16": all_low_t / mixed_t if mixed_t else 1.0,
        "target": ctx.target if isinstance(ctx.target, str) else getattr(ctx.target, "name", str(ctx.target)),
        "dtype": ctx.low_dtype, "planner": ctx.planner, "keep_io_types": ctx.keep_io_types,
        "default_dim": default_dim, "dim_values": graph.dim_values(), "unknown_ops": sorted(unknown),
        **_plan_fields(result),
        **_saturated(result),
        **_nothing_to_do(result),
        **_guessed_gemm_sizes(graph, tensor_core, gemm_flops),
        **_body_runs(graph),
    }
    data = {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "amp-compiler", "version": __version__},
        "source": result.source,
        "summary": summary,
        "ops": ops,
        "casts": casts,
        "passes": [r.to_dict() for r in result.records],
        "alignment": [f.to_dict() for f in result.alignment],
        "tensors": tensor_table(graph),  # schema 1.1: the edges' sizes (docs/report-schema.md)
    }
    fill_memory(data)  # summary's predicted_memory_* keys: the one estimate (report_memory.py)
    _why_with_memory(summary)
    costs = functools.partial(_op_costs, graph, timer, ctx.low_dtype, casts_caused, ops)
    if not defer_costs:
        costs(data)
    return Report(data, details=costs if defer_costs else None)


def _op_and_cast_rows(result: PlanResult) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, int],
                                                   list[tuple[dict[str, Any], float]], set[str]]:
    """One walk of the ops: the report's op rows without their costs (source ops only, in graph
    order; ``_op_costs`` adds those), its cast rows, how many casts each op reads, the tensor-core
    rows with their FLOPs, and the unknown op types met."""
    graph, timer = result.graph, result.timer
    keep_io_types, emitter_casts = result.ctx.keep_io_types, result.emitter_casts
    rows, casts, casts_caused, tensor_core, unknown = [], [], {}, [], set()
    for op in graph.ops.values():
        if op.canonical == "cast":
            cast = _cast_row(graph, op, casts_caused, keep_io_types, emitter_casts)
            if cast is not None:
                casts.append(cast)
        if op.inserted:
            continue
        row = {
            "name": op.name, "op_type": op.op_type, "canonical": op.canonical or "", "class": op.op_class,
            "precision": op.precision or "n/a", "reason": op.reason,
            **({"scope": op.scope} if op.scope else {}),
            "inputs": [t for t in op.inputs if t], "outputs": [t for t in op.outputs if t],  # schema 1.1
        }
        rows.append(row)
        if op.tensor_core:
            tensor_core.append((row, timer.flops(op) if timer else 0.0))
        if op.op_class == UNKNOWN:
            unknown.add(f"{op.domain}::{op.op_type}" if op.domain else op.op_type)
    return rows, casts, casts_caused, tensor_core, unknown


def _cast_row(graph: PrecisionGraph, op, casts_caused: dict[str, int], keep_io_types: bool,
              emitter_casts) -> dict[str, Any] | None:
    """The casts section's row of ``op`` (a cast), counted in ``casts_caused`` for the ops reading it;
    None for a cast that changes no precision (int64 -> bool and the like)."""
    src = graph.tensors[op.inputs[0]] if op.inputs and op.inputs[0] else None
    out = graph.tensors[op.outputs[0]]
    if src is None or not (is_float(src.dtype) and is_float(out.dtype)) or src.dtype == out.dtype:
        return None
    consumers = [c for c, _ in out.consumers]
    for c in consumers:
        casts_caused[c] = casts_caused.get(c, 0) + 1
    return {"name": op.name, "tensor": src.name, "from": src.dtype, "to": out.dtype,
            "bytes": graph.nbytes(src) + graph.nbytes(out),
            "reason": (op.reason if op.name in emitter_casts else
                       _cast_reason(graph, op, consumers, keep_io_types) if op.inserted
                       else "cast in the source model"),
            "inserted": op.inserted, "output": out.name}


def _op_costs(graph: PrecisionGraph, timer, low: str, casts_caused: dict[str, int], rows: list[dict[str, Any]],
              data: dict[str, Any]) -> None:
    """Fill in each op row's costs (``Report``'s deferred ``details``): FLOPs, bytes moved, predicted
    times in FP32 and ``low``, and the casts it reads. ``rows`` are ``_op_and_cast_rows``' (one per
    source op in graph order), wherever ``data`` holds them now; the IR is as it was when they
    were built (nothing changes it after the report)."""
    timed = bool(timer)
    sources = (op for op in graph.ops.values() if not op.inserted)
    for row, op in zip(rows, sources):
        priced = timed and op.has_unit_ports
        row["flops"] = timer.flops(op) if timed else 0.0
        row["bytes"] = timer.bytes(op, op.precision or FLOAT32) if timed else 0.0
        row["predicted_time_fp32_s"] = timer.time(op, FLOAT32) if priced else 0.0
        row["predicted_time_fp16_s"] = timer.time(op, low) if priced else 0.0
        row["casts"] = casts_caused.get(op.name, 0)


def _why_with_memory(summary: dict[str, Any]) -> None:
    """Close the why-lines' "all-fp16 would change ..." line with the memory change the summary
    predicts from this plan to all-FP16 (weights plus peak activations, ``report_memory.py``)."""
    why = summary.get("fp32_tensor_core_why") or ""
    mixed, low = summary.get("predicted_memory_mixed_bytes"), summary.get("predicted_memory_all_fp16_bytes")
    if mixed is None or low is None or "\nall-" not in "\n" + why:
        return
    lines = why.splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith("all-"))
    lines[i] += f", memory by {(low - mixed) / 2 ** 20:+.2f} MiB"
    summary["fp32_tensor_core_why"] = "\n".join(lines)


def _nothing_to_do(result: PlanResult) -> dict[str, Any]:
    """``nothing_to_do``: one line when a model converted before (onnxconverter-common, an earlier
    run of ours) comes out as it went in: every op in its source dtype, no cast inserted."""
    ops = [op for op in result.graph.ops.values() if op.precision is not None and op.source_dtype]
    low = sum(op.source_dtype in LOW_PRECISION for op in ops)
    if not low:
        return {}
    raised = [op for op in ops if op.source_dtype in LOW_PRECISION and op.precision == FLOAT32 and not op.inserted]
    if raised:
        return {"raised_from_low": _raised_from_low(result.graph, ops, low, raised)}
    if any(op.inserted for op in result.graph.ops.values()) or any(
            op.precision != op.source_dtype for op in ops if not op.inserted):
        return {}
    earlier = sum("kept FP32 by the amp-compiler run" in (op.reason or "") for op in ops)
    kept = f", {earlier} kept FP32 by the run that converted it" if earlier else ""
    return {"nothing_to_do": f"nothing to do: {low} ops already {_low_name(ops)}{kept}; no op or cast changes"}


def _raised_from_low(graph: PrecisionGraph, ops: list, low: int, raised: list) -> str:
    """``raised_from_low``: one line when a model already in the low dtype (ONNX Runtime's float16
    tool, onnxconverter-common) had ops moved back to FP32 by a rule: its LayerNorms' Pow and
    centring were, with casts around them, and the report had said nothing of it."""
    rules: dict[str, Counter] = {}
    for op in raised:  # "deny: pow overflows ...", "infer: centring (x - mean(x)): <op> subtracts ..."
        rules.setdefault(op.reason.split(": ")[1] if ": " in op.reason else op.reason, Counter())[op.op_type] += 1
    said = "; ".join(f"{' + '.join(f'{n} {t}' for t, n in kinds.most_common())}: {rule}"
                     for rule, kinds in sorted(rules.items(), key=lambda kv: -sum(kv[1].values()))[:3])
    casts = sum(op.inserted and op.op_type == "Cast" for op in graph.ops.values())
    return (f"source already {_low_name(ops)}: {low - len(raised)} ops left as they were, {len(raised)} moved to FP32 "
            f"by a rule with {casts} casts ({said})")


def _body_runs(graph: PrecisionGraph) -> dict[str, Any]:
    """``body_runs``: how many times the predicted times count each Loop/Scan body, where there is one."""
    note = body_runs_note(graph) if graph.scopes else ""
    return {"body_runs": note} if note else {}


def _guessed_gemm_sizes(graph: PrecisionGraph, tensor_core: list[tuple[dict, float]], gemm_flops: float
                        ) -> dict[str, Any]:
    """``guessed_gemm_sizes``: one line when tensor-core ops (``tensor_core``: their report rows and FLOPs) read
    a dim that no input declares (a symbol shape inference made up, sized ``--default-dim`` whatever
    ``--dim`` says), so their FLOPs are a guess whatever the plan; a TorchScript Swin all FP16 had
    said nothing of its 13 MatMuls priced so."""
    sizes = graph.dim_values()
    verdicts: dict[tuple, bool] = {}  # per shape: a 100k-node graph repeats a handful of them

    def made_up(name: str) -> bool:
        shape = graph.tensors[name].shape if name in graph.tensors else None
        if not shape:
            return False
        verdict = verdicts.get(shape)
        if verdict is None:
            verdict = verdicts[shape] = any(isinstance(d, str) and bool(sizes.unsized(d) - sizes.declared)
                                            for d in shape)
        return verdict

    guessed = [(o, flops) for o, flops in tensor_core if any(made_up(t) for t in o["inputs"])]
    if not guessed:
        return {}
    share = sum(flops for _, flops in guessed) / gemm_flops if gemm_flops else 0.0
    return {"guessed_gemm_sizes": f"{len(guessed)} tensor-core ops ({share:.0%} of GEMM/conv FLOPs) read dims no "
                                  f"input declares, sized {graph.default_dim()} (--default-dim): their FLOPs are a "
                                  f"guess (first: {guessed[0][0]['name']})"}


def _low_name(ops) -> str:
    return next(op.source_dtype for op in ops if op.source_dtype in LOW_PRECISION)


def _saturated(result: PlanResult) -> dict[str, Any]:
    """Mask fills stored saturated (numerics rule 10; the casts pass keeps those on all-FP32 paths)."""
    kept = {name: why for name, why in result.numerics.saturated.items()
            if result.graph.tensors[name].saturate_to is not None}
    return {"saturated_constants": kept} if kept else {}


def _plan_fields(result: PlanResult) -> dict[str, Any]:
    """What the convert pass computed in one place (``passes/convert.py``), as the summary carries it:
    the runtime profile, the objective and why tensor-core work stayed FP32."""
    costs = result.costs
    if costs is None:
        return {}
    return {"runtime_profile": costs.runtime_profile, "objective": costs.objective,
            "fusion_groups": costs.fusion_groups, "fp32_tensor_core_why": costs.fp32_tensor_core_why, "near_tie": costs.near_tie}


def _cast_reason(graph: PrecisionGraph, op, consumers: list[str], keep_io_types: bool) -> str:
    """Why the casts pass inserted ``op``: a kept graph input/output, a subgraph's declared input or
    output (kept whatever ``keep_io_types``: the casts inside a Loop body had said "(keep_io_types)"
    under ``--no-keep-io-types``), or the ops reading it."""
    out = graph.tensors[op.outputs[0]]
    src = graph.tensors[op.inputs[0]]
    names = ", ".join(consumers[:3]) + (" ..." if len(consumers) > 3 else "")
    for side, owner in (("output", declared_by(graph, out)),
                        ("input", declared_by(graph, src) if src.kind == GRAPH_INPUT else None)):
        if owner is not None:
            why = f"subgraph {side} keeps its declared type ({graph.ops[owner].op_type} {owner})"
            return why + (f"; read by {names}" if consumers else "")
    if out.is_graph_output and not consumers:
        return "graph output keeps its dtype (keep_io_types)"
    if src.producer is None and not src.is_constant:
        if not graph.inputs_retypable:
            return "graph input arrives in the caller's dtype"
        if keep_io_types:
            return "graph input keeps its dtype (keep_io_types)"
    return f"read by {names}"
