"""The typed products of the pipeline: each pass's output, and the ``PlanResult`` that collects them.

``plan.run_passes`` returns a ``PlanResult``; the emitters read it (the ONNX emitter needs
the tensors' original dtypes) and ``plan_report.build_report`` turns it, after emission,
into the report (docs/architecture.md, "The plan result").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from amp_compiler.ir import PrecisionGraph
from cost_model.timer import OpTimer

from .base import PassRecord, PlanContext


@dataclass(frozen=True)
class NumericsFlags:
    """What the numerics pass flagged for the target dtype: tensor or op name -> reason."""

    tensors: dict[str, str]
    ops: dict[str, str]
    #: mask sentinels stored clamped to the dtype's finite range (rule 10): tensor -> reason
    saturated: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Prediction:
    """Predicted seconds of the all-FP32, the chosen and the all-low-dtype plans (one energy)."""

    fp32_s: float
    mixed_s: float
    all_low_s: float
    casts: int  # casts the chosen plan pays for
    cast_s: float


@dataclass(frozen=True)
class Costs:
    """The convert pass's product: the prediction, the op timer that priced it (per-op costs), the
    runtime profile and fusion groups it priced for, the objective, why tensor-core work
    stayed FP32 (lines for the report's top; empty when none did) and the near-tie taken, if any."""

    prediction: Prediction
    timer: OpTimer
    runtime_profile: str = "eager"
    fusion_groups: int = 0
    objective: str = "time"
    fp32_tensor_core_why: str = ""
    near_tie: str = ""  # why the plan is predicted slower than all-FP32 (the objective's tie), or ""


@dataclass(frozen=True)
class CastChanges:
    """The casts pass's product: every tensor's dtype before it retyped the graph."""

    original_dtypes: dict[str, str | None]
    inserted: int
    folded: int
    removed: int


@dataclass(frozen=True)
class AlignmentFinding:
    """A low-precision tensor-core op whose dims are not a multiple of the tensor-core granularity."""

    op: str
    op_type: str
    dims: dict[str, int]
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "op_type": self.op_type, "dims": dict(self.dims), "message": self.message}


@dataclass(frozen=True)
class Alignment:
    findings: tuple[AlignmentFinding, ...]


@dataclass
class PlanResult:
    """Everything the passes decided about one graph, typed; the graph itself carries the plan."""

    graph: PrecisionGraph
    ctx: PlanContext
    source: str
    records: list[PassRecord]
    numerics: NumericsFlags = field(default_factory=lambda: NumericsFlags({}, {}))
    costs: Costs | None = None
    casts: CastChanges | None = None
    alignment: tuple[AlignmentFinding, ...] = ()
    #: casts an emitter had to add after the plan (a kernel's output dtype differs), routed through the IR
    emitter_casts: list[str] = field(default_factory=list)

    @classmethod
    def collect(cls, graph: PrecisionGraph, ctx: PlanContext, source: str, records: list[PassRecord],
                outputs: list[Any]) -> "PlanResult":
        result = cls(graph, ctx, source, list(records))
        for out in outputs:
            if isinstance(out, NumericsFlags):
                result.numerics = out
            elif isinstance(out, Costs):
                result.costs = out
            elif isinstance(out, CastChanges):
                result.casts = out
            elif isinstance(out, Alignment):
                result.alignment = out.findings
        return result

    @property
    def prediction(self) -> Prediction:
        return self.costs.prediction if self.costs else Prediction(0.0, 0.0, 0.0, 0, 0.0)

    @property
    def timer(self) -> OpTimer | None:
        return self.costs.timer if self.costs else None

    @property
    def original_dtypes(self) -> dict[str, str | None]:
        return self.casts.original_dtypes if self.casts else {}

    def record(self, name: str) -> PassRecord:
        """The record of the pass called ``name`` (KeyError if it did not run)."""
        for r in self.records:
            if r.name == name:
                return r
        raise KeyError(name)


__all__ = ["Alignment", "AlignmentFinding", "CastChanges", "Costs", "NumericsFlags", "PlanResult", "Prediction"]
