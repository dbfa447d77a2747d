"""Numerics: flag what the target low dtype cannot hold, for both paths alike.

Runs right after classify. The importers recorded raw facts only (constants' ``ValueStats``,
ops' float scalar arguments, calibrated peaks); every rule here reads the target dtype's
range (``amp_compiler.numerics.RANGES``: BF16 has FP32's exponent range, so a BF16 plan never
keeps an op FP32 for FP16's range).

Rewrite cases (they set ``Tensor.low_unsafe`` / ``Op.forbid_low``; the propagate pass keeps
every op reading or writing a flagged value through a unit port in FP32):

1. A float constant with a finite value beyond the dtype's max, or with 1 % or more of its
   nonzero values below the dtype's smallest subnormal (they would flush to zero), is flagged.
2. An op with a float scalar argument beyond the dtype's max (FX: ``full(..., -3.4e38)``,
   the usual attention-mask fill) is forbidden the low dtype and its outputs are flagged. A clamp
   whose scalar minimum is below the dtype's smallest subnormal (``F.normalize``'s
   ``clamp_min(norm, 1e-12)``; Clip-6's ``min``) has its outputs flagged as rule 1 flags that
   minimum stored as a constant: the floor would flush to zero and a zero norm divide 0 by 0.
3. A calibrated activation (``calibrated_peak``) above ``max / ctx.calibration_margin``, or
   nonzero yet below the dtype's smallest normal (every value subnormal), is flagged.
4. QDQ units: an op reading a DequantizeLinear output or feeding a QuantizeLinear keeps its
   source dtype, so runtimes can still fuse the pattern into an integer kernel; so do the Cast
   of a MatMulInteger/ConvInteger accumulator and the Mul by its scale (dynamic quantization).
5. Value flow: a flag follows the value through data movement (clear ops other than casts)
   and ``VALUE_FLOW`` ops, whose outputs carry their inputs' extremes, so no op on the way
   casts it to the low dtype (where it would become inf).
6. A constant flagged only because its values flush to zero does not veto a reader that
   adds it (Add/Sub, a Conv/Gemm bias): BN-folded biases of 1e-9 vanish beside their addend.
   Readers are found through data movement; deny ops and a training step's ops after the unscale
   markers (the optimizer's update) read the FP32 copy and do not count.
7. Trigonometric functions (Sin, Cos, Tan) of an argument that is not bounded stay FP32, and
   so do the ops computing that argument from integers and constants alone (RoPE: position x
   inv_freq): the dtype's spacing near 2048 (2 in FP16, 16 in BF16) loses the angle.
8. A reduction -> add-eps -> sqrt/rsqrt/reciprocal chain, the reduction (a mean too) included,
   stays FP32 when eps is below the dtype's smallest normal (a variance near zero plus eps would
   be subnormal, its reciprocal overflow); an output that overflows the dtype (1/eps) is flagged
   like a constant.
9. A small power (x^2, x^3: deny by class) whose value reaches only saturating ops (tanh,
   sigmoid, erf) through scale and shift becomes infer: where it overflows to inf the
   saturating op returns its limit, exactly as in FP32 (GELU's tanh form: x + 0.044715 x^3).
   A Pow the user denied by name stays deny.
10. A mask sentinel: an initializer with values beyond the dtype's range (``finfo.min``) whose
   value reaches only Softmax/LogSoftmax inputs through value flow (Where, Add, Sub, Mul,
   data movement) is not flagged but stored clamped to the dtype's largest power of two
   (FP16: 32768), in FP32 and low copies alike: ``exp`` of either is 0 beside any unmasked
   score; a score below 2^-12 of it (FP16: 8) added to it rounds back to it, so a fully masked
   row is the uniform average FP32 gives (an -inf fill makes it NaN, a fill off a power of two
   turns score noise into a near one-hot row); scores up to the rest of the range added to it
   stay finite. The report lists each one (``summary["saturated_constants"]``). An op whose
   scalar argument is such a fill (FX: ``scalar_tensor``, ``masked_fill``, ``full`` of
   ``finfo.min``) is not forbidden the low dtype either; the FX emitter writes the argument clamped.
   A test of the value against infinity (SDPA's decomposition: ``eq(scores, -inf)``) reads a clamped
   fill as it reads finfo.min, and is passed over (``numerics_chains.tests_for_infinity``).
   Nor is a calibrated activation (rule 3) that such a fill flows into and that reaches only
   Softmax inputs: calibration ran the FP32 model with the fill unclamped (3.4e38 in a dynamo
   GPT-NeoX's mask), which the converted model never holds; with ``--calibrate`` GPT-NeoX,
   StableLM and Speech2Text were planned all FP32.
11. A product with a tiny constant factor (a GEMM/conv weight or a Mul scale whose max |c| times
   sqrt of the terms summed lies below the dtype's smallest normal) writes values that O(1)
   activations leave below it too; that magnitude is followed forward (data movement, Relu,
   Mul/Div by constants, sums of such values) until a rescale lifts it, and every value on
   the way is flagged like a constant (``numerics_magnitude.py``).
12. Centring: a mean whose output is subtracted from the values it averages (``x - mean(x)``,
   through reshapes, broadcasts and casts: written-out LayerNorm/GroupNorm/InstanceNorm, a
   variance's deviations) stays FP32 with that Sub: the difference can be far smaller than the
   mean, and would keep the whole error of the mean's rounding (``numerics_centring.py``). Any
   other mean (pooling, squeeze-excitation, a mean over tokens) is infer.
13. Unscaled attention scores: a product of two activations (``q @ k^T``) that reaches a
   Softmax with no Mul/Div by a static value on the scores or on either operand stays FP32,
   with the ops to the softmax and the softmax, for dtypes with FP16's range: without the
   ``1/sqrt(d)`` the scores grow with the activations past 65504 (HF's GPT-Neo computes these
   in FP32 for that reason; ``numerics_attention.py``).
14. Log-probabilities a loss reads: a LogSoftmax whose output reaches a loss (NLL, softmax
   cross-entropy) through data movement stays FP32, for every low dtype, as torch autocast and
   Apex keep ``log_softmax`` and transformers' causal LMs upcast their logits before the loss:
   the loss and the gradient it seeds would carry the rounding of each log-probability (near
   -10, FP16's spacing is 0.008 and BF16's 0.06).
"""

