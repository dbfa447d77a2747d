"""The text report's table engine: display widths, truncation, columns fitted into 120 columns.

docs/architecture.md, "Report".
"""

from __future__ import annotations

import functools
import re
import unicodedata
from typing import Any, Sequence

from .formatting import clean

TEXT_WIDTH = 120
INDENT = "  "
_GAP = "  "
_ELLIPSIS = "…"
_MORE_HINT = "see --report report.json"


_NON_ASCII = re.compile(r"[^\x00-\x7f]")


@functools.lru_cache(maxsize=None)
def _char_width(c: str) -> int:
    if unicodedata.combining(c):
        return 0
    return 2 if unicodedata.east_asian_width(c) in ("W", "F") else 1


def display_width(s: str) -> int:
    """Terminal columns of ``s``: one per ASCII character, the others looked up (once per character)."""
    if s.isascii():
        return len(s)
    return len(s) + sum(_char_width(c) - 1 for c in _NON_ASCII.findall(s))


def _take(s: str, w: int) -> str:
    """Longest prefix of ``s`` with display width <= w."""
    if s.isascii() or all(_char_width(c) == 1 for c in _NON_ASCII.findall(s)):
        return s[:max(w, 0)]  # one column per character (a "µs" or "…" among ASCII)
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
    if display_width(s) <= w:
        return s
    if w <= 0:
        return ""
    return _take(s, w - 1) + _ELLIPSIS


def trunc_middle(s: str, w: int) -> str:
    """Cut ``s`` to display width ``w`` keeping both ends (op names: the tail says most)."""
    if display_width(s) <= w:
        return s
    if w <= 0:
        return ""
    if w < 8:
        return trunc_end(s, w)
    head = (w - 1) // 3
    tail = w - 1 - head
    return _take(s, head) + _ELLIPSIS + _take_tail(s, tail)


def _pad(s: str, w: int, align: str) -> str:
    fill = " " * max(0, w - display_width(s))
    return fill + s if align == "r" else s + fill


class Col:
    __slots__ = ("header", "align", "trunc", "min_width")

    def __init__(self, header: str, align: str = "l", trunc: str | None = None,
                 min_width: int = 8) -> None:
        self.header = header
        self.align = align          # "l" or "r"
        self.trunc = trunc          # None (never cut), "end" or "middle"
        self.min_width = min_width


def table(cols: Sequence[Col], rows: Sequence[Sequence[str]],
           width: int = TEXT_WIDTH, indent: str = INDENT) -> list[str]:
    """Lay out ``rows`` under ``cols``; columns fit their content, the whole fits ``width``.

    When the table is too wide the truncatable columns shrink, widest first, but
    not below their minimum width (or their header).
    """
    if not rows:        # everything cut by max_rows: the "… N more" line says it all
        return []
    rows = [[clean(c) for c in r] for r in rows]
    widths = [max([display_width(c.header)] + [display_width(r[i]) for r in rows]) for i, c in enumerate(cols)]
    fixed = len(indent) + len(_GAP) * (len(cols) - 1)
    excess = fixed + sum(widths) - width
    while excess > 0:
        shrinkable = [i for i, c in enumerate(cols)
                      if c.trunc and widths[i] > max(c.min_width, display_width(c.header))]
        if not shrinkable:
            break
        i = max(shrinkable, key=lambda k: widths[k])
        others = [widths[k] for k in shrinkable if k != i]
        floor = max(cols[i].min_width, display_width(cols[i].header))
        target = max(floor, widths[i] - excess, (max(others) if others else 0))
        if target >= widths[i]:      # tie with another column: shave one
            target = widths[i] - 1
        excess -= widths[i] - target
        widths[i] = target

    def line(cells: Sequence[str]) -> str:
        out = []
        for i, (c, cell) in enumerate(zip(cols, cells)):
            w = widths[i]
            if display_width(cell) > w:
                cell = trunc_middle(cell, w) if c.trunc == "middle" else trunc_end(cell, w)
            out.append(_pad(cell, w, c.align))
        return trunc_end((indent + _GAP.join(out)).rstrip(), width)

    lines = [line([c.header for c in cols]),
             trunc_end(indent + _GAP.join("─" * w for w in widths), width)]
    lines.extend(line(r) for r in rows)
    return lines


def cut(items: Sequence[Any], max_rows: int | None) -> tuple[Sequence[Any], int]:
    if max_rows is None or len(items) <= max_rows:
        return items, 0
    return items[:max_rows], len(items) - max_rows


def more_line(n: int) -> str:
    return f"{INDENT}{_ELLIPSIS} {n:,} more ({_MORE_HINT})"


def heading(title: str, width: int = TEXT_WIDTH) -> list[str]:
    title = trunc_end(clean(title), width)
    return ["", title, "═" * min(width, display_width(title))]

