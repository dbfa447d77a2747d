"""Check the names a user's rules give against the model: a rule that matches nothing does nothing.

``--deny Softmx``, ``--force-op Gelux``, ``--deny-node`` with a name from another export and an
``--exclude-nodes`` pattern written for ``re.search`` (it is matched at the start of the name, as
AutoCast's ``re.match``) had each converted as if not given, with no word said. Here, after the
import (``onnx_api.convert_onnx``):

* a node name or pattern matching no node is an error naming the option, the value and the
  closest node names;
* an op type no node of the model has is an error when neither ONNX nor the registry knows it
  (a typo: the closest names in the model are offered, else the closest ONNX or registry
  names), else a warning that the option changes nothing in this model (one command line is
  often reused across models).

docs/architecture.md, "Input handling".
"""

from __future__ import annotations

import difflib
import re
import warnings
from typing import Iterable

import onnx

from .errors import ConversionError
from .ir import PrecisionGraph
from .registry import Registry

__all__ = ["RuleNameError", "check_rule_names"]


class RuleNameError(ConversionError):
    """A rule value (op type, node name, pattern) that names nothing in the model."""


def check_rule_names(graph: PrecisionGraph, source: str, registry: Registry, *, op_types: dict[str, Iterable[str]],
                     node_names: Iterable[str] = (), patterns: dict[str, Iterable[str]] | None = None,
                     stacklevel: int = 4) -> None:
    """Raise ``RuleNameError`` (or warn) for rule values that match nothing in ``graph``.
    ``op_types``: ``{"--deny": names, ...}``; ``node_names``: exact ``--deny-node`` names;
    ``patterns``: ``{"--exclude-nodes": regexes, ...}``; ``stacklevel``: the warning's, from here
    (4: the caller of ``convert_onnx``, through ``gc_paused``)."""
    ops = [op for op in graph.ops.values() if not op.inserted]
    node_names = list(node_names)
    rules = [(option, pattern) for option, values in (patterns or {}).items() for pattern in values]
    if node_names or rules:  # the model's names and types are gathered only for options that name some
        _check_node_names([op.name for op in ops], source, node_names, rules)
    requested = [(option, op_type) for option, values in op_types.items() for op_type in values]
    if not requested:
        return
    types = {n for op in ops for n in (op.op_type, op.canonical, f"{op.domain}::{op.op_type}" if op.domain else "") if n}
    for option, op_type in requested:
        if op_type in types:
            continue
        if not _known(op_type, registry):
            near = _closest(op_type, sorted(types)) or _closest(op_type, _known_types(registry))
            raise RuleNameError(source, f"{option} {op_type}", f"no op type {op_type!r} in ONNX or the "
                                                                 f"registry{near}")
        warnings.warn(f"{source}: {option} {op_type}: the model has no {op_type} op; the option changes nothing",
                      stacklevel=stacklevel)


def _check_node_names(names: list[str], source: str, node_names: list[str], rules: list[tuple[str, str]]) -> None:
    """``check_rule_names`` for exact ``--deny-node`` names and (option, pattern) ``rules``."""
    present = set(names)
    for name in node_names:
        if name not in present:
            raise RuleNameError(source, f"--deny-node {name}", f"no node is named {name!r}{_closest(name, names)}")
    for option, pattern in rules:
        if not any(re.match(pattern, n) for n in names):
            raise RuleNameError(source, f"{option} {pattern!r}",
                                  f"matches no node name (a pattern matches the start of the name, as "
                                  f"re.match does; prefix '.*' to match inside it){_closest(pattern, names)}")


def _known(op_type: str, registry: Registry) -> bool:
    """Whether ``op_type`` names an ONNX op, a registry op (ONNX column, ``domain::op``) or a canonical op."""
    if op_type in registry.by_canonical:
        return True
    domain, _, name = op_type.rpartition("::")
    if registry.lookup_onnx(domain, name) is not None:
        return True
    return not domain and onnx.defs.has(name)


def _known_types(registry: Registry) -> list[str]:
    """Every ONNX op type and registry op, for a typo of an op the model does not hold."""
    onnx_types = {schema.name for schema in onnx.defs.get_all_schemas() if schema.domain in ("", "ai.onnx")}
    registry_types = {f"{d}::{t}" if d else t for d, t in registry.by_onnx} | set(registry.by_canonical)
    return sorted(onnx_types | registry_types)


def _closest(value: str, candidates: list[str]) -> str:
    """``"; closest: 'a', 'b'"`` for up to three near candidates, else ``""``."""
    near = difflib.get_close_matches(value, candidates, n=3, cutoff=0.6)
    return f"; closest: {', '.join(repr(n) for n in near)}" if near else ""
