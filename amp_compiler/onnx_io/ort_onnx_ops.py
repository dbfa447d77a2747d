"""ONNX Runtime's own ops in the ONNX domain, which onnx has no schema for at the file's opset.

ONNX Runtime registers ``LayerNormalization`` in the default domain from version 1 (ONNX only has it
from opset 17) and ``SimplifiedLayerNormalization`` (ONNX has none); its transformer optimizer
(``onnxruntime.transformers.optimizer.optimize_model``, Optimum's O1-O4) writes them into opset-12..16
files. onnx's checker refused such a file ("No Op registered for LayerNormalization with
domain_version of 14") though ONNX Runtime loads it. Here:

* ``stand_in_for_inference`` rewrites each such node of the check-and-inference copy
  (``inference.light_copy``) as ``Cast(X, to=<the scale's dtype>) -> Y``: the dtype and shape ONNX
  Runtime's kernel gives its one output, so the values behind it keep their shapes; a node with its
  statistics outputs, or whose scale's dtype the file does not declare, moves to a private domain
  instead (no schema: ``untyped.py`` types its output);
* ``schema`` gives the ONNX schema whose ports bind as the op's do, for port groups
  (``schemas.port_groups``) and untyped outputs: ``LayerNormalization``-17 (X, Scale, B and Y one
  type: stricter than ONNX Runtime's, whose Y follows the scale, so every plan is legal there) and
  ``RMSNormalization``-23 (X; scale and Y) for ``SimplifiedLayerNormalization``.

docs/architecture.md, "Input handling".
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterable

import onnx
from onnx import GraphProto, ModelProto

__all__ = ["schema", "stand_in_for_inference"]

#: ONNX Runtime's ONNX-domain op -> the ONNX op and opset whose schema binds its ports alike
_STAND_IN_SCHEMAS = {"LayerNormalization": ("LayerNormalization", 17),
                     "SimplifiedLayerNormalization": ("RMSNormalization", 23)}
#: domain the check-and-inference copy moves a node it cannot write as Identity to
_PRIVATE_DOMAIN = "amp_compiler.ort_onnx_domain"


@lru_cache(maxsize=None)
def schema(op_type: str, opset: int) -> onnx.defs.OpSchema | None:
    """The ONNX schema of ``op_type`` at ``opset``, else that of its stand-in for one of ONNX
    Runtime's ONNX-domain ops, else None."""
    try:
        return onnx.defs.get_schema(op_type, opset, "")
    except onnx.defs.SchemaError:
        pass
    if op_type not in _STAND_IN_SCHEMAS:
        return None
    return onnx.defs.get_schema(*_STAND_IN_SCHEMAS[op_type], "")


def is_ort_onnx_op(op_type: str, domain: str, opset: int) -> bool:
    """Whether a node is one of ONNX Runtime's ONNX-domain ops that onnx has no schema for at ``opset``."""
    if domain not in ("", "ai.onnx") or op_type not in _STAND_IN_SCHEMAS:
        return False
    try:
        onnx.defs.get_schema(op_type, opset, "")
    except onnx.defs.SchemaError:
        return True
    return False


def stand_in_for_inference(light: ModelProto, subgraphs, op_types: Iterable[str] | None = None) -> None:
    """Rewrite ``light`` (a data-less copy for onnx's checker and inference, never written) as the
    module docstring says; ``subgraphs(graph, path)`` walks a graph and its subgraphs. ``op_types``:
    those of all of ``light``'s nodes, where the caller knows them (none of ONNX Runtime's ops at
    the file's opset among them: no node is read)."""
    opset = next((o.version for o in light.opset_import if o.domain in ("", "ai.onnx")), 0)
    if op_types is not None:
        if not any(is_ort_onnx_op(t, "", opset) for t in _STAND_IN_SCHEMAS.keys() & op_types):
            return
    moved = False
    for g, _ in subgraphs(light.graph, ""):
        found = [n for n in g.node if n.op_type in _STAND_IN_SCHEMAS and is_ort_onnx_op(n.op_type, n.domain, opset)]
        dtypes = _declared_dtypes(g) if found else {}
        for node in found:
            outputs = [o for o in node.output if o]
            to = dtypes.get(node.input[1]) if len(node.input) > 1 else None
            if len(outputs) == 1 and outputs[0] == node.output[0] and to:
                node.op_type, node.domain = "Cast", ""
                del node.input[1:]
                del node.attribute[:]
                node.attribute.append(onnx.helper.make_attribute("to", to))
            else:
                node.domain = _PRIVATE_DOMAIN
                moved = True
    if moved:
        light.opset_import.add(domain=_PRIVATE_DOMAIN, version=1)


def _declared_dtypes(g: GraphProto) -> dict[str, int]:
    """Element types the graph declares (inputs, initializers, value_info, outputs), by name."""
    out = {t.name: t.data_type for t in g.initializer}
    for v in (*g.input, *g.value_info, *g.output):
        if v.type.HasField("tensor_type"):
            out[v.name] = v.type.tensor_type.elem_type
    return out
