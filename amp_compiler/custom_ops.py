"""Custom-op tables: ops of a plugin library (TensorRT plugins, ORT custom-op domains) classified
from a user's JSON table instead of as "unknown" (``--custom-ops``, ``docs/migrating.md``).

Light on purpose (json and the registry only): the CLI checks the table before it imports
onnx or numpy, so a malformed table is refused at once with one line.
"""

from __future__ import annotations

import json

from .registry import CLASSES, DEFAULT_REGISTRY, INFER, UNKNOWN, OpDef, Registry

_OP_KEYS = {"op_type", "domain", "class", "tensor_core", "fp32_inputs", "fp32_outputs", "note"}


def load_custom_ops(path: str) -> list[OpDef]:
    """Rows of a custom-op table (JSON); ``ValueError`` says ``<file>: <where>: <reason>`` in one line.

    ``{"ops": [{"op_type": "MyGelu", "domain": "my.plugins", "class": "infer",
    "tensor_core": false, "fp32_inputs": [1], "fp32_outputs": []}]}``: ``class`` is one of
    allow/infer/clear/deny; the other keys but ``op_type`` are optional.
    """
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the custom-op table: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON: {exc}") from None
    return custom_ops_from_dict(data, path)


def custom_ops_from_dict(data: object, source: str = "custom ops") -> list[OpDef]:
    if not isinstance(data, dict) or not isinstance(data.get("ops"), list):
        raise ValueError(f"{source}: expected an object with a list \"ops\"")
    rows = []
    for i, entry in enumerate(data["ops"]):
        where = f"{source}: ops[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: expected an object, got {type(entry).__name__}")
        if unknown := sorted(set(entry) - _OP_KEYS):
            raise ValueError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(_OP_KEYS))})")
        op_type, domain, op_class = entry.get("op_type"), entry.get("domain", ""), entry.get("class", INFER)
        if not isinstance(op_type, str) or not op_type or not isinstance(domain, str):
            raise ValueError(f"{where}: \"op_type\" (and \"domain\", if given) must be non-empty strings")
        if op_class not in CLASSES or op_class == UNKNOWN:
            raise ValueError(f"{where}: \"class\" must be one of allow, infer, clear, deny, got {op_class!r}")
        if not isinstance(entry.get("tensor_core", False), bool):
            raise ValueError(f"{where}: \"tensor_core\" must be true or false")
        ports = {}
        for key in ("fp32_inputs", "fp32_outputs"):
            value = entry.get(key, [])
            if not isinstance(value, list) or not all(isinstance(p, int) and not isinstance(p, bool) and p >= 0
                                                      for p in value):
                raise ValueError(f"{where}: \"{key}\" must be a list of port indices")
            ports[key] = tuple(value)
        name = f"{domain}::{op_type}" if domain else op_type
        rows.append(OpDef(f"custom:{name}", op_class, onnx=(name,), tensor_core=entry.get("tensor_core", False),
                          flops="matmul" if entry.get("tensor_core") else "elementwise",
                          note=str(entry.get("note", f"from the custom-op table {source}")), **ports))
    return rows


def custom_registry(rows: list[OpDef], base: Registry = DEFAULT_REGISTRY) -> Registry:
    """``base`` plus ``rows``; a row for an op the base knows replaces it (the user's table wins)."""
    reg = Registry(dict(base.by_canonical), dict(base.by_onnx), dict(base.by_aten))
    for row in rows:
        reg.by_canonical[row.canonical] = row
        domain, _, op = row.onnx[0].rpartition("::")
        reg.by_onnx[(domain, op)] = row
    return reg


__all__ = ["custom_ops_from_dict", "custom_registry", "load_custom_ops"]
