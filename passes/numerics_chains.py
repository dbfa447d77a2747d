"""The numerics rules that follow chains of ops (``passes/numerics.py`` rules 7 and 8).

* ``trig_chains``: Sin/Cos/Tan of an argument that is not bounded, and the ops computing
  that argument from integers and constants alone (RoPE's position x inv_freq), stay FP32.
* ``eps_chains``: reduction -> add-eps -> sqrt/rsqrt/reciprocal stays FP32 when eps is below
  the dtype's smallest normal; an output the dtype cannot hold (1/eps) is flagged.
* ``normalisations``: a written-out LayerNorm/RMSNorm's final Div (or Mul by the reciprocal root)
  writes a bounded value: deny propagation stops there as at LayerNormalization; so it does at
  ``ratio_to_own_mean``, a non-negative value over its own mean (ConvNeXt-V2's GRN).
* ``bounded_exp``: an Exp whose argument a constant bounds above, ``exp`` of the bound within the
  dtype's range (SwinV2's ``clamp(logit_scale, max=log(100)).exp()``): its output is no value of unknown
  range, so deny propagation does not start there.
* ``saturating_powers``: a small power (x^2, x^3) whose value reaches only a saturating op
  (tanh, sigmoid, erf) through scaling and shifting is safe in the low dtype: where it
  overflows to inf the saturating op returns its limit, as FP32 does (GELU's tanh form).
The first two read the target dtype's range (docs/architecture.md, "Numerics").
"""

from __future__ import annotations

import math

from amp_compiler.dtypes import is_float
from amp_compiler.ir import PARAMETER, Op, PrecisionGraph
from amp_compiler.numerics import DtypeRange
from amp_compiler.registry import CLEAR
from cost_model.norm_pattern import reciprocal_of

#: ops whose output is bounded whatever their input (what deny propagation and the trig rule stop at)
BOUNDED = frozenset({"tanh", "sigmoid", "hard_sigmoid", "softmax", "erf", "sin", "cos", "layer_norm", "rms_norm",
                     "group_norm", "instance_norm", "batch_norm"})
TRIG = frozenset({"sin", "cos", "tan"})
#: ops that build an angle from positions and frequencies
_ANGLE_OPS = frozenset({"mul", "matmul", "gemm", "einsum", "add", "sub", "div", "neg"})
_ROOTS = frozenset({"sqrt", "rsqrt", "reciprocal"})
#: elementwise ops allowed between the reduction and the root (add eps, scale, cast)
_BETWEEN = frozenset({"add", "mul", "div", "cast", "identity"})
_MAX_CHAIN = 4
#: ops whose output is never negative (norms, roots, magnitudes)
_NON_NEGATIVE = frozenset({"reduce_l2", "reduce_l1", "sqrt", "abs"})
#: a trig argument this large is typical of RoPE at long context (positions up to 2048)
_ANGLE = 2048.0


def trig_chains(graph: PrecisionGraph, rng: DtypeRange, label: str) -> dict[str, str]:
    """op name -> reason for every trig op of unbounded argument and the position math feeding it."""
    out: dict[str, str] = {}
    memo: dict[str, bool] = {}
    for op in graph.ops.values():
        if op.canonical not in TRIG or not op.inputs or not op.inputs[0]:
            continue
        producer = graph.producer(op.inputs[0])
        if producer is not None and producer.canonical in BOUNDED:
            continue
        why = (f"{op.op_type} of an unbounded argument: {label}'s spacing near {_ANGLE:.0f} is "
               f"{rng.spacing(_ANGLE):g}, so the angle is lost")
        out[op.name] = why
        chain: list[str] = []
        if _from_positions(graph, op.inputs[0], memo, chain):
            for name in chain:
                out.setdefault(name, f"computes the argument of {op.name}: {why.split(': ', 1)[1]}")
    return out


