"""Relate the symbolic dims onnx's inference leaves unrelated to the graph's inputs.

onnx's shape inference gives a ``Reshape`` or ``Flatten`` output of a dynamic graph a fresh
symbol (``unk__3``; the TorchScript exporter writes ``MatMul_out_dim_0``), so the cost model
sized those tensors at ``default_dim`` whatever ``--dim seq=2048`` said: a Llama exported with
``torch.onnx.export(dynamo=False)`` had 131 such dims and was planned as if it were tiny.
ONNX Runtime's symbolic shape inference (``onnxruntime.tools.symbolic_shape_infer``, sympy
arithmetic over the inputs' dims) writes them as expressions (``batch*seq``, ``seq + 1``),
which ``amp_compiler.dims`` sizes. It runs only when such dims exist, on the light copy
(weights as shaped inputs, no data), and is best effort: where it fails, onnx's shapes stay.
docs/architecture.md, "Input handling".
"""

from __future__ import annotations

import logging
import math
from typing import Iterable

import onnx
from onnx import ModelProto, TensorProto, ValueInfoProto, helper

from ..dims import names_in
from .contrib_shapes import add_contrib_rules
from .inference import placeholder_names
from .nonzero_ranges import nonzero_as_range
from .ort_shape_tool import symbolic_shape_infer
from .shape_folding import fold_shape_values
from .tensors import is_external


def unrelated_dims(light: ModelProto, types: dict[str, tuple[int, tuple | None]]) -> set[str]:
    """Symbolic dims of the values in ``types`` (``inference.inferred_types`` of ``light``) that the
    main graph's inputs do not declare."""
    found = {d for _, shape in set(types.values()) if shape for d in shape if isinstance(d, str)}
    return found - _dims(light.graph.input)


def _unshaped(light: ModelProto, types: dict[str, tuple[int, tuple | None]],
              outputs: Iterable[str] | None = None) -> bool:
    """Whether a main-graph value has no shape (onnx could not tell its rank). ``outputs``: the
    main graph's node outputs where the caller read them already (a walk of 100k protobuf nodes
    costs more than the test)."""
    names = (o for n in light.graph.node for o in n.output) if outputs is None else outputs
    unknown = (0, None)
    return any(types.get(o, unknown)[1] is None for o in names if o)


def _dims(values) -> set[str]:
    return {d.dim_param for vi in values for d in vi.type.tensor_type.shape.dim if d.dim_param}


