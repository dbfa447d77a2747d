"""Shape rules for the ONNX Runtime contrib ops its own symbolic shape inference has none for.

ONNX Runtime's graph optimizer, at ``ORT_ENABLE_EXTENDED``, writes ``FusedMatMul`` (a MatMul with
its scale, or its inputs' transposes, folded in), ``FusedGemm`` and ``FusedConv`` (an activation
folded in) into the models it saves (``optimized_model_filepath``); ``onnxruntime.tools.
symbolic_shape_infer``, which ``symbolic_dims`` runs on models with symbolic dims, has no rule for
them and guessed their outputs fresh symbols, so every value after them was sized
``--default-dim``: a BERT so saved had its attention's second GEMM priced on made-up dims (a Swin,
31 % of its GEMM work). Each rule here is the standard op's, on the fused op's attributes.
docs/architecture.md, "Input handling".
"""

from __future__ import annotations

from typing import Any

from onnx import helper

__all__ = ["add_contrib_rules"]


def add_contrib_rules(inference: Any) -> None:
    """Register the rules below in a ``SymbolicShapeInference``'s dispatcher (its own win where it has one)."""
    inference.dispatcher_.setdefault("FusedMatMul", lambda node: _fused_matmul(inference, node))
    inference.dispatcher_.setdefault("FusedGemm", lambda node: _fused_gemm(inference, node))
    if "Conv" in inference.dispatcher_:
        inference.dispatcher_.setdefault("FusedConv", lambda node: _fused_conv(inference, node))


def _attr(node, name: str, default: int = 0) -> int:
    return next((a.i for a in node.attribute if a.name == name), default)


def _swapped(shape: list, swap: bool) -> list:
    return [*shape[:-2], shape[-1], shape[-2]] if swap and len(shape) >= 2 else list(shape)


def _fused_matmul(inference: Any, node) -> None:
    """``MatMul(A', B')`` with ``A'``/``B'`` transposed in their last two dims where ``transA``/``transB``
    say; ``transBatchA``/``transBatchB`` (batch dims moved behind the matrix dims) are left to the
    inference's guess, as before."""
    if _attr(node, "transBatchA") or _attr(node, "transBatchB"):
        return
    lhs = _swapped(inference._get_shape(node, 0), bool(_attr(node, "transA")))
    rhs = _swapped(inference._get_shape(node, 1), bool(_attr(node, "transB")))
    if not lhs or not rhs:
        return
    if len(lhs) == 1 and len(rhs) == 1:
        shape, reduced = [], (lhs[0], rhs[0])
    elif len(lhs) == 1:
        shape, reduced = [*rhs[:-2], rhs[-1]], (lhs[0], rhs[-2])
    elif len(rhs) == 1:
        shape, reduced = lhs[:-1], (lhs[-1], rhs[0])
    else:
        shape = [*inference._broadcast_shapes(lhs[:-2], rhs[:-2]), lhs[-2], rhs[-1]]
        reduced = (lhs[-1], rhs[-2])
    inference._check_merged_dims(list(reduced), allow_broadcast=False)
    _write(inference, node, shape)


def _fused_gemm(inference: Any, node) -> None:
    """``Gemm``'s ``[M, N]``: ``A`` is ``[M, K]`` (``[K, M]`` with ``transA``), ``B`` ``[K, N]`` (``transB``: ``[N, K]``)."""
    lhs = _swapped(inference._get_shape(node, 0), bool(_attr(node, "transA")))
    rhs = _swapped(inference._get_shape(node, 1), bool(_attr(node, "transB")))
    if len(lhs) != 2 or len(rhs) != 2:
        return
    inference._check_merged_dims([lhs[1], rhs[0]], allow_broadcast=False)
    _write(inference, node, [lhs[0], rhs[1]])


def _fused_conv(inference: Any, node) -> None:
    """``Conv``'s rule (the inference's own, on the same attributes), in the input's dtype."""
    inference.dispatcher_["Conv"](node)
    inference.known_vi_[node.output[0]].type.tensor_type.elem_type = _dtype(inference, node)


def _write(inference: Any, node, shape: list) -> None:
    """Output 0 of ``node``: ``shape`` (dims or symbols), in its first input's dtype."""
    inference.known_vi_[node.output[0]].CopyFrom(helper.make_tensor_value_info(node.output[0], _dtype(inference, node),
                                                                               shape))


def _dtype(inference: Any, node) -> int:
    return inference.known_vi_[node.input[0]].type.tensor_type.elem_type
