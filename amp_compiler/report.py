"""Per-op precision report: rendering of the compiler's report dict.

The planner builds a plain, JSON-serialisable dict (schema 1.0, see DESIGN.md §1)
that says, for every op, which precision it got and why, what it costs, and
what the passes did. This module wraps that dict in :class:`Report` and renders
it as

* JSON (``to_json``) -- the machine-readable form, stable key order;
* text (``to_text`` / ``str``) -- a terminal report of at most ~120 columns;
* HTML (``to_html``) -- one self-contained page (inline CSS, optional inline JS
  for sorting / filtering; fully readable with JS off).

``save(path)`` picks the format from the suffix and writes atomically.

Standard library only. Every string that comes from the model (op names, tensor
names, reasons) is escaped with :func:`html.escape` in HTML, and stripped of
control characters in text, so a hostile model cannot inject markup or
terminal escape sequences into a report.

Schema 1.0 (optional keys may be absent; lists may be empty)::

    {"schema_version": "1.0",
     "tool": {"name", "version"}, "source": str,
     "summary": {"nodes", "fp16_nodes", "fp32_nodes", "casts", "cast_bytes",
                 "gemm_flops", "fp16_gemm_flop_fraction",
                 "predicted_time_fp32_s", "predicted_time_mixed_s",
                 "predicted_time_all_fp16_s", "predicted_speedup_vs_fp32",
                 "target", "dtype", "planner", "unknown_ops"},
     "ops": [{"name", "op_type", "canonical", "class", "precision", "reason",
              "flops", "bytes", "predicted_time_fp32_s",
              "predicted_time_fp16_s", "casts"}],
     "casts": [{"name", "tensor", "from", "to", "bytes", "reason"}],
     "passes": [{"name", "time_s", "changed", "details"}],
     "alignment": [{"op", "message"}],                                # optional
     "validation": {"tolerance", "passed",
                    "outputs": [{"name", "max_abs_error", "max_rel_error"}]}}  # optional

Summary totals that are missing are derived from ``ops`` / ``casts`` where
possible, so a partial dict still renders.
"""

from __future__ import annotations

import html
import json
import math
import os
import secrets
import unicodedata
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

__all__ = ["SCHEMA_VERSION", "Report", "SAVE_FORMATS"]

SCHEMA_VERSION = "1.0"

#: Op classes in the order the report lists them (DESIGN.md §2, op registry).
CLASS_ORDER = ("allow", "infer", "clear", "deny", "unknown")
#: Precisions in the order the report lists them.
PRECISION_ORDER = ("float16", "bfloat16", "float32", "n/a")
_REDUCED = frozenset({"float16", "bfloat16"})
_PRECISION_LABEL = {"float16": "FP16", "bfloat16": "BF16", "float32": "FP32", "n/a": "n/a"}

#: Accepted ``save`` suffixes and the format each one selects.
SAVE_FORMATS = {".json": "json", ".html": "html", ".htm": "html", ".txt": "text"}

TEXT_WIDTH = 120
_INDENT = "  "
_GAP = "  "
_ELLIPSIS = "…"
_MORE_HINT = "see --report report.json"

# Canonical key order for the records of schema 1.0; unknown keys follow, sorted.
_TOP_KEYS = ("schema_version", "tool", "source", "summary", "ops", "casts", "passes",
             "alignment", "validation")
_SUMMARY_KEYS = ("nodes", "fp16_nodes", "fp32_nodes", "casts", "cast_bytes", "gemm_flops",
                 "fp16_gemm_flop_fraction", "predicted_time_fp32_s", "predicted_time_mixed_s",
                 "predicted_time_all_fp16_s", "predicted_speedup_vs_fp32", "target", "dtype",
                 "planner", "unknown_ops")
_OP_KEYS = ("name", "op_type", "canonical", "class", "precision", "reason", "flops", "bytes",
            "predicted_time_fp32_s", "predicted_time_fp16_s", "casts")
_CAST_KEYS = ("name", "tensor", "from", "to", "bytes", "reason")
_PASS_KEYS = ("name", "time_s", "changed", "details")
_ALIGN_KEYS = ("op", "message")
_VALIDATION_KEYS = ("tolerance", "passed", "outputs")
_VOUT_KEYS = ("name", "max_abs_error", "max_rel_error", "passed")


# --------------------------------------------------------------------------------------
# number formatting
# --------------------------------------------------------------------------------------

def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _num(x: Any) -> float | None:
    """``x`` as a float, or None when it is not a number (bools are not numbers)."""
    if _is_num(x):
        return float(x)
    # numpy scalars and the like, without importing numpy
    item = getattr(x, "item", None)
    if callable(item) and not isinstance(x, (str, bytes)):
        try:
            v = item()
        except Exception:  # noqa: BLE001 - anything odd is "not a number"
            return None
        return float(v) if _is_num(v) else None
    return None


def fmt_count(x: Any) -> str:
    v = _num(x)
    if v is None:
        return "—" if x is None else str(x)
    if not math.isfinite(v):
        return str(v)
    return f"{int(round(v)):,}" if v == int(v) else f"{v:,.1f}"


def fmt_bytes(x: Any) -> str:
    """Bytes in binary units: ``512 B``, ``120.6 KiB``, ``3.0 GiB``."""
    v = _num(x)
    if v is None:
        return "—" if x is None else str(x)
    if not math.isfinite(v):
        return str(v)
    sign = "-" if v < 0 else ""
    v = abs(v)
    if v < 1024:
        return f"{sign}{v:.0f} B"
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        v /= 1024.0
        if v < 1024 or unit == "PiB":
            return f"{sign}{v:.1f} {unit}"
    raise AssertionError("unreachable")  # pragma: no cover


