"""Numerics rule 12: a centring mean stays FP32 (docs/architecture.md, "Numerics").

``x - mean(x)`` (a LayerNorm, GroupNorm or InstanceNorm written out, a variance's deviations)
subtracts two nearly equal values: the low dtype's rounding of the mean (FP16: 2^-11 of |mean|)
becomes the error of a difference that can be far smaller than the mean. That mean and the Sub
stay FP32, with the data movement between them. A mean read any other way (global pooling,
squeeze-excitation, a mean over tokens) stays infer.
"""

from __future__ import annotations

from collections.abc import Iterator

from amp_compiler.ir import Op, PrecisionGraph
from amp_compiler.numerics import DtypeRange

#: ops that pass a value on unchanged (or only reshaped, broadcast or cast) through input 0
_SAME_VALUES = frozenset({"reshape", "squeeze", "unsqueeze", "flatten", "identity", "expand", "cast"})
_MAX_WALK = 4


def centrings(graph: PrecisionGraph, rng: DtypeRange, label: str) -> dict[str, str]:
    """op name -> reason for each mean subtracted from the values it averages, its Sub and the
    data movement between them (rule 12)."""
    out: dict[str, str] = {}
    for op in graph.ops.values():
        if op.canonical != "reduce_mean" or not op.inputs or not op.inputs[0] or not op.outputs or not op.outputs[0]:
            continue
        source = _source(graph, op.inputs[0])
        for sub, mean_side, between in _subtractions(graph, op.outputs[0]):
            if not any(i and i != mean_side and _source(graph, i) == source for i in sub.inputs):
                continue
            why = (f"centring (x - mean(x)): {sub.name} subtracts this mean from the values it averages; the "
                   f"error of rounding the mean to {label}'s {rng.bits + 1} bits stays whole in a difference far "
                   f"smaller than the mean")
            for name in (op.name, *between, sub.name):
                out.setdefault(name, why)
    return out


def _source(graph: PrecisionGraph, tensor: str) -> str:
    """The tensor whose values ``tensor`` carries, back through reshapes, broadcasts and casts."""
    for _ in range(_MAX_WALK):
        op = graph.producer(tensor)
        if op is None or op.canonical not in _SAME_VALUES or not op.inputs or not op.inputs[0]:
            break
        tensor = op.inputs[0]
    return tensor


def _subtractions(graph: PrecisionGraph, tensor: str) -> Iterator[tuple[Op, str, tuple[str, ...]]]:
    """(Sub op, the operand it reads ``tensor``'s value as, the ops on the way) for each Sub reading
    ``tensor`` directly or through reshapes, broadcasts and casts."""
    frontier: list[tuple[str, tuple[str, ...]]] = [(tensor, ())]
    for _ in range(_MAX_WALK + 1):
        following = []
        for t, between in frontier:
            for name, port in graph.tensors[t].consumers:
                reader = graph.ops[name]
                if reader.canonical == "sub":
                    yield reader, t, between
                elif reader.canonical in _SAME_VALUES and port == 0 and reader.outputs and reader.outputs[0]:
                    following.append((reader.outputs[0], (*between, name)))
        frontier = following


__all__ = ["centrings"]
