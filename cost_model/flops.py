"""FLOP formulas named by the registry's ``flops`` column, and the dims tensor cores need aligned.

Each formula takes an IR op and its graph (``amp_compiler.ir``, duck-typed: this module
imports nothing from it at run time) and returns floating-point operations for one
execution; shapes with symbolic dims use the graph's dim sizes. Bytes moved are
``cost_model.traffic``'s job. The alignment rule (``misaligned_dims``) is written once,
here, on top of ``roofline.tensor_core_aligned``: the op timer and the align pass share it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

from .roofline import alignment_multiple, tensor_core_aligned

if TYPE_CHECKING:
    from amp_compiler.ir import Op, PrecisionGraph


def _shape(graph: PrecisionGraph, name: str) -> list[int] | None:
    return graph.concrete_shape(name) if name else None


def _numel(graph: PrecisionGraph, name: str) -> int:
    return graph.numel(name) if name else 0


def _out_numel(op: Op, graph: PrecisionGraph) -> int:
    return max((_numel(graph, o) for o in op.outputs if o), default=0)


def gemm_dims(op: Op, graph: PrecisionGraph) -> tuple[int, int, int, int] | None:
    """(batch, M, N, K) of a matmul/gemm op, or None when shapes are unknown."""
    a, b = (_shape(graph, op.inputs[0]), _shape(graph, op.inputs[1])) if len(op.inputs) >= 2 else (None, None)
    if not a or not b:
        return None
    if op.canonical == "gemm" and len(a) == 2 and len(b) == 2:
        m, k = (a[1], a[0]) if op.attrs.get("transA") else (a[0], a[1])
        n = b[0] if op.attrs.get("transB") else b[1]
        return 1, m, n, k
    if len(a) == 1:
        a = [1, a[0]]
    if len(b) == 1:
        b = [b[0], 1]
    out = _shape(graph, op.outputs[0]) or []
    batch = math.prod(out[:-2]) if len(out) > 2 else 1
    return batch, a[-2], b[-1], a[-1]


def _matmul(op: Op, graph: PrecisionGraph) -> float:
    dims = gemm_dims(op, graph)
    if dims is None:
        return 2.0 * _out_numel(op, graph)
    batch, m, n, k = dims
    return 2.0 * batch * m * n * k


def _gemm(op: Op, graph: PrecisionGraph) -> float:
    return _matmul(op, graph) + _out_numel(op, graph)


def _conv(op: Op, graph: PrecisionGraph) -> float:
    w = _shape(graph, op.inputs[1]) if len(op.inputs) > 1 else None
    if not w:
        return 2.0 * _out_numel(op, graph)
    # weight [Cout, Cin/group, k...]: each output element needs Cin/group * prod(k) MACs
    return 2.0 * _out_numel(op, graph) * math.prod(w[1:])


def _conv_transpose(op: Op, graph: PrecisionGraph) -> float:
    w = _shape(graph, op.inputs[1]) if len(op.inputs) > 1 else None
    if not w:
        return 2.0 * _out_numel(op, graph)
    # weight [Cin, Cout/group, k...]: each input element scatters into Cout/group * prod(k) outputs
    return 2.0 * _numel(graph, op.inputs[0]) * math.prod(w[1:])


def _attention(op: Op, graph: PrecisionGraph) -> float:
    q = _shape(graph, op.inputs[0])
    if not q:
        return 2.0 * _out_numel(op, graph)
    if len(q) == 4:  # [B, H, S, D]
        b, h, s, d = q
        return 4.0 * b * h * s * s * d
    b, s, hidden = (q + [1, 1, 1])[:3]
    return 4.0 * b * s * s * hidden + (2.0 * b * s * hidden * 3 * hidden if len(op.inputs) > 1 else 0.0)


def _einsum(op: Op, graph: PrecisionGraph) -> float:
    """Twice the product of the equation's index sizes (one multiply-add per index combination);
    without a readable equation, an upper bound from the operands' sizes (a Longformer's chunked
    ``bcxd,bcyd->bcxy`` was priced 10x over so)."""
    exact = _einsum_by_equation(op, graph)
    if exact is not None:
        return exact
    sizes = [_numel(graph, i) for i in op.inputs if i]
    if len(sizes) < 2:
        return float(_out_numel(op, graph))
    return 2.0 * math.sqrt(float(sizes[0]) * sizes[1] * max(_out_numel(op, graph), 1))


def _einsum_by_equation(op: Op, graph: PrecisionGraph) -> float | None:
    """``_einsum`` from the ``equation`` attribute; None where there is none, it has an ellipsis,
    or an operand's shape is unknown or of another rank."""
    equation = op.attrs.get("equation")
    equation = equation.decode() if isinstance(equation, bytes) else equation
    if not isinstance(equation, str) or "." in equation:
        return None
    terms = equation.replace(" ", "").split("->")[0].split(",")
    inputs = [i for i in op.inputs if i]
    if len(terms) != len(inputs):
        return None
    sizes: dict[str, int] = {}
    for term, name in zip(terms, inputs):
        shape = _shape(graph, name)
        if shape is None or len(shape) != len(term):
            return None
        for letter, size in zip(term, shape):  # a broadcast index is 1 in one operand
            sizes[letter] = max(size, sizes.get(letter, 1))
    product = float(math.prod(sizes.values()))
    return 2.0 * product if len(inputs) > 1 else product


