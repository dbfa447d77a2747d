"""The HTML rendering of a report: one self-contained page (inline CSS; inline JS only sorts and filters).

Every string from the model is escaped with ``html.escape``. Extra sections (title,
HTML) go after the standard ones, before the page ends: the place for a graph view.
docs/architecture.md, "Report".
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, Callable

from .formatting import (clean, fmt_bool, fmt_bytes, fmt_count, fmt_flops, fmt_pct, fmt_sci, fmt_speedup,
                         fmt_tensor_core_share, fmt_time, overflow_lines, num, plural, ratio)
from .html_assets import CSS, JS
from ..report_graph import GRAPH_JS, html_views
from .schema import CLASS_ORDER, PRECISION_LABEL, SCHEMA_VERSION


def render_html(report, sections: Sequence[tuple[str, str]] = ()) -> str:
    """``report`` (a ``Report``) as one HTML page; ``sections``: extra ``(title, html)`` sections, in order."""
    e = esc
    s = report.summary
    title = report.title()
    parts: list[str] = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f'<meta name="generator" content="amp-compiler report schema {e(SCHEMA_VERSION)}">',
        f"<title>{e(title)}</title>",
        f"<style>{CSS}</style>",
        "</head><body>",
        f"<header><h1>{e(title)}</h1>",
        f'<p class="meta">target <b>{e(s.get("target") or "—")}</b> · dtype '
        f'<b>{e(s.get("dtype") or "—")}</b> · planner <b>{e(s.get("planner") or "—")}</b>'
        f' · schema {e(report.data.get("schema_version") or SCHEMA_VERSION)}</p></header>',
        "<main>",
    ]

    # summary cards
    nodes, fp16, fp32 = (s.get(k) for k in ("nodes", "fp16_nodes", "fp32_nodes"))
    vs_fp32, vs_fp16 = s.get("predicted_speedup_vs_fp32"), s.get("predicted_speedup_vs_all_fp16")
    low_label = PRECISION_LABEL.get(str(s.get("dtype")), "FP16")  # all-BF16 under --dtype bf16
    cards = [
        ("Nodes", fmt_count(nodes), f"{fmt_count(fp16)} reduced · {fmt_count(fp32)} FP32"),
        ("Reduced precision", fmt_pct(ratio(fp16, nodes)), "of nodes"),
        ("Tensor-core FLOPs", *fmt_tensor_core_share(s)),
        ("Casts", fmt_count(s.get("casts")), fmt_bytes(s.get("cast_bytes"))),
        ("Predicted time", fmt_time(s.get("predicted_time_mixed_s")),
         f"FP32 {fmt_time(s.get('predicted_time_fp32_s'))} · all-{low_label} "
         f"{fmt_time(s.get('predicted_time_all_fp16_s'))}"),
        ("Speed-up vs FP32", fmt_speedup(vs_fp32), f"{fmt_speedup(vs_fp16)} of all-{low_label}"),
    ]
    val = report.validation
    if val is not None:
        passed = val.get("passed")
        cards.append(("Validation", {True: "passed", False: "FAILED"}.get(passed, "—"),
                      f"tolerance {fmt_sci(val.get('tolerance'))}"))
    parts.append('<section class="cards">')
    for label, value, sub in cards:
        cls = ""
        if label == "Validation":
            cls = " ok" if val and val.get("passed") is True else (
                " bad" if val and val.get("passed") is False else "")
        parts.append(f'<div class="card{cls}"><div class="label">{e(label)}</div>'
                     f'<div class="value">{e(value)}</div><div class="sub">{e(sub)}</div></div>')
    parts.append("</section>")
    unknown = s.get("unknown_ops")
    if unknown:
        names = unknown if isinstance(unknown, list) else [unknown]
        parts.append(f'<p class="warn">Unknown ops (run as exported, in their source dtypes): '
                     f'{", ".join(f"<code>{e(n)}</code>" for n in names)}</p>')
    # what the text report's first lines say: a plan that did nothing, or left tensor-core work FP32, says why
    said = [s.get("nothing_to_do"), s.get("raised_from_low"), s.get("merged_duplicates"), s.get("exported_in_training"),
            s.get("cpu_layout_ops"), s.get("guessed_gemm_sizes"),
            *(s.get("fp32_tensor_core_why") or "").splitlines(),
            f"near tie: {s['near_tie']}" if s.get("near_tie") else None,
            f"Loop and Scan {s['body_runs']}" if s.get("body_runs") else None]
    parts += [f'<p class="warn">{e(line)}</p>' for line in said if line]

    # per-class breakdown
    counts = report.class_counts()
    precs = report.precisions(counts)
    parts.append("<section><h2>Ops by class</h2>")
    head = ["class", "ops"] + [PRECISION_LABEL.get(p, p) for p in precs] + ["split"]
    parts.append('<table class="classes"><thead><tr>'
                 + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr></thead><tbody>")
    for cls, c in counts.items():
        n = sum(c.values())
        bar = "".join(
            f'<span class="seg {prec_css(p)}" style="width:{100.0 * c[p] / n:.2f}%" '
            f'title="{e(PRECISION_LABEL.get(p, p))}: {c[p]}"></span>'
            for p in precs if c[p]) if n else ""
        parts.append(f'<tr><td><span class="cls cls-{class_css(cls)}">{e(cls)}</span></td>'
                     f'<td class="num">{e(fmt_count(n))}</td>'
                     + "".join(f'<td class="num">{e(fmt_count(c[p]))}</td>' for p in precs)
                     + f'<td class="barcell"><div class="bar">{bar}</div></td></tr>')
    parts.append("</tbody></table></section>")
    parts.append(html_views(report.data))  # the graph and cost charts (report_graph.py)

    # full op table
    ops = report.ops
    parts.append(f'<section><h2>Ops <span class="count">({len(ops):,})</span></h2>')
    if ops:
        parts.append('<p class="tools"><input id="op-filter" type="search" hidden '
                     'placeholder="filter ops (name, type, class, precision, reason)…" '
                     'aria-label="filter ops"> <span id="op-shown"></span></p>')
        cols = [("#", "num"), ("name", "str"), ("op_type", "str"), ("canonical", "str"),
                ("class", "str"), ("precision", "str"), ("reason", "str"), ("FLOPs", "num"),
                ("bytes", "num"), ("time FP32", "num"), ("time FP16", "num"), ("casts", "num")]
        parts.append('<table id="ops" class="sortable"><thead><tr>'
                     + "".join(f'<th data-type="{t}" title="sort">{e(h)}</th>' for h, t in cols)
                     + "</tr></thead><tbody>")
        rows = []
        for i, op in enumerate(ops):
            prec = clean(op.get("precision") or "n/a")
            cls = clean(op.get("class") or "unknown")
            rows.append(
                f'<tr class="{prec_css(prec)}"><td class="num">{i}</td>'
                f'<td class="name">{e(op.get("name"))}</td>'
                f'<td>{e(op.get("op_type"))}</td><td>{e(op.get("canonical"))}</td>'
                f'<td><span class="cls cls-{class_css(cls)}">{e(cls)}</span></td>'
                f'<td><span class="prec {prec_css(prec)}">{e(prec)}</span></td>'
                f'<td class="reason">{e(op.get("reason"))}</td>'
                + num_td(op.get("flops"), fmt_flops)
                + num_td(op.get("bytes"), fmt_bytes)
                + num_td(op.get("predicted_time_fp32_s"), fmt_time)
                + num_td(op.get("predicted_time_fp16_s"), fmt_time)
                + num_td(op.get("casts"), fmt_count)
                + "</tr>")
        parts.append("\n".join(rows))
        parts.append("</tbody></table>")
    else:
        parts.append('<p class="none">No ops.</p>')
    parts.append("</section>")

    # casts
    casts = report.casts
    parts.append(f'<section><h2>Casts <span class="count">({len(casts):,}, '
                 f'{e(fmt_bytes(s.get("cast_bytes")))})</span></h2>')
    if casts:
        parts.append('<table class="sortable"><thead><tr>'
                     + "".join(f'<th data-type="{t}" title="sort">{e(h)}</th>' for h, t in (
                         ("name", "str"), ("tensor", "str"), ("from", "str"), ("to", "str"),
                         ("bytes", "num"), ("reason", "str")))
                     + "</tr></thead><tbody>")
        parts.append("\n".join(
            f'<tr><td class="name">{e(c.get("name"))}</td><td class="name">{e(c.get("tensor"))}</td>'
            f'<td><span class="prec {prec_css(clean(c.get("from")))}">{e(c.get("from"))}</span></td>'
            f'<td><span class="prec {prec_css(clean(c.get("to")))}">{e(c.get("to"))}</span></td>'
            + num_td(c.get("bytes"), fmt_bytes)
            + f'<td class="reason">{e(c.get("reason"))}</td></tr>' for c in casts))
        parts.append("</tbody></table>")
    else:
        parts.append('<p class="none">No casts.</p>')
    parts.append("</section>")

    # passes
    passes = report.passes
    parts.append(f'<section><h2>Passes <span class="count">({len(passes):,})</span></h2>')
    if passes:
        parts.append('<table class="sortable"><thead><tr>'
                     + "".join(f'<th data-type="{t}" title="sort">{e(h)}</th>' for h, t in (
                         ("#", "num"), ("pass", "str"), ("time", "num"), ("changed", "str"),
                         ("details", "str")))
                     + "</tr></thead><tbody>")
        parts.append("\n".join(
            f'<tr><td class="num">{i}</td><td>{e(p.get("name"))}</td>'
            + num_td(p.get("time_s"), fmt_time)
            + f'<td>{e(fmt_bool(p.get("changed")))}</td>'
            f'<td class="reason">{e(p.get("details"))}</td></tr>' for i, p in enumerate(passes)))
        tot = sum(v for v in (num(p.get("time_s")) for p in passes) if v is not None)
        parts.append(f'</tbody><tfoot><tr><td></td><td>total</td><td class="num">'
                     f'{e(fmt_time(tot))}</td><td></td><td></td></tr></tfoot></table>')
    else:
        parts.append('<p class="none">No passes recorded.</p>')
    parts.append("</section>")

    # alignment (optional)
    if "alignment" in report.data:
        align = report.alignment
        parts.append(f'<section><h2>Tensor-core alignment <span class="count">'
                     f'({e(plural(len(align), "warning"))})</span></h2>')
        if align:
            parts.append('<table><thead><tr><th>op</th><th>message</th></tr></thead><tbody>')
            parts.append("\n".join(f'<tr><td class="name">{e(a.get("op"))}</td>'
                                   f'<td>{e(a.get("message"))}</td></tr>' for a in align))
            parts.append("</tbody></table>")
        else:
            parts.append('<p class="none">All GEMM/conv dimensions aligned.</p>')
        parts.append("</section>")

    # validation (optional)
    if val is not None:
        status = {True: "passed", False: "FAILED"}.get(val.get("passed"), "—")
        css = {True: "ok", False: "bad"}.get(val.get("passed"), "")
        parts.append(f'<section id="validation"><h2>Validation <span class="status {css}">'
                     f'{e(status)}</span> <span class="count">(tolerance '
                     f'{e(fmt_sci(val.get("tolerance")))})</span></h2>')
        outputs = val.get("outputs") if isinstance(val.get("outputs"), list) else []
        if outputs:
            parts.append('<table class="validation"><thead><tr><th>output</th>'
                         '<th>max abs error</th><th>max rel error</th><th>ok</th>'
                         '</tr></thead><tbody>')
            for o in outputs:
                o = o if isinstance(o, Mapping) else {"name": o}
                ok = o.get("passed")
                parts.append(f'<tr><td class="name">{e(o.get("name"))}</td>'
                             + num_td(o.get("max_abs_error"), fmt_sci)
                             + num_td(o.get("max_rel_error"), fmt_sci)
                             + f'<td class="{ {True: "ok", False: "bad"}.get(ok, "")}">'
                             f'{e(fmt_bool(ok, "ok", "FAIL"))}</td></tr>')
            parts.append("</tbody></table>")
            parts += [f'<p class="note">{e(o.get("name"))}: {e(o["note"])}</p>' for o in outputs
                      if isinstance(o, Mapping) and o.get("note")]
            parts += [f'<p class="note">{e(line)}</p>' for line in overflow_lines(val)]
        else:
            parts.append('<p class="none">No outputs compared.</p>')
        drawn = s.get("inputs_drawn")
        if isinstance(drawn, Mapping):  # how the inputs were made, and a size the graph pins
            parts += [f'<p class="note">input {e(name)}: {e(how)}</p>' for name, how in drawn.items()]
        parts.append("</section>")

    for title_, content in sections:  # extra sections (a graph, ...): trusted HTML from amp-compiler
        parts.append(f"<section><h2>{e(title_)}</h2>\n{content}\n</section>")
    parts.append("</main>")
    parts.append(f"<script>{JS}{GRAPH_JS}</script>")  # one script element: ours
    parts.append("</body></html>\n")
    return "\n".join(parts)


_SPECIAL = re.compile("[&<>\"']").search  # what html.escape(quote=True) rewrites


def esc(x: Any) -> str:
    if x is None:
        return ""
    s = str(x)
    return html.escape(s, quote=True) if _SPECIAL(s) else s  # most text has nothing to escape


def prec_css(p: str) -> str:
    return {"float16": "p-fp16", "bfloat16": "p-bf16", "float32": "p-fp32",
            "n/a": "p-na"}.get(p, "p-other")


def class_css(c: str) -> str:
    return c if c in CLASS_ORDER else "other"


def num_td(x: Any, fmt: Callable[[Any], str]) -> str:
    v = num(x)
    key = "" if v is None else ("Infinity" if v == math.inf else
                                "-Infinity" if v == -math.inf else repr(v))
    return f'<td class="num" data-sort="{key}">{esc(fmt(x))}</td>'  # a float's repr needs no escaping
