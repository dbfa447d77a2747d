"""Where the time and memory go: inline SVG bar charts for the HTML report.

* Predicted time by op kind (canonical op, else op type) in FP32, as planned (mixed) and
  all in the low dtype (deny and unknown ops stay FP32 there), the heaviest kinds first;
  the casts' share of the mixed time is the summary's mixed total less the sum of the
  ops' planned times.
* Predicted memory: weights stored and peak live activations in FP32, mixed and all-FP16,
  from the summary's ``predicted_memory_*`` keys, else computed from the report's tensors
  (``report_memory.predicted_memory``). See docs/architecture.md (Report).
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

from .report_memory import predicted_memory

TOP_KINDS = 12
_ALWAYS_FP32 = ("deny", "unknown")  # FP32 in the all-low-precision plan too, as in the summary's ceiling
BAR_W, LABEL_W, ROW_H = 420, 150, 15
SERIES = (("fp32", "FP32", "#f5a35c"), ("mixed", "mixed (planned)", "#7b3fe4"), ("low", "all low precision", "#7fd39a"))


def _num(x: Any) -> float:
    return float(x) if isinstance(x, (int, float)) and x == x else 0.0


def time_by_kind(data: Mapping[str, Any]) -> tuple[list[tuple[str, dict[str, float]]], float]:
    """[(kind, {fp32, mixed, low} seconds)], heaviest first, and the casts' predicted seconds."""
    kinds: dict[str, dict[str, float]] = {}
    for op in data.get("ops") or []:
        kind = str(op.get("canonical") or op.get("op_type") or "?")
        t32, tlow = _num(op.get("predicted_time_fp32_s")), _num(op.get("predicted_time_fp16_s"))
        row = kinds.setdefault(kind, {"fp32": 0.0, "mixed": 0.0, "low": 0.0})
        row["fp32"] += t32
        row["low"] += t32 if op.get("class") in _ALWAYS_FP32 else tlow
        row["mixed"] += tlow if op.get("precision") in ("float16", "bfloat16") else t32
    ops_mixed = sum(r["mixed"] for r in kinds.values())
    casts = max(_num((data.get("summary") or {}).get("predicted_time_mixed_s")) - ops_mixed, 0.0)
    ranked = sorted(kinds.items(), key=lambda kv: -max(kv[1].values()))
    return ranked, casts


def memory(data: Mapping[str, Any]) -> tuple[dict[str, int] | None, str]:
    """The ``predicted_memory_*`` values and where they come from (summary or the tensors table)."""
    summary = data.get("summary") or {}
    keys = [k for k in summary if str(k).startswith("predicted_memory_")]
    if keys:
        return {k: summary[k] for k in keys}, "planner's summary"
    mem = predicted_memory(data)
    return mem, "computed from the report's tensors"


def render(data: Mapping[str, Any]) -> str:
    """The 'Where the time and memory go' section."""
    from .report import fmt_bytes, fmt_time  # the report's own number formats

    parts = ['<section id="costs"><h2>Where the time and memory go</h2>']
    ranked, cast_s = time_by_kind(data)
    if ranked:
        rows = [(k, v) for k, v in ranked[:TOP_KINDS]]
        rest = ranked[TOP_KINDS:]
        if rest:
            rows.append((f"{len(rest)} other kinds", {s: sum(v[s] for _, v in rest) for s, _, _ in SERIES}))
        rows.append(("casts", {"fp32": 0.0, "mixed": cast_s, "low": 0.0}))
        total = sum(v["mixed"] for _, v in rows)
        share = f"{100 * cast_s / total:.1f} %" if total else "—"
        parts.append(f'<p class="meta">Predicted time by op kind; casts take {html.escape(share)} of the mixed '
                     f'plan\'s {html.escape(fmt_time(total))}.</p>')
        parts.append(_bars("g-time", rows, fmt_time))
    mem, origin = memory(data)
    if mem:
        rows = []
        for part in ("weights", "activations"):
            vals = {s: _num(mem.get(f"predicted_memory_{part}_{key}_bytes"))
                    for s, key in (("fp32", "fp32"), ("mixed", "mixed"), ("low", "all_fp16"))}
            rows.append((part if part == "weights" else "activations (peak)", vals))
        parts.append(f'<p class="meta">Predicted memory ({html.escape(origin)}): weights stored, and the peak '
                     'of activations alive at once.</p>')
        parts.append(_bars("g-mem", rows, fmt_bytes))
    else:
        parts.append('<p class="none">No memory prediction: this report has no tensors table (schema 1.0).</p>')
    parts.append("</section>")
    return "".join(parts)


def _bars(css_id: str, rows: list[tuple[str, dict[str, float]]], fmt) -> str:
    """Horizontal grouped bars: one group per row, one bar per series, value printed at the end."""
    e = html.escape
    top = max((v for _, r in rows for v in r.values()), default=0.0) or 1.0
    group_h = ROW_H * len(SERIES) + 8
    height = group_h * len(rows) + 24
    out = [f'<svg id="{css_id}" class="chart" width="{LABEL_W + BAR_W + 90}" '
           f'height="{height}" font-size="11" font-family="system-ui,sans-serif">']
    x = LABEL_W
    for k, (_, label, colour) in enumerate(SERIES):  # legend
        out.append(f'<rect x="{x}" y="2" width="10" height="10" fill="{colour}"/>'
                   f'<text x="{x + 14}" y="11">{e(label)}</text>')
        x += 16 + 7 * len(label)
    for g, (name, vals) in enumerate(rows):
        y0 = 20 + g * group_h
        out.append(f'<text x="{LABEL_W - 6}" y="{y0 + group_h / 2:.0f}" text-anchor="end">{e(name)}</text>')
        for k, (key, label, colour) in enumerate(SERIES):
            v = vals.get(key, 0.0)
            w = BAR_W * v / top
            y = y0 + k * ROW_H
            out.append(f'<rect x="{LABEL_W}" y="{y}" width="{w:.1f}" height="{ROW_H - 3}" fill="{colour}">'
                       f'<title>{e(name)}, {e(label)}: {e(fmt(v))}</title></rect>'
                       f'<text x="{LABEL_W + w + 4:.1f}" y="{y + ROW_H - 5}" fill="#5d6875">{e(fmt(v))}</text>')
    out.append("</svg>")
    return "".join(out)


__all__ = ["memory", "render", "time_by_kind"]
