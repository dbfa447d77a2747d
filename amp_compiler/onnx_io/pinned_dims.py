"""Symbolic input dims that the graph itself fixes: an export specialised to one size.

``torch.onnx.export`` with a batch-1 example and a dynamic batch axis often declares the
batch symbolic on the inputs but bakes 1 into a ``Reshape`` target (``[1, 32, 8, 8]``) or
into the shapes it declares for later values (ONNX Runtime's graph optimizer trusts those,
then refuses the run). Drawn at the default size, such a model's FP32 run failed
``--validate``. Each of these states an equation over the input dims: a constant ``Reshape``
target without ``-1`` equals its input's element count, and a declared dim equals the dim
that inference from the inputs alone gives. When one declared input symbol is left in an
equation of products, that symbol has one size: ``input_gen`` draws it so, and says why.
docs/architecture.md, "Input handling".
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Iterator

import onnx
from onnx import ModelProto, NodeProto, TensorProto, numpy_helper

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:]*\Z")
#: a Reshape target longer than this is not read (shapes are short)
_MAX_TARGET = 16


@dataclass(frozen=True)
class Pin:
    """``dim`` can only be ``size``; ``why`` says which node or declared value says so."""

    dim: str
    size: int
    why: str

    def describe(self) -> str:
        return f"{self.dim} = {self.size}, pinned by {self.why}"


def free_dims(model: ModelProto, sized: Iterable[str] = ()) -> set[str]:
    """Symbolic dims of the main graph's inputs (plain names) not in ``sized``."""
    initializers = {t.name for t in model.graph.initializer}
    found = {d.dim_param for vi in model.graph.input if vi.name not in initializers
             for d in vi.type.tensor_type.shape.dim if d.dim_param and _NAME.match(d.dim_param)}
    return found - set(sized)


@dataclass(frozen=True)
class Derived:
    """``dim`` equals ``expression`` of other input dims: a decoder's ``total_sequence`` (its
    attention mask) is ``past_sequence + sequence`` (the ``present.*`` its Concat makes)."""

    dim: str
    expression: str
    why: str

    def describe(self, size: int) -> str:
        return f"{self.dim} = {self.expression} = {size}, as {self.why}"


def pins_of_model(model: ModelProto, sized: Iterable[str] = ()) -> dict[str, Pin]:
    """The pins of ``model``'s main graph (``sized`` dims aside); {} when its inputs have no free
    symbolic dim. Best effort: a model whose shapes cannot be inferred has none."""
    return relations_of_model(model, sized)[0]


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


def carries_cache(model: ModelProto) -> bool:
    """Whether a graph output is a ``Concat`` of a graph input (a decoder's ``present.*`` made of
    its ``past_key_values.*``): the cheap test before ``derived_sizes`` pays for an inference."""
    inputs = {vi.name for vi in model.graph.input}
    outputs = {vi.name for vi in model.graph.output}
    return any(n.op_type == "Concat" and n.output and n.output[0] in outputs and inputs.intersection(n.input)
               for n in model.graph.node)


def derived_sizes(model: ModelProto, dims: dict[str, int] | None, default_dim: int,
                  derived: dict[str, Derived] | None = None) -> dict[str, int]:
    """Sizes of the derived dims ``dims`` does not give, from ``dims`` (others ``default_dim``):
    ``past_sequence + sequence`` for a decoder's ``total_sequence``. ``derived``:
    ``relations_of_model``'s when the caller has it."""
    from ..dims import DimSizes

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
    from ..dims import DimSizes, names_in

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
        declared, inferred = _dims(vi), shapes.get(vi.name)
        if declared is not None and inferred is not None and len(declared) == len(inferred):
            for d, i in zip(declared, inferred):
                if isinstance(d, str) and isinstance(i, str) and not _NAME.match(i):
                    yield d, i, f"{vi.name!r} is declared {d} and computed as {i}"


