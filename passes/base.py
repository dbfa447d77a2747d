"""The pass contract and the pass manager (in the style of onnx-ir's passes).

A pass is a small object with a ``name`` and ``call(graph, ctx) -> PassResult``;
``requires``/``ensures`` check invariants before and after. ``PassManager`` runs a
sequence of passes and records, per pass, the time it took, whether it changed the
graph and a one-line summary; the report shows these records.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from amp_compiler.ir import PrecisionGraph


@dataclass
class PassResult:
    graph: PrecisionGraph
    modified: bool
    details: str = ""


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


#: what the planner minimises first: predicted ``time`` (near-ties within ``TIE_TOLERANCE`` go to
#: the plan with less memory) or ``memory`` (weights plus activations; time breaks ties)
OBJECTIVES = ("time", "memory")

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
    deny_propagation: bool = False  # infer ops fed by a deny op through infer/clear ops stay FP32 (TF's rule)
    allow: frozenset[str] = frozenset()  # op types or canonical names forced to class allow
    deny: frozenset[str] = frozenset()  # op types or canonical names forced to class deny
    deny_nodes: frozenset[str] = frozenset()  # op names kept FP32
    force_low_nodes: frozenset[str] = frozenset()  # op names forced to the low dtype if legal
    default_dim: int = 8  # value for symbolic dims in cost estimates
    runtime: str = "eager"  # deployment runtime profile (cost_model/runtime.py): what fuses, what a launch costs
    objective: str = "time"  # one of OBJECTIVES
    profile: Any = None  # cost_model.MeasuredProfile or None
    registry: Any = None  # amp_compiler.registry.Registry; None = the default
    progress: Callable[[str], None] | None = None
    alignment: list[dict[str, Any]] = field(default_factory=list)  # filled by AlignPass


class PassManager:
    """Runs passes in order and keeps a ``PassRecord`` per pass."""

    def __init__(self, passes: list[Pass]) -> None:
        self.passes = passes
        self.records: list[PassRecord] = []

    def run(self, graph: PrecisionGraph, ctx: PlanContext) -> PrecisionGraph:
        for p in self.passes:
            if ctx.progress:
                ctx.progress(p.name)
            start = time.perf_counter()
            result = p(graph, ctx)
            graph = result.graph
            self.records.append(PassRecord(p.name, time.perf_counter() - start, result.modified, result.details))
        return graph