def fmt_time(x: Any) -> str:
    """Seconds in a readable unit: ``850 ns``, ``12.1 µs``, ``2.10 ms``, ``1.50 s``."""
    v = _num(x)
    if v is None:
        return "—" if x is None else str(x)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "∞" if v > 0 else "-∞"
    a = abs(v)
    if a == 0:
        return "0 µs"
    if a < 1e-6:
        return f"{v * 1e9:.0f} ns"
    if a < 1e-3:
        return f"{v * 1e6:.1f} µs"
    if a < 1.0:
        return f"{v * 1e3:.2f} ms"
    return f"{v:.2f} s"


def fmt_flops(x: Any) -> str:
    """FLOP counts with SI prefixes: ``1.20 GFLOP``."""
    v = _num(x)
    if v is None:
        return "—" if x is None else str(x)
    if not math.isfinite(v):
        return str(v)
    a = abs(v)
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= scale:
            return f"{v / scale:.2f} {prefix}FLOP"
    return f"{v:.0f} FLOP"


def fmt_pct(fraction: Any) -> str:
    v = _num(fraction)
    if v is None:
        return "—" if fraction is None else str(fraction)
    if not math.isfinite(v):
        return str(v)
    return f"{v * 100:.1f}%"


def fmt_speedup(x: Any) -> str:
    v = _num(x)
    if v is None:
        return "—" if x is None else str(x)
    if not math.isfinite(v):
        return str(v)
    return f"{v:.2f}×"


def fmt_sci(x: Any) -> str:
    v = _num(x)
    if v is None:
        return "—" if x is None else str(x)
    return f"{v:.3g}"


def _fmt_bool(x: Any, yes: str = "yes", no: str = "no") -> str:
    if x is True:
        return yes
    if x is False:
        return no
    if x is None:
        return "—"
    return fmt_count(x) if _num(x) is not None else str(x)


# --------------------------------------------------------------------------------------
# text layout helpers
# --------------------------------------------------------------------------------------

def _clean(s: Any) -> str:
    """One-line, printable text: control characters (newlines, ANSI escapes) become spaces."""
    if s is None:
        return ""
    s = str(s)
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() else " " for c in s)


def _char_width(c: str) -> int:
    if unicodedata.combining(c):
        return 0
    return 2 if unicodedata.east_asian_width(c) in ("W", "F") else 1


def _width(s: str) -> int:
    if s.isascii():
        return len(s)
    return sum(_char_width(c) for c in s)


def _take(s: str, w: int) -> str:
    """Longest prefix of ``s`` with display width <= w."""
    out, used = [], 0
    for c in s:
        cw = _char_width(c)
        if used + cw > w:
            break
        out.append(c)
        used += cw
    return "".join(out)


def _take_tail(s: str, w: int) -> str:
    return _take(s[::-1], w)[::-1]


def trunc_end(s: str, w: int) -> str:
    """Cut ``s`` to display width ``w``, ending in an ellipsis when cut."""
    if _width(s) <= w:
        return s
    if w <= 0:
        return ""
    return _take(s, w - 1) + _ELLIPSIS


def trunc_middle(s: str, w: int) -> str:
    """Cut ``s`` to display width ``w`` keeping both ends (op names: the tail says most)."""
    if _width(s) <= w:
        return s
    if w <= 0:
        return ""
    if w < 8:
        return trunc_end(s, w)
    head = (w - 1) // 3
    tail = w - 1 - head
    return _take(s, head) + _ELLIPSIS + _take_tail(s, tail)


def _pad(s: str, w: int, align: str) -> str:
    fill = " " * max(0, w - _width(s))
    return fill + s if align == "r" else s + fill


class _Col:
    __slots__ = ("header", "align", "trunc", "min_width")

    def __init__(self, header: str, align: str = "l", trunc: str | None = None,
                 min_width: int = 8) -> None:
        self.header = header
        self.align = align          # "l" or "r"
        self.trunc = trunc          # None (never cut), "end" or "middle"
        self.min_width = min_width


def _table(cols: Sequence[_Col], rows: Sequence[Sequence[str]],
           width: int = TEXT_WIDTH, indent: str = _INDENT) -> list[str]:
    """Lay out ``rows`` under ``cols``; columns fit their content, the whole fits ``width``.

    When the table is too wide the truncatable columns shrink, widest first, but
    not below their minimum width (or their header).
    """
    if not rows:        # everything cut by max_rows: the "… N more" line says it all
        return []
    rows = [[_clean(c) for c in r] for r in rows]
    widths = [max([_width(c.header)] + [_width(r[i]) for r in rows]) for i, c in enumerate(cols)]
    fixed = len(indent) + len(_GAP) * (len(cols) - 1)
    excess = fixed + sum(widths) - width
    while excess > 0:
        shrinkable = [i for i, c in enumerate(cols)
                      if c.trunc and widths[i] > max(c.min_width, _width(c.header))]
        if not shrinkable:
            break
        i = max(shrinkable, key=lambda k: widths[k])
        others = [widths[k] for k in shrinkable if k != i]
        floor = max(cols[i].min_width, _width(cols[i].header))
        target = max(floor, widths[i] - excess, (max(others) if others else 0))
        if target >= widths[i]:      # tie with another column: shave one
            target = widths[i] - 1
        excess -= widths[i] - target
        widths[i] = target

    def line(cells: Sequence[str]) -> str:
        out = []
        for i, (c, cell) in enumerate(zip(cols, cells)):
            w = widths[i]
            if _width(cell) > w:
                cell = trunc_middle(cell, w) if c.trunc == "middle" else trunc_end(cell, w)
            out.append(_pad(cell, w, c.align))
        return trunc_end((indent + _GAP.join(out)).rstrip(), width)

    lines = [line([c.header for c in cols]),
             trunc_end(indent + _GAP.join("─" * w for w in widths), width)]
    lines.extend(line(r) for r in rows)
    return lines


