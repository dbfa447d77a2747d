"""The terminal rendering of a report: summary, ops by class, FP32 ops, casts, passes, alignment, validation.

At most 120 columns; long tables are cut at ``max_rows`` rows with a "… N more" line.
docs/architecture.md, "Report".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from .formatting import (clean, fmt_bool, fmt_bytes, fmt_count, fmt_sci, fmt_speedup,
                         fmt_tensor_core_share, fmt_time, overflow_lines, num, plural, short_dtype)
from .schema import PRECISION_LABEL
from .text_table import INDENT, TEXT_WIDTH, Col, cut, display_width, heading, more_line, table, trunc_end


def _low_counts(ops: list, total, label: str) -> str:
    """The summary's count of low-precision ops, by the dtypes they run in: a model already in BF16
    planned for FP16 keeps its BF16 ops, which had read "3 FP16"; ``label`` (the plan's dtype) where
    the ops do not say."""
    counts = Counter(op.get("precision") for op in ops if isinstance(op, Mapping)
                     and op.get("precision") in ("float16", "bfloat16"))
    if not counts or sum(counts.values()) != total:
        return f"{fmt_count(total)} {label}"
    return ", ".join(f"{fmt_count(n)} {PRECISION_LABEL[d]}" for d, n in sorted(counts.items(), reverse=True))


def render_text(report, max_rows: int | None = 60) -> str:
    """``report`` (a ``Report``) as terminal text; tables cut at ``max_rows`` rows (None: never)."""
    if max_rows is not None and max_rows < 0:
        raise ValueError(f"max_rows must be >= 0 or None, got {max_rows}")
    W = TEXT_WIDTH
    s = report.summary
    out: list[str] = []

    # header
    title = trunc_end(clean(report.title()), W)
    out += [title, "═" * display_width(title)]
    # a model converted before: unchanged, or what changed; ops merged as ONNX Runtime's CSE would
    for key in ("nothing_to_do", "raised_from_low", "merged_duplicates"):
        if s.get(key):
            out.append(trunc_end("! " + clean(s[key]), W))
    for key in ("exported_in_training", "cpu_layout_ops"):  # training-mode nodes; ORT's CPU-only layout ops
        if s.get(key):
            out.append(trunc_end("! " + clean(s[key]), W))
    if s.get("guessed_gemm_sizes"):  # GEMMs read dims shape inference made up (sized --default-dim)
        out.append(trunc_end("! " + clean(s["guessed_gemm_sizes"]), W))
    for line in (s.get("fp32_tensor_core_why") or "").splitlines():  # why GEMM/conv work stayed FP32
        out.append(trunc_end("! " + clean(line), W))
    out.append(trunc_end(
        f"target {clean(s.get('target') or '—')} · dtype {clean(s.get('dtype') or '—')}"
        f" · planner {clean(s.get('planner') or '—')}", W))

    # summary
    out += heading("Summary")
    nodes = s.get("nodes")
    fp16, fp32 = s.get("fp16_nodes"), s.get("fp32_nodes")
    red_label = PRECISION_LABEL.get(clean(s.get("dtype")), "FP16")
    rows = [("nodes", f"{fmt_count(nodes)} ({_low_counts(report.decisions, fp16, red_label)}, {fmt_count(fp32)} FP32)")]
    rows.append(("casts", f"{fmt_count(s.get('casts'))} "
                          f"({fmt_bytes(s.get('cast_bytes'))} converted)"))
    rows.append(("tensor cores", " ".join(fmt_tensor_core_share(s))))
    rows.append(("predicted time",
                 f"FP32 {fmt_time(s.get('predicted_time_fp32_s'))} · "
                 f"mixed {fmt_time(s.get('predicted_time_mixed_s'))} · "
                 f"all-{red_label} {fmt_time(s.get('predicted_time_all_fp16_s'))}"))
    if s.get("predicted_memory_fp32_bytes") is not None:  # weights + peak activations (report_memory.py)
        mem = [f"{k} {fmt_bytes(s.get(f'predicted_memory_{f}_bytes'))}"
               for k, f in (("FP32", "fp32"), ("mixed", "mixed"), (f"all-{red_label}", "all_fp16"))]
        rows.append(("predicted memory", " · ".join(mem)))
    vs_fp32, vs_fp16 = s.get("predicted_speedup_vs_fp32"), s.get("predicted_speedup_vs_all_fp16")
    rows.append(("speed-up", f"{fmt_speedup(vs_fp32)} vs FP32 · "
                             f"{fmt_speedup(vs_fp16)} of all-{red_label}"))
    if s.get("body_runs"):  # how many iterations of each Loop/Scan body the times count (cost_model/repeats.py)
        rows.append(("loop bodies", clean(s["body_runs"])))
    if s.get("near_tie"):  # the plan is predicted slower than FP32: say it is the objective's tie
        rows.append(("near tie", clean(s["near_tie"])))
    unknown = s.get("unknown_ops")
    if unknown:
        names = unknown if isinstance(unknown, list) else [unknown]
        rows.append(("unknown ops", ", ".join(clean(n) for n in names) + " (run as exported, in their source dtypes)"))
    lw = max(len(k) for k, _ in rows)
    out += [trunc_end(f"{INDENT}{k:<{lw}}  {v}", W) for k, v in rows]

    # ops by class
    counts = report.class_counts()
    precs = report.precisions(counts)
    out += heading("Ops by class")
    cols = [Col("class", trunc="end"), Col("ops", "r")]
    cols += [Col(PRECISION_LABEL.get(p, p), "r", trunc="end") for p in precs]
    trows = []
    for cls, c in counts.items():
        trows.append([cls, fmt_count(sum(c.values()))] + [fmt_count(c[p]) for p in precs])
    total = Counter()
    for c in counts.values():
        total.update(c)
    trows.append(["total", fmt_count(sum(total.values()))] + [fmt_count(total[p]) for p in precs])
    out += table(cols, trows)

    # FP32 ops
    fp32_ops = report.fp32_ops
    out += heading(f"Ops kept in FP32 ({len(fp32_ops):,} of {len(report.decisions):,})")
    if fp32_ops:
        shown, more = cut(fp32_ops, max_rows)
        cols = [Col("name", trunc="middle", min_width=16), Col("op_type", trunc="end"),
                Col("class", trunc="end"), Col("reason", trunc="end", min_width=20)]
        out += table(cols, [[op.get("name"), op.get("op_type"), op.get("class") or "unknown",
                              op.get("reason")] for op in shown])
        if more:
            out.append(more_line(more))
    else:
        out.append(f"{INDENT}none")

    # casts
    casts = report.casts
    out += heading(f"Casts ({len(casts):,}, {fmt_bytes(s.get('cast_bytes'))})")
    if casts:
        shown, more = cut(casts, max_rows)
        cols = [Col("name", trunc="middle", min_width=16), Col("tensor", trunc="middle"),
                Col("from → to", trunc="end"), Col("bytes", "r"),
                Col("reason", trunc="end", min_width=20)]
        out += table(cols, [[c.get("name"), c.get("tensor"),
                              f"{short_dtype(c.get('from'))} → {short_dtype(c.get('to'))}",
                              fmt_bytes(c.get("bytes")), c.get("reason")] for c in shown])
        if more:
            out.append(more_line(more))
    else:
        out.append(f"{INDENT}none")

    # passes
    passes = report.passes
    tot = sum(v for v in (num(p.get("time_s")) for p in passes) if v is not None)
    out += heading(f"Passes ({len(passes):,}, {fmt_time(tot) if passes else '—'})")
    if passes:
        shown, more = cut(passes, max_rows)
        cols = [Col("pass", trunc="end"), Col("time", "r"), Col("changed"),
                Col("details", trunc="end", min_width=20)]
        out += table(cols, [[p.get("name"), fmt_time(p.get("time_s")),
                              fmt_bool(p.get("changed")), p.get("details")] for p in shown])
        if more:
            out.append(more_line(more))
    else:
        out.append(f"{INDENT}none")

    # alignment (optional)
    if report.has("alignment"):
        align = report.alignment
        out += heading(f"Tensor-core alignment ({plural(len(align), 'warning')})")
        if align:
            shown, more = cut(align, max_rows)
            cols = [Col("op", trunc="middle", min_width=16),
                    Col("message", trunc="end", min_width=20)]
            out += table(cols, [[a.get("op"), a.get("message")] for a in shown])
            if more:
                out.append(more_line(more))
        else:
            out.append(f"{INDENT}all GEMM/conv dimensions aligned")

    # validation (optional)
    val = report.validation
    if val is not None:
        status = {True: "PASSED", False: "FAILED"}.get(val.get("passed"), "—")
        out += heading(f"Validation: {status} (tolerance {fmt_sci(val.get('tolerance'))})")
        outputs = val.get("outputs") if isinstance(val.get("outputs"), list) else []
        if outputs:
            shown, more = cut(outputs, max_rows)
            has_pass = any(isinstance(o, Mapping) and "passed" in o for o in shown)
            cols = [Col("output", trunc="middle", min_width=16), Col("max abs err", "r"),
                    Col("max rel err", "r")] + ([Col("ok")] if has_pass else [])
            trows = []
            for o in shown:
                o = o if isinstance(o, Mapping) else {"name": o}
                r = [o.get("name"), fmt_sci(o.get("max_abs_error")),
                     fmt_sci(o.get("max_rel_error"))]
                if has_pass:
                    r.append(fmt_bool(o.get("passed"), "ok", "FAIL"))
                trows.append(r)
            out += table(cols, trows)
            if more:
                out.append(more_line(more))
            out += [f"{INDENT}{o.get('name')}: {o['note']}" for o in shown if isinstance(o, Mapping) and o.get("note")]
            out += [f"{INDENT}{line}" for line in overflow_lines(val)]
        else:
            out.append(f"{INDENT}no outputs compared")
        drawn = s.get("inputs_drawn")
        if isinstance(drawn, Mapping):  # how the inputs were made: a size the graph pins is said here
            out += [f"{INDENT}input {clean(name)}: {clean(how)}" for name, how in drawn.items()]

    return "\n".join(trunc_end(line, W) for line in out) + "\n"
