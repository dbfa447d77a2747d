"""The passes of amp-compiler, in pipeline order, and the pass manager that runs them."""

from .align import AlignPass
from .base import OBJECTIVES, PLANNERS, Pass, PassError, PassManager, PassRecord, PassResult, PlanContext
from .casts import CastPass
from .classify import ClassifyPass
from .convert import ConvertPass
from .numerics import NumericsPass
from .propagate import PropagatePass
from .result import PlanResult


def default_passes() -> list[Pass]:
    """classify -> numerics -> propagate -> convert -> casts -> align (docs/architecture.md, "Passes")."""
    return [ClassifyPass(), NumericsPass(), PropagatePass(), ConvertPass(), CastPass(), AlignPass()]


__all__ = [
    "OBJECTIVES", "PLANNERS", "AlignPass", "CastPass", "ClassifyPass", "ConvertPass", "Pass", "PassError",
    "NumericsPass", "PassManager", "PassRecord", "PassResult", "PlanContext", "PlanResult", "PropagatePass",
    "default_passes",
]
