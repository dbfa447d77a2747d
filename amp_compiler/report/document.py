"""The ``Report`` object: a schema-1.0 report dict, its sections, and its renderings and saving.

``Report(data)`` wraps the dict ``plan_report.build_report`` makes; ``to_text``,
``to_html`` and ``to_json`` render it (modules ``text``, ``html_page``, ``schema``);
``save`` writes by suffix through the one atomic writer. docs/architecture.md, "Report".
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from collections.abc import Mapping, Sequence
from typing import Any, Callable

from ..atomic import Staging, atomic_write
from .formatting import clean, fmt_count
from .html_page import render_html
from .schema import CLASS_ORDER, PRECISION_ORDER, SAVE_FORMATS, SCHEMA_VERSION, canonical, to_json
from .text import render_text


class Report:
    """A per-op precision report (schema 1.0) and its renderings.

    ``Report(data)`` wraps the dict without copying it; the properties return
    views into it (missing sections come back empty). ``html_sections`` holds extra
    ``(title, html)`` sections the HTML page shows after the standard ones.

    ``details``, where given (``plan_report.build_report``), fills in what only the full
    report shows, the ops' per-op cost columns: it runs on the first read of ``data`` or
    ``ops``, so a run that prints the terminal summary and annotates the model (which read
    ``decisions``, ``summary`` and ``casts``) never computes them (docs/architecture.md, "Report").
    """

    def __init__(self, data: Mapping[str, Any], details: Callable[[Mapping[str, Any]], None] | None = None) -> None:
        if not isinstance(data, Mapping):
            raise TypeError(f"Report expects a dict, got {type(data).__name__}")
        version = data.get("schema_version")
        if version is not None and str(version).split(".")[0] != SCHEMA_VERSION.split(".")[0]:
            raise ValueError(f"unsupported report schema_version {version!r}; "
                             f"this amp-compiler reads {SCHEMA_VERSION}")
        self._data: Mapping[str, Any] = data
        self._details = details
        self.html_sections: list[tuple[str, str]] = []

    @property
    def data(self) -> Mapping[str, Any]:
        """The report dict, complete: the deferred ``details`` are filled in on first access."""
        if self._details is not None:
            details, self._details = self._details, None
            details(self._data)
        return self._data

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
    def _section(self, key: str) -> list[dict]:  # sections ``details`` never changes: no need to fill it in
        v = self._data.get(key)
        return v if isinstance(v, list) else []

    def has(self, key: str) -> bool:
        """Whether the report holds the top-level section ``key`` (``"alignment"``, ``"validation"``, ...)."""
        return key in self._data

    @property
    def summary(self) -> dict:
        v = self._data.get("summary")
        return v if isinstance(v, dict) else {}

    @property
    def ops(self) -> list[dict]:
        """The op rows, complete (their per-op costs included)."""
        v = self.data.get("ops")
        return v if isinstance(v, list) else []

    @property
    def decisions(self) -> list[dict]:
        """The op rows as far as the plan's decisions go: ``name``, ``op_type``, ``canonical``, ``class``,
        ``precision``, ``reason``, ``scope``, ``inputs``, ``outputs``; their per-op costs (``flops``,
        ``bytes``, ``predicted_time_*``, ``casts``) may be missing until ``ops`` or ``data`` is read.
        What the terminal text and the model's annotations read."""
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
        v = self._data.get("validation")
        return v if isinstance(v, dict) else None

    @property
    def source(self) -> str:
        return clean(self._data.get("source") or "")

    @property
    def fp32_ops(self) -> list[dict]:
        """The ops kept in FP32 -- what users read first."""
        return [op for op in self.decisions if op.get("precision") == "float32"]

    def class_counts(self) -> dict[str, Counter]:
        """``{class: Counter(precision -> n)}`` in report order (allow, infer, clear, deny, unknown, others)."""
        counts: dict[str, Counter] = {c: Counter() for c in CLASS_ORDER}
        extra: dict[str, Counter] = {}
        pairs = Counter((op.get("class"), op.get("precision")) for op in self.decisions)  # a few distinct
        for (cls, precision), n in pairs.items():
            cls = clean(cls or "unknown")
            target = counts[cls] if cls in counts else extra.setdefault(cls, Counter())
            target[clean(precision or "n/a")] += n
        for cls in sorted(extra):
            counts[cls] = extra[cls]
        return counts

    def precisions(self, counts: Mapping[str, Counter]) -> list[str]:
        """The precisions ``counts`` holds, in report order."""
        seen = set()
        for c in counts.values():
            seen.update(c)
        return [p for p in PRECISION_ORDER if p in seen] + sorted(seen - set(PRECISION_ORDER))

    def title(self) -> str:
        tool = self._data.get("tool") if isinstance(self._data.get("tool"), Mapping) else {}
        name = clean(tool.get("name") or "amp-compiler")
        version = clean(tool.get("version") or "")
        title = f"{name} {version}".strip() + " — per-op precision report"
        return title + (f": {self.source}" if self.source else "")

    # ---- renderings ---------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The data in canonical key order (schema_version first)."""
        return canonical(self.data)

    def to_json(self, indent: int | None = 2) -> str:
        """JSON text; keys in a fixed order with ``schema_version`` first."""
        return to_json(self.data, indent)

    def to_text(self, max_rows: int | None = 60) -> str:
        """Terminal report, at most ~120 columns; long tables are cut at ``max_rows`` rows."""
        return render_text(self, max_rows)

    def to_html(self, sections: Sequence[tuple[str, str]] = ()) -> str:
        """One self-contained HTML page; ``sections`` are shown after ``html_sections``."""
        return render_html(self, [*self.html_sections, *sections])

    def __str__(self) -> str:
        return self.to_text()

    def __repr__(self) -> str:
        s = self.summary
        return (f"<Report {self.source or '?'}: {fmt_count(s.get('nodes'))} ops, "
                f"{fmt_count(s.get('fp16_nodes'))} reduced precision, "
                f"{fmt_count(s.get('fp32_nodes'))} FP32>")

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


    def save(self, path: str | os.PathLike[str], *, staging: Staging | None = None) -> Path:
        """Write the report; the format follows the suffix (.json, .html/.htm, .txt).

        Written atomically (``atomic.atomic_write``): readers never see a half-written
        report. With ``staging`` it is only staged, for the caller to publish. A ``.txt``
        file holds the full text report (no row limit).
        """
        path = Path(path)
        suffix = path.suffix.lower()
        if suffix not in SAVE_FORMATS:
            shown = repr(path.suffix) if path.suffix else "'' (no suffix)"
            raise ValueError(f"cannot save report as {shown} ({path}): "
                             f"accepted suffixes are {', '.join(SAVE_FORMATS)}")
        content = self.render(SAVE_FORMATS[suffix]).encode("utf-8")
        if staging is not None:
            staging.write_bytes(path, content)
        else:
            atomic_write(path, content)
        return path
