"""The dynamo capture route of ``amp_compiler.compile`` (docs/architecture.md, "Capture routes and shapes"):
``torch.compile`` with this package's backend, graph breaks allowed, for the models ``torch.export``
cannot capture."""

from __future__ import annotations

import contextlib
import functools
import warnings
from typing import Any

import torch

from .backend import amp_compiler_backend
from .fx_io.capture_failure import eager_error, tracing_quiet
from .fx_io.serving import CAPTURE_LOCK
from .fx_io.plans import Plan, PlanCache, describe_key, merge_reports
from .report import Report

DYNAMO = "torch.compile (dynamo, graph breaks allowed)"

try:  # what compile_again needs; a torch without them has nothing to undo
    from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list, set_code_exec_strategy
    from torch._dynamo.types import FrameAction, FrameExecStrategy
    _DEFAULT_STRATEGY = FrameExecStrategy(FrameAction.DEFAULT, FrameAction.DEFAULT)
except ImportError:
    _DEFAULT_STRATEGY = None


class DynamoRoute:
    """``torch.compile`` with the amp_compiler backend and dynamo's default shapes
    (``dynamic=None``): a call's first shapes get a static graph, and a dim seen at a second
    size a symbolic one, sized by that call, which later sizes reuse (a decode loop's growing
    cache shares one plan). Dynamo picks the graphs each call runs; the backend's ``on_run``
    tells the route which, so the plan a call used is the set of graphs that ran."""

    name = DYNAMO

    def __init__(self, model: torch.nn.Module, opts: dict, source: str, limit: int) -> None:
        self.model, self.source = model, source
        self.cache = PlanCache(limit)
        self._ran: list[Report] = []  # the reports of the graphs the current call ran, in order
        self._reuse: dict = {}  # graphs planned, by what their plan depends on (backend.py, reuse)
        options = {**opts, "on_run": lambda report: self._ran.append(report), "reuse": self._reuse}
        self.compiled = torch.compile(model, backend=functools.partial(amp_compiler_backend, options=options),
                                      dynamic=None)

    @property
    def plans(self) -> list[Plan]:
        return list(self.cache.plans.values())

    def call(self, args: tuple, kwargs: dict, own_errors: bool = True) -> tuple[Plan, Any]:
        """Run one call through dynamo. Once the route holds ``max_plans`` plans, a call that would
        need another graph runs that part eagerly (``eager_on_recompile``), in FP32, with a warning.
        Calls hold ``CAPTURE_LOCK``: any call may compile, and which graphs ran is the route's state.
        A call that fails and that the model fails on eagerly too (``own_errors``; an input of the wrong
        shape or dtype) raises the model's own error, as the model would, not dynamo's fake-tensor
        report of it."""
        with CAPTURE_LOCK.capturing():
            try:
                with tracing_quiet():  # the failure is raised, as the model's error or dynamo's
                    return self._call(args, kwargs)
            except Exception:
                own = eager_error(self.model, args, kwargs) if own_errors else None
                if own is None:
                    raise
                raise own from None

    def _call(self, args: tuple, kwargs: dict) -> tuple[Plan, Any]:
        cache = self.cache
        at_limit = len(cache.plans) >= cache.limit
        self._ran = []
        stance = torch.compiler.set_stance("eager_on_recompile") if at_limit else contextlib.nullcontext()
        # dynamo's own recompile limit is per code object, shared with every model of the class: ours is max_plans
        compile_again(self.model)
        with torch._dynamo.config.patch(recompile_limit=1 << 20), stance:
            out = self.compiled(*args, **kwargs)
        key = tuple(id(report) for report in self._ran)
        plan = cache.get(key)
        if plan is None:
            if at_limit:
                warnings.warn(f"amp_compiler: {self.source} holds max_plans={cache.limit} plans; a call with shapes "
                              f"{describe_key(args, kwargs)} ran {'partly ' if self._ran else ''}on the FP32 model "
                              f"(raise max_plans)", stacklevel=5)
            report = merge_reports(self._ran, self.source, self.name) if self._ran else None
            plan = Plan(self.compiled, report, describe_key(args, kwargs))
            if self._ran and not at_limit:
                cache.put(key, plan)
        return plan, out


def compile_again(model: torch.nn.Module) -> None:
    """Let dynamo compile ``model``'s forward again where some other ``torch.compile`` of that code used
    up dynamo's recompile limit. Dynamo then marks the code object run-only for the process (cached graphs
    run, nothing new compiles), whatever limit a later call patches in; transformers wraps every model's
    forward in one function, so after a user's ``torch.compile`` of five LMs (eight graphs) this route
    captured nothing, and ``compile`` of any other transformers model failed with "dynamo captured no
    graph" and advice about traceable constructs. There is no reading the mark back: a forward whose code
    holds as many graphs as the limit gets the default strategy again; the user's own compiles of it
    still meet the limit as before (docs/architecture.md, "Shapes on the dynamo route")."""
    code = getattr(getattr(type(model), "forward", None), "__code__", None)
    if code is not None and _DEFAULT_STRATEGY is not None and \
            len(_debug_get_cache_entry_list(code)) >= torch._dynamo.config.recompile_limit:
        set_code_exec_strategy(code, _DEFAULT_STRATEGY)


__all__ = ["DYNAMO", "DynamoRoute", "compile_again"]