def _from_positions(graph: PrecisionGraph, tensor: str, memo: dict[str, bool], chain: list[str]) -> bool:
    """Whether ``tensor`` is computed from integers and constants only; its float ops join ``chain``."""
    if tensor in memo:
        return memo[tensor]
    t = graph.tensors[tensor]
    if t.is_constant or not is_float(t.dtype):
        memo[tensor] = True
        return True
    op = graph.producer(tensor)
    memo[tensor] = False  # until proven (also breaks cycles through subgraph captures)
    if op is None or not (op.canonical in _ANGLE_OPS or op.op_class == CLEAR):
        return False
    if all(_from_positions(graph, i, memo, chain) for i in op.inputs if i):
        memo[tensor] = True
        chain.append(op.name)
        return True
    return False


def eps_chains(graph: PrecisionGraph, rng: DtypeRange, label: str) -> tuple[dict[str, str], dict[str, str]]:
    """(op name -> reason, output tensor -> reason) for reduction -> add-eps -> root chains (rule 8)."""
    ops: dict[str, str] = {}
    tensors: dict[str, str] = {}
    for op in graph.ops.values():
        if op.canonical not in _ROOTS or not op.inputs or not op.inputs[0]:
            continue
        found = _chain_to_reduction(graph, op)
        if found is None:
            continue
        between, eps, reduction = found
        if eps >= rng.min_normal:
            continue
        why = (f"{op.op_type} of a reduction plus eps {eps:.3g}: below {label}'s smallest normal "
               f"({rng.min_normal:.2g}) a variance near zero loses its digits and its reciprocal overflows")
        inverses = _reciprocals_of(graph, op) if op.canonical == "sqrt" else []
        for name in (reduction.name, *between, op.name, *(r.name for r in inverses)):  # a mean is infer
            ops.setdefault(name, why)
        peak = {"sqrt": eps ** 0.5, "rsqrt": eps ** -0.5, "reciprocal": 1.0 / eps}[op.canonical]
        for writer, top in [(op, peak)] + [(r, eps ** -0.5) for r in inverses]:
            if top > rng.max and writer.outputs and writer.outputs[0]:
                tensors[writer.outputs[0]] = f"{writer.name} can reach {top:.3g} (1/eps), beyond the {label} range"
    return ops, tensors


def _reciprocals_of(graph: PrecisionGraph, root: Op) -> list[Op]:
    """The readers of ``root``'s output that take its reciprocal: a Reciprocal (the dynamo exporter's
    ``rsqrt``) or ``Div(1, s)`` (TorchScript's). With the Sqrt they are the chain's ``rsqrt``, and the
    rule holds them as it holds an Rsqrt: an RMSNorm's ``Div(1, s)`` had been reported held by deny
    propagation from the Pow, a rule the value it reads (at least sqrt(eps)) does not need."""
    out = root.outputs[0] if root.outputs else None
    if not out:
        return []
    readers = (graph.ops[name] for name, _ in graph.tensors[out].consumers)
    return [r for r in readers if r.canonical == "reciprocal" or reciprocal_of(graph, r) == out]


def _chain_to_reduction(graph: PrecisionGraph, root: Op) -> tuple[list[str], float, Op] | None:
    """The ops between a reduction and ``root``, the smallest positive constant they add and the
    reduction, or None."""
    between: list[str] = []
    eps = None
    tensor = root.inputs[0]
    for _ in range(_MAX_CHAIN):
        op = graph.producer(tensor)
        if op is None:
            return None
        if _is_reduction(op):
            return (between, eps, op) if eps is not None else None
        if op.canonical not in _BETWEEN or not op.inputs or not op.inputs[0]:
            return None
        between.append(op.name)
        if op.canonical == "add":
            for value in (v for v in _split_eps(graph, op)[0] if v > 0):
                eps = value if eps is None else min(eps, value)
        tensor = next((i for i in op.inputs if i and graph.tensors[i].stats is None), op.inputs[0])
    return None


def normalisations(graph: PrecisionGraph) -> set[str]:
    """Ops that write a written-out normalisation's result (bounded by sqrt(n) like LayerNorm's):
    ``Div(v, Sqrt(mean(v^2) + eps))`` or ``Mul(v, Reciprocal/Rsqrt(...))``, with v the tensor whose
    square was reduced (``x`` for RMSNorm, ``x - mean`` for LayerNorm). Deny propagation stops there."""
    return {op.name for op in graph.ops.values() if writes_normalisation(graph, op)}