from __future__ import annotations

import math

from amp_compiler.dtypes import is_float, short
from amp_compiler.ir import Op, PrecisionGraph, Tensor
from amp_compiler.numerics import RANGES, DtypeRange
from amp_compiler.registry import CLEAR, DENY, INFER

from .numerics_attention import unscaled_attention
from .numerics_centring import centrings
from .numerics_chains import eps_chains, mask_sentinel, saturating_powers, trig_chains
from .numerics_magnitude import tiny_products

from .base import Pass, PassResult, PlanContext, check, unclassified
from .propagate import after_unscale
from .result import NumericsFlags

#: ops whose output carries their inputs' extreme values
VALUE_FLOW = frozenset({"where", "add", "sub", "mul", "neg", "min", "max", "clip"})
#: share of nonzero values below the smallest subnormal that flags a constant (1 %)
FLUSH_SHARE = 0.01
QDQ_KEEP = ("in a QDQ (quantized) unit: kept in its source dtype so that runtimes can still fuse "
            "DequantizeLinear -> op -> QuantizeLinear into an int8 kernel")
#: rule 4's reason for what feeds a DynamicQuantizeLinear, through data movement
QUANTIZER_INPUT_KEEP = ("feeds a DynamicQuantizeLinear (dynamic quantization): kept in its source dtype, as its "
                        "int8 rounding flips where the value it reads is rounded to FP16 first")
#: rule 4's reason for a dynamic quantization's rescale, which is no QDQ unit (no DequantizeLinear)
RESCALE_KEEP = ("rescale of an integer GEMM's int32 accumulator (dynamic quantization): kept FP32, as ONNX "
                "Runtime fuses MatMulInteger -> Cast -> Mul into MatMulIntegerToFloat; in FP16 the accumulator "
                "alone can pass 65504")
_QDQ = ("QuantizeLinear", "DequantizeLinear")
_INTEGER_GEMMS = ("MatMulInteger", "ConvInteger")


