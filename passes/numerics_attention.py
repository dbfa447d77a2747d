"""Numerics rule 13: unscaled scores of unnormalised activations stay FP32 (docs/architecture.md, "Numerics").

A product of two activations (``q @ k^T``) whose value reaches a Softmax with no scaling on the
way — no Mul or Div by a static value on the scores, nor on either operand since its last
computing op — and with an operand not derived from a bounded value (a normalisation's output,
or tanh/sigmoid/softmax..., through weight GEMMs, affine constants and data movement) has
scores that grow with activations nothing bounds: the usual ``1 / sqrt(d)``, or a
normalisation in front with the scale folded into the weights (T5), is what keeps them inside
FP16 (65504). HF's GPT-Neo, whose attention is unscaled, computes that product and its softmax
in FP32 on purpose (``GPTNeoSelfAttention._attn``: "Keep the attention weights computation in
fp32 to avoid overflow issues"). The product, the ops between it and the softmax, and the
softmax stay FP32; the softmax's output is bounded, so what follows is free to run in the low
dtype. BF16 holds FP32's range: the rule applies only to dtypes whose max is below FP32's.
Fused attention ops (SDPA) carry their own scale and are not products here; a product with an
``alpha`` below 1 (ONNX Runtime's ``FusedMatMul``) is scaled.
"""

from __future__ import annotations

from amp_compiler.ir import Op, PrecisionGraph
from amp_compiler.numerics import DtypeRange
from amp_compiler.registry import CLEAR

from .numerics_chains import BOUNDED, mask_flow, normalisations

_PRODUCTS = frozenset({"matmul", "einsum"})
_SCALES = frozenset({"mul", "div"})
_SOFTMAX = frozenset({"softmax", "log_softmax"})
_MAX_BACK = 8  # data-movement ops walked back from an operand
_MAX_STATIC = 8  # ops deep a value computed from constants and shapes alone is still recognised as static
#: ops whose output is a tensor's dims, not its values: static however the tensor was computed
_SHAPES = frozenset({"shape", "size"})
_MAX_SOURCE = 16  # ops walked back from an operand to the value it projects
_WEIGHT_PRODUCTS = frozenset({"matmul", "gemm", "einsum"})  # canonical names: aten addmm/linear are gemm
_AFFINE = frozenset({"add", "sub", "mul", "div"})
_WIDE = 1e38  # a dtype with FP32's exponent range (BF16) cannot overflow here


def unscaled_attention(graph: PrecisionGraph, rng: DtypeRange, label: str) -> dict[str, str]:
    """op name -> reason for each unscaled score product, the ops to its softmax and the softmax."""
    if rng.max >= _WIDE:
        return {}
    out: dict[str, str] = {}
    tensors = graph.tensors
    bounded: set[str] | None = None  # written-out norms, found once a candidate needs them
    for op in graph.ops.values():
        if op.canonical not in _PRODUCTS or not op.outputs or not op.outputs[0]:
            continue
        operands = [i for i in op.inputs if i]
        if len(operands) != 2 or tensors[operands[0]].is_constant or tensors[operands[1]].is_constant \
                or _own_scale(op):
            continue  # a weight GEMM (most products), or scaled by its own alpha
        # every test is a condition on its own, so the cheap and selective ones go first: the walk
        # forward to a softmax ends at the first other reader, where the walks back from both operands
        # (is either computed from constants?) run to their full depth for every product of activations
        path = mask_flow(graph, op.outputs[0])  # the ops to the softmax it feeds, or None
        if path is None or any(_scales(graph, graph.ops[n]) for n in path) or _weight_product(graph, operands):
            continue
        if any(_scaled_operand(graph, t) for t in operands):
            continue
        bounded = normalisations(graph) if bounded is None else bounded
        if all(_from_bounded(graph, t, bounded) for t in operands):
            continue
        why = (f"unscaled attention scores: {op.name}'s product of two activations reaches "
               f"{_softmax_of(graph, path)} with no 1/sqrt(d) scale on the way and no normalisation in front, "
               f"so the scores grow with the activations and can pass {label}'s max {rng.max:.5g} (HF's GPT-Neo computes these in FP32)")
        for name in (op.name, *sorted(path)):
            out.setdefault(name, why)
    return out


def _own_scale(op: Op) -> bool:
    """A product that scales its result itself: ONNX Runtime's ``FusedMatMul`` (its
    MatMulScaleFusion folds BERT's 1/sqrt(d) into ``alpha``) or a ``Gemm`` with ``alpha`` below 1."""
    alpha = op.attrs.get("alpha")
    return isinstance(alpha, (int, float)) and abs(alpha) < 1


def _weight_product(graph: PrecisionGraph, operands: list[str]) -> bool:
    """A product with a static operand: a weight GEMM, not scores. A constant operand (most weight
    GEMMs) settles it before the walk back from the activation operand."""
    tensors = graph.tensors
    return any(tensors[t].is_constant for t in operands) or any(_static(graph, t, _MAX_STATIC) for t in operands)


def _softmax_of(graph: PrecisionGraph, path: set[str]) -> str:
    return next(n for n in sorted(path) if graph.ops[n].canonical in _SOFTMAX)


def _scales(graph: PrecisionGraph, op: Op) -> bool:
    """A Mul or Div of a value by a static one (a constant, a scalar argument, or computed from them)."""
    if op.canonical not in _SCALES:
        return False
    return bool(op.scalars) or any(i and graph.tensors[i].is_constant for i in op.inputs) \
        or any(i and _static(graph, i, _MAX_STATIC) for i in op.inputs)  # constants first: no walk back


def _scaled_operand(graph: PrecisionGraph, tensor: str) -> bool:
    """Whether ``tensor`` was scaled by a static value since its last computing op (back through
    data movement: transposes, reshapes, casts)."""
    for _ in range(_MAX_BACK):
        op = graph.producer(tensor)
        if op is None:
            return False
        if _scales(graph, op):
            return True
        if op.op_class != CLEAR or not op.inputs or not op.inputs[0]:
            return False
        tensor = op.inputs[0]
    return False


def _from_bounded(graph: PrecisionGraph, tensor: str, norms: set[str]) -> bool:
    """Whether ``tensor`` projects a bounded value: back through data movement, weight GEMMs and
    affine constants (gamma, beta, biases) to a normalisation or a saturating op's output."""
    for _ in range(_MAX_SOURCE):
        op = graph.producer(tensor)
        if op is None:
            return False  # a graph input: nothing bounds it
        if op.canonical in BOUNDED or op.name in norms:
            return True
        moving = [i for i in op.inputs if i and not _static(graph, i, _MAX_STATIC)]
        passes = op.op_class == CLEAR or op.canonical in _WEIGHT_PRODUCTS or op.canonical in _AFFINE
        if not passes or len(moving) != 1:
            return False
        tensor = moving[0]
    return False


def _static(graph: PrecisionGraph, tensor: str, depth: int) -> bool:
    """A constant, or computed from constants and shapes alone within ``depth`` ops (``sqrt(tensor(64.))``;
    the TorchScript exporter's ``sqrt(1 / sqrt(Shape(q)[-1]))`` for an SDPA called without ``scale=``)."""
    t = graph.tensors[tensor]
    if t.is_constant:
        return True
    if depth == 0 or t.kind != "activation":
        return False
    op = graph.producer(tensor)
    if op is not None and op.canonical in _SHAPES:
        return True
    return op is not None and all(not i or _static(graph, i, depth - 1) for i in op.inputs)


__all__ = ["unscaled_attention"]