def writes_normalisation(graph: PrecisionGraph, op: Op) -> bool:
    """Whether ``op`` is one of ``normalisations``' ops (asked alone by walks that reach few ops)."""
    if op.canonical not in ("div", "mul") or len(op.inputs) != 2 or not all(op.inputs):
        return False
    pairs = [(op.inputs[0], op.inputs[1])] if op.canonical == "div" else [tuple(op.inputs), tuple(op.inputs[::-1])]
    return any(_root_of_squares(graph, scale, value, reciprocal=op.canonical == "mul") for value, scale in pairs)


def ratio_to_own_mean(graph: PrecisionGraph, op: Op) -> bool:
    """Whether ``op`` is ``Div(v, mean(v) + eps)`` (or without eps) of a non-negative ``v``: GRN's
    ``Nx = Gx / (mean(Gx) + eps)`` over ConvNeXt-V2's per-channel norms ``Gx``. Each value is at most
    the number averaged times the mean, so the result is bounded whatever ``v``'s range: deny
    propagation from the norm stops there (``propagate.py``); it had kept each block's ``x * Nx`` and
    residual FP32, casts on both sides (a default ConvNeXt-V2 at 1.00x its FP32 time)."""
    if op.canonical != "div" or len(op.inputs) != 2 or not all(op.inputs):
        return False
    value, divisor = op.inputs
    source = graph.producer(value)
    if source is None or source.canonical not in _NON_NEGATIVE:
        return False
    mean = graph.producer(divisor)
    if mean is not None and mean.canonical == "add":  # + eps
        mean = _past_eps(graph, mean)
    return mean is not None and mean.canonical == "reduce_mean" and mean.inputs[:1] == [value]


def bounded_exp(graph: PrecisionGraph, op: Op, rng: DtypeRange) -> bool:
    """Whether ``op`` is an Exp whose argument a constant bounds above with ``exp`` of the bound within
    ``rng``: its output lies in (0, exp(bound)], a known range, so it seeds no deny propagation
    (``propagate.py``; the Exp itself stays FP32, deny by class). SwinV2's cosine attention scales its
    scores by ``clamp(logit_scale, max=log(100)).exp()``, at most 100: deny propagation from that Exp
    had kept every block's scores ``Mul`` and the bias and mask ``Add``s after it FP32 (39 ops of a
    default SwinV2-tiny)."""
    if op.canonical != "exp" or not op.inputs or not op.inputs[0]:
        return False
    bound = _upper_bound(graph, op.inputs[0])
    return bound is not None and bound <= math.log(rng.max)


def _upper_bound(graph: PrecisionGraph, tensor: str) -> float | None:
    """An upper bound on ``tensor``'s values read off constants: a frozen constant's largest magnitude,
    or the constant maximum of a Clip/Min (ONNX's ``max`` input or attribute, aten's ``clamp`` argument),
    through data movement with one float operand. None where none is found."""
    for _ in range(_MAX_CHAIN):
        if (known := _constant_max(graph, tensor, None)) is not None:
            return known
        op = graph.producer(tensor)
        if op is None:
            return None
        if op.canonical == "clip":
            return _constant_max(graph, op.inputs[2] if len(op.inputs) > 2 else "", op.attrs.get("max"))
        if op.canonical == "min":
            bounds = [_constant_max(graph, i, None) for i in op.inputs if i]
            return min((b for b in bounds if b is not None), default=None)
        floats = [i for i in op.inputs if i and is_float(graph.tensors[i].dtype)]
        if op.op_class != CLEAR or floats != op.inputs[:1]:
            return None
        tensor = floats[0]
    return None


def _constant_max(graph: PrecisionGraph, tensor: str, attribute: float | None) -> float | None:
    """The largest value of a constant operand (an initializer, a Constant node's output; signed where it
    has one element), else ``attribute``. A parameter being trained is none: its value moves."""
    stats = graph.tensors[tensor].stats if tensor else None
    if stats is not None and graph.tensors[tensor].kind != PARAMETER:
        return stats.value if stats.value is not None else stats.max_abs
    return None if attribute is None else float(attribute)


