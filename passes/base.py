"""The pass contract and the pass manager (in the style of onnx-ir's passes).

A pass is a small object with a ``name`` and ``call(graph, ctx) -> PassResult``;
``requires``/``ensures`` check its contract before and after (a broken one raises
``PassError``). A pass hands what it computed to later stages only through its
result's typed ``output`` (never through ``graph.meta`` or the options), and reports
``modified`` as computed, not assumed. ``PassManager`` runs a sequence of passes and
records, per pass, the time it took, whether it changed the graph and a one-line
summary; ``passes.result.PlanResult`` collects the outputs (docs/architecture.md, "Passes").
"""

from __future__ import annotations

import time
from operator import attrgetter
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from amp_compiler.ir import PrecisionGraph


@dataclass
class PassResult:
    graph: PrecisionGraph
    modified: bool
    details: str = ""
    #: the pass's typed product for later stages (``passes.result``), or None
    output: Any = None


@dataclass
class PassRecord:
    name: str
    time_s: float
    changed: bool
    details: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "time_s": self.time_s, "changed": self.changed, "details": self.details}


class Pass:
    """Base class: subclasses set ``name`` and implement ``call``."""

    name = "pass"

    def requires(self, graph: PrecisionGraph, ctx: "PlanContext") -> None:
        """Raise ``PassError`` if the graph is not in the state this pass needs."""

    def ensures(self, graph: PrecisionGraph, ctx: "PlanContext") -> None:
        """Raise ``PassError`` if the pass left the graph in a wrong state."""

    def call(self, graph: PrecisionGraph, ctx: "PlanContext") -> PassResult:
        raise NotImplementedError

    def __call__(self, graph: PrecisionGraph, ctx: "PlanContext") -> PassResult:
        self.requires(graph, ctx)
        result = self.call(graph, ctx)
        self.ensures(result.graph, ctx)
        return result


class PassError(RuntimeError):
    """A pass found the graph in a state it cannot handle (a bug, not bad user input)."""


def check(pass_name: str, stage: str, bad: Iterable[str], what: str) -> None:
    """Raise ``PassError`` naming up to three offenders when ``bad`` is not empty."""
    bad = list(bad)
    if bad:
        names = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise PassError(f"{pass_name}: {stage} violated: {what} ({names})")


def unclassified(graph: PrecisionGraph) -> list[str]:
    """Names of the source ops (not inserted by a pass) without a class: what numerics and propagate
    require to be empty."""
    return [op.name for op in graph.ops.values() if not op.inserted and op.op_class is None]


def snapshot(graph: PrecisionGraph, *fields: str) -> list:
    """The listed attributes of every op (a tuple per op, or the value for one field), to compare
    before/after and report ``modified`` honestly; ``attrgetter`` reads them in C."""
    return list(map(attrgetter(*fields), graph.ops.values()))


#: what the planner minimises first: predicted ``time`` (near-ties within ``TIE_TOLERANCE`` go to
#: the plan with less memory) or ``memory`` (weights plus activations; time breaks ties)
OBJECTIVES = ("time", "memory", "fastest")

#: planner names: ``optimal`` (min-cut over op and cast costs), ``greedy`` (TF-style painter),
#: ``all`` (every op that may legally and safely take the low dtype does, whatever the cost)
PLANNERS = ("optimal", "greedy", "all")


@dataclass
class PlanContext:
    """Options every pass may read; built once by the entry point."""

    low_dtype: str = "float16"
    target: str = "h100"
    planner: str = "optimal"  # one of PLANNERS
    keep_io_types: bool = True
    training: bool = False  # weights are FP32 master copies: casting one costs every step
    deny_propagation: bool = True  # infer ops fed by a deny op through infer/clear ops stay FP32 (TF's rule)
    allow: frozenset[str] = frozenset()  # op types or canonical names forced to class allow
    deny: frozenset[str] = frozenset()  # op types or canonical names forced to class deny
    deny_nodes: frozenset[str] = frozenset()  # op names kept FP32
    deny_node_reasons: Any = None  # op name -> why it is in deny_nodes, where not the user's --deny-node
    earlier_fp32: Any = None  # op name -> reason an earlier amp-compiler run kept it FP32 (its annotations)
    force_low_nodes: frozenset[str] = frozenset()  # op names forced to the low dtype if legal
    default_dim: int = 8  # value for symbolic dims in cost estimates
    runtime: str = "eager"  # deployment runtime profile (cost_model/runtime.py): what fuses, what a launch costs
    objective: str = "time"  # one of OBJECTIVES
    profile: Any = None  # cost_model.MeasuredProfile or None
    registry: Any = None  # amp_compiler.registry.Registry; None = the default
    progress: Callable[[str], None] | None = None
    calibration_margin: float = 2.0  # calibrated peaks above low-dtype max / margin stay FP32
    user_rules: Any = None  # passes.user_rules.UserRules: the user's pattern/depth/initializer rules


class PassManager:
    """Runs passes in order and keeps a ``PassRecord`` per pass."""

    def __init__(self, passes: list[Pass]) -> None:
        self.passes = passes
        self.records: list[PassRecord] = []
        self.outputs: list[Any] = []  # each pass's typed output, in pipeline order (None entries dropped)

    def run(self, graph: PrecisionGraph, ctx: PlanContext) -> PrecisionGraph:
        for p in self.passes:
            if ctx.progress:
                ctx.progress(p.name)
            start = time.perf_counter()
            result = p(graph, ctx)
            graph = result.graph
            self.records.append(PassRecord(p.name, time.perf_counter() - start, result.modified, result.details))
            if result.output is not None:
                self.outputs.append(result.output)
        return graph