def _cut(items: Sequence[Any], max_rows: int | None) -> tuple[Sequence[Any], int]:
    if max_rows is None or len(items) <= max_rows:
        return items, 0
    return items[:max_rows], len(items) - max_rows


def _more_line(n: int) -> str:
    return f"{_INDENT}{_ELLIPSIS} {n:,} more ({_MORE_HINT})"


def _heading(title: str, width: int = TEXT_WIDTH) -> list[str]:
    title = trunc_end(_clean(title), width)
    return ["", title, "═" * min(width, _width(title))]


# --------------------------------------------------------------------------------------
# JSON helpers
# --------------------------------------------------------------------------------------

def _ordered(d: Mapping[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    """``d`` with ``keys`` first (in that order), then the remaining keys sorted."""
    out = {k: d[k] for k in keys if k in d}
    for k in sorted((k for k in d if k not in out), key=str):
        out[k] = d[k]
    return out


def _ordered_list(items: Any, keys: Sequence[str]) -> Any:
    if not isinstance(items, list):
        return items
    return [_ordered(x, keys) if isinstance(x, Mapping) else x for x in items]


def _json_default(obj: Any) -> Any:
    """Best effort for values that slipped in without being converted (numpy, Path, sets)."""
    for attr in ("tolist", "item"):
        fn = getattr(obj, attr, None)
        if callable(fn):
            try:
                return fn()
            except Exception:  # noqa: BLE001
                pass
    if isinstance(obj, (set, frozenset, tuple)):
        return sorted(obj, key=str) if isinstance(obj, (set, frozenset)) else list(obj)
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    return str(obj)


# --------------------------------------------------------------------------------------
# the report
# --------------------------------------------------------------------------------------

class Report:
    """A per-op precision report (schema 1.0) and its renderings.

    ``Report(data)`` wraps the dict without copying it; the properties return
    views into it (missing sections come back empty).
    """

    def __init__(self, data: Mapping[str, Any]) -> None:
        if not isinstance(data, Mapping):
            raise TypeError(f"Report expects a dict, got {type(data).__name__}")
        version = data.get("schema_version")
        if version is not None and str(version).split(".")[0] != SCHEMA_VERSION.split(".")[0]:
            raise ValueError(f"unsupported report schema_version {version!r}; "
                             f"this amp-compiler reads {SCHEMA_VERSION}")
        self.data: Mapping[str, Any] = data

    # ---- construction -------------------------------------------------------------
    @classmethod
    def from_json(cls, text_or_path: str | bytes | os.PathLike[str]) -> "Report":
        """Load from JSON text, or from a path to a ``.json`` report."""
        if isinstance(text_or_path, os.PathLike):
            text = Path(text_or_path).read_text(encoding="utf-8")
        elif isinstance(text_or_path, (bytes, bytearray)):
            text = bytes(text_or_path).decode("utf-8")
        elif isinstance(text_or_path, str):
            stripped = text_or_path.lstrip()
            if stripped.startswith("{") or stripped.startswith("["):
                text = text_or_path
            else:
                text = Path(text_or_path).read_text(encoding="utf-8")
        else:
            raise TypeError("from_json expects JSON text or a path, "
                            f"got {type(text_or_path).__name__}")
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"a report is a JSON object, got {type(data).__name__}")
        return cls(data)

    # ---- sections -----------------------------------------------------------------
    def _section(self, key: str) -> list[dict]:
        v = self.data.get(key)
        return v if isinstance(v, list) else []

    @property
    def summary(self) -> dict:
        v = self.data.get("summary")
        return v if isinstance(v, dict) else {}

    @property
    def ops(self) -> list[dict]:
        return self._section("ops")

    @property
    def casts(self) -> list[dict]:
        return self._section("casts")

    @property
    def passes(self) -> list[dict]:
        return self._section("passes")

    @property
    def alignment(self) -> list[dict]:
        return self._section("alignment")

    @property
    def validation(self) -> dict | None:
        v = self.data.get("validation")
        return v if isinstance(v, dict) else None

    @property
    def source(self) -> str:
        return _clean(self.data.get("source") or "")

    @property
    def fp32_ops(self) -> list[dict]:
        """The ops kept in FP32 -- what users read first."""
        return [op for op in self.ops if op.get("precision") == "float32"]

    # ---- derived totals -----------------------------------------------------------
    def _total(self, key: str) -> Any:
        """A summary value, derived from ops/casts when the summary lacks it."""
        s = self.summary
        if s.get(key) is not None:
            return s[key]
        ops = self.ops
        if key == "nodes":
            return len(ops) if ops else None
        if key == "fp16_nodes":
            return sum(op.get("precision") in _REDUCED for op in ops) if ops else None
        if key == "fp32_nodes":
            return sum(op.get("precision") == "float32" for op in ops) if ops else None
        if key == "casts":
            return len(self.casts) if "casts" in self.data else None
        if key == "cast_bytes":
            vals = [_num(c.get("bytes")) for c in self.casts]
            return sum(v for v in vals if v is not None) if "casts" in self.data else None
        if key == "gemm_flops":
            vals = [_num(op.get("flops")) for op in ops if op.get("class") == "allow"]
            vals = [v for v in vals if v is not None]
            return sum(vals) if vals else None
        if key == "fp16_gemm_flop_fraction":
            tot = fp16 = 0.0
            for op in ops:
                f = _num(op.get("flops"))
                if op.get("class") == "allow" and f is not None:
                    tot += f
                    if op.get("precision") in _REDUCED:
                        fp16 += f
            return fp16 / tot if tot > 0 else None
        if key == "predicted_speedup_vs_fp32":
            return _ratio(self._total("predicted_time_fp32_s"),
                          self._total("predicted_time_mixed_s"))
        if key == "unknown_ops":
            names = sorted({_clean(op.get("op_type") or op.get("name") or "?")
                            for op in ops if op.get("class") == "unknown"})
            return names or None
        return None

    def class_counts(self) -> dict[str, Counter]:
        """``{class: Counter(precision -> n)}`` in report order (allow, infer, clear, deny, unknown, others)."""
        counts: dict[str, Counter] = {c: Counter() for c in CLASS_ORDER}
        extra: dict[str, Counter] = {}
        for op in self.ops:
            cls = op.get("class") or "unknown"
            cls = _clean(cls)
            target = counts[cls] if cls in counts else extra.setdefault(cls, Counter())
            target[_clean(op.get("precision") or "n/a")] += 1
        for cls in sorted(extra):
            counts[cls] = extra[cls]
        return counts

    def _precisions(self, counts: Mapping[str, Counter]) -> list[str]:
        seen = set()
        for c in counts.values():
            seen.update(c)
        return [p for p in PRECISION_ORDER if p in seen] + sorted(seen - set(PRECISION_ORDER))

    # ---- JSON ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The data in canonical key order (schema_version first)."""
        d = dict(self.data)
        d.setdefault("schema_version", SCHEMA_VERSION)
        out = _ordered(d, _TOP_KEYS)
        if isinstance(out.get("summary"), Mapping):
            out["summary"] = _ordered(out["summary"], _SUMMARY_KEYS)
        if isinstance(out.get("tool"), Mapping):
            out["tool"] = _ordered(out["tool"], ("name", "version"))
        for key, keys in (("ops", _OP_KEYS), ("casts", _CAST_KEYS), ("passes", _PASS_KEYS),
                          ("alignment", _ALIGN_KEYS)):
            if key in out:
                out[key] = _ordered_list(out[key], keys)
        if isinstance(out.get("validation"), Mapping):
            v = _ordered(out["validation"], _VALIDATION_KEYS)
            if "outputs" in v:
                v["outputs"] = _ordered_list(v["outputs"], _VOUT_KEYS)
            out["validation"] = v
        return out

    def to_json(self, indent: int | None = 2) -> str:
        """JSON text; keys in a fixed order with ``schema_version`` first."""
        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=False,
                          default=_json_default)

    # ---- text ---------------------------------------------------------------------
    def __str__(self) -> str:
        return self.to_text()

    def __repr__(self) -> str:
        return (f"<Report {self.source or '?'}: {fmt_count(self._total('nodes'))} ops, "
                f"{fmt_count(self._total('fp16_nodes'))} reduced precision, "
                f"{fmt_count(self._total('fp32_nodes'))} FP32>")

    def _title(self) -> str:
        tool = self.data.get("tool") if isinstance(self.data.get("tool"), Mapping) else {}
        name = _clean(tool.get("name") or "amp-compiler")
        version = _clean(tool.get("version") or "")
        title = f"{name} {version}".strip() + " — per-op precision report"
        return title + (f": {self.source}" if self.source else "")

    def _speedups(self) -> tuple[Any, Any]:
        vs_fp32 = self._total("predicted_speedup_vs_fp32")
        vs_fp16 = self.summary.get("predicted_speedup_vs_all_fp16")
        if vs_fp16 is None:
            vs_fp16 = _ratio(self._total("predicted_time_all_fp16_s"),
                             self._total("predicted_time_mixed_s"))
        return vs_fp32, vs_fp16

    def to_text(self, max_rows: int | None = 60) -> str:
        """Terminal report, at most ~120 columns; long tables are cut at ``max_rows`` rows."""
        if max_rows is not None and max_rows < 0:
            raise ValueError(f"max_rows must be >= 0 or None, got {max_rows}")
        W = TEXT_WIDTH
        s = self.summary
        out: list[str] = []

        # header
        title = trunc_end(_clean(self._title()), W)
        out += [title, "═" * _width(title)]
        for line in (s.get("fp32_tensor_core_why") or "").splitlines():  # why GEMM/conv work stayed FP32
            out.append(trunc_end("! " + _clean(line), W))
        out.append(trunc_end(
            f"target {_clean(s.get('target') or '—')} · dtype {_clean(s.get('dtype') or '—')}"
            f" · planner {_clean(s.get('planner') or '—')}", W))

        # summary
        out += _heading("Summary")
        nodes = self._total("nodes")
        fp16, fp32 = self._total("fp16_nodes"), self._total("fp32_nodes")
        red_label = _PRECISION_LABEL.get(_clean(s.get("dtype")), "FP16")
        rows = [("nodes", f"{fmt_count(nodes)} ({fmt_count(fp16)} {red_label}, "
                          f"{fmt_count(fp32)} FP32)")]
        rows.append(("casts", f"{fmt_count(self._total('casts'))} "
                              f"({fmt_bytes(self._total('cast_bytes'))} converted)"))
        frac, gemm = self._total("fp16_gemm_flop_fraction"), self._total("gemm_flops")
        rows.append(("tensor cores", f"{fmt_pct(frac)} of GEMM/conv FLOPs"
                                     + (f" ({fmt_flops(gemm)})" if gemm is not None else "")))
        rows.append(("predicted time",
                     f"FP32 {fmt_time(self._total('predicted_time_fp32_s'))} · "
                     f"mixed {fmt_time(self._total('predicted_time_mixed_s'))} · "
                     f"all-FP16 {fmt_time(self._total('predicted_time_all_fp16_s'))}"))
        if s.get("predicted_memory_fp32_bytes") is not None:  # weights + peak activations (passes/memory.py)
            mem = [f"{k} {fmt_bytes(s.get(f'predicted_memory_{f}_bytes'))}"
                   for k, f in (("FP32", "fp32"), ("mixed", "mixed"), ("all-FP16", "all_fp16"))]
            rows.append(("predicted memory", " · ".join(mem)))
        vs_fp32, vs_fp16 = self._speedups()
        rows.append(("speed-up", f"{fmt_speedup(vs_fp32)} vs FP32 · "
                                 f"{fmt_speedup(vs_fp16)} of all-FP16"))
        unknown = self._total("unknown_ops")
        if unknown:
            names = unknown if isinstance(unknown, list) else [unknown]
            rows.append(("unknown ops", ", ".join(_clean(n) for n in names) + " (kept FP32)"))
        lw = max(len(k) for k, _ in rows)
        out += [trunc_end(f"{_INDENT}{k:<{lw}}  {v}", W) for k, v in rows]

        # ops by class
        counts = self.class_counts()
        precs = self._precisions(counts)
        out += _heading("Ops by class")
        cols = [_Col("class", trunc="end"), _Col("ops", "r")]
        cols += [_Col(_PRECISION_LABEL.get(p, p), "r", trunc="end") for p in precs]
        trows = []
        for cls, c in counts.items():
            trows.append([cls, fmt_count(sum(c.values()))] + [fmt_count(c[p]) for p in precs])
        total = Counter()
        for c in counts.values():
            total.update(c)
        trows.append(["total", fmt_count(sum(total.values()))] + [fmt_count(total[p]) for p in precs])
        out += _table(cols, trows)

        # FP32 ops
        fp32_ops = self.fp32_ops
        out += _heading(f"Ops kept in FP32 ({len(fp32_ops):,} of {len(self.ops):,})")
        if fp32_ops:
            shown, more = _cut(fp32_ops, max_rows)
            cols = [_Col("name", trunc="middle", min_width=16), _Col("op_type", trunc="end"),
                    _Col("class", trunc="end"), _Col("reason", trunc="end", min_width=20)]
            out += _table(cols, [[op.get("name"), op.get("op_type"), op.get("class") or "unknown",
                                  op.get("reason")] for op in shown])
            if more:
                out.append(_more_line(more))
        else:
            out.append(f"{_INDENT}none")

        # casts
        casts = self.casts
        out += _heading(f"Casts ({len(casts):,}, {fmt_bytes(self._total('cast_bytes'))})")
        if casts:
            shown, more = _cut(casts, max_rows)
            cols = [_Col("name", trunc="middle", min_width=16), _Col("tensor", trunc="middle"),
                    _Col("from → to", trunc="end"), _Col("bytes", "r"),
                    _Col("reason", trunc="end", min_width=20)]
            out += _table(cols, [[c.get("name"), c.get("tensor"),
                                  f"{_short_dtype(c.get('from'))} → {_short_dtype(c.get('to'))}",
                                  fmt_bytes(c.get("bytes")), c.get("reason")] for c in shown])
            if more:
                out.append(_more_line(more))
        else:
            out.append(f"{_INDENT}none")

        # passes
        passes = self.passes
        tot = sum(v for v in (_num(p.get("time_s")) for p in passes) if v is not None)
        out += _heading(f"Passes ({len(passes):,}, {fmt_time(tot) if passes else '—'})")
        if passes:
            shown, more = _cut(passes, max_rows)
            cols = [_Col("pass", trunc="end"), _Col("time", "r"), _Col("changed"),
                    _Col("details", trunc="end", min_width=20)]
            out += _table(cols, [[p.get("name"), fmt_time(p.get("time_s")),
                                  _fmt_bool(p.get("changed")), p.get("details")] for p in shown])
            if more:
                out.append(_more_line(more))
        else:
            out.append(f"{_INDENT}none")

        # alignment (optional)
        if "alignment" in self.data:
            align = self.alignment
            out += _heading(f"Tensor-core alignment ({_plural(len(align), 'warning')})")
            if align:
                shown, more = _cut(align, max_rows)
                cols = [_Col("op", trunc="middle", min_width=16),
                        _Col("message", trunc="end", min_width=20)]
                out += _table(cols, [[a.get("op"), a.get("message")] for a in shown])
                if more:
                    out.append(_more_line(more))
            else:
                out.append(f"{_INDENT}all GEMM/conv dimensions aligned")

        # validation (optional)
        val = self.validation
        if val is not None:
            status = {True: "PASSED", False: "FAILED"}.get(val.get("passed"), "—")
            out += _heading(f"Validation: {status} (tolerance {fmt_sci(val.get('tolerance'))})")
            outputs = val.get("outputs") if isinstance(val.get("outputs"), list) else []
            if outputs:
                shown, more = _cut(outputs, max_rows)
                has_pass = any(isinstance(o, Mapping) and "passed" in o for o in shown)
                cols = [_Col("output", trunc="middle", min_width=16), _Col("max abs err", "r"),
                        _Col("max rel err", "r")] + ([_Col("ok")] if has_pass else [])
                trows = []
                for o in shown:
                    o = o if isinstance(o, Mapping) else {"name": o}
                    r = [o.get("name"), fmt_sci(o.get("max_abs_error")),
                         fmt_sci(o.get("max_rel_error"))]
                    if has_pass:
                        r.append(_fmt_bool(o.get("passed"), "ok", "FAIL"))
                    trows.append(r)
                out += _table(cols, trows)
                if more:
                    out.append(_more_line(more))
            else:
                out.append(f"{_INDENT}no outputs compared")

        return "\n".join(trunc_end(line, W) for line in out) + "\n"

    # ---- HTML ---------------------------------------------------------------------
    def to_html(self) -> str:
        """One self-contained HTML page (inline CSS; inline JS only adds sorting/filtering)."""
        e = _esc
        s = self.summary
        title = self._title()
        parts: list[str] = [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f'<meta name="generator" content="amp-compiler report schema {e(SCHEMA_VERSION)}">',
            f"<title>{e(title)}</title>",
            f"<style>{_CSS}</style>",
            "</head><body>",
            f"<header><h1>{e(title)}</h1>",
            f'<p class="meta">target <b>{e(s.get("target") or "—")}</b> · dtype '
            f'<b>{e(s.get("dtype") or "—")}</b> · planner <b>{e(s.get("planner") or "—")}</b>'
            f' · schema {e(self.data.get("schema_version") or SCHEMA_VERSION)}</p></header>',
            "<main>",
        ]

        # summary cards
        nodes, fp16, fp32 = (self._total(k) for k in ("nodes", "fp16_nodes", "fp32_nodes"))
        vs_fp32, vs_fp16 = self._speedups()
        gemm = self._total("gemm_flops")
        cards = [
            ("Nodes", fmt_count(nodes), f"{fmt_count(fp16)} reduced · {fmt_count(fp32)} FP32"),
            ("Reduced precision", fmt_pct(_ratio(fp16, nodes)), "of nodes"),
            ("Tensor-core FLOPs", fmt_pct(self._total("fp16_gemm_flop_fraction")),
             "of GEMM/conv FLOPs" + (f" ({fmt_flops(gemm)})" if gemm is not None else "")),
            ("Casts", fmt_count(self._total("casts")), fmt_bytes(self._total("cast_bytes"))),
            ("Predicted time", fmt_time(self._total("predicted_time_mixed_s")),
             f"FP32 {fmt_time(self._total('predicted_time_fp32_s'))} · all-FP16 "
             f"{fmt_time(self._total('predicted_time_all_fp16_s'))}"),
            ("Speed-up vs FP32", fmt_speedup(vs_fp32), f"{fmt_speedup(vs_fp16)} of all-FP16"),
        ]
        val = self.validation
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
        unknown = self._total("unknown_ops")
        if unknown:
            names = unknown if isinstance(unknown, list) else [unknown]
            parts.append(f'<p class="warn">Unknown ops (kept FP32): '
                         f'{", ".join(f"<code>{e(n)}</code>" for n in names)}</p>')

        # per-class breakdown
        counts = self.class_counts()
        precs = self._precisions(counts)
        parts.append("<section><h2>Ops by class</h2>")
        head = ["class", "ops"] + [_PRECISION_LABEL.get(p, p) for p in precs] + ["split"]
        parts.append('<table class="classes"><thead><tr>'
                     + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr></thead><tbody>")
        for cls, c in counts.items():
            n = sum(c.values())
            bar = "".join(
                f'<span class="seg {_prec_css(p)}" style="width:{100.0 * c[p] / n:.2f}%" '
                f'title="{e(_PRECISION_LABEL.get(p, p))}: {c[p]}"></span>'
                for p in precs if c[p]) if n else ""
            parts.append(f'<tr><td><span class="cls cls-{_class_css(cls)}">{e(cls)}</span></td>'
                         f'<td class="num">{e(fmt_count(n))}</td>'
                         + "".join(f'<td class="num">{e(fmt_count(c[p]))}</td>' for p in precs)
                         + f'<td class="barcell"><div class="bar">{bar}</div></td></tr>')
        parts.append("</tbody></table></section>")

        # full op table
        ops = self.ops
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
                prec = _clean(op.get("precision") or "n/a")
                cls = _clean(op.get("class") or "unknown")
                rows.append(
                    f'<tr class="{_prec_css(prec)}"><td class="num">{i}</td>'
                    f'<td class="name">{e(op.get("name"))}</td>'
                    f'<td>{e(op.get("op_type"))}</td><td>{e(op.get("canonical"))}</td>'
                    f'<td><span class="cls cls-{_class_css(cls)}">{e(cls)}</span></td>'
                    f'<td><span class="prec {_prec_css(prec)}">{e(prec)}</span></td>'
                    f'<td class="reason">{e(op.get("reason"))}</td>'
                    + _num_td(op.get("flops"), fmt_flops)
                    + _num_td(op.get("bytes"), fmt_bytes)
                    + _num_td(op.get("predicted_time_fp32_s"), fmt_time)
                    + _num_td(op.get("predicted_time_fp16_s"), fmt_time)
                    + _num_td(op.get("casts"), fmt_count)
                    + "</tr>")
            parts.append("\n".join(rows))
            parts.append("</tbody></table>")
        else:
            parts.append('<p class="none">No ops.</p>')
        parts.append("</section>")

        # casts
        casts = self.casts
        parts.append(f'<section><h2>Casts <span class="count">({len(casts):,}, '
                     f'{e(fmt_bytes(self._total("cast_bytes")))})</span></h2>')
        if casts:
            parts.append('<table class="sortable"><thead><tr>'
                         + "".join(f'<th data-type="{t}" title="sort">{e(h)}</th>' for h, t in (
                             ("name", "str"), ("tensor", "str"), ("from", "str"), ("to", "str"),
                             ("bytes", "num"), ("reason", "str")))
                         + "</tr></thead><tbody>")
            parts.append("\n".join(
                f'<tr><td class="name">{e(c.get("name"))}</td><td class="name">{e(c.get("tensor"))}</td>'
                f'<td><span class="prec {_prec_css(_clean(c.get("from")))}">{e(c.get("from"))}</span></td>'
                f'<td><span class="prec {_prec_css(_clean(c.get("to")))}">{e(c.get("to"))}</span></td>'
                + _num_td(c.get("bytes"), fmt_bytes)
                + f'<td class="reason">{e(c.get("reason"))}</td></tr>' for c in casts))
            parts.append("</tbody></table>")
        else:
            parts.append('<p class="none">No casts.</p>')
        parts.append("</section>")

        # passes
        passes = self.passes
        parts.append(f'<section><h2>Passes <span class="count">({len(passes):,})</span></h2>')
        if passes:
            parts.append('<table class="sortable"><thead><tr>'
                         + "".join(f'<th data-type="{t}" title="sort">{e(h)}</th>' for h, t in (
                             ("#", "num"), ("pass", "str"), ("time", "num"), ("changed", "str"),
                             ("details", "str")))
                         + "</tr></thead><tbody>")
            parts.append("\n".join(
                f'<tr><td class="num">{i}</td><td>{e(p.get("name"))}</td>'
                + _num_td(p.get("time_s"), fmt_time)
                + f'<td>{e(_fmt_bool(p.get("changed")))}</td>'
                f'<td class="reason">{e(p.get("details"))}</td></tr>' for i, p in enumerate(passes)))
            tot = sum(v for v in (_num(p.get("time_s")) for p in passes) if v is not None)
            parts.append(f'</tbody><tfoot><tr><td></td><td>total</td><td class="num">'
                         f'{e(fmt_time(tot))}</td><td></td><td></td></tr></tfoot></table>')
        else:
            parts.append('<p class="none">No passes recorded.</p>')
        parts.append("</section>")

        # alignment (optional)
        if "alignment" in self.data:
            align = self.alignment
            parts.append(f'<section><h2>Tensor-core alignment <span class="count">'
                         f'({e(_plural(len(align), "warning"))})</span></h2>')
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
                                 + _num_td(o.get("max_abs_error"), fmt_sci)
                                 + _num_td(o.get("max_rel_error"), fmt_sci)
                                 + f'<td class="{ {True: "ok", False: "bad"}.get(ok, "")}">'
                                 f'{e(_fmt_bool(ok, "ok", "FAIL"))}</td></tr>')
                parts.append("</tbody></table>")
            else:
                parts.append('<p class="none">No outputs compared.</p>')
            parts.append("</section>")

        parts.append("</main>")
        parts.append(f"<script>{_JS}</script>")
        parts.append("</body></html>\n")
        return "\n".join(parts)

    # ---- saving -------------------------------------------------------------------
    def render(self, fmt: str) -> str:
        """Render as ``"json"``, ``"html"`` or ``"text"`` (the full, untruncated text)."""
        if fmt == "json":
            return self.to_json() + "\n"
        if fmt == "html":
            return self.to_html()
        if fmt == "text":
            return self.to_text(max_rows=None)
        raise ValueError(f"unknown report format {fmt!r}; use 'json', 'html' or 'text'")

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the report; the format follows the suffix (.json, .html/.htm, .txt).

        The file is written to a temporary file in the same folder and moved into
        place with :func:`os.replace`, so readers never see a half-written report.
        A ``.txt`` file holds the full text report (no row limit).
        """
        path = Path(path)
        suffix = path.suffix.lower()
        if suffix not in SAVE_FORMATS:
            shown = repr(path.suffix) if path.suffix else "'' (no suffix)"
            raise ValueError(f"cannot save report as {shown} ({path}): "
                             f"accepted suffixes are {', '.join(SAVE_FORMATS)}")
        content = self.render(SAVE_FORMATS[suffix]).encode("utf-8")
        _atomic_write(path, content)
        return path


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------

def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def _ratio(a: Any, b: Any) -> float | None:
    x, y = _num(a), _num(b)
    if x is None or y is None or y == 0:
        return None
    return x / y


def _short_dtype(d: Any) -> str:
    return _PRECISION_LABEL.get(_clean(d), _clean(d) or "?")


def _esc(x: Any) -> str:
    if x is None:
        return ""
    return html.escape(str(x), quote=True)


def _prec_css(p: str) -> str:
    return {"float16": "p-fp16", "bfloat16": "p-bf16", "float32": "p-fp32",
            "n/a": "p-na"}.get(p, "p-other")


def _class_css(c: str) -> str:
    return c if c in CLASS_ORDER else "other"


def _num_td(x: Any, fmt: Callable[[Any], str]) -> str:
    v = _num(x)
    key = "" if v is None else ("Infinity" if v == math.inf else
                                "-Infinity" if v == -math.inf else repr(v))
    return f'<td class="num" data-sort="{_esc(key)}">{_esc(fmt(x))}</td>'


def _atomic_write(path: Path, content: bytes) -> None:
    folder = path.parent
    # os.open with mode 0o666 lets the umask apply, like a plain open(); mkstemp would give 0o600.
    for _ in range(100):
        tmp = folder / f".{path.name}.{secrets.token_hex(6)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0),
                         0o666)
        except FileExistsError:
            continue
        break
    else:  # pragma: no cover - 100 collisions of 48 random bits
        raise FileExistsError(f"could not create a temporary file next to {path}")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


_CSS = """
:root{--fg:#1d232b;--muted:#5d6875;--bg:#f6f7f9;--card:#fff;--line:#dde1e6;
--fp16:#1a7f37;--fp16bg:#dcf5e3;--bf16:#0b6e8a;--bf16bg:#d7eff6;--fp32:#b35900;--fp32bg:#ffe9d1;
--na:#6e7781;--nabg:#eceff2;--bad:#b42318;--badbg:#fde4e1}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);background:var(--bg)}
header{padding:18px 24px 8px}h1{font-size:20px;margin:0 0 4px;word-break:break-all}
.meta{color:var(--muted);margin:0}main{padding:0 24px 32px}
h2{font-size:16px;margin:24px 0 8px}.count{color:var(--muted);font-weight:normal}
.cards{display:flex;flex-wrap:wrap;gap:12px;margin-top:12px}
.card{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:10px 14px;min-width:170px}
.card .label{color:var(--muted);font-size:12px;text-transform:uppercase;letter-spacing:.04em}
.card .value{font-size:22px;font-weight:600}.card .sub{color:var(--muted);font-size:12px}
.card.ok{border-color:var(--fp16)}.card.bad{border-color:var(--bad);background:var(--badbg)}
table{border-collapse:collapse;background:var(--card);border:1px solid var(--line);width:100%}
th,td{padding:4px 8px;border-bottom:1px solid var(--line);text-align:left;vertical-align:top}
th{background:#eef1f4;position:sticky;top:0;white-space:nowrap}
table.sortable th{cursor:pointer}th.asc::after{content:" \\25B2"}th.desc::after{content:" \\25BC"}
td.num{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
td.name{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px;word-break:break-all}
td.reason{color:#333;min-width:18em}
table.classes{width:auto}td.barcell{min-width:220px}
.bar{display:flex;height:12px;background:var(--nabg);border-radius:3px;overflow:hidden}
.seg.p-fp16{background:var(--fp16)}.seg.p-bf16{background:var(--bf16)}.seg.p-fp32{background:var(--fp32)}
.seg.p-na,.seg.p-other{background:#aab2bb}
.prec,.cls{display:inline-block;padding:0 6px;border-radius:10px;font-size:12px;white-space:nowrap}
.prec.p-fp16{color:var(--fp16);background:var(--fp16bg)}.prec.p-bf16{color:var(--bf16);background:var(--bf16bg)}
.prec.p-fp32{color:var(--fp32);background:var(--fp32bg);font-weight:600}
.prec.p-na,.prec.p-other{color:var(--na);background:var(--nabg)}
.cls{border:1px solid var(--line)}.cls-deny{border-color:var(--fp32)}.cls-unknown{border-color:var(--bad);color:var(--bad)}
tr.p-fp32 td{background:#fff8f0}
.ok{color:var(--fp16)}.bad{color:var(--bad);font-weight:600}.status{font-size:14px}
.warn{background:var(--badbg);border:1px solid var(--bad);border-radius:6px;padding:6px 10px}
.none{color:var(--muted)}.tools{margin:4px 0 8px}#op-filter{width:28em;max-width:100%;padding:4px 8px}
#op-shown{color:var(--muted)}
"""

# Only structure, never report data, goes into the script (data lives in escaped HTML).
_JS = """
(function(){
function key(td,type){if(!td)return type==="num"?-Infinity:"";
 if(type==="num"){var s=td.getAttribute("data-sort");var v=s===null?parseFloat(td.textContent):parseFloat(s);
  return isNaN(v)?-Infinity:v;}return td.textContent.toLowerCase();}
document.querySelectorAll("table.sortable").forEach(function(t){
 var ths=t.tHead.rows[0].cells;
 Array.prototype.forEach.call(ths,function(th,i){th.addEventListener("click",function(){
  var asc=!th.classList.contains("asc");
  Array.prototype.forEach.call(ths,function(h){h.classList.remove("asc","desc");});
  th.classList.add(asc?"asc":"desc");var type=th.getAttribute("data-type");var body=t.tBodies[0];
  var rows=Array.prototype.map.call(body.rows,function(r,j){return [key(r.cells[i],type),j,r];});
  rows.sort(function(a,b){return a[0]<b[0]?(asc?-1:1):a[0]>b[0]?(asc?1:-1):a[1]-b[1];});
  var f=document.createDocumentFragment();rows.forEach(function(x){f.appendChild(x[2]);});body.appendChild(f);
 });});});
var inp=document.getElementById("op-filter"),ops=document.getElementById("ops"),
 shown=document.getElementById("op-shown");
if(inp&&ops){inp.hidden=false;var timer=null;
 function apply(){var terms=inp.value.toLowerCase().split(/\\s+/).filter(Boolean),n=0,rows=ops.tBodies[0].rows;
  for(var i=0;i<rows.length;i++){var txt=rows[i].textContent.toLowerCase(),ok=true;
   for(var k=0;k<terms.length;k++){if(txt.indexOf(terms[k])<0){ok=false;break;}}
   rows[i].style.display=ok?"":"none";if(ok)n++;}
  shown.textContent=terms.length?(n+" of "+rows.length+" ops shown"):"";}
 inp.addEventListener("input",function(){clearTimeout(timer);timer=setTimeout(apply,120);});}
})();
"""
