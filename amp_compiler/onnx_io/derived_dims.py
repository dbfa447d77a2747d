"""Symbolic input dims that the graph derives from others: a decoder exported with its KV cache
declares its attention mask ``[batch, total_sequence]`` where ``total_sequence`` is
``past_sequence + sequence`` (the ``present.*`` its Concat makes). Drawn at 2 apiece, the mask
had 2 columns against 4 keys and the FP32 run failed ``--validate``; planned at
``--dim past_sequence=1024``, the attention was priced over 8 keys. ``input_gen`` and the plan
size such a dim from the others. docs/architecture.md, "Input handling".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator

from onnx import ModelProto, NodeProto

from ..dims import DimSizes, names_in
from .inference import tensor_type
from .pinned_dims import _NAME, Pin, _equations, _shapes_from_inputs, free_dims, solve
from .structure import graphs


@dataclass(frozen=True)
class Derived:
    """``dim`` equals ``expression`` of other input dims: a decoder's ``total_sequence`` (its
    attention mask) is ``past_sequence + sequence`` (the ``present.*`` its Concat makes)."""

    dim: str
    expression: str
    why: str

    def describe(self, size: int) -> str:
        return f"{self.dim} = {self.expression} = {size}, as {self.why}"


def relations_of_model(model: ModelProto, sized: Iterable[str] = ()
                       ) -> tuple[dict[str, Pin], dict[str, Derived]]:
    """The pins and the derived dims of ``model``'s main graph (``sized`` dims aside), from one
    inference; ({}, {}) when its inputs have no free symbolic dim or nothing can infer them."""
    free = free_dims(model, sized)
    if not free:
        return {}, {}
    shapes = _shapes_from_inputs(model)
    if not shapes:
        return {}, {}
    return solve(_equations(model, shapes), free), _derived(model, shapes, free)


def carries_cache(model: ModelProto, nested: bool = True) -> bool:
    """Whether an output of the graph or of a subgraph is a ``Concat`` of a graph input (a decoder's
    ``present.*`` made of its ``past_key_values.*``, in a merged decoder's ``If`` branches too): the
    cheap test before ``derived_sizes`` pays for an inference. ``nested=False``: the model holds no
    subgraph (``len(OnnxImport.graphs) == 1``), so its nodes' attributes are not read."""
    inputs = {vi.name for vi in model.graph.input}
    for g, _ in graphs(model.graph, "") if nested else [(model.graph, "")]:  # a merged decoder: in If branches
        outputs = {vi.name for vi in g.output}
        if any(n.op_type == "Concat" and n.output and n.output[0] in outputs and inputs.intersection(n.input)
               for n in g.node):
            return True
    return False


def derived_sizes(model: ModelProto, dims: dict[str, int] | None, default_dim: int,
                  derived: dict[str, Derived] | None = None) -> dict[str, int]:
    """Sizes of the derived dims ``dims`` does not give, from ``dims`` (others ``default_dim``):
    ``past_sequence + sequence`` for a decoder's ``total_sequence``. ``derived``:
    ``relations_of_model``'s when the caller has it."""
    if derived is None:
        derived = relations_of_model(model, sized=dims or ())[1]
    known = DimSizes(dict(dims or {}), default_dim, free_dims(model))
    return {dim: known.get(rel.expression) for dim, rel in derived.items() if dim not in known}


def _derived(model: ModelProto, shapes: dict[str, tuple], free: set[str]) -> dict[str, Derived]:
    """Free input dims that a declared output or value dim names where the inputs alone give
    arithmetic of other input dims (``past_sequence + sequence``): by inference, or as the sum a
    ``Concat`` makes (ONNX Runtime's inference merges a dim with the one it is added to, so a
    cache concatenated and then masked came out ``total_sequence``). A dim given expressions that
    disagree is left out."""
    inputs = free_dims(model)
    found: dict[str, list[tuple[str, str]]] = {}
    for dim, expression, why in (*_declared_against_inferred(model, shapes), *_concat_sums(model, shapes),
                                 *_cache_mask(model, shapes)):
        if dim in free and dim not in names_in(expression) and names_in(expression) <= inputs:
            found.setdefault(dim, []).append((expression, why))
    probe = DimSizes({d: 3 + 7 * i for i, d in enumerate(sorted(inputs))}, 1, inputs)  # distinct sizes
    return {dim: Derived(dim, *cases[0]) for dim, cases in found.items()
            if len({probe.get(expression) for expression, _ in cases}) == 1}


def _declared_against_inferred(model: ModelProto, shapes: dict[str, tuple]) -> Iterator[tuple[str, str, str]]:
    for vi in (*model.graph.output, *model.graph.value_info):
        declared, inferred = tensor_type(vi)[1], shapes.get(vi.name)
        if declared is not None and inferred is not None and len(declared) == len(inferred):
            for d, i in zip(declared, inferred):
                if isinstance(d, str) and isinstance(i, str) and not _NAME.match(i):
                    yield d, i, f"{vi.name!r} is declared {d} and computed as {i}"


def _concat_sums(model: ModelProto, shapes: dict[str, tuple]) -> Iterator[tuple[str, str, str]]:
    declared = {vi.name: tensor_type(vi)[1] for vi in (*model.graph.output, *model.graph.value_info)}
    for node in model.graph.node:
        out = declared.get(node.output[0]) if node.op_type == "Concat" and node.output else None
        expression = _concat_sum(node, shapes, len(out)) if out is not None else None
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        if expression is not None and isinstance(out[axis], str):
            yield out[axis], expression, f"{node.output[0]!r} is declared {out[axis]} and concatenates {expression}"


def _cache_mask(model: ModelProto, shapes: dict[str, tuple]) -> Iterator[tuple[str, str, str]]:
    """A decoder's attention mask covers its cache and its new tokens: the last dim of a ``*mask*``
    input is the length of the ``present`` a Concat of a graph input makes. Deployment runtimes
    feed it so; a dynamo export declares the mask's own symbol (``total_sequence``) and nothing
    relates it, and drawn at 2 its GatherND read past the mask. Not a mask whose last dim another
    input declares: a seq2seq decoder's ``encoder_attention_mask`` has the length of its
    ``encoder_hidden_states``, and had been tied to the self-attention cache."""
    inputs = {vi.name for vi in model.graph.input}
    outputs = {vi.name for vi in model.graph.output}
    lengths = {_concat_sum(n, shapes) for n in model.graph.node if n.op_type == "Concat" and n.output
               and n.output[0] in outputs and inputs.intersection(n.input)}
    lengths.discard(None)
    if len(lengths) != 1:
        return
    (length,) = lengths
    own = {d for vi in model.graph.input if "mask" not in vi.name.lower() for d in tensor_type(vi)[1] or ()}
    for vi in model.graph.input:
        dims = tensor_type(vi)[1]
        if ("mask" in vi.name.lower() and dims and isinstance(dims[-1], str) and _NAME.match(dims[-1])
                and dims[-1] not in own):
            yield dims[-1], length, f"{vi.name!r} masks the cache and the new tokens ({length})"


def _concat_sum(node: NodeProto, shapes: dict[str, tuple], rank: int | None = None) -> str | None:
    """The length along its axis of what Concat ``node`` makes, as arithmetic of its inputs' dims."""
    parts = [shapes.get(name) for name in node.input]
    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
    rank = rank if rank is not None else (len(parts[0]) if parts and parts[0] is not None else None)
    if rank is None or len(parts) < 2 or any(p is None or len(p) != rank for p in parts):
        return None
    terms = [p[axis] for p in parts]
    if not all(isinstance(t, (int, str)) for t in terms):
        return None
    return " + ".join(f"({t})" if isinstance(t, str) and not _NAME.match(t) else str(t) for t in terms)


__all__ = ["Derived", "carries_cache", "derived_sizes", "relations_of_model"]
