"""Port roles of ONNX ops, derived from the ``onnx.defs`` schemas of the model's opset.

For each op the schema names type parameters (``T``, ``T1``, ...) and the dtypes each
may take. From that we derive, per port, which *group* it belongs to (ports bound to
one type parameter must agree) and whether the group can be FP32 and the low dtype.
The classify pass turns groups into roles (``unit`` / ``fixed`` / ``any`` / ``other``).
"""

from __future__ import annotations

from functools import lru_cache

import onnx.defs

from ..ir import PortGroup
from .ort_onnx_ops import schema as ort_schema

_ONNX_NAMES = {"float32": "tensor(float)", "float16": "tensor(float16)", "bfloat16": "tensor(bfloat16)"}


@lru_cache(maxsize=None)
def port_groups(op_type: str, domain: str, opset: int, n_inputs: int, n_outputs: int) -> tuple[PortGroup, ...] | None:
    """Port groups of ``op_type`` at ``opset`` for a node with that many inputs/outputs; None if no schema."""
    try:
        schema = onnx.defs.get_schema(op_type, opset, domain)
    except Exception:  # onnx raises SchemaError; no schema means the registry decides alone
        schema = ort_schema(op_type, opset) if domain == "" else None  # ONNX Runtime's LayerNorm below 17
        if schema is None:
            return None
    params = {tc.type_param_str: frozenset(tc.allowed_type_strs) for tc in schema.type_constraints}
    # A type parameter of sequence/optional values next to other type parameters (SequenceConstruct,
    # OptionalGetElement, ...): dtypes flow between parameters through values the IR does not track,
    # so every port keeps its source dtype. (Identity's one parameter is an ordinary unit group.)
    containers = {p for p, allowed in params.items() if any(t.startswith(("seq(", "optional(")) for t in allowed)}
    through_container = bool(containers) and len(params) > 1

    def allowed_of(type_str: str) -> tuple[str, frozenset[str]]:
        allowed = params.get(type_str, frozenset({type_str}))
        floats = frozenset(k for k, v in _ONNX_NAMES.items() if v in allowed)
        return type_str, floats

    members: dict[str, tuple[list[int], list[int], frozenset[str]]] = {}

    def bind(formals, count: int, is_input: bool) -> None:
        for idx in range(count):
            formal = formals[min(idx, len(formals) - 1)] if formals else None
            if formal is None:
                break
            if idx >= len(formals) and formal.option != onnx.defs.OpSchema.FormalParameterOption.Variadic:
                break
            key, floats = allowed_of(formal.type_str)
            if key not in params or not formal.is_homogeneous:
                # a fixed-type port, or one slot of a heterogeneous variadic: its own group
                key = f"{key}:{'in' if is_input else 'out'}{idx}"
            ins, outs, _ = members.setdefault(key, ([], [], floats))
            (ins if is_input else outs).append(idx)

    bind(schema.inputs, n_inputs, True)
    bind(schema.outputs, n_outputs, False)
    output_params = {formal.type_str for formal in schema.outputs if formal.type_str in params}
    return tuple(PortGroup(f"{k}@v{schema.since_version}", tuple(i), tuple(o), f,
                           fixed_type=through_container or k.partition(":")[0] not in params,
                           binds_output=k in output_params,
                           later_opsets=_later_opsets(op_type, domain, schema.since_version, k, f))
                 for k, (i, o, f) in members.items())


def _later_opsets(op_type: str, domain: str, since: int, param: str, allowed: frozenset[str]) -> tuple:
    if "float32" not in allowed:
        return ()
    found = ((dtype, first_opset_accepting(op_type, domain, since, param, dtype))
             for dtype in ("float16", "bfloat16") if dtype not in allowed)
    return tuple((dtype, opset) for dtype, opset in found if opset)


@lru_cache(maxsize=None)
def first_opset_accepting(op_type: str, domain: str, since: int, param: str, dtype: str) -> int | None:
    """The first opset after the schema version ``since`` whose ``op_type`` lets type parameter
    ``param`` take ``dtype`` (Conv takes bfloat16 from opset 22), or None."""
    wanted = _ONNX_NAMES.get(dtype)
    for schema in sorted(_history(op_type, domain), key=lambda s: s.since_version):
        if schema.since_version > since and any(
                tc.type_param_str == param and wanted in tc.allowed_type_strs for tc in schema.type_constraints):
            return schema.since_version
    return None


@lru_cache(maxsize=None)
def _history(op_type: str, domain: str) -> tuple:
    return tuple(s for s in onnx.defs.get_all_schemas_with_history() if s.name == op_type and s.domain == domain)
