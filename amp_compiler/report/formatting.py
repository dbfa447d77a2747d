"""Number and text formatting for the report: units, percentages, one-line printable text.

Every string that comes from the model is passed through ``clean`` in text (control
characters become spaces, so a model cannot inject terminal escapes). docs/architecture.md, "Report".
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any, Callable

from .schema import PRECISION_LABEL

def is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def num(x: Any) -> float | None:
    """``x`` as a float, or None when it is not a number (bools are not numbers)."""
    if type(x) is float:  # most report values
        return x
    if is_num(x):
        return float(x)
    # numpy scalars and the like, without importing numpy
    item = getattr(x, "item", None)
    if callable(item) and not isinstance(x, (str, bytes)):
        try:
            v = item()
        except Exception:  # noqa: BLE001 - anything odd is "not a number"
            return None
        return float(v) if is_num(v) else None
    return None


def _numeric(nonfinite: Callable[[float], str] = str) -> Callable[[Callable[[float], str]], Callable[[Any], str]]:
    """Wrap a formatter of finite floats: None shows as ``—``, a non-number as itself, inf/nan via ``nonfinite``."""
    def wrap(fmt: Callable[[float], str]) -> Callable[[Any], str]:
        @functools.wraps(fmt)
        def formatted(x: Any) -> str:
            v = num(x)
            if v is None:
                return "—" if x is None else str(x)
            return fmt(v) if math.isfinite(v) else nonfinite(v)
        return formatted
    return wrap


def _time_nonfinite(v: float) -> str:
    return "nan" if math.isnan(v) else ("∞" if v > 0 else "-∞")


@_numeric()
def fmt_count(v: float) -> str:
    return f"{int(round(v)):,}" if v == int(v) else f"{v:,.1f}"


@_numeric()
def fmt_bytes(v: float) -> str:
    """Bytes in binary units: ``512 B``, ``120.6 KiB``, ``3.0 GiB``."""
    sign = "-" if v < 0 else ""
    v = abs(v)
    if v < 1024:
        return f"{sign}{v:.0f} B"
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        v /= 1024.0
        if v < 1024 or unit == "PiB":
            return f"{sign}{v:.1f} {unit}"
    raise AssertionError("unreachable")  # pragma: no cover


@_numeric(_time_nonfinite)
def fmt_time(v: float) -> str:
    """Seconds in a readable unit: ``850 ns``, ``12.1 µs``, ``2.10 ms``, ``1.50 s``."""
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


@_numeric()
def fmt_flops(v: float) -> str:
    """FLOP counts with SI prefixes: ``1.20 GFLOP``."""
    a = abs(v)
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= scale:
            return f"{v / scale:.2f} {prefix}FLOP"
    return f"{v:.0f} FLOP"


@_numeric()
def fmt_pct(fraction: float) -> str:
    return f"{fraction * 100:.1f}%"


def fmt_tensor_core_share(summary: Mapping[str, Any]) -> tuple[str, str]:
    """(share, what of) for the summary's tensor-core line: the low-dtype share of the GEMM/conv
    FLOPs, or that there are none (the summary's fraction is 1.0 then: nothing left FP32)."""
    gemm = summary.get("gemm_flops")
    if gemm == 0:
        return "none", "no GEMM/conv ops"
    return (fmt_pct(summary.get("fp16_gemm_flop_fraction")),
            "of GEMM/conv FLOPs" + (f" ({fmt_flops(gemm)})" if gemm is not None else ""))


@_numeric()
def fmt_speedup(v: float) -> str:
    return f"{v:.2f}×"


@_numeric(lambda v: f"{v:.3g}")
def fmt_sci(v: float) -> str:
    return f"{v:.3g}"


def fmt_bool(x: Any, yes: str = "yes", no: str = "no") -> str:
    if x is True:
        return yes
    if x is False:
        return no
    if x is None:
        return "—"
    return fmt_count(x) if num(x) is not None else str(x)


def clean(s: Any) -> str:
    """One-line, printable text: control characters (newlines, ANSI escapes) become spaces."""
    if s is None:
        return ""
    s = str(s)
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() else " " for c in s)


def plural(n: int, word: str) -> str:
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def ratio(a: Any, b: Any) -> float | None:
    x, y = num(a), num(b)
    if x is None or y is None or y == 0:
        return None
    return x / y


def short_dtype(d: Any) -> str:
    return PRECISION_LABEL.get(clean(d), clean(d) or "?")



def overflow_lines(validation: Mapping) -> list[str]:
    """A line per value validation's overflow check found overflowing (``amp_compiler/overflow.py``),
    and one counting the values an inf reached from them."""
    rows = [r for r in validation.get("overflows") or [] if isinstance(r, Mapping)]
    origins = [r for r in rows if r.get("origin", True)] or rows
    lines = [f"overflow: {clean(r.get('name'))} (written by {clean(r.get('writer'))}) reaches "
             f"{fmt_sci(r.get('fp32_peak'))} in the FP32 run, inf in FP16 (a GPU computes it so; "
             "--calibrate keeps it FP32)" for r in origins]
    if len(rows) > len(origins):
        lines.append(f"overflow: {len(rows) - len(origins)} more values are not finite downstream of them")
    return lines