def relate_dims(light: ModelProto, types: dict[str, tuple[int, tuple | None]],
                outputs: Iterable[str] | None = None) -> int:
    """Rewrite ``light``'s value shapes with ONNX Runtime's related dims where onnx's are
    unrelated symbols or unknown; returns how many values changed (0 when nothing was to do).
    ``outputs`` as for ``_unshaped``."""
    if not unrelated_dims(light, types) and not _unshaped(light, types, outputs):
        return 0
    inferred = symbolic_model(light)
    if inferred is None:
        return 0
    related = {vi.name: vi for vi in (*inferred.graph.value_info, *inferred.graph.output)}
    related.update((t.name, helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
                   for t in inferred.graph.initializer if t.name not in related)  # a folded shape value
    declared = _dims(light.graph.input)
    adopted = ModelProto()
    adopted.CopyFrom(light)
    changed = sum(_adopt(vi, related.get(vi.name), declared) for vi in (*adopted.graph.value_info, *adopted.graph.output))
    changed += _adopt_missing(adopted, related, declared)
    try:  # the model's own declared shapes must agree (a stale output shape that no dim contradicted did)
        onnx.shape_inference.infer_shapes(adopted, check_type=False, strict_mode=True)
    except Exception:  # noqa: BLE001 - onnx raises InferenceError, or ValueError/RuntimeError
        return 0
    light.CopyFrom(adopted)
    return changed


def symbolic_model(light: ModelProto) -> ModelProto | None:
    """``light`` (a ``light_copy``) shaped by ONNX Runtime's symbolic inference from its inputs
    alone; None where that inference is missing or fails (best effort)."""
    tool = symbolic_shape_infer()
    if tool is None:  # no ONNX Runtime, or a build without its tools
        return None
    logger = logging.getLogger(tool.__name__)
    level, logger.level = logger.level, logging.ERROR  # its merge notes are not the user's concern
    try:
        model = _shape_model(light)
        inference = _symbolic_shapes(tool.SymbolicShapeInference, model)
        if fold_shape_values(model, inference.known_vi_, inference.sympy_data_, _dims(light.graph.input)):
            inference = _symbolic_shapes(tool.SymbolicShapeInference, model)  # once more, with the pads known
        return inference.out_mp_
    except Exception:  # noqa: BLE001 - best effort: any op it cannot handle leaves onnx's shapes
        return None
    finally:
        logger.level = level


def _symbolic_shapes(inference_class, model: ModelProto):
    """``SymbolicShapeInference.infer_shapes`` without its side effect: where some shape stays
    unknown it saves ``sym_shape_infer_temp.onnx`` into the working directory and raises; here what
    it did infer is kept (the strict check in ``relate_dims`` vets it), and no file is written."""
    inference = inference_class(2**31 - 1, True, False, 0)  # int_max, auto_merge, guess_output_rank, verbose
    inference.dispatcher_.setdefault("Flatten", lambda node: _infer_flatten(inference, node))
    inference.dispatcher_.setdefault("Mod", lambda node: _infer_mod(inference, node))
    add_contrib_rules(inference)  # ONNX Runtime's own fused ops (ORT_ENABLE_EXTENDED files)
    inference._preprocess(model)
    while inference.run_:
        inference._infer_impl()
    inference._update_output_from_vi()
    return inference


def _infer_flatten(inference, node) -> None:
    """``Flatten``'s two dims as products of its input's, which that inference has no rule for (it
    named both anew: ``[batch, seq]`` flattened at axis 2, a TorchScript Longformer's mask, and a
    projection after ``Flatten`` was priced at ``--default-dim`` rows)."""
    dims = inference._get_sympy_shape(node, 0)
    axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
    axis = axis + len(dims) if axis < 0 else axis
    shape = [math.prod(dims[:axis]), math.prod(dims[axis:])]
    inference._update_computed_dims(shape)
    vi = inference.known_vi_[node.output[0]]
    vi.CopyFrom(helper.make_tensor_value_info(node.output[0], vi.type.tensor_type.elem_type,
                                              symbolic_shape_infer().get_shape_from_sympy_shape(shape)))


def _infer_mod(inference, node) -> None:
    """An integer ``Mod``'s value (``fmod=0``: the divisor's sign, sympy's ``Mod``), which that
    inference does not carry: a window's ``(8 - seq % 8) % 8`` padding, a TorchScript Swin's or
    Longformer's, left what it pads sized ``--default-dim`` where ``seq`` is dynamic."""
    if not any(a.name == "fmod" and a.i for a in node.attribute):
        import sympy

        inference._compute_on_sympy_data(node, lambda values: sympy.Mod(values[0], values[1]))


def _shape_model(light: ModelProto) -> ModelProto:
    """``light`` with its data-less initializers as graph inputs of the same type and shape (the
    symbolic inference reads initializers' values; these have none), and no other value shaped."""
    model = ModelProto()
    model.CopyFrom(light)
    graph = model.graph
    stripped = placeholder_names(model)
    kept: list[TensorProto] = [t for t in graph.initializer if t.name not in stripped]
    shaped = [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
              for t in graph.initializer if t.name in stripped]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    graph.input.extend(shaped)
    graph.input.extend(_stripped_constants(graph))
    graph.input.extend(_weight_values(graph, {t.name for t in graph.initializer} | stripped))
    nonzero_as_range(graph)
    # shapes are worked out from the inputs alone: a stale declared one (value_info, an output's
    # exporter-named dims) would pass for a result, and the emitted file carries these shapes
    del graph.value_info[:]
    for out in graph.output:
        if out.type.HasField("tensor_type"):
            out.type.tensor_type.ClearField("shape")
    return model


_FLOATS = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE}


def _stripped_constants(graph) -> list[ValueInfoProto]:
    """``Constant`` nodes whose value the light copy left without data, taken out of ``graph`` and
    returned as inputs of the same type and shape: ONNX Runtime's inference reads every Constant's
    value, and a Speech2Text exported with ``dynamo=False`` (its sinusoidal position table is one)
    failed there, leaving 158 dims unsized."""
    values, kept = [], []
    for node in graph.node:
        value = next((a.t for a in node.attribute if a.name == "value"), None) if node.op_type == "Constant" else None
        if value is not None and is_external(value):
            values.append(helper.make_tensor_value_info(node.output[0], value.data_type, list(value.dims)))
        else:
            kept.append(node)
    return _taken_out(graph, kept, values)


def _taken_out(graph, kept: list, values: list[ValueInfoProto]) -> list[ValueInfoProto]:
    """``values``, once ``graph`` holds only the ``kept`` nodes (where any value was taken out)."""
    if values:
        del graph.node[:]
        graph.node.extend(kept)
    return values