def _concat_sums(model: ModelProto, shapes: dict[str, tuple]) -> Iterator[tuple[str, str, str]]:
    declared = {vi.name: _dims(vi) for vi in (*model.graph.output, *model.graph.value_info)}
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
    relates it, and drawn at 2 its GatherND read past the mask."""
    inputs = {vi.name for vi in model.graph.input}
    outputs = {vi.name for vi in model.graph.output}
    lengths = {_concat_sum(n, shapes) for n in model.graph.node if n.op_type == "Concat" and n.output
               and n.output[0] in outputs and inputs.intersection(n.input)}
    lengths.discard(None)
    if len(lengths) != 1:
        return
    (length,) = lengths
    for vi in model.graph.input:
        dims = _dims(vi)
        if "mask" in vi.name.lower() and dims and isinstance(dims[-1], str) and _NAME.match(dims[-1]):
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


def solve(equations: Iterable[tuple[tuple, tuple[int, ...], str]], free: set[str]) -> dict[str, Pin]:
    """Pins from ``(symbolic dims, constant dims, why)`` equations (products equal): each that
    leaves exactly one symbol of ``free``; a dim pinned to two sizes is left unpinned (the
    model cannot run at all: not ours to choose)."""
    found: dict[str, list[Pin]] = {}
    for dims, constants, why in equations:
        pin = _pin(dims, constants, why, free)
        if pin is not None:
            found.setdefault(pin.dim, []).append(pin)
    return {dim: pins[0] for dim, pins in found.items() if len({p.size for p in pins}) == 1}


def _pin(dims: tuple, constants: tuple, why: str, free: set[str]) -> Pin | None:
    left, right = _monomial(dims), _monomial(constants)
    if left is None or right is None:
        return None
    (k_in, s_in), (k_out, s_out) = left, right
    rest_in, rest_out = s_in - s_out, s_out - s_in
    if rest_out or len(rest_in) != 1 or sum(rest_in.values()) != 1 or k_in <= 0 or k_out <= 0:
        return None
    (dim,) = rest_in
    if dim not in free or k_out % k_in:
        return None
    return Pin(dim, k_out // k_in, why)


def _monomial(dims) -> tuple[int, Counter] | None:
    """(product of the numbers, multiset of the symbols) of dims that are numbers, names or
    products of them (``4*batch``); None when one is anything else (unknown, ``seq + 1``)."""
    k, symbols = 1, Counter()
    for d in dims:
        if d is None:
            return None
        for factor in str(d).split("*") if isinstance(d, str) else (d,):
            factor = factor.strip() if isinstance(factor, str) else factor
            if isinstance(factor, str) and factor.isdigit():
                k *= int(factor)
            elif isinstance(factor, str):
                if not _NAME.match(factor):
                    return None
                symbols[factor] += 1
            else:
                k *= int(factor)
    return k, symbols


def _equations(model: ModelProto, shapes: dict[str, tuple]) -> Iterator[tuple[tuple, tuple, str]]:
    """Constant Reshape targets against their input's shape; declared dims against inferred ones."""
    initializers = {t.name: t for t in model.graph.initializer}
    constants = {n.output[0]: n for n in model.graph.node if n.op_type == "Constant" and n.output}
    for node in model.graph.node:
        if node.op_type != "Reshape" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
            continue
        target, shape = _target(node.input[1], initializers, constants), shapes.get(node.input[0])
        if target is None or shape is None or -1 in target:
            continue
        allowzero = any(a.name == "allowzero" and a.i for a in node.attribute)
        if not allowzero and any(t == 0 and i >= len(shape) for i, t in enumerate(target)):
            continue
        resolved = tuple(shape[i] if t == 0 and not allowzero else t for i, t in enumerate(target))
        where = f"Reshape {node.name or node.output[0]!r} of [{', '.join(map(str, shape))}] to {list(target)}"
        yield shape, resolved, where
    for vi in (*model.graph.value_info, *model.graph.output):
        declared, inferred = _dims(vi), shapes.get(vi.name)
        if declared is None or inferred is None or len(declared) != len(inferred):
            continue
        for d, i in zip(declared, inferred):
            if isinstance(d, int) and d > 0 and isinstance(i, str):
                yield (i,), (d,), (f"{vi.name!r} declared {list(declared)}, not "
                                   f"[{', '.join(map(str, inferred))}]")


def _shapes_from_inputs(model: ModelProto) -> dict[str, tuple]:
    """Each main-graph value's shape inferred from the inputs alone (declared shapes dropped), by
    ONNX Runtime's symbolic inference (``4*batch``) where it runs, else onnx's."""
    from .inference import light_copy, tensor_type
    from .symbolic_dims import symbolic_model

    light = light_copy(model)
    inferred = symbolic_model(light)
    if inferred is None:
        del light.graph.value_info[:]
        for out in light.graph.output:
            out.type.tensor_type.ClearField("shape")
        try:
            inferred = onnx.shape_inference.infer_shapes(light, check_type=False, strict_mode=False)
        except Exception:  # noqa: BLE001 - best effort: a model nothing can infer has no pins
            return {}
    values = (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output)
    return {vi.name: shape for vi in values for _, shape in (tensor_type(vi),) if shape is not None}


def _dims(vi) -> tuple | None:
    tt = vi.type.tensor_type
    if not vi.type.HasField("tensor_type") or not tt.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim)


def _target(name: str, initializers: dict[str, TensorProto], constants: dict[str, NodeProto]
            ) -> tuple[int, ...] | None:
    """The constant int64 Reshape target called ``name``, if it is one (short and inline)."""
    tensor = initializers.get(name)
    if tensor is None and name in constants:
        tensor = next((a.t for a in constants[name].attribute if a.name == "value" and a.type == a.TENSOR), None)
    if (tensor is None or tensor.data_type != TensorProto.INT64 or len(tensor.dims) != 1
            or tensor.dims[0] > _MAX_TARGET or tensor.data_location == TensorProto.EXTERNAL):
        return None
    return tuple(int(v) for v in numpy_helper.to_array(tensor))


__all__ = ["Derived", "Pin", "carries_cache", "derived_sizes", "free_dims", "pins_of_model",
           "relations_of_model", "solve"]
