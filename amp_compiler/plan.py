"""Run the pass pipeline on a ``PrecisionGraph``: the part both entry points share.

``run_passes`` returns a typed ``PlanResult``; the caller emits the plan, then builds the
report from the result with ``plan_report.build_report`` (so it counts the casts the
emitter added too; docs/architecture.md, "The plan result").
"""

from __future__ import annotations

from typing import Callable, Iterable

from cost_model import get_device
from cost_model.runtime import get_runtime
from passes import OBJECTIVES, PLANNERS, PassManager, PlanContext, default_passes
from passes.result import PlanResult

from .dtypes import normalize_low_dtype
from .ir import PrecisionGraph


def make_context(*, target: str = "h100", dtype: str = "fp16", planner: str = "optimal",
                 keep_io_types: bool = True, allow: Iterable[str] = (), deny: Iterable[str] = (),
                 deny_nodes: Iterable[str] = (), training: bool = False, default_dim: int = 8,
                 profile=None, progress: Callable[[str], None] | None = None,
                 deny_propagation: bool = True, runtime: str = "eager",
                 objective: str = "time") -> PlanContext:
    """Validate user options once and pack them for the passes.

    ``runtime``: the deployment runtime profile the cost model prices (``eager``,
    ``ort-cuda``, ``tensorrt``, ``inductor``, ``inductor-cudagraphs``; see
    ``cost_model/runtime.py``); ``objective``: ``time`` or ``memory`` first.
    """
    get_device(target)  # raises ValueError listing the known devices
    runtime = get_runtime(runtime).name  # raises ValueError listing the known profiles
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}: use one of {', '.join(OBJECTIVES)}")
    if planner not in PLANNERS:
        raise ValueError(f"unknown planner {planner!r}: use one of {', '.join(PLANNERS)}")
    if default_dim < 1:
        raise ValueError(f"default_dim must be >= 1, got {default_dim}")
    return PlanContext(low_dtype=normalize_low_dtype(dtype), target=target, planner=planner,
                       keep_io_types=keep_io_types, training=training, allow=frozenset(allow),
                       deny=frozenset(deny), deny_nodes=frozenset(deny_nodes), default_dim=default_dim,
                       profile=profile, progress=progress, deny_propagation=bool(deny_propagation),
                       runtime=runtime, objective=objective)


def run_passes(graph: PrecisionGraph, ctx: PlanContext, source: str,
               dim_values: dict[str, int] | None = None) -> PlanResult:
    """classify -> numerics -> propagate -> convert -> casts -> align; returns the typed result."""
    graph.set_dim_sizes(ctx.default_dim, dim_values)
    manager = PassManager(default_passes())
    graph = manager.run(graph, ctx)
    return PlanResult.collect(graph, ctx, source, manager.records, manager.outputs)