def _rnn(op: Op, graph: PrecisionGraph) -> float:
    x, w = _shape(graph, op.inputs[0]), _shape(graph, op.inputs[1]) if len(op.inputs) > 1 else None
    if not x or not w:
        return 2.0 * _out_numel(op, graph)
    seq, batch = x[0], x[1]
    return 2.0 * seq * batch * math.prod(w) * 2  # input and recurrent GEMMs


def _elementwise(op: Op, graph: PrecisionGraph) -> float:
    return float(_out_numel(op, graph))


def _input_sized(op: Op, graph: PrecisionGraph) -> float:
    return float(_numel(graph, op.inputs[0])) if op.inputs and op.inputs[0] else 0.0


def _none(op: Op, graph: PrecisionGraph) -> float:
    return 0.0


FORMULAS: dict[str, Callable[[Op, PrecisionGraph], float]] = {
    "matmul": _matmul,
    "gemm": _gemm,
    "conv": _conv,
    "conv_transpose": _conv_transpose,
    "attention": _attention,
    "einsum": _einsum,
    "rnn": _rnn,
    "elementwise": _elementwise,
    "softmax": lambda op, g: 5.0 * _input_sized(op, g),
    "norm": lambda op, g: 8.0 * _input_sized(op, g),
    "reduction": _input_sized,
    "pool": lambda op, g: float(_out_numel(op, g)) * 9.0,
    "none": _none,
}


def op_flops(op: Op, graph: PrecisionGraph, formula: str, per_element: float = 1.0) -> float:
    fn = FORMULAS.get(formula, _elementwise)
    flops = fn(op, graph)
    return flops * per_element if formula == "elementwise" else flops


def alignment_dims(op: Op, graph: PrecisionGraph) -> dict[str, int]:
    """The dims tensor cores need aligned: M/N/K for GEMMs, channels for convs."""
    if op.canonical in ("matmul", "gemm"):
        dims = gemm_dims(op, graph)
        if dims is None:
            return {}
        _, m, n, k = dims
        return {"N": n, "K": k}  # M is the batch-like dim; cuBLAS pads it cheaply
    if op.canonical in ("conv", "conv_transpose"):
        w = _shape(graph, op.inputs[1]) if len(op.inputs) > 1 else None
        if not w or len(w) < 2:
            return {}
        group = int(op.attrs.get("group", 1) or 1)
        if group > 1:
            return {}
        return {"C_out": w[0], "C_in": w[1]}
    return {}


def misaligned_dims(op: Op, graph: PrecisionGraph, dtype: str) -> dict[str, int]:
    """The tensor-core dims of ``op`` that are not a multiple of ``dtype``'s granularity (8 for FP16/BF16)."""
    return misaligned(alignment_dims(op, graph), dtype)


def misaligned(dims: dict[str, int], dtype: str) -> dict[str, int]:
    """The dims of ``dims`` (``alignment_dims``' result) that are not aligned for ``dtype``."""
    return {k: v for k, v in dims.items() if not tensor_core_aligned(dtype, v)}


def padded(dim: int, dtype: str) -> int:
    """``dim`` rounded up to ``dtype``'s tensor-core granularity."""
    mult = alignment_multiple(dtype) or 1
    return -(-dim // mult) * mult