class NumericsPass(Pass):
    name = "numerics"

    def requires(self, graph: PrecisionGraph, ctx: PlanContext) -> None:
        check(self.name, "requires", unclassified(graph), "every op has a class (run classify first)")
        if ctx.low_dtype not in RANGES:
            raise ValueError(f"no numeric range known for {ctx.low_dtype!r}: use float16 or bfloat16")

    def call(self, graph: PrecisionGraph, ctx: PlanContext) -> PassResult:
        rng, label = RANGES[ctx.low_dtype], short(ctx.low_dtype).upper()
        tensors: dict[str, str] = {}
        ops: dict[str, str] = {}
        saturated: dict[str, str] = {}
        calibrated: dict[str, str] = {}
        unscaled = after_unscale(graph)  # a training step's optimizer update: FP32 whatever the plan
        for t in graph.tensors.values():  # 1, 3, 6, 10
            if t.stats is None and t.calibrated_peak is None:
                continue  # no value statistics, no calibrated peak: no rule here reads it
            why = constant_reason(t, rng, label) if not _only_added(graph, t, rng, unscaled) else None
            if why and t.origin in ("initializer", "constant") and t.stats.max_abs > rng.max and \
                    mask_sentinel(graph, t.name):  # a Constant node's value too (the TorchScript exporter's fill)
                t.saturate_to, why = mask_fill(rng), None
                saturated[t.name] = (f"{t.origin} {t.name} (max |w| = {t.stats.max_abs:.3g}) only masks softmax "
                                     f"inputs: stored as +-{t.saturate_to:.5g}, {label}'s largest power of two: "
                                     f"scores added to it stay finite, and a fully masked row uniform as in FP32")
            if why:
                tensors[t.name] = why
            elif why := calibrated_reason(t, rng, label, ctx.calibration_margin):
                calibrated[t.name] = why
        for op in (op for op in graph.ops.values() if op.scalars):
            big = next((s for s in op.scalars if abs(s) != float("inf") and abs(s) > rng.max), None)
            if big is not None:  # 2
                outs = [out for out in op.outputs if out]
                if outs and all(mask_sentinel(graph, out) for out in outs):  # 10: a mask fill in an argument
                    for out in outs:
                        graph.tensors[out].saturate_to = mask_fill(rng)
                        saturated[out] = (f"{op.name}: argument {big:.3g} only masks softmax inputs: written as "
                                          f"+-{mask_fill(rng):.5g}, {label}'s largest power of two")
                    continue
                ops[op.name] = f"{op.name}: argument {big:.3g} is beyond the {label} range"
                for out in op.outputs:
                    if out:
                        tensors.setdefault(out, ops[op.name])
        for op in graph.ops.values():  # 2: a clamp's floor that flushes to zero
            if (why := flushed_floor(op, rng, label)) is not None:
                for out in op.outputs:
                    if out:
                        tensors.setdefault(out, why)
        masked = dict.fromkeys(saturated, "")  # 3 and 10: what a stored-clamped fill flows into
        _follow_value_flow(graph, masked)
        for name, why in calibrated.items():
            if name not in masked or not mask_sentinel(graph, name):
                tensors.setdefault(name, why)
        for name, why in qdq_members(graph).items():  # 4
            ops.setdefault(name, why)
        for name, why in trig_chains(graph, rng, label).items():  # 7
            ops.setdefault(name, why)
        chain_ops, overflowing = eps_chains(graph, rng, label)  # 8
        for name, why in chain_ops.items():
            ops.setdefault(name, why)
        for name, why in overflowing.items():
            tensors.setdefault(name, why)
        for name, why in centrings(graph, rng, label).items():  # 12
            ops.setdefault(name, why)
        for name, why in unscaled_attention(graph, rng, label).items():  # 13
            ops.setdefault(name, why)
        for name in loss_log_probs(graph):  # 14
            ops.setdefault(name, LOSS_LOG_PROBS)
        _follow_value_flow(graph, tensors)  # 5
        for name, why in tiny_products(graph, rng, label).items():  # 11: after 5, which would pass a rescale
            tensors.setdefault(name, why)
        changed = False
        for name, why in saturating_powers(graph).items():  # 9
            op = graph.ops[name]
            if op.op_class == DENY and "by the user" not in (op.reason or ""):
                op.op_class, op.reason, changed = INFER, why, True
        for name, why in tensors.items():
            t = graph.tensors[name]
            changed |= t.low_unsafe != why
            t.low_unsafe = why
        for name, why in ops.items():
            op = graph.ops[name]
            if op.forbid_low is None:
                op.forbid_low, changed = why, True
        qdq = sum(1 for why in ops.values() if why in (QDQ_KEEP, RESCALE_KEEP, QUANTIZER_INPUT_KEEP))
        details = f"{len(tensors)} values beyond {label}'s range, {len(ops) - qdq} ops kept FP32 by a numerics " \
                  f"rule, {qdq} ops in QDQ units, {len(saturated)} mask sentinels stored as +-{mask_fill(rng):.5g}"
        return PassResult(graph, changed or bool(saturated), details, NumericsFlags(tensors, ops, saturated))


