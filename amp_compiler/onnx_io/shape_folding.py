"""Fold the values a shape input is computed from where they are constants of the inputs' static dims.

ONNX Runtime's symbolic inference carries shape arithmetic through few ops: a MobileViT exported
with ``dynamo=False`` reshapes to ``batch * int(ceil(8 / 2.0))`` rows, in floats, and 165 dims
after its first unfold were made up, 75 GEMMs priced at ``--default-dim``. Here each shape
input it left unevaluated, and every small value that one is computed from, is evaluated from the
``Shape`` values inference did size, once per three sizings of the declared dims; where all agree
it is a constant of the model and becomes an initializer of the shape model, and inference runs
again (it writes ``4*batch`` then). A TorchScript Swin's window ``Pad`` (pads through ``Mod``,
``Reshape``, a reversing ``Slice``) was the first case; ``symbolic_dims`` now carries ``Mod`` too.
docs/architecture.md, "Input handling".
"""

from __future__ import annotations

import math

import numpy as np
from onnx import ModelProto, NodeProto, TensorProto, helper, numpy_helper

from ..dims import DimSizes, names_in

#: the inputs of each op that ONNX Runtime's inference reads the value of (a shape, pads, a range)
_SHAPE_INPUTS = {"Pad": (1,), "Reshape": (1,), "Expand": (1,), "ConstantOfShape": (0,), "Tile": (1,),
                 "Range": (0, 1, 2), "Slice": (1, 2, 3, 4), "Resize": (3,), "Unsqueeze": (1,),
                 "Squeeze": (1,), "Split": (1,)}
#: a cone bigger than this is not a shape computation worth evaluating
_MOST_NODES = 200
#: the most elements a value of a shape computation has (a shape, pads, a scalar)
_MOST_ELEMENTS = 64


def fold_shape_values(model: ModelProto, known: dict, data: dict, declared: set[str]) -> int:
    """Make the unevaluated shape inputs of ``model`` (the shape model ONNX Runtime's inference ran
    on: ``known`` its value infos, ``data`` the values it evaluated) initializers where they are
    constants; returns how many were folded."""
    graph = model.graph
    nodes = list(graph.node)
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    constants = {t.name: t for t in graph.initializer}
    wanted = {n.input[i] for n in nodes for i in _SHAPE_INPUTS.get(n.op_type, ())
              if i < len(n.input) and n.input[i] and n.input[i] not in data and n.input[i] in producer
              and n.input[i] not in constants}
    cones = {}
    for name in sorted(wanted):
        cone = _cone(name, nodes, producer, (constants, known, declared))
        if cone is not None:
            cones[name] = cone
    if not cones:
        return 0
    body = [nodes[i] for i in sorted(set().union(*cones.values()))]  # in graph order, which is topological
    # every value of the cones, not only the wanted ones: a part that is a constant (MobileViT's
    # patch count, through a float ceil) lets the inference carry ``batch * 4`` through the rest
    outputs = [n.output[0] for n in body if n.op_type not in ("Shape", "Constant") and len(n.output) == 1]
    opsets = list(model.opset_import)
    values = [_evaluate(body, outputs, (known, declared, constants), opsets, sizing) for sizing in _sizings(declared)]
    if any(v is None for v in values):
        return 0
    folded = [name for name in outputs if all(_same(values[0][name], v[name]) for v in values[1:])]
    return sum(_fold(graph, nodes[producer[name]], name, values[0][name]) for name in folded)


def _sizings(declared: set[str]) -> list[dict[str, int]]:
    """Three sizings of the declared dims, each dim apart from the others and of other parities and
    residues (a window's ``(8 - seq % 8) % 8`` must differ between them)."""
    return [{d: base + step * i for i, d in enumerate(sorted(declared))} for base, step in ((3, 4), (7, 9), (16, 1))]


def _cone(name: str, nodes: list[NodeProto], producer: dict[str, int], context: tuple) -> set[int] | None:
    """The indices of the nodes ``name`` is computed by, back to ``Shape`` nodes whose input
    inference sized from declared dims, ``Constant`` nodes and initializers; None if it reads anything
    else. ``context``: the initializers, the value infos and the declared dims."""
    constants, known, declared = context
    cone: set[int] = set()
    stack = [name]
    while stack:
        value = stack.pop()
        if value in constants:
            continue
        index = producer.get(value)
        if index is None or len(cone) > _MOST_NODES:
            return None  # a graph input: data the model reads, not a shape
        if index in cone:
            continue
        cone.add(index)
        node = nodes[index]
        if node.op_type == "Shape":
            if _shape_of(known.get(node.input[0]), declared) is None:
                return None
            continue
        if node.op_type != "Constant":
            if not all(_small(known.get(o)) for o in node.output if o):
                return None  # not a shape computation (a mask built from a shape)
            stack.extend(i for i in node.input if i)
    return cone


def _small(vi) -> bool:
    """Whether inference gave ``vi`` a static shape of at most ``_MOST_ELEMENTS`` elements."""
    if vi is None or not vi.type.tensor_type.HasField("shape"):
        return False
    dims = vi.type.tensor_type.shape.dim
    return all(d.HasField("dim_value") for d in dims) and math.prod(d.dim_value for d in dims) <= _MOST_ELEMENTS


def _shape_of(vi, declared: set[str]) -> list | None:
    """The dims of ``vi``: numbers or expressions of declared dims; None otherwise."""
    if vi is None or not vi.type.tensor_type.HasField("shape"):
        return None
    dims = []
    for d in vi.type.tensor_type.shape.dim:
        if d.HasField("dim_value"):
            dims.append(d.dim_value)
        elif d.dim_param and names_in(d.dim_param) <= declared:
            dims.append(d.dim_param)
        else:
            return None
    return dims


def _evaluate(nodes: list[NodeProto], outputs: list[str], context: tuple, opsets: list,
              sizing: dict[str, int]) -> dict | None:
    """The ``outputs`` of ``nodes`` with the declared dims sized by ``sizing``; None if evaluation fails.
    ``context``: the value infos, the declared dims and the initializers, as ``fold_shape_values``'s."""
    from onnx.reference import ReferenceEvaluator

    known, declared, constants = context
    sizes = DimSizes(sizing, 1, declared)
    body = []
    for node in nodes:
        if node.op_type == "Shape":
            dims = np.array([sizes.get(d) if isinstance(d, str) else d
                             for d in _shape_of(known[node.input[0]], declared)], dtype=np.int64)
            attrs = {a.name: a.i for a in node.attribute}
            dims = dims[attrs.get("start", 0):attrs["end"] if "end" in attrs else None]
            body.append(helper.make_node("Constant", [], [node.output[0]], value=numpy_helper.from_array(dims)))
        else:
            body.append(node)
    read = {i for n in body for i in n.input if i in constants}
    graph = helper.make_graph(body, "shape_cone", [], [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None)
                                                       for o in outputs], [constants[r] for r in sorted(read)])
    try:
        results = ReferenceEvaluator(helper.make_model(graph, opset_imports=opsets)).run(None, {})
    except Exception:  # noqa: BLE001 - best effort: a cone the reference runtime cannot run stays unfolded
        return None
    return dict(zip(outputs, results))


def _same(a, b) -> bool:
    return a is not None and b is not None and np.shape(a) == np.shape(b) and bool(np.all(np.asarray(a) == b))


def _fold(graph, node: NodeProto, name: str, value) -> bool:
    """``name`` as an initializer in place of ``node``'s output (a single-output node only)."""
    if len([o for o in node.output if o]) != 1:
        return False
    graph.node.remove(node)
    graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
    return True


__all__ = ["fold_shape_values"]