def _past_eps(graph: PrecisionGraph, add: Op) -> Op | None:
    """The producer of what ``add`` adds a constant to, or None where it adds two activations."""
    added, varying = _split_eps(graph, add)
    return graph.producer(varying) if added and varying else None


def _split_eps(graph: PrecisionGraph, add: Op) -> tuple[list[float], str | None]:
    """What an Add adds as eps, one-element constants (ONNX) and scalar arguments (FX), by magnitude,
    and its one other operand (None where there are none or several)."""
    operands = [i for i in add.inputs if i]
    stats = [graph.tensors[i].stats for i in operands]
    added = [st.max_abs for st in stats if st is not None and st.size == 1] + list(add.scalars)
    varying = [i for i, st in zip(operands, stats) if st is None or st.size != 1]
    return added, varying[0] if len(varying) == 1 else None


def _root_of_squares(graph: PrecisionGraph, tensor: str, value: str, reciprocal: bool) -> bool:
    """Whether ``tensor`` is sqrt (1/sqrt when ``reciprocal``) of a reduction over ``value`` squared, plus eps."""
    root = graph.producer(tensor)
    if root is None:
        return False
    if reciprocal and root.canonical == "reciprocal" and root.inputs and root.inputs[0]:
        root = graph.producer(root.inputs[0])
        reciprocal = False
    elif reciprocal and (divisor := reciprocal_of(graph, root)) is not None:  # Div(1, d): TorchScript's rsqrt
        root = graph.producer(divisor)
        reciprocal = False
    if root is None or root.canonical != ("rsqrt" if reciprocal else "sqrt"):
        return False
    found = _chain_to_reduction(graph, root)
    square = graph.producer(found[2].inputs[0]) if found and found[2].inputs and found[2].inputs[0] else None
    return square is not None and square.canonical in ("pow", "mul") and value in square.inputs and (
        square.canonical == "mul" and square.inputs[0] == square.inputs[1] or _exponent(graph, square) == 2.0)


#: ops a mask value flows through on its way to the scores (where, add, sub, mul, neg, data movement)
_MASK_FLOW = frozenset({"where", "add", "sub", "mul", "neg", "expand", "unsqueeze", "reshape", "squeeze", "view",
                        "transpose", "slice", "concat", "identity", "tile", "broadcast_to", "cast"})
_MASK_SINKS = frozenset({"softmax", "log_softmax"})
_MASK_WALK = 4096
#: tests whose answer is the same for any finite value: a finite fill, clamped or not, reads alike
_NONFINITE_TESTS = frozenset({"is_inf", "is_na_n"})
_EQUALITY_TESTS = frozenset({"equal", "not_equal"})


def mask_flow(graph: PrecisionGraph, tensor: str) -> set[str] | None:
    """The ops ``tensor``'s value flows through into Softmax/LogSoftmax inputs, sinks included, when
    that is all it reaches (rule 10: a mask fill); None when it reaches anything else. A test of the
    value against infinity is no reader of it (``tests_for_infinity``): it is passed over."""
    return _walk_to_sinks(graph, tensor, _MASK_SINKS, lambda reader, t: reader.canonical in _MASK_FLOW, _MASK_WALK,
                          ignores=tests_for_infinity)


def tests_for_infinity(graph: PrecisionGraph, reader: Op, tensor: str) -> bool:
    """Whether ``reader`` only asks if ``tensor`` is infinite or NaN: IsInf/IsNaN, or Equal/NotEqual
    with an infinite scalar or one-element constant. Its boolean answer is the same for a mask fill
    stored clamped (-32768) as for finfo.min, both finite: torch's SDPA decomposition guards fully
    masked rows with ``eq(scores + mask, -inf)`` (a T5's relative-position mask on the torch path kept
    every attention's mask Add and Softmax FP32, and the casts around them its score GEMMs)."""
    if reader.canonical in _NONFINITE_TESTS:
        return True
    if reader.canonical not in _EQUALITY_TESTS:
        return False
    others = [graph.tensors[i].stats for i in reader.inputs if i and i != tensor]
    return any(math.isinf(s) for s in reader.scalars) or \
        any(s is not None and s.value is not None and math.isinf(s.value) for s in others)


