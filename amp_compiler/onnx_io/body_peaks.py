"""The largest finite magnitude of values inside ``Loop`` and ``Scan`` bodies, for calibration.

A probed run reads a value by making it a graph output (``probe.run_exposed``), which a value
computed in a loop body cannot be: it exists once per iteration. So calibration had measured no
body value, and an FP16 plan of a body whose state grows past 65504 passed ``--calibrate``
(docs/architecture.md, "Numerics"). Here each wanted body value gets, per iteration, its peak
``ReduceMax(|x|)`` (non-finite values read as 0, as calibration ignores them) as an extra scan
output of the body; the ``Loop``/``Scan`` node stacks it over the iterations into a new output of
its own, which a probed run can expose. Bodies of main-graph nodes are measured (with
``taken_branches``, those of the ``If`` branches the feeds take too), and through them every
``Loop``/``Scan``/``If`` nested inside: a nested node gets the same extra outputs (an ``If`` its
taken branch's peak, 0 from the other), which its enclosing body reduces to one peak per iteration
(values in nested bodies had been left to the static rules: a Loop in a Loop whose state passed
65504 was planned FP16 under ``--calibrate``).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterable, Iterator

from onnx import GraphProto, ModelProto, NodeProto, TensorProto, helper

from .structure import names_in_use

LOOPS = ("Loop", "Scan")
NESTING = (*LOOPS, "If")  # nodes whose subgraphs a body's peaks are read through
MIN_OPSET = 11  # IsInf (10) and today's Loop/Scan scan-output semantics; older models: static rules only


@contextmanager
def body_peaks_exposed(model: ModelProto, wanted: Iterable[str]) -> Iterator[dict[str, str]]:
    """Within the block, ``model``'s main-graph ``Loop``/``Scan`` nodes have an extra output per
    ``wanted`` value their body computes, at any depth (a ``Loop``, ``Scan`` or ``If`` inside the body,
    nested): that value's peak per iteration. Yields ``{extra output: body value}``; ``model`` is
    restored on exit: what was appended is trimmed off the same messages (nothing is copied, and
    references into the bodies stay valid)."""
    wanted = set(wanted)
    graph = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < MIN_OPSET:
        wanted = set()
    edits = _Edits()
    peaks: dict[str, str] = {}
    taken: set[str] | None = None
    for node in graph.node:
        if node.op_type not in LOOPS or node.domain not in ("", "ai.onnx") or not _computes(node, wanted):
            continue
        if taken is None:
            taken = names_in_use(model)
        peaks.update(_node_peaks(node, wanted, taken, edits))
    try:
        yield peaks
    finally:  # the messages themselves are trimmed: the importer holds references into the bodies
        edits.undo()


class _Edits:
    """The lengths of the repeated fields the probe appends to, recorded before the first append, and
    trimmed back to them on ``undo``."""

    def __init__(self) -> None:
        self._lengths: list[tuple[Any, tuple[int, ...]]] = []

    def node(self, node: NodeProto) -> None:
        self._lengths.append((node, (len(node.output), *(len(a.ints) for a in _axes(node)))))

    def graph(self, graph: GraphProto) -> None:
        self._lengths.append((graph, (len(graph.node), len(graph.output), len(graph.initializer))))

    def undo(self) -> None:
        for message, lengths in self._lengths:
            if isinstance(message, NodeProto):
                del message.output[lengths[0]:]
                for a, n in zip(_axes(message), lengths[1:]):
                    del a.ints[n:]
            else:
                del message.node[lengths[0]:]
                del message.output[lengths[1]:]
                del message.initializer[lengths[2]:]


def _subgraphs(node: NodeProto) -> list[GraphProto]:
    """The bodies of a ``Loop``/``Scan`` node, the branches of an ``If`` (none for any other op)."""
    if node.op_type not in NESTING or node.domain not in ("", "ai.onnx"):
        return []
    return [a.g for a in node.attribute if a.name in ("body", "then_branch", "else_branch")]


def _computes(node: NodeProto, wanted: set[str]) -> bool:
    """Whether a subgraph of ``node``, at any depth, computes a ``wanted`` value."""
    return any(o in wanted or _computes(n, wanted) for g in _subgraphs(node) for n in g.node for o in n.output)


def _node_peaks(node: NodeProto, wanted: set[str], taken: set[str], edits: _Edits) -> dict[str, str]:
    """New outputs of ``node`` holding the peaks of the ``wanted`` values its subgraphs compute: a
    ``Loop``/``Scan`` stacks its body's per-iteration peaks, an ``If`` outputs the peak its taken branch
    computed (0 from a branch that does not compute the value). Returns ``{node output: value}``."""
    edits.node(node)
    branches = _subgraphs(node)
    per_branch = [_graph_peaks(g, wanted, taken, edits) for g in branches]
    values = list(dict.fromkeys(v for peaks in per_branch for v in peaks.values()))
    for g, peaks in zip(branches, per_branch):
        scalar_of = {v: name for name, v in peaks.items()}
        for value in values:
            if value not in scalar_of:  # the other branch of an If computes it
                zero = _fresh(taken, f"{value}/peak_none")
                g.node.append(helper.make_node("Constant", [], [zero], name=zero,
                                               value=helper.make_tensor(zero, TensorProto.FLOAT, [], [0.0])))
                scalar_of[value] = zero
            g.output.append(helper.make_tensor_value_info(scalar_of[value], TensorProto.FLOAT, []))
    out = {}
    for value in values:
        name = _fresh(taken, f"{node.name or node.op_type}/{value}/peaks")
        node.output.append(name)
        out[name] = value
    for a in _axes(node):  # a Scan that lists its scan outputs' axes or directions lists the new ones too
        if len(a.ints):
            a.ints.extend([0] * len(values))
    return out


def _graph_peaks(graph: GraphProto, wanted: set[str], taken: set[str], edits: _Edits) -> dict[str, str]:
    """Scalars appended to ``graph``: the peak of each ``wanted`` value it computes, and of each one its
    nested ``Loop``/``Scan``/``If`` nodes compute (the largest over their iterations). ``{scalar: value}``."""
    edits.graph(graph)
    nested = [n for n in graph.node if _computes(n, wanted)]
    values = [o for n in graph.node for o in n.output if o in wanted]
    peaks = _add_peaks(graph, values, taken)
    for node in nested:
        for stacked, value in _node_peaks(node, wanted, taken, edits).items():
            peaks[_largest(graph, stacked, taken)] = value
    return peaks


def _largest(graph: GraphProto, peaks: str, taken: set[str]) -> str:
    """A scalar in ``graph``: the largest of ``peaks`` (finite magnitudes, any shape, possibly empty: a
    nested loop that ran no iteration reads 0)."""
    n = {step: _fresh(taken, f"{peaks}/{step}") for step in ("shape", "flat", "zero", "with_zero", "max")}
    graph.initializer.extend([helper.make_tensor(n["shape"], TensorProto.INT64, [1], [-1]),
                              helper.make_tensor(n["zero"], TensorProto.FLOAT, [1], [0.0])])
    graph.node.extend([
        helper.make_node("Reshape", [peaks, n["shape"]], [n["flat"]], name=n["flat"]),
        helper.make_node("Concat", [n["zero"], n["flat"]], [n["with_zero"]], name=n["with_zero"], axis=0),
        helper.make_node("ReduceMax", [n["with_zero"]], [n["max"]], name=n["max"], keepdims=0),
    ])
    return n["max"]


def _fresh(taken: set[str], base: str) -> str:
    """``base``, or ``base_k`` for the first ``k`` no graph uses (then taken)."""
    name, k = base, 1
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    taken.add(name)
    return name


def _axes(node: NodeProto) -> list:
    """A ``Scan``'s attributes listing one entry per scan output."""
    return [a for a in node.attribute if node.op_type == "Scan" and a.name in ("scan_output_axes",
                                                                                "scan_output_directions")]


def _add_peaks(body: GraphProto, values: list[str], taken: set[str]) -> dict[str, str]:
    """Append to ``body`` a scalar per value: its largest finite magnitude (non-finite values read as 0,
    as calibration ignores them). Returns ``{scalar: value}``."""
    out: dict[str, str] = {}
    for value in values:
        n = {step: _fresh(taken, f"{value}/peak_{step}")
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
        out[n["max"]] = value
    return out


__all__ = ["LOOPS", "body_peaks_exposed"]
