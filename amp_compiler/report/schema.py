"""Report schema 1.0: its version, the canonical key order, the class and precision orders, JSON encoding.

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

The summary is ``plan_report.build_report``'s (the one derivation); renderers show
what it holds and never recompute it. docs/architecture.md, "Report".
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

SCHEMA_VERSION = "1.1"  # 1.1: ops inputs/outputs, casts output, tensors, memory (docs/report-schema.md)

#: Op classes in the order the report lists them (docs/architecture.md, "The op registry").
CLASS_ORDER = ("allow", "infer", "clear", "deny", "unknown")
#: Precisions in the order the report lists them.
PRECISION_ORDER = ("float16", "bfloat16", "float32", "n/a")
PRECISION_LABEL = {"float16": "FP16", "bfloat16": "BF16", "float32": "FP32", "n/a": "n/a"}

#: Accepted ``save`` suffixes and the format each one selects.
SAVE_FORMATS = {".json": "json", ".html": "html", ".htm": "html", ".txt": "text"}

# Canonical key order for the records of the schema; unknown keys follow, sorted.
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
_VALIDATION_KEYS = ("tolerance", "passed", "outputs", "overflows")
_VOUT_KEYS = ("name", "max_abs_error", "max_rel_error", "passed")


def _ordered(d: Mapping[str, Any], keys: Sequence[str], orders: dict[tuple, tuple] | None = None) -> dict[str, Any]:
    """``d`` with ``keys`` first (in that order), then the remaining keys sorted. ``orders`` caches
    the order per key tuple of ``d`` (the rows of one list share a few)."""
    present = tuple(d)
    order = orders.get(present) if orders is not None else None
    if order is None:
        order = tuple(k for k in keys if k in d)
        order += tuple(sorted((k for k in d if k not in order), key=str))
        if orders is not None and all(type(k) is str for k in present):
            orders[present] = order
    return dict(d) if order == present else {k: d[k] for k in order}


def _ordered_list(items: Any, keys: Sequence[str]) -> Any:
    if not isinstance(items, list):
        return items
    orders: dict[tuple, tuple] = {}
    return [_ordered(x, keys, orders) if isinstance(x, Mapping) else x for x in items]


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



def canonical(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` in canonical key order (schema_version first), top level and every record."""
    d = dict(data)
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


def to_json(data: Mapping[str, Any], indent: int | None = 2) -> str:
    """JSON text of ``data`` in canonical key order. With ``indent``, the top level and the small
    records are indented and each record of a list of them (``ops``, ``casts``, ``tensors``, ...)
    is one line: one op per line reads, greps and diffs as well, and json's C encoder writes it,
    where its indenting encoder is pure Python (a 112k-op report: 87 MB in 6 s, against 68 MB in
    a third of that)."""
    doc = canonical(data)
    if indent is None:
        return json.dumps(doc, ensure_ascii=False, default=_json_default)
    one_line = json.JSONEncoder(ensure_ascii=False, default=_json_default).encode
    pad = " " * indent
    fields = []
    for key, value in doc.items():
        if isinstance(value, list) and value and all(isinstance(x, Mapping) for x in value):
            text = "[\n" + pad * 2 + f",\n{pad * 2}".join(map(one_line, value)) + "\n" + pad + "]"
        else:  # an encoded string holds no raw newline: every one is indentation
            text = json.dumps(value, indent=indent, ensure_ascii=False,
                              default=_json_default).replace("\n", "\n" + pad)
        fields.append(f"{pad}{one_line(key)}: {text}")
    return "{\n" + ",\n".join(fields) + "\n}" if fields else "{}"