def _weight_values(graph, constants: set[str]) -> list[ValueInfoProto]:
    """Float values computed from the weights alone (a TorchScript export's weight norm: ``ReduceL2``
    over the weight, ``Div``, ``Mul``), taken out of ``graph`` and returned as inputs of the static
    shapes onnx's inference gave them. ONNX Runtime's inference cannot shape an opset-18 reduction
    whose axes are an input, then fails on the whole graph, and every dim a wav2vec2 exported with
    ``dynamo=False`` derives from its samples stayed a made-up symbol sized 8. Integer values stay
    computed: their data (shapes, axes) is what that inference reads."""
    static = {vi.name: vi for vi in graph.value_info if vi.type.tensor_type.elem_type in _FLOATS
              and vi.type.tensor_type.HasField("shape")
              and all(d.HasField("dim_value") for d in vi.type.tensor_type.shape.dim)}
    known = set(constants)
    kept, values = [], []
    for node in graph.node:
        inputs = [i for i in node.input if i]
        from_weights = node.op_type == "Constant" or (inputs and all(i in known for i in inputs))
        if from_weights:
            known.update(node.output)
        if from_weights and node.op_type != "Constant" and all(o in static for o in node.output):
            values.extend(static[o] for o in node.output)
        else:
            kept.append(node)
    return _taken_out(graph, kept, values)


def _adopt(mine: ValueInfoProto, theirs: ValueInfoProto | None, declared: set[str]) -> bool:
    """Take ``theirs``' dims where ``mine`` has an unknown or undeclared symbol: a number, or an
    expression of declared dims (same rank only)."""
    if theirs is None or not theirs.type.tensor_type.HasField("shape"):
        return False
    dims, other = mine.type.tensor_type.shape.dim, theirs.type.tensor_type.shape.dim
    if not mine.type.tensor_type.HasField("shape"):  # onnx could not tell the rank: a Reshape to a computed shape
        return _adopt_whole(mine, theirs, declared)
    if len(dims) != len(other):
        return False
    changed = False
    for d, o in zip(dims, other):
        if d.HasField("dim_value") or d.dim_param in declared:
            continue
        if o.HasField("dim_value"):
            d.dim_value = o.dim_value
        elif o.dim_param and o.dim_param != d.dim_param and names_in(o.dim_param) <= declared:
            d.dim_param = o.dim_param
        else:
            continue
        changed = True
    return changed


def _adopt_whole(mine: ValueInfoProto, theirs: ValueInfoProto, declared: set[str]) -> bool:
    """Take ``theirs``' whole shape where onnx gave ``mine`` none, if each dim is a number or an
    expression of declared dims. A TorchScript export's ``view(*x.size()[:-1], heads, d)`` reshapes
    to ``Concat(Unsqueeze(Gather(Shape(x))), ...)``, which onnx cannot evaluate: every value after a
    BERT's first head split was unshaped, its GEMMs priced at 16 FLOPs, the plan FP32 by cost."""
    other = theirs.type.tensor_type.shape.dim
    if mine.type.tensor_type.elem_type != theirs.type.tensor_type.elem_type or not all(
            o.HasField("dim_value") or (o.dim_param and names_in(o.dim_param) <= declared) for o in other):
        return False
    mine.type.tensor_type.shape.CopyFrom(theirs.type.tensor_type.shape)
    return True


def _adopt_missing(model: ModelProto, related: dict[str, ValueInfoProto], declared: set[str]) -> int:
    """Add ``related``'s shape of each main-graph node output onnx left without any type (an op it has no
    schema for, ONNX Runtime's ``FusedMatMul``, and a Softmax reading it), where ``_adopt_whole`` would
    take it; returns how many."""
    known = {vi.name for vi in (*model.graph.value_info, *model.graph.output, *model.graph.input)}
    known.update(t.name for t in model.graph.initializer)
    added = 0
    for node in model.graph.node:
        for name in node.output:
            theirs = related.get(name)
            if not name or name in known or theirs is None or not theirs.type.tensor_type.elem_type:
                continue
            mine = ValueInfoProto(name=name)
            mine.type.tensor_type.elem_type = theirs.type.tensor_type.elem_type
            if theirs.type.tensor_type.HasField("shape") and _adopt_whole(mine, theirs, declared):
                model.graph.value_info.append(mine)
                known.add(name)
                added += 1
    return added


__all__ = ["relate_dims", "symbolic_model", "unrelated_dims"]