#: (canonical op, input port) pairs that add their operand: an operand flushed to zero changes nothing
_ADDITIVE_PORTS = {"conv": (2,), "conv_transpose": (2,), "gemm": (2,)}
_ADDITIVE_OPS = frozenset({"add", "sub", "bias_add"})


def mask_fill(rng: DtypeRange) -> float:
    """The magnitude a mask sentinel is stored at (rule 10): the dtype's largest power of two, where
    the spacing (below it 2^-11 of it in FP16, above 2^-10) absorbs any score below 2^-12 of it."""
    return 2.0 ** math.floor(math.log2(rng.max))


def _only_added(graph: PrecisionGraph, t: Tensor, rng: DtypeRange, unscaled: set[str]) -> bool:
    """Whether ``t`` is a constant whose only trouble is underflow, read only as an addend (rule 6):
    through data movement (a training graph's ``detach`` of a parameter, views), and leaving out
    readers FP32 whatever the plan: deny ops (a training step's optimizer update) and those after
    the loss scale's unscale markers (``unscaled``). Before, AdamW's weight-decay and skip-step
    reads of a GPT-2 bias with a few entries below FP16's smallest subnormal kept its c_attn GEMM
    FP32 (their FP32 copy was never in question)."""
    s = t.stats
    if s is None or s.max_abs > rng.max or not t.consumers:
        return False
    frontier, seen, added = [t.name], set(), False
    while frontier:
        for name, port in graph.tensors[frontier.pop()].consumers:
            op = graph.ops[name]
            canonical = op.canonical or ""
            if name in unscaled or op.op_class == DENY or (name, port) in seen:
                continue  # FP32 whatever the plan: it reads the FP32 copy
            seen.add((name, port))
            if canonical in _ADDITIVE_OPS or port in _ADDITIVE_PORTS.get(canonical, ()):
                added = True
            elif op.op_class == CLEAR and canonical != "cast" and canonical not in VALUE_FLOW:
                frontier += [o for o in op.outputs if o]  # the same values, moved
            else:
                return False
    return added


def flushed_floor(op: Op, rng: DtypeRange, label: str) -> str | None:
    """Why a clamp's scalar minimum cannot be held in the dtype of range ``rng`` (rule 2), or None: a
    nonzero ``min`` (Clip-6's attribute, aten's clamp argument as the FX importer keeps it) below the
    smallest subnormal flushes to zero. On the ONNX path the same minimum is a constant (rule 1); on the
    torch path ``F.normalize``'s Div had been reported held by deny propagation from its norm."""
    floor = op.attrs.get("min") if op.canonical == "clip" else None
    if not floor or abs(floor) >= rng.tiny:
        return None
    return (f"{op.name}: argument min={floor:.3g} is below the smallest {label} subnormal and would flush "
            f"to zero: the clamp would no longer keep its output off 0")


def constant_reason(t: Tensor, rng: DtypeRange, label: str) -> str | None:
    """Why the constant ``t`` cannot be stored in the dtype of range ``rng`` (rule 1), or None."""
    s = t.stats
    if s is None:
        return None
    what = f"{t.origin or 'constant'} {t.name}"
    if s.max_abs > rng.max:
        return f"{what} has values beyond the {label} range (max |w| = {s.max_abs:.3g})"
    tiny = s.below(rng.tiny)
    if tiny and tiny >= FLUSH_SHARE * s.nonzero:
        return (f"{what}: {tiny} of {s.nonzero} nonzero values are below the smallest {label} subnormal "
                f"and would flush to zero")
    return None


def calibrated_reason(t: Tensor, rng: DtypeRange, label: str, margin: float) -> str | None:
    """Why the calibrated activation ``t`` cannot be held in the dtype (rule 3), or None."""
    peak = t.calibrated_peak
    if peak is None:
        return None
    if peak > rng.max / margin:
        return f"activation {t.name} reaches {peak:.3g} on the calibration data ({label} max {rng.max:.5g})"
    if 0 < peak < rng.min_normal:
        return (f"activation {t.name} peaks at {peak:.3g} on the calibration data: in {label} every value "
                f"would be subnormal (below {rng.min_normal:.2g}), losing precision or flushing to zero")
    return None


