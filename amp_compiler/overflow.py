"""Validation's overflow check: values the converted model holds in FP16 that overflow there.

ONNX Runtime's CPU provider runs FP16 ops it has no kernel for in FP32 and keeps the chain
between them in FP32, so an FP16 MatMul whose result passes 65504 (a T5 FFN's ``wo``) gives
the FP32 answer on the CPU and ``inf`` on a GPU: ``--validate`` passed such a model. Exposed as
a graph output, an FP16 value is cast to FP16 where the runtime computed it in FP32, so the
overflow shows there. Both models run once with the main graph's shared float values exposed;
a value finite in the FP32 run and not finite in the converted run is an overflow (a clamped
mask fill stays finite; an ``-inf`` fill is ``-inf`` in both), unless every path from it runs
through scale and shift into a saturating op, which returns its limit as in FP32 (numerics rule 9:
GELU's tanh form, whose ``x³`` overflows in a Flan-T5). An FP16 value of a main-graph ``Loop``/``Scan``
body cannot be exposed: it overflows where its per-iteration peak in the FP32 run
(``onnx_io/body_peaks.py``) passes 65504. docs/architecture.md, "Numerics".
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from onnx import ModelProto, TensorProto

from .onnx_io.body_peaks import LOOPS, body_peaks_exposed
from .onnx_io.probe import run_exposed
from .onnx_io.taken_branches import inline_taken_branches

#: ops an inf passes through unchanged in sign (each reading it once), and ops that saturate it (rule 9)
_SCALE_SHIFT = frozenset("Mul Div Add Sub Neg Cast Identity Reshape Transpose Squeeze Unsqueeze".split())
_SATURATING = frozenset("Tanh Sigmoid Erf HardSigmoid Softsign".split())
_MAX_CHAIN = 8


def shared_values(original: ModelProto, converted: ModelProto, fp16: set[str]) -> dict[str, str]:
    """Main-graph node outputs of ``converted`` in FP16 (``fp16``: its FP16 values) -> the name
    ``original`` has them under: their own; a graph output's where the conversion renamed its writer's
    output and cast it back (``passes/casts.py``: ``logits_fp16`` -> ``logits``); or, for an inserted
    cast to FP16, its source's (a graph input's values beyond 65504 are inf from its first cast on)."""
    computed = {o for n in original.graph.node for o in n.output if o}
    known = computed | {i.name for i in original.graph.input}
    outputs = {o.name for o in converted.graph.output}
    renamed = {}
    for n in converted.graph.node:
        if n.op_type != "Cast" or not n.output or n.output[0] in known:
            continue
        if n.output[0] in outputs and n.input[0] not in computed:
            renamed[n.input[0]] = n.output[0]
        elif n.input[0] in known:
            renamed[n.output[0]] = n.input[0]
    return {o: o if o in computed else renamed[o] for n in converted.graph.node for o in n.output
            if (o in computed or o in renamed) and o in fp16}


def runnable(model: ModelProto) -> bool:
    """Whether ``model`` runs from memory: no tensor kept in external data."""
    return not any(t.data_location == TensorProto.EXTERNAL for t in model.graph.initializer)


def probed_runs(original: ModelProto, converted: ModelProto, feeds: dict, converted_feeds: dict,
                runner: Callable, converted_runner: Callable | None = None) -> tuple[list, list, list[dict]]:
    """(FP32 outputs, converted outputs, overflow rows) from one exposed run of each model
    (``converted_runner``, if given, runs the converted one). The ``If`` branches the feeds take are
    checked too (``onnx_io/taken_branches.py``: a merged decoder's GEMMs are all in branches).

    A row: the value's name (``value``: in the converted model), its writer, its largest magnitude in the FP32 run where it is not finite
    in the converted one, and ``origin``: its writer reads no exposed value that is not finite (it
    overflows itself, rather than an inf reaching it: the reference runtime carries infs downstream).
    """
    original, converted = inline_taken_branches(original, feeds), inline_taken_branches(converted, converted_feeds)
    from .onnx_io.validation import infer_types

    fp16 = {name for name, (code, _) in infer_types(converted).items() if code == TensorProto.FLOAT16}
    names = shared_values(original, converted, fp16)
    in_bodies = body_values(original, converted, fp16)
    inputs = {i.name for i in original.graph.input}
    with body_peaks_exposed(original, in_bodies.values()) as peaks:
        expected = {**run_exposed(original, sorted(set(names.values()) - inputs) + list(peaks), feeds, runner,
                                  "the FP32 model"),
                    **{k: v for k, v in feeds.items() if k in inputs}}
    actual = run_exposed(converted, names, converted_feeds, converted_runner or runner, "the converted model")
    writers = {o: n for n in converted.graph.node for o in n.output}
    broken = _reached(converted, {name for name in names if np.asarray(actual[name]).dtype.kind == "f"
                                  and not np.all(np.isfinite(actual[name]))}, set(names))
    readers: dict[str, list] = {}
    for node in converted.graph.node:
        for i in set(node.input):
            readers.setdefault(i, []).append(node)
    ends = {o.name for o in converted.graph.output}
    rows = []
    for name, source in names.items():
        fp32, low = np.asarray(expected[source]), np.asarray(actual[name])
        if fp32.shape != low.shape or fp32.dtype.kind != "f" or low.dtype.kind != "f":
            continue
        bad = np.isfinite(fp32) & ~np.isfinite(low)
        if bad.any() and not _saturated(name, readers, ends, _MAX_CHAIN):
            writer = writers.get(name)
            rows.append({"name": source, "value": name, "writer": writer.name or writer.op_type if writer else "",
                         "fp32_peak": float(np.max(np.abs(fp32[bad]))),
                         "origin": writer is None or not broken.intersection(writer.input)})
    rows += _body_rows(converted, in_bodies, {peaks[k]: v for k, v in expected.items() if k in peaks})
    rows.sort(key=lambda r: not r["origin"])  # the values that overflow first, those an inf reached after
    outputs = [o.name for o in original.graph.output]
    return [expected[o] for o in outputs], [actual[o] for o in outputs], rows


def _loop_bodies(model: ModelProto) -> list:
    """The bodies of ``model``'s main-graph ``Loop``/``Scan`` nodes."""
    return [a.g for n in model.graph.node if n.op_type in LOOPS and n.domain in ("", "ai.onnx")
            for a in n.attribute if a.name == "body"]


def body_values(original: ModelProto, converted: ModelProto, fp16: set[str]) -> dict[str, str]:
    """FP16 values (of ``fp16``) of the bodies of ``converted``'s main-graph ``Loop``/``Scan`` nodes ->
    the name ``original``'s body has them under (their own, or, for a body output the conversion cast
    back, the output's: ``s_out_fp16`` -> ``s_out``); {} where there is no such body."""
    converted_bodies = _loop_bodies(converted)
    if not converted_bodies:
        return {}
    computed = {o for body in _loop_bodies(original) for n in body.node for o in n.output if o}
    found = {}
    for body in converted_bodies:
        outputs = {o.name for o in body.output}
        for n in body.node:
            if n.op_type == "Cast" and n.output[0] in outputs and n.output[0] in computed and n.input[0] in fp16:
                found[n.input[0]] = n.output[0]
        found.update((o, o) for n in body.node for o in n.output if o in computed and o in fp16)
    return found


def _body_rows(converted: ModelProto, in_bodies: dict[str, str], fp32_peaks: dict[str, np.ndarray]) -> list[dict]:
    """Overflow rows of body values (``body_values``): their per-iteration peaks in the FP32 run pass
    FP16's largest value, so a GPU computes inf there. Element by element they cannot be compared, and
    ONNX Runtime's CPU provider computes FP16 body ops in FP32, hiding it; the check reads the FP32 peak."""
    limit = float(np.finfo(np.float16).max)
    over = {value: float(np.max(peak)) for value, source in in_bodies.items()
            if (peak := np.asarray(fp32_peaks.get(source, ()))).size and np.max(peak) > limit}
    writers = {o: n for body in _loop_bodies(converted) for n in body.node for o in n.output}
    return [{"name": in_bodies[value], "value": value,
             "writer": writers[value].name or writers[value].op_type if value in writers else "",
             "fp32_peak": peak, "origin": value not in writers or not set(over).intersection(writers[value].input)}
            for value, peak in over.items()]


def _reached(model: ModelProto, broken: set[str], exposed: set[str]) -> set[str]:
    """``broken`` and the values not exposed that a broken value may reach (in node order): what an
    inf could have come through, unseen, into an op's input."""
    reached = set(broken)
    for node in model.graph.node:
        if reached.intersection(node.input):
            reached.update(o for o in node.output if o not in exposed)
    return reached


def _saturated(name: str, readers: dict[str, list], ends: set[str], depth: int) -> bool:
    """Whether every path from ``name`` runs through scale/shift ops into a saturating op."""
    uses = readers.get(name, [])
    if not uses or name in ends or depth == 0:
        return False
    for node in uses:
        if node.op_type in _SATURATING:
            continue
        if node.op_type not in _SCALE_SHIFT or list(node.input).count(name) != 1:
            return False
        if not all(_saturated(o, readers, ends, depth - 1) for o in node.output if o):
            return False
    return True


def overflow_line(rows: list[dict]) -> str:
    """One line naming the first overflowing value and what keeps it finite."""
    first = rows[0]
    more = f" (and {len(rows) - 1} more values)" if len(rows) > 1 else ""
    return (f"{first['name']} (written by {first['writer']}) reaches {first['fp32_peak']:.3g} in the FP32 run and "
            f"is inf in FP16{more}, as a GPU computes it (ONNX Runtime's CPU provider runs such ops in FP32 and "
            "hides it); --calibrate keeps the ops whose values FP16 cannot hold in FP32")
