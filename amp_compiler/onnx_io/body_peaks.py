"""The largest finite magnitude of values inside ``Loop`` and ``Scan`` bodies, for calibration.

A probed run reads a value by making it a graph output (``probe.run_exposed``), which a value
computed in a loop body cannot be: it exists once per iteration. So calibration had measured no
body value, and an FP16 plan of a body whose state grows past 65504 passed ``--calibrate``
(docs/architecture.md, "Numerics"). Here each wanted body value gets, per iteration, its peak
``ReduceMax(|x|)`` (non-finite values read as 0, as calibration ignores them) as an extra scan
output of the body; the ``Loop``/``Scan`` node stacks it over the iterations into a new output of
its own, which a probed run can expose. Only bodies of main-graph nodes are measured (with
``taken_branches``, those of the ``If`` branches the feeds take too); a value in a body nested
deeper is left to the static rules.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterable, Iterator

from onnx import GraphProto, ModelProto, NodeProto, TensorProto, helper

from .structure import names_in_use

LOOPS = ("Loop", "Scan")
MIN_OPSET = 11  # IsInf (10) and today's Loop/Scan scan-output semantics; older models: static rules only


@contextmanager
def body_peaks_exposed(model: ModelProto, wanted: Iterable[str]) -> Iterator[dict[str, str]]:
    """Within the block, ``model``'s main-graph ``Loop``/``Scan`` nodes have an extra output per
    ``wanted`` value their body computes: that value's peak per iteration. Yields ``{extra output:
    body value}``; ``model`` is restored on exit: what was appended is trimmed off the same messages
    (nothing is copied, and references into the bodies stay valid)."""
    wanted = set(wanted)
    graph = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < MIN_OPSET:
        wanted = set()
    added: list[tuple[NodeProto, GraphProto, tuple[int, ...]]] = []  # what each node and body held before
    peaks: dict[str, str] = {}
    taken: set[str] | None = None
    for node in graph.node:
        if node.op_type not in LOOPS or node.domain not in ("", "ai.onnx"):
            continue
        body = next((a.g for a in node.attribute if a.name == "body"), None)
        values = [] if body is None else [o for n in body.node for o in n.output if o in wanted]
        if not values:
            continue
        if taken is None:
            taken = names_in_use(model)
        added.append((node, body, (len(node.output), len(body.node), len(body.output), len(body.initializer),
                                   *(len(a.ints) for a in _axes(node)))))
        peaks.update(_add_peaks(node, body, values, taken))
    try:
        yield peaks
    finally:  # the messages themselves are trimmed: the importer holds references into the bodies
        for node, body, (outputs, nodes, body_outputs, initializers, *axes) in added:
            del node.output[outputs:]
            del body.node[nodes:]
            del body.output[body_outputs:]
            del body.initializer[initializers:]
            for a, n in zip(_axes(node), axes):
                del a.ints[n:]


def _axes(node: NodeProto) -> list:
    """A ``Scan``'s attributes listing one entry per scan output."""
    return [a for a in node.attribute if node.op_type == "Scan" and a.name in ("scan_output_axes",
                                                                                "scan_output_directions")]


def _add_peaks(node: NodeProto, body: GraphProto, values: list[str], taken: set[str]) -> dict[str, str]:
    """Give ``node``'s ``body`` a scan output per value (its peak this iteration) and ``node`` an
    output stacking it; returns ``{node output: value}``."""

    def fresh(base: str) -> str:
        name, k = base, 1
        while name in taken:
            name, k = f"{base}_{k}", k + 1
        taken.add(name)
        return name

    out: dict[str, str] = {}
    for value in values:
        n = {step: fresh(f"{value}/peak_{step}")
             for step in ("float", "inf", "nan", "bad", "abs", "finite", "max", "zero")}
        body.node.extend([
            helper.make_node("Cast", [value], [n["float"]], name=n["float"], to=TensorProto.FLOAT),
            helper.make_node("IsInf", [n["float"]], [n["inf"]], name=n["inf"]),
            helper.make_node("IsNaN", [n["float"]], [n["nan"]], name=n["nan"]),
            helper.make_node("Or", [n["inf"], n["nan"]], [n["bad"]], name=n["bad"]),
            helper.make_node("Abs", [n["float"]], [n["abs"]], name=n["abs"]),
            helper.make_node("Where", [n["bad"], n["zero"], n["abs"]], [n["finite"]], name=n["finite"]),
            helper.make_node("ReduceMax", [n["finite"]], [n["max"]], name=n["max"], keepdims=0),
        ])
        body.initializer.append(helper.make_tensor(n["zero"], TensorProto.FLOAT, [], [0.0]))
        body.output.append(helper.make_tensor_value_info(n["max"], TensorProto.FLOAT, []))
        stacked = fresh(f"{node.name or node.op_type}/{value}/peaks")
        node.output.append(stacked)
        out[stacked] = value
    for a in _axes(node):  # a Scan that lists its scan outputs' axes or directions lists the new ones too
        if len(a.ints):
            a.ints.extend([0] * len(values))
    return out


__all__ = ["LOOPS", "body_peaks_exposed"]