def qdq_members(graph: PrecisionGraph) -> dict[str, str]:
    """Ops reading a DequantizeLinear output or feeding a QuantizeLinear, and an integer GEMM's
    rescale (rule 4), each with its reason (the first found)."""
    names: dict[str, str] = {}
    for op in graph.ops.values():
        if op.op_type in _INTEGER_GEMMS and op.outputs and op.outputs[0]:
            for name in _rescale_of(graph, op.outputs[0]):
                names.setdefault(name, RESCALE_KEEP)
        elif op.op_type == "DynamicQuantizeLinear" and op.inputs and op.inputs[0]:
            for name in _feeding(graph, op.inputs[0]):
                names.setdefault(name, QUANTIZER_INPUT_KEEP)
        elif op.op_type == "DequantizeLinear" and op.outputs and op.outputs[0]:
            for c, _ in graph.tensors[op.outputs[0]].consumers:
                if graph.ops[c].op_type not in _QDQ:
                    names.setdefault(c, QDQ_KEEP)
        elif op.op_type == "QuantizeLinear" and op.inputs and op.inputs[0]:
            producer = graph.producer(op.inputs[0])
            if producer is not None and producer.op_type not in _QDQ:
                names.setdefault(producer.name, QDQ_KEEP)
    return names


#: rule 14's reason
LOSS_LOG_PROBS = ("log-probabilities a loss reads: kept FP32, as torch autocast keeps log_softmax, so the loss "
                  "and the gradient it seeds carry no rounding of them")
_LOSSES = frozenset({"negative_log_likelihood_loss", "softmax_cross_entropy_loss"})


def loss_log_probs(graph: PrecisionGraph) -> list[str]:
    """The LogSoftmax ops whose output a loss reads, back through data movement (rule 14)."""
    found = []
    for op in graph.ops.values():
        if op.canonical in _LOSSES and op.inputs and op.inputs[0]:
            found += [name for name in _feeding(graph, op.inputs[0]) if graph.ops[name].canonical == "log_softmax"]
    return found


def _feeding(graph: PrecisionGraph, tensor: str) -> list[str]:
    """The ops that compute ``tensor``: back through data movement (Reshape, Transpose, ...) to the
    first op that computes (a quantize_dynamic GPT-2's attention context MatMul: in FP16 it failed
    validation, 1.2e-2, from the quantizer's flipped roundings alone)."""
    names, frontier = [], [tensor]
    while frontier:
        op = graph.producer(frontier.pop())
        if op is None or op.name in names or op.op_type in _QDQ or op.op_type == "DynamicQuantizeLinear":
            continue
        names.append(op.name)
        if op.op_class == CLEAR and op.canonical != "cast":
            frontier += [i for i in op.inputs[:1] if i and is_float(graph.tensors[i].dtype)]
    return names


def _rescale_of(graph: PrecisionGraph, accumulator: str) -> list[str]:
    """The Cast of an integer GEMM's int32 accumulator to float and the Muls by its scales
    (``quantize_dynamic``'s pattern, which ONNX Runtime fuses into MatMulIntegerToFloat): in FP16
    the cast alone can pass 65504 (127 x 127 x 64 already does)."""
    names, frontier = [], [accumulator]
    while frontier:
        for consumer, _ in graph.tensors[frontier.pop()].consumers:
            op = graph.ops[consumer]
            if op.op_type in ("Cast", "Mul") and consumer not in names and (op.op_type == "Mul" or not names):
                names.append(consumer)
                frontier += [o for o in op.outputs if o and op.op_type == "Cast"]
    return names


def carries_values(op: Op) -> bool:
    """Whether ``op``'s float outputs carry its inputs' extreme values (rule 5)."""
    return op.op_class == CLEAR and op.canonical != "cast" or op.canonical in VALUE_FLOW


def _follow_value_flow(graph: PrecisionGraph, flagged: dict[str, str]) -> None:
    if not flagged:
        return  # nothing to follow
    for op in graph.ops.values():  # topological order: one sweep reaches every descendant
        if not carries_values(op):
            continue
        why = next((flagged[i] for i in op.inputs if i in flagged), None)
        if why is None:
            continue
        for out in op.outputs:
            if out and is_float(graph.tensors[out].dtype):
                flagged.setdefault(out, why)


__all__ = ["NumericsPass", "VALUE_FLOW", "mask_fill", "calibrated_reason", "constant_reason", "flushed_floor", "qdq_members"]
