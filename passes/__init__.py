"""The passes of amp-compiler, in pipeline order, and the pass manager that runs them."""

from .align import AlignPass
from .base import OBJECTIVES, PLANNERS, Pass, PassError, PassManager, PassRecord, PassResult, PlanContext
from .casts import CastPass
from .classify import ClassifyPass
from .convert import ConvertPass
from .propagate import PropagatePass


def default_passes() -> list[Pass]:
    """classify -> propagate -> convert -> casts -> align (DESIGN.md section 3)."""
    return [ClassifyPass(), PropagatePass(), ConvertPass(), CastPass(), AlignPass()]


__all__ = [
    "OBJECTIVES", "PLANNERS", "AlignPass", "CastPass", "ClassifyPass", "ConvertPass", "Pass", "PassError",
    "PassManager", "PassRecord", "PassResult", "PlanContext", "PropagatePass", "default_passes",
]
