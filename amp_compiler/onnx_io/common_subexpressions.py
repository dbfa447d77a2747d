"""Merge duplicate computations before planning, as ONNX Runtime does when it loads a model.

torch's exporter at opset 23 writes each ``RotaryEmbedding`` with a ``Cos`` and a ``Sin`` of its
own, all of the one angle tensor. The trig ops stay FP32 (numerics rule 7), so each pair costs two
kernels and two casts: a 2-layer Llama was planned all FP32 by cost, where its opset-18 export
(one ``Cos``, one ``Sin``) is planned all FP16. ONNX Runtime runs them once: its
``CommonSubexpressionElimination`` (level 1, every provider) merges ops with the same type,
inputs and attributes, and then the identical casts behind them.

``merge_duplicates`` does the same to the IR before the passes run, so a plan is priced as the
runtime will run it and the converted model holds one op where the source had several. An op is
merged into an earlier twin when both are main-graph ops of the default domain with the same type,
inputs (after earlier merges) and attributes, it writes a float value, computes something (views
such as ``Identity`` cost nothing), is deterministic (no ``Random*``, ``Dropout``, ``Multinomial``),
holds no subgraph, and its outputs are no graph output and not read inside a subgraph. Its readers
read the twin's outputs; the emitter writes no node for it (docs/architecture.md, "Input handling").
"""

from __future__ import annotations

from collections import Counter

from cost_model.traffic import ALIAS

from ..dtypes import is_float
from ..ir import Op, PrecisionGraph
from ..registry import DEFAULT_REGISTRY
from .importer import OnnxImport

__all__ = ["merge_duplicates"]

_NONDETERMINISTIC = frozenset({"Dropout", "Multinomial", "Bernoulli", "RandomNormal", "RandomNormalLike",
                               "RandomUniform", "RandomUniformLike"})


def merge_duplicates(imp: OnnxImport, keep: set[str] = frozenset()) -> Counter:
    """Merge duplicate ops of ``imp.graph`` into their first occurrence (see module docstring),
    except the ops named in ``keep`` (a ``--deny-node`` names one: it must stay what it names);
    returns how many of each op type were merged."""
    graph = imp.graph
    first: dict[tuple, Op] = {}  # (op type, *inputs) -> the first op: most ops share them with none
    by_inputs: dict[tuple, list[Op]] = {}  # the same, for those that do: the ops so far (no list per op)
    keys: dict[str, tuple | None] = {}  # op name -> ``_key``, worked out only for ops that share them
    merged: Counter = Counter()
    for op in list(graph.ops.values()):
        if op.scope or not any(op.inputs) or op.name in keep:
            continue
        reads = (op.op_type, *op.inputs)
        if first.setdefault(reads, op) is op:
            continue
        earlier = by_inputs.get(reads)
        if earlier is None:
            earlier = by_inputs[reads] = [first[reads]]
        earlier.append(op)
        key = _key(graph, imp, op)
        twin = next((o for o in earlier[:-1] if key is not None and _memo(keys, graph, imp, o) == key), None)
        if twin is None or not _movable(graph, op):
            continue
        for mine, theirs in zip(op.outputs, twin.outputs):
            if mine:
                for reader, port in list(graph.tensors[mine].consumers):
                    graph.set_input(reader, port, theirs)
        graph.remove_op(op.name)
        earlier.pop()
        for name in op.outputs:
            graph.tensors.pop(name, None)
        merged[op.op_type] += 1
    return merged


def _memo(keys: dict[str, tuple | None], graph: PrecisionGraph, imp: OnnxImport, op: Op) -> tuple | None:
    if op.name not in keys:
        keys[op.name] = _key(graph, imp, op)
    return keys[op.name]


def _key(graph: PrecisionGraph, imp: OnnxImport, op: Op) -> tuple | None:
    """What makes two ops the same computation, or None for an op that is never merged."""
    if op.scope or op.inserted or op.domain not in ("", "ai.onnx") or not any(op.inputs) \
            or op.op_type in _NONDETERMINISTIC:
        return None
    row = DEFAULT_REGISTRY.lookup_onnx(op.domain, op.op_type)
    if row is not None and row.traffic == ALIAS:
        return None
    if not any(name and is_float(graph.tensors[name].dtype) for name in op.outputs):
        return None
    node = imp.nodes.get(op.name)
    if node is None or any(a.HasField("g") or a.graphs for a in node.attribute):
        return None
    return op.op_type, tuple(op.inputs), len(op.outputs), tuple(a.SerializeToString() for a in node.attribute)


def _movable(graph: PrecisionGraph, op: Op) -> bool:
    """Whether every reader of ``op``'s outputs can read its twin's instead."""
    for name in op.outputs:
        t = graph.tensors.get(name) if name else None
        if t is None:
            continue
        if t.is_graph_output or t.scope_output or any(graph.ops[c].scope for c, _ in t.consumers):
            return False
    return True
