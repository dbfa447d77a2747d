"""Compare two plans of one model: which ops changed precision, and the predicted effect.

``amp-compile --compare a.json b.json`` (two saved JSON reports) prints the ops whose
precision differs, each with its predicted time change (its time in B's precision less its
time in A's), the ops only one plan has, and the summary totals side by side. Exit status:
0 the plans agree, 1 they differ, 2 bad input. See docs/architecture.md (Report).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Mapping

from .report import Report, fmt_bytes, fmt_count, fmt_time

_LOW = ("float16", "bfloat16")
#: summary keys compared side by side, with their formats
TOTALS = (("nodes", fmt_count), ("fp16_nodes", fmt_count), ("fp32_nodes", fmt_count), ("casts", fmt_count),
          ("cast_bytes", fmt_bytes), ("predicted_time_mixed_s", fmt_time),
          ("predicted_memory_weights_mixed_bytes", fmt_bytes),
          ("predicted_memory_activations_mixed_bytes", fmt_bytes))
MIN_SHARED = 0.5  # below this share of common op names the two reports are of different models


def load(path: str | Path) -> Report:
    """A saved JSON report; ``ValueError`` naming the file for anything else."""
    try:
        return Report.from_json(Path(path))
    except OSError as exc:
        raise ValueError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not a JSON report ({exc})") from None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from None


def _op_time(op: Mapping[str, Any], precision: Any) -> float:
    key = "predicted_time_fp16_s" if precision in _LOW else "predicted_time_fp32_s"
    value = op.get(key)
    return float(value) if isinstance(value, (int, float)) else 0.0


def compare(a: Report, b: Report, names: tuple[str, str] = ("A", "B")) -> dict[str, Any]:
    """The differences between plan ``a`` and plan ``b`` of the same model, as a dict."""
    ops_a = {op.get("name"): op for op in a.ops}
    ops_b = {op.get("name"): op for op in b.ops}
    shared = ops_a.keys() & ops_b.keys()
    if len(shared) < MIN_SHARED * max(len(ops_a), len(ops_b), 1):
        raise ValueError(f"{names[0]} and {names[1]} are not plans of the same model: only {len(shared)} of "
                         f"{len(ops_a)} / {len(ops_b)} op names in common")
    changed = []
    for name in (n for n in ops_a if n in shared):
        pa, pb = ops_a[name].get("precision"), ops_b[name].get("precision")
        if pa == pb:
            continue
        changed.append({"name": name, "op_type": ops_a[name].get("op_type"), "from": pa, "to": pb,
                        "time_delta_s": _op_time(ops_b[name], pb) - _op_time(ops_a[name], pa),
                        "reason_a": ops_a[name].get("reason"), "reason_b": ops_b[name].get("reason")})
    changed.sort(key=lambda c: -abs(c["time_delta_s"]))
    totals = {key: (a.summary.get(key), b.summary.get(key)) for key, _ in TOTALS}
    return {"a": names[0], "b": names[1], "changed": changed,
            "only_in_a": sorted(n for n in ops_a if n not in shared),
            "only_in_b": sorted(n for n in ops_b if n not in shared),
            "options": {k: (a.summary.get(k), b.summary.get(k)) for k in ("target", "dtype", "planner")
                        if a.summary.get(k) != b.summary.get(k)},
            "totals": totals}


def to_text(diff: Mapping[str, Any], max_rows: int = 40) -> str:
    """A terminal rendering of ``compare``'s result."""
    a, b, changed = diff["a"], diff["b"], diff["changed"]
    lines = [f"plan diff: A = {a}", f"           B = {b}"]
    for key, (va, vb) in diff["options"].items():
        lines.append(f"  {key}: {va} -> {vb}")
    ops_delta = sum(c["time_delta_s"] for c in changed)
    ta, tb = (float(v) if isinstance(v, (int, float)) else None for v in diff["totals"]["predicted_time_mixed_s"])
    effect = f"predicted effect: the ops {_signed(ops_delta)}"
    if ta is not None and tb is not None:
        effect += f", the whole plan {_signed(tb - ta)} (casts {_signed(tb - ta - ops_delta)})"
    lines.append(f"{len(changed)} op(s) changed precision" + (f"; {effect}" if changed else ""))
    for c in changed[:max_rows]:
        lines.append(f"  {c['name']} ({c['op_type']}): {c['from']} -> {c['to']}, {_signed(c['time_delta_s'])}")
        lines.append(f"      B: {c['reason_b']}")
    if len(changed) > max_rows:
        lines.append(f"  ... {len(changed) - max_rows} more")
    for side in ("a", "b"):
        only = diff[f"only_in_{side}"]
        if only:
            lines.append(f"{len(only)} op(s) only in {side.upper()}: {', '.join(only[:5])}"
                         + (" ..." if len(only) > 5 else ""))
    lines.append("totals (A -> B):")
    for key, fmt in TOTALS:
        va, vb = diff["totals"][key]
        if va is not None or vb is not None:
            lines.append(f"  {key}: {fmt(va)} -> {fmt(vb)}")
    return "\n".join(lines) + "\n"


def _signed(seconds: float) -> str:
    return ("+" if seconds >= 0 else "-") + fmt_time(abs(seconds))


def differ(diff: Mapping[str, Any]) -> bool:
    return bool(diff["changed"] or diff["only_in_a"] or diff["only_in_b"])


def main(argv: list[str]) -> int:
    """``amp-compile --compare A.json B.json [--json]``: print the diff; 0 same, 1 different, 2 bad input."""
    p = argparse.ArgumentParser(prog="amp-compile", usage="amp-compile --compare A.json B.json [--json]",
                                description="Compare two saved JSON plans of one model: the ops whose precision "
                                            "differs and the predicted effect. Exit status 0 same plan, 1 "
                                            "different, 2 bad input.")
    p.add_argument("--compare", nargs=2, required=True, metavar=("A.json", "B.json"),
                   help="two reports saved with --report FILE.json")
    p.add_argument("--json", action="store_true", help="print the diff as JSON")
    if "-h" in argv or "--help" in argv:  # before --compare's two arguments are demanded
        p.print_help()
        return 0
    args = p.parse_args(argv)
    try:
        diff = compare(load(args.compare[0]), load(args.compare[1]), tuple(args.compare))
    except ValueError as exc:
        print(f"amp-compile: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(diff, indent=2) if args.json else to_text(diff), end="" if not args.json else "\n")
    return 1 if differ(diff) else 0


__all__ = ["compare", "differ", "load", "main", "to_text"]
