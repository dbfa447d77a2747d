"""Automatic FP32 fallback: move the few ops that cause the error back to FP32, in seconds.

Node-by-node bisection rebuilds a session per step (tens of minutes on real models).
Instead, one run of each model with every float tensor exposed tells, per low-precision
op, how much error it *adds*: the relative error of its output minus the worst
relative error of its inputs. The worst offenders, with the low-precision ops that
feed them, are denied (``deny_nodes``), the
model is re-planned — so casts stay optimal around them — and checked again; the
number moved doubles each round, so a handful of rounds suffice. The writers of values that
overflow FP16 (``overflow.py``: the CPU runtime computes them in FP32, so their error is
invisible there) are moved first, all of them at once. A ``Loop``/``Scan`` body cannot be exposed,
so such a node with low-precision ops inside is measured as one op, and moving it moves them all
(``low_bodies``). An ``If`` is not: a merged decoder holds the whole model in its branches, which
would all move at once. Where the feeds set its condition (a merged decoder's ``use_cache_branch``),
the branch each way of it takes is written into the main graph (``onnx_io/taken_branches.py``) and
its ops are ranked one by one like the main graph's (``taken_scopes``); they had never been
candidates, and the fallback gave up on a merged decoder's rounding error having moved nothing.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from onnx import ModelProto

from .dtypes import LOW_PRECISION, short
from .errors import ConversionError
from .metrics import max_rel_error, rel_error
from .onnx_io.body_peaks import LOOPS
from .onnx_io.probe import run_exposed
from .onnx_io.structure import graphs
from .onnx_io.taken_branches import inline_taken_branches
from .overflow import probed_runs, runnable
from .validate import branch_feeds, run_model, undetermined_selections


def added_error(original: ModelProto, converted: ModelProto, report, feeds: dict,
                runner: Callable = run_model) -> list[tuple[float, str]]:
    """(error an op adds, op name) for every low-precision op of the main graph and of the ``If``
    branches the feeds take (each way a fed condition goes: ``validate.branch_feeds``; an op's worst),
    and for every main-graph ``Loop``/``Scan`` node with low-precision ops in its body (its name:
    ``low_bodies``), worst first. A body's values cannot be exposed, so such a node is measured as one op."""
    worst: dict[str, float] = {}
    for _, variant in branch_feeds(original, feeds):
        for error, name in _added_error_taking(original, converted, report, variant, runner):
            worst[name] = max(worst.get(name, error), error)
    return sorted(((error, name) for name, error in worst.items()), reverse=True)


def _added_error_taking(original: ModelProto, converted: ModelProto, report, feeds: dict,
                        runner: Callable) -> list[tuple[float, str]]:
    """``added_error`` for one set of feeds: the branches they take inlined into both models."""
    scopes = taken_scopes(original, feeds)
    bodies = low_bodies(original, report)
    original, converted = inline_taken_branches(original, feeds), inline_taken_branches(converted, feeds)
    low_ops = [o for o in report.ops if o["precision"] in LOW_PRECISION and (o.get("scope") or "") in scopes]
    low_ops += [{"name": name} for name in bodies]
    orig_outputs = {n.output[i] for n in original.graph.node for i in range(len(n.output)) if n.output[i]}
    by_name = {**original_nodes(original, report, scopes),
               **{name: node for name, (node, _) in bodies.items()}}
    tensors = sorted({t for o in low_ops if o["name"] in by_name for t in by_name[o["name"]].output
                      if t in orig_outputs} | {t for o in low_ops if o["name"] in by_name
                                               for t in by_name[o["name"]].input if t in orig_outputs})
    converted_names = {t for n in converted.graph.node for t in n.output}
    tensors = [t for t in tensors if t in converted_names]
    ref = run_exposed(original, tensors, feeds, runner, "the FP32 model")
    got = run_exposed(converted, tensors, feeds, runner, "the converted model")
    err = {t: rel_error(ref[t], got[t]) for t in tensors if t in ref and t in got
           and np.asarray(ref[t]).dtype.kind == "f"}
    ranked = []
    for o in low_ops:
        node = by_name.get(o["name"])
        if node is None:
            continue
        out_err = max((err.get(t, 0.0) for t in node.output), default=0.0)
        in_err = max((err.get(t, 0.0) for t in node.input), default=0.0)
        ranked.append((out_err - in_err if np.isfinite(out_err) else float("inf"), o["name"]))
    return ranked


def taken_scopes(model: ModelProto, feeds: dict) -> frozenset[str]:
    """The main graph's scope ('') and the plan scopes of the ``If`` branches ``feeds`` take (a
    one-element boolean condition they give, as ``inline_taken_branches`` reads it): the importer
    scopes a branch op as ``<node>.then_branch/<op>`` (``onnx_io/importer.py``)."""
    scopes = {""}
    for idx, node in enumerate(model.graph.node):
        if node.op_type != "If" or not node.input:
            continue
        flag = feeds.get(node.input[0])
        if isinstance(flag, np.ndarray) and flag.dtype == np.bool_ and flag.size == 1:
            branch = "then_branch" if bool(flag.reshape(-1)[0]) else "else_branch"
            scopes.add(f"{node.name or f'{node.op_type}_{idx}'}.{branch}")
    return frozenset(scopes)


def original_nodes(original: ModelProto, report, scopes: frozenset[str] = frozenset({""})) -> dict[str, Any]:
    """Report op name -> the main-graph node of ``original`` it plans, for the ops of ``scopes`` (the
    main graph's, and the branches ``original`` has inlined: ``taken_scopes``), matched by an output
    (a node may have no name: the importer names it ``<op_type>_<index>``, and matching by node name
    had found none, so the fallback moved nothing; a branch's values keep their names when inlined)."""
    by_output = {t: n for n in original.graph.node for t in n.output if t}
    # the importer's name for each node (``onnx_io/importer.py``): an op whose output the emitter
    # renamed (an FP16 MatMul feeding a graph output kept FP32 writes ``y_fp16``) is found by it
    by_name = {n.name or f"{n.op_type}_{idx}": n for idx, n in enumerate(original.graph.node)}
    found = {}
    for op in report.ops:
        scope = op.get("scope") or ""
        if scope not in scopes:
            continue
        node = next((by_output[t] for t in op.get("outputs") or () if t in by_output), None) or (
            None if scope else by_name.get(op["name"]))
        if node is not None:
            found[op["name"]] = node
    return found


def _planned_nodes(original: ModelProto, report, feeds: dict) -> dict[str, Any]:
    """``original_nodes`` of the main graph and of every branch some way of the feeds takes."""
    found: dict[str, Any] = {}
    for _, variant in branch_feeds(original, feeds):
        found.update(original_nodes(inline_taken_branches(original, variant), report, taken_scopes(original, variant)))
    return found


def low_bodies(original: ModelProto, report) -> dict[str, tuple[Any, list[str]]]:
    """Main-graph ``Loop``/``Scan`` nodes whose bodies, at any depth, hold low-precision ops: the
    importer's name for the node -> (node, those ops' plan names). The importer scopes a body op as
    ``<node>.<attribute>/<op>`` (``onnx_io/importer.py``)."""
    low = [(o.get("scope") or "", o["name"]) for o in report.ops if o["precision"] in LOW_PRECISION and o.get("scope")]
    found = {}
    for idx, node in enumerate(original.graph.node):
        if node.op_type not in LOOPS or node.domain not in ("", "ai.onnx"):
            continue
        name = node.name or f"{node.op_type}_{idx}"
        inside = [op for scope, op in low if scope.startswith(f"{name}.")]
        if inside:
            found[name] = (node, inside)
    return found


def _with_low_producers(names: list[str], nodes: dict[str, Any], low: set[str]) -> list[str]:
    """``names`` plus the low-precision ops writing their inputs (``nodes``: ``original_nodes``).

    Error shows where it is *revealed* (x + 1000 - 1000 cancels in the Sub), but it was
    made where a value was rounded (the Add): moving only the revealing op rarely helps.
    """
    producer = {t: name for name, n in nodes.items() for t in n.output}
    by_name = nodes
    out = list(names)
    for name in names:
        for t in by_name[name].input if name in by_name else ():
            p = producer.get(t)
            if p in low and p not in out:
                out.append(p)
    return out


def convert_with_fallback(convert: Callable[..., Any], original: ModelProto, feeds: dict,
                          tolerance: float, *, deny_nodes=(), max_rounds: int = 8, progress=None,
                          runner: Callable = run_model):
    """Convert, validate, and deny the worst error-adding ops until the outputs are within ``tolerance``.

    ``convert(deny_nodes=...)`` re-plans the model (``convert_onnx`` with its options);
    ``runner`` runs a model (ONNX Runtime by default; ``validate.run_reference`` rounds
    exactly like FP16 hardware, slowly). Returns ``(ConvertedModel, moved op names)``.
    """
    user = "deny: node named by the user (--deny-node)"
    denied = dict.fromkeys(deny_nodes, user)  # op name -> its reason (``passes/classify.py`` reports it)
    moved: list[str] = []
    expected = None
    take = 1
    for round_ in range(max_rounds + 1):
        result = convert(deny_nodes=denied)  # first: a malformed model gets the importer's error, not ORT's
        converted, report = result.model, result.report
        name16 = short(report.summary.get("dtype") or "float16").upper()  # FP16 or BF16
        if expected is None:
            expected = runner(original, feeds, label="the FP32 model")
            outputs = [o.name for o in original.graph.output]
            # outputs chosen by near-tied TopK/ArgMax scores: a reorder is no op's error (``onnx_io/selection.py``)
            uncounted = undetermined_selections(original, set(outputs), feeds, tolerance, runner)
            counted = [name not in uncounted for name in outputs]
        worst, rows = _check(original, converted, feeds, runner, expected, counted)
        # writers of values FP16 cannot hold (the CPU runtime hides them, ``overflow.py``), by their plan names
        plan_name = {op["name"][len(op["scope"]) + 1:]: op["name"] for op in report.ops if op.get("scope")}
        plan_name.update((op["name"], op["name"]) for op in report.ops if not op.get("scope"))
        writer_of = {t: op["name"] for op in report.ops for t in op.get("outputs") or ()}  # unnamed nodes too
        overflowing = {name: f"fallback: its {name16} value overflows ({r['fp32_peak']:.3g} in the FP32 run)"
                       for r in rows for name in _planned_writers(converted, r, plan_name, writer_of)}
        overflowing = {name: why for name, why in overflowing.items() if name not in denied}
        if progress:
            progress(f"fallback round {round_}: max rel error {worst:.3g}, {len(rows)} overflowing {name16} "
                     f"values, with {len(moved)} ops moved to FP32")
        if worst <= tolerance and not rows:
            report.data["fallback"] = {"moved_to_fp32": moved, "rounds": round_, "max_rel_error": worst,
                                       "tolerance": tolerance}
            if uncounted:
                report.data["fallback"]["not_counted"] = uncounted
            return result, moved
        if round_ == max_rounds:
            break
        candidates = list(overflowing) or [
            name for e, name in added_error(original, converted, report, feeds, runner) if name not in denied and e > 0]
        if not candidates:
            break
        low = {o["name"] for o in report.ops if o["precision"] in LOW_PRECISION}
        step = _with_low_producers(candidates if overflowing else candidates[:take],
                                   _planned_nodes(original, report, feeds), low - set(denied))
        why = (f"fallback: writes an input of an op whose {name16} value overflows" if overflowing
               else f"fallback: {name16} here added error beyond the {tolerance:g} budget")
        bodies = low_bodies(original, report)  # a node measured as one op moves its bodies' low ops
        in_body = {op: (f"fallback: {name16} in the body of {bodies[name][0].op_type} {name} added error beyond "
                        f"the {tolerance:g} budget (a body's ops are measured together)")
                   for name in step if name in bodies for op in bodies[name][1]}
        step = list(dict.fromkeys(m for name in step for m in (bodies[name][1] if name in bodies else [name])))
        denied.update((name, overflowing.get(name) or in_body.get(name) or why) for name in step)
        moved += step
        if not overflowing:
            take *= 2
    left = f" and {len(rows)} {name16} values overflow" if rows else ""
    raise ConversionError("", "validation", f"max relative error {worst:.3g}{left}: stays above the tolerance "
                                            f"{tolerance:g} after moving {len(moved)} ops to FP32")


def _planned_writers(converted: ModelProto, row: dict, plan_name: dict[str, str],
                     writer_of: dict[str, str]) -> list[str]:
    """The plan names of the ops to move for an overflow ``row``: its value's writer where the plan
    has it, else, for a cast the conversion inserted (an FP32 op's output cast to FP16 overflows
    there), the planned ops reading its output. Ops are found by the values they write
    (``writer_of``: the report's), then by node name: ONNX nodes need not have one."""
    def planned(node) -> str | None:
        by_value = next((writer_of[t] for t in node.output if t in writer_of), None)
        return by_value if by_value is not None else plan_name.get(node.name)

    if row.get("value") in writer_of:
        return [writer_of[row["value"]]]
    if row["writer"] in plan_name:
        return [plan_name[row["writer"]]]
    for g, _ in graphs(converted.graph, ""):
        cast = next((n for n in g.node if n.name == row["writer"] and n.op_type == "Cast"), None)
        if cast is not None:
            return [p for n in g.node if cast.output[0] in n.input and (p := planned(n)) is not None]
    return []


def _check(original: ModelProto, converted: ModelProto, feeds: dict, runner: Callable,
           expected: list, counted: list[bool]) -> tuple[float, list[dict]]:
    """(worst error of the ``counted`` outputs, overflow rows) of ``converted``: each way a merged
    decoder's switch goes, with the overflow check where both models are in memory (``overflow.py``)."""
    def worst_of(fp32: list, actual: list) -> float:
        return max_rel_error([a for a, c in zip(fp32, counted) if c], [b for b, c in zip(actual, counted) if c])

    if not (runnable(original) and runnable(converted)):
        return worst_of(expected, runner(converted, feeds, label="the converted model")), []
    worst, rows = 0.0, []
    for _, variant in branch_feeds(original, feeds):
        fp32, actual, found = probed_runs(original, converted, variant, variant, runner)
        worst, rows = max(worst, worst_of(fp32, actual)), rows + found
    return worst, rows
