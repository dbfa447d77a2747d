"""The ``torch.export`` capture route of ``amp_compiler.compile`` (docs/architecture.md, "Capture routes
and shapes"): one export and plan per call shape, automatic symbolic shapes, and the dynamo route for
the calls export refuses."""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable, Hashable

import torch
from torch import fx
from torch.utils import _pytree as pytree

from cost_model.runtime import default_runtime

from .dynamo_route import DynamoRoute
from .errors import ConversionError
from .fx_io.autograd_functions import CustomBackwardError
from .fx_io.capture import (accepts, automatic_dynamic_shapes, export_graph, input_symbols,
                              views_as_reshapes)
from .fx_io.capture_failure import tracing_quiet
from .fx_io.emitter import emit
from .fx_io.importer import import_graph_module, resolve_rule_names
from .fx_io.operand_dtypes import OperandDtypeError, check_operand_dtypes
from .fx_io.plans import (Plan, PlanCache, beyond_fp16, call_key, call_structure, describe_key,
                          finite_peak, largest_sizes, leaf_shapes, varying_dims)
from .fx_io.serving import CAPTURE_LOCK, kwarg_order
from .plan import make_context, run_passes
from .plan_report import build_report

EXPORT = "torch.export"


class ExportRoute:
    """One ``torch.export`` capture and plan per call shape, with automatic dynamic shapes: a call
    whose dims differ from those of earlier calls of the same ranks is captured with those dims
    ``Dim.AUTO`` (symbolic where the model allows it), and that plan takes every later call its
    guards accept. At most ``max_plans`` plans, least recently used dropped first (with a warning:
    its shapes are captured again if they return). A later call export cannot capture (a cache
    passed back in, as ``generate`` does) goes to a dynamo route, and so do the calls of the same
    structure after it."""

    name = EXPORT

    def __init__(self, model: torch.nn.Module, opts: dict, source: str, dynamic_shapes: Any, limit: int) -> None:
        self.model, self.opts, self.source, self.dynamic_shapes = model, opts, source, dynamic_shapes
        self.cache = PlanCache(limit)
        self._dynamo: DynamoRoute | None = None  # made on the first call export refuses
        self._refused: set = set()  # ``call_structure`` of the calls export refused
        self._seen: dict[Hashable, list[tuple]] = {}  # by family: the leaf shapes of the calls planned
        self._static_only: set = set()  # families whose automatic symbolic capture failed
        self._order = kwarg_order(model)

    @property
    def plans(self) -> list[Plan]:
        return list(self.cache.plans.values()) + (self._dynamo.plans if self._dynamo is not None else [])

    def key(self, args: tuple, kwargs: dict):
        return call_key(args, kwargs, sizes=self.dynamic_shapes is None)

    def first(self, args: tuple, kwargs: dict) -> Plan:
        """Capture and plan the example call (``ConversionError`` if export cannot)."""
        kwargs = self._order(kwargs)
        return self.cache.put(self.key(args, kwargs), self.plan(args, kwargs))

    def call(self, args: tuple, kwargs: dict) -> tuple[Plan, Any]:
        """Run one call on its key's plan, or a symbolic plan that takes it, else on a new plan (captured
        under ``CAPTURE_LOCK``: torch.export's tracing state is the process's). Keyword arguments are
        taken in the forward's order, so a call naming them in another order shares the plan."""
        kwargs = self._order(kwargs)
        if self._dynamo is not None and call_structure(args, kwargs) in self._refused:
            return self._dynamo.call(args, kwargs)
        key = self.key(args, kwargs)
        plan = self.cache.get(key) or self._symbolic_taking(args, kwargs)
        if plan is None:
            with CAPTURE_LOCK.capturing():  # another thread may have planned it meanwhile
                plan = self.cache.get(key) or self._symbolic_taking(args, kwargs)
                if plan is None:
                    try:
                        with tracing_quiet():  # a call export refuses goes to dynamo, which says why
                            plan = self._put(key, self.plan(args, kwargs), args, kwargs)
                    except ConversionError as error:
                        if self.dynamic_shapes is not None or \
                                isinstance(error, (CustomBackwardError, OperandDtypeError)):
                            raise  # the user asked for torch.export's symbolic shapes, or dynamo would capture the same
                        self._refused.add(call_structure(args, kwargs))
                        if self._dynamo is None:
                            self._dynamo = DynamoRoute(self.model, self.opts, self.source, self.cache.limit)
                        return self._dynamo.call(args, kwargs)
        with CAPTURE_LOCK.running():
            return plan, plan.run(*args, **kwargs)

    def _symbolic_taking(self, args: tuple, kwargs: dict) -> Plan | None:
        """The most recently used symbolic plan whose guards accept the call."""
        family = call_key(args, kwargs, sizes=False)
        for key, plan in reversed(self.cache.plans.items()):
            if plan.family == family and plan.accepts is not None and plan.accepts(args, kwargs):
                return self.cache.get(key)
        return None

    def _put(self, key: Hashable, plan: Plan, args: tuple, kwargs: dict) -> Plan:
        if len(self.cache.plans) >= self.cache.limit:
            dropped = next(iter(self.cache.plans.values()))
            warnings.warn(f"amp_compiler: {self.source} holds max_plans={self.cache.limit} plans; the plan for "
                          f"{describe_key(args, kwargs)} replaced the least recently used one ({dropped.shapes}), "
                          f"which is captured again if its shapes return (raise max_plans, or pass "
                          f"dynamic_shapes)", stacklevel=5)
        return self.cache.put(key, plan)

    def plan(self, args: tuple, kwargs: dict) -> Plan:
        """Capture the call with torch.export and plan the graph (sized by the call's shapes): dims
        that took other sizes in earlier calls of the same ranks are captured ``Dim.AUTO``."""
        family, shapes = call_key(args, kwargs, sizes=False), leaf_shapes(args, kwargs)
        dims = {} if self.dynamic_shapes is not None or family in self._static_only else \
            varying_dims(self._seen.get(family, ()), shapes)
        self._seen.setdefault(family, []).append(shapes)
        automatic = automatic_dynamic_shapes(args, kwargs, dims) if dims else None
        if automatic is not None:
            try:
                return self._planned(args, kwargs, automatic, family, self._seen[family])
            except ConversionError:  # the model pins what changed: one static plan per shape, as before
                self._static_only.add(family)
        return self._planned(args, kwargs, self.dynamic_shapes, family)

    def _planned(self, args: tuple, kwargs: dict, dynamic_shapes: Any, family: Hashable,
                 seen: list[tuple] | None = None) -> Plan:
        """Export, plan and emit one call; an automatic symbolic plan is sized by the largest sizes
        ``seen`` (``plans.largest_sizes``), not by the call that made it."""
        o = self.opts
        gm = export_graph(self.model, args, kwargs, source=self.source, dynamic_shapes=dynamic_shapes,
                          training=o["training"])
        check_operand_dtypes(gm, self.source, self.model.parameters())  # the meta kernels did not
        hints = largest_sizes(input_symbols(gm, args, kwargs), seen) if seen else None
        imp = import_graph_module(gm, source=self.source, training=o["training"], default_dim=o["default_dim"],
                                  input_peaks=_input_peaks(gm, args, kwargs), size_hints=hints)
        ctx = plan_context(o)
        resolve_rule_names(imp.graph, ctx, self.source, node_names=o.get("deny_nodes") or ())
        result = run_passes(imp.graph, ctx, self.source, imp.dim_values)
        folded = emit(imp, result)
        report = build_report(result)  # after emission: counts the casts the emitter added
        report.summary.update(capture=self.name, graphs=1)
        torch.nn.Module.train(gm, o["training"])
        # a symbolic plan's inductor graph is compiled symbolic once, not once per size
        inner: Callable = gm
        if o["backend"] == "inductor":
            inner = torch.compile(views_as_reshapes(gm), backend="inductor", dynamic=bool(imp.dim_values) or None)

        def run(*a: Any, **k: Any) -> Any:
            if folded.entries:
                folded.refresh(gm)
            return inner(*a, **k)

        symbolic = bool(imp.dim_values) and self.dynamic_shapes is None  # automatic: taken by its guards
        return Plan(run, report, describe_key(args, kwargs), gm,
                    accepts=functools.partial(accepts, gm) if symbolic else None, family=family)


def plan_context(opts: dict):
    """The plan context of ``compile``'s options (the same keys the torch.compile backend takes):
    ``deploy`` names the runtime profile; by default inductor's when it runs the graph, else eager."""
    plan_opts = {k: v for k, v in opts.items() if k not in ("backend", "deploy")}
    return make_context(runtime=opts["deploy"] or default_runtime("torch", opts["backend"]), **plan_opts)


def _input_peaks(gm: fx.GraphModule, args: tuple, kwargs: dict) -> dict[str, float]:
    """Largest magnitudes of an unlifted export's example inputs that FP16 cannot hold, by placeholder
    (a ``finfo.min`` additive mask): the numerics pass keeps what reads them FP32."""
    tensors = [leaf for leaf in pytree.tree_leaves((args, kwargs)) if isinstance(leaf, torch.Tensor)]
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor)]
    if len(tensors) != len(placeholders):
        return {}
    return {n.name: finite_peak(t) for n, t in zip(placeholders, tensors) if beyond_fp16(t)}


__all__ = ["EXPORT", "ExportRoute", "plan_context"]
