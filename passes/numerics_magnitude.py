"""Numerics rule 11: products of tiny constants, followed forward until a rescale.

A GEMM, convolution or Mul whose multiplicative constant (a weight, a scale) is tiny makes tiny
outputs: for O(1) activations a GEMM's output is about ``max|w| * sqrt(K)`` (K terms of random
sign), a Mul's ``max|c|``. When that lies below the target dtype's smallest normal the outputs
are subnormal there (FP16: below 6.1e-5, with fewer significant bits the smaller they are) or
flush to zero, and a normalisation downstream amplifies the lost digits. The estimate follows
the value through data movement, Relu/Neg and Mul/Div by constants (a rescale by 1e8 brings it
back into range and ends the walk) and through Add/Sub of two such values; every tensor on the
way still below the smallest normal is flagged, so its writer and readers stay FP32, unless
all its uses end in a sum with a value that is not tiny (a layer scale of 1e-6 before a residual
Add), where the lost digits lie below the sum's own spacing. BF16 has
FP32's exponent range: nothing there is flagged for FP16's. All-zero constants (pruned or
zero-initialised layers) make exact zeros and are left alone. See docs/architecture.md, "Numerics".
"""

from __future__ import annotations

import math

from amp_compiler.dtypes import is_float
from amp_compiler.ir import Op, PrecisionGraph, Tensor
from amp_compiler.numerics import DtypeRange
from amp_compiler.registry import CLEAR

#: ops whose output is a product of their inputs (constant operand = a scale or a weight)
_PRODUCTS = frozenset({"matmul", "gemm", "conv", "conv_transpose", "einsum", "mul", "linear"})
#: ops that pass a small magnitude through unchanged
_KEEPS = frozenset({"relu", "neg", "abs", "dropout"})
_SUMS = frozenset({"add", "sub"})
#: input ports that add rather than multiply (Gemm's C, a convolution's bias)
_ADDENDS = {"gemm": (2,), "conv": (2,), "conv_transpose": (2,), "linear": (2,)}


def tiny_products(graph: PrecisionGraph, rng: DtypeRange, label: str) -> dict[str, str]:
    """tensor name -> reason, for values a tiny constant factor keeps below ``rng.min_normal``."""
    size: dict[str, float] = {}  # tensor -> estimated magnitude for O(1) activations
    source: dict[str, str] = {}  # tensor -> the constant behind it
    terms: dict[tuple, tuple | None] = {}  # _product's memo: weights shared by many ops are sized once
    for op in graph.ops.values():  # topological order: one sweep follows every chain
        if op.canonical in _PRODUCTS:
            found = _product(graph, op, size, source, terms)
        elif size:  # nothing flagged yet (most models, always): nothing to carry on
            found = _carried(graph, op, size, source)
        else:
            continue
        if found is None:
            continue
        magnitude, constant = found
        if not magnitude < rng.min_normal:
            continue
        for out in op.outputs:
            if out and is_float(graph.tensors[out].dtype):
                size[out], source[out] = magnitude, constant
    if not size:
        return {}  # nothing tiny (most models): no walk back over the readers
    absorbed: set[str] = set()
    for op in reversed(graph.ops.values()):  # readers first
        absorbed.update(out for out in op.outputs if out in size and _absorbed(graph, out, size, absorbed))
    return {name: (f"values ~{m:.2g} (constant {source[name]} times O(1) activations) lie below the smallest "
                   f"{label} normal {rng.min_normal:.2g}: they would lose their digits or flush to zero")
            for name, m in size.items() if name not in absorbed}


def _absorbed(graph: PrecisionGraph, name: str, size: dict[str, float], absorbed: set[str]) -> bool:
    """Whether every use of the tiny value ``name`` ends in a sum with a value that is not tiny (a
    ConvNeXt layer scale of 1e-6 before its residual Add): there its lost digits are below the
    sum's own spacing, as for the underflowing additive constants of rule 6."""
    t = graph.tensors[name]
    if t.is_graph_output or not t.consumers:
        return False
    for reader_name, _ in t.consumers:
        reader = graph.ops[reader_name]
        if reader.canonical in _SUMS and any(i and i not in size for i in reader.inputs):
            continue
        outs = [o for o in reader.outputs if o]
        if not outs or not all(o in absorbed for o in outs):
            return False
    return True


def _product(graph: PrecisionGraph, op: Op, size: dict[str, float], source: dict[str, str],
             terms: dict[tuple, tuple | None]) -> tuple | None:
    """(output magnitude, constant behind it) of a product with a tiny factor: a nonzero constant
    (times sqrt of the terms a GEMM sums) or an already flagged value; other operands count as O(1)."""
    magnitude, constant = 1.0, None
    for port, name in enumerate(op.inputs):
        if not name or port in _ADDENDS.get(op.canonical, ()):
            continue
        if name in size:
            magnitude, constant = magnitude * size[name], constant or source[name]
            continue
        t = graph.tensors[name]
        if not t.is_constant:
            continue  # an activation: O(1)
        key = (op.canonical, port, name)
        if key not in terms:
            terms[key] = _constant_term(op, port, t)
        term = terms[key]
        if term is None:
            continue
        if term[0] == 0:
            return None  # exact zeros stay exact
        magnitude, constant = magnitude * term[0] * term[1], constant or name
    return (magnitude, constant) if constant else None


def _constant_term(op: Op, port: int, t: Tensor) -> tuple[float, float] | None:
    """(max |c|, sqrt of the terms the product sums) for the constant ``t`` read at ``port`` of an
    op like ``op``; None for one without statistics or not float."""
    s = t.stats if is_float(t.dtype) else None
    if s is None:
        return None
    return s.max_abs, math.sqrt(_reduction_length(op, t.shape or (), port)) if s.max_abs else 0.0


def _reduction_length(op: Op, shape: tuple, port: int) -> int:
    """How many products a GEMM/conv output sums (over-estimated where the layout is not known)."""
    dims = [d for d in shape if isinstance(d, int) and d > 0]
    if not dims or op.canonical == "mul":
        return 1
    if op.canonical in ("conv", "conv_transpose"):
        return max(1, math.prod(dims[1:]))
    if op.canonical == "matmul" and len(dims) >= 2:
        return dims[-2] if port == 1 else dims[-1]
    return max(dims)


def _carried(graph: PrecisionGraph, op: Op, size: dict[str, float], source: dict[str, str]) -> tuple | None:
    """(magnitude, constant) of ``op``'s output when it carries a flagged input's magnitude on."""
    flagged = [i for i in op.inputs if i in size]
    if not flagged:
        return None
    first = flagged[0]
    if op.op_class == CLEAR or op.canonical in _KEEPS:
        return size[first], source[first]
    others = [i for i in op.inputs if i and i not in size]
    if op.canonical in _SUMS:  # a sum is tiny only when every term is
        return (max(size[i] for i in flagged), source[first]) if not others else None
    if op.canonical == "div" and op.inputs and op.inputs[0] == first and len(others) == 1:
        s = graph.tensors[others[0]].stats if graph.tensors[others[0]].is_constant else None
        return (size[first] / s.max_abs, source[first]) if s is not None and s.max_abs > 0 else None
    return None


__all__ = ["tiny_products"]