def _walk_to_sinks(graph: PrecisionGraph, tensor: str, sinks: frozenset[str], passes, limit: int,
                   ignores=None) -> set[str] | None:
    """Every op reached from ``tensor`` through readers ``passes(reader, tensor)`` lets through, up to
    ops in ``sinks``; None when a path ends anywhere else (a graph output, another op, ``limit`` ops).
    Readers ``ignores(graph, reader, tensor name)`` accepts end their path without counting."""
    frontier, ops = [tensor], set()
    while frontier:
        t = graph.tensors[frontier.pop()]
        if t.is_graph_output or not t.consumers:
            return None
        for name, _ in t.consumers:
            reader = graph.ops[name]
            if reader.canonical in sinks:
                ops.add(name)
                continue
            if name in ops or (ignores is not None and ignores(graph, reader, t.name)):
                continue
            if not passes(reader, t) or len(ops) >= limit:
                return None
            ops.add(name)
            frontier += [out for out in reader.outputs if out]
    return ops if any(graph.ops[o].canonical in sinks for o in ops) else None


def mask_sentinel(graph: PrecisionGraph, tensor: str) -> bool:
    """Whether ``tensor``'s value reaches only Softmax/LogSoftmax inputs (rule 10): a mask fill."""
    return mask_flow(graph, tensor) is not None


#: ops whose output tends to a finite limit as their input tends to +-inf
SATURATING = frozenset({"tanh", "sigmoid", "erf"})
#: scale and shift: an inf operand (from one source only) stays inf of a known sign
_SCALE_SHIFT = frozenset({"mul", "add", "sub", "div"})
_SMALL_POWERS = (2.0, 3.0)


def saturating_powers(graph: PrecisionGraph) -> dict[str, str]:
    """pow op name -> reason, for powers whose overflow is saturated downstream (rule 9)."""
    out: dict[str, str] = {}
    for op in graph.ops.values():
        if op.canonical != "pow" or not op.outputs or not op.outputs[0] or _exponent(graph, op) not in _SMALL_POWERS:
            continue
        sink = _only_into_saturation(graph, op.outputs[0])
        if sink is not None:
            out[op.name] = (f"infer: its only use is through scale and shift into {sink}, which saturates: "
                            f"where the power overflows to inf the result is the same limit as in FP32")
    return out


def _exponent(graph: PrecisionGraph, op: Op) -> float | None:
    """The constant exponent of a Pow (a one-element constant in ONNX, a scalar argument in aten:
    a float in ``scalars``, an int in ``attrs["exponent"]``)."""
    if len(op.inputs) > 1 and op.inputs[1]:
        s = graph.tensors[op.inputs[1]].stats
        return s.max_abs if s is not None and s.size == 1 else None
    return op.scalars[0] if len(op.scalars) == 1 else op.attrs.get("exponent")


def _only_into_saturation(graph: PrecisionGraph, tensor: str) -> str | None:
    """The saturating op every path from ``tensor`` ends in through scale/shift ops that read the
    value once (so no inf - inf), or None."""
    ops = _walk_to_sinks(graph, tensor, SATURATING, lambda reader, t: reader.canonical in _SCALE_SHIFT and sum(
        1 for i in reader.inputs if i == t.name) == 1, _MAX_CHAIN)
    if ops is None:
        return None
    return "/".join(sorted({graph.ops[o].op_type for o in ops if graph.ops[o].canonical in SATURATING}))


def _is_reduction(op: Op) -> bool:
    c = op.canonical or ""
    return c == "var_mean" or c.startswith("reduce_") and c not in ("reduce_max", "reduce_min")


__all__ = ["BOUNDED", "SATURATING", "TRIG", "bounded_exp", "eps_chains", "mask_flow", "mask_sentinel", "normalisations", "ratio_to_own_mean",
           "writes_normalisation",
           "saturating_powers", "trig_chains"]
