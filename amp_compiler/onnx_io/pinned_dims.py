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

from .inference import light_copy, tensor_type

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


def pins_of_model(model: ModelProto, sized: Iterable[str] = ()) -> dict[str, Pin]:
    """The pins of ``model``'s main graph (``sized`` dims aside); {} when its inputs have no free
    symbolic dim. Best effort: a model whose shapes cannot be inferred has none."""
    free = free_dims(model, sized)
    shapes = _shapes_from_inputs(model) if free else {}
    return solve(_equations(model, shapes), free) if shapes else {}


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
        declared, inferred = tensor_type(vi)[1], shapes.get(vi.name)
        if declared is None or inferred is None or len(declared) != len(inferred):
            continue
        for d, i in zip(declared, inferred):
            if isinstance(d, int) and d > 0 and isinstance(i, str):
                yield (i,), (d,), (f"{vi.name!r} declared {list(declared)}, not "
                                   f"[{', '.join(map(str, inferred))}]")


def _shapes_from_inputs(model: ModelProto) -> dict[str, tuple]:
    """Each main-graph value's shape inferred from the inputs alone (declared shapes dropped), by
    ONNX Runtime's symbolic inference (``4*batch``) where it runs, else onnx's."""
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


__all__ = ["Pin", "free_dims", "pins_of_model", "solve"]
