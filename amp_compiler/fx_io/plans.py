"""Plans of one compiled module: keyed by the call's shapes, bounded, and one merged report.

``amp_compiler.compile`` plans for the shapes it is called with (the cost model's sizes
come from them). ``call_key`` says which calls may share a plan: same tensor shapes (or
ranks, where the user gave ``dynamic_shapes``), dtypes and devices, and the same
non-tensor arguments (a Python scalar is specialised by both capture routes).
``PlanCache`` keeps the last ``limit`` plans, least recently used out first. ``varying_dims``
says which dims of a call changed size since earlier calls of the same ranks: the export
route's automatic symbolic capture and ``compile_training`` make them dynamic, and
``largest_sizes`` sizes the symbols for the cost model.
``merge_reports`` makes one report of the per-graph reports of a dynamo capture (one
graph per graph break); ``docs/architecture.md`` ("Capture routes and shapes") says why.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterable

import torch
from torch.utils import _pytree as pytree

from ..numerics import FP16_MAX
from ..report import Report

#: plans kept per compiled module (dynamo's default recompile limit is also 8)
DEFAULT_PLAN_LIMIT = 8
_SUMMED = ("nodes", "fp16_nodes", "fp32_nodes", "casts", "inserted_casts", "cast_bytes", "gemm_flops",
           "predicted_time_fp32_s", "predicted_time_mixed_s", "predicted_time_all_fp16_s")
#: every ``predicted_memory_*`` key is summed too: each graph's weights are its own, and the sum of
#: the peak activations of graphs that run one after another is an upper bound
_MEMORY_PREFIX = "predicted_memory_"


def finite_peak(t: torch.Tensor) -> float:
    """Largest finite magnitude of a float32 tensor (0.0 for other dtypes and empty tensors)."""
    if t.dtype != torch.float32 or t.numel() == 0:
        return 0.0
    with torch.no_grad():
        return float(t.detach().abs().nan_to_num(0.0, posinf=0.0, neginf=0.0).amax())


def beyond_fp16(t: torch.Tensor) -> bool:
    """A float32 tensor holding finite values FP16 cannot (a ``finfo(float32).min`` additive mask)."""
    return finite_peak(t) > FP16_MAX


def call_key(args: tuple, kwargs: dict, *, sizes: bool = True) -> Hashable:
    """What a plan is specialised to: tensor shapes (ranks if not ``sizes``), dtypes, devices, whether a
    float input holds values FP16 cannot, other values."""
    leaves, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
    out: list[Hashable] = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            shape = tuple(leaf.shape) if sizes else leaf.dim()
            out.append(("tensor", shape, leaf.dtype, leaf.device.type, leaf.requires_grad, beyond_fp16(leaf)))
        elif isinstance(leaf, (int, float, bool, str, type(None), torch.dtype, torch.device)):
            out.append(leaf)
        else:  # an object the capture sees through (a cache, a config): its type and tensors decide
            out.append(("object", type(leaf).__qualname__,
                        tuple((tuple(t.shape), t.dtype) for t in _held_tensors(leaf))))
    return str(spec), tuple(out)


def call_structure(args: tuple, kwargs: dict) -> Hashable:
    """A call's argument structure without shapes or values: its pytree spec and each leaf's type
    (the calls a capture route refused once, such as those passing a cache back in)."""
    leaves, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
    return str(spec), tuple(type(leaf).__qualname__ for leaf in leaves)


def _held_tensors(obj: Any, depth: int = 3):
    """Tensors an object holds in its attributes, lists, tuples and dicts, ``depth`` levels down
    (a ``DynamicCache``'s per-layer keys and values): dynamo guards on their shapes and dtypes, so
    a call that changes them is a new plan."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth > 0:
        if isinstance(obj, dict):
            values = obj.values()
        elif isinstance(obj, (list, tuple)):
            values = obj
        else:
            values = getattr(obj, "__dict__", {}).values()
        for value in values:
            yield from _held_tensors(value, depth - 1)


def leaf_shapes(args: tuple, kwargs: dict) -> tuple[tuple[int, ...] | None, ...]:
    """Each pytree leaf's tensor shape (``None`` for a leaf that is not a tensor), in flattening order."""
    leaves = pytree.tree_leaves((tuple(args), dict(kwargs)))
    return tuple(tuple(leaf.shape) if isinstance(leaf, torch.Tensor) else None for leaf in leaves)


def varying_dims(seen: Iterable[tuple], current: tuple) -> dict[int, frozenset[int]]:
    """By leaf index, the dims of ``current`` (``leaf_shapes`` of a call) whose size differs from any
    of ``seen`` (the shapes of earlier calls of the same ranks): what an automatic symbolic capture
    makes dynamic."""
    out: dict[int, set[int]] = {}
    for shapes in seen:
        for i, (old, new) in enumerate(zip(shapes, current)):
            if old is not None and new is not None and old != new:
                out.setdefault(i, set()).update(d for d, (a, b) in enumerate(zip(old, new)) if a != b)
    return {i: frozenset(dims) for i, dims in out.items()}


def largest_sizes(symbols: dict[tuple[int, int], str], seen: Iterable[tuple]) -> dict[str, int]:
    """The size each symbol (by ``(leaf, dim)``, as a symbolic capture names its input dims) is
    planned at: the largest that dim took over ``seen`` (``leaf_shapes`` of the calls so far), so a
    symbolic plan made when a small call arrived is not priced as small for every later call."""
    out: dict[str, int] = {}
    seen = list(seen)
    for (i, d), symbol in symbols.items():
        sizes = [shapes[i][d] for shapes in seen if shapes[i] is not None and len(shapes[i]) > d]
        out[symbol] = max([out.get(symbol, 0), *sizes])
    return {symbol: size for symbol, size in out.items() if size}


def describe_key(args: tuple, kwargs: dict) -> str:
    """The tensor shapes of a call, for messages: ``(2, 16), attention_mask=(2, 16)``."""
    def one(v: Any) -> str:
        return str(tuple(v.shape)) if isinstance(v, torch.Tensor) else type(v).__name__
    return ", ".join([one(a) for a in args] + [f"{k}={one(v)}" for k, v in kwargs.items()])


@dataclass
class Plan:
    """One planned graph (or, for the dynamo route, the reports of the graphs one call compiled)."""

    run: Callable
    report: Report
    shapes: str
    graph_module: Any = None  # the rewritten GraphModule (torch.export route), else None
    #: a symbolic plan of the export route: the calls it takes (``capture.accepts``) among those of
    #: its ``family`` (their ``call_key`` without sizes)
    accepts: Callable[[tuple, dict], bool] | None = None
    family: Hashable = None


@dataclass
class PlanCache:
    """Plans by ``call_key``, most recently used last; at most ``limit`` kept."""

    limit: int = DEFAULT_PLAN_LIMIT
    plans: "OrderedDict[Hashable, Plan]" = field(default_factory=OrderedDict)

    def get(self, key: Hashable) -> Plan | None:
        plan = self.plans.get(key)
        if plan is not None:
            self.plans.move_to_end(key)
        return plan

    def put(self, key: Hashable, plan: Plan) -> Plan:
        self.plans[key] = plan
        while len(self.plans) > self.limit:
            self.plans.popitem(last=False)
        return plan


def all_fp32_note(report: Report) -> str:
    """What a torch-path user is told when a plan runs none of its GEMM/conv FLOPs in the low dtype
    (never silently: docs/architecture.md, "The objective"): the why-line's first line and what would
    change it, or "" where some run low, there are none, or the user chose a planner other than the
    cost model's."""
    summary = report.summary
    if not summary.get("gemm_flops") or summary.get("fp16_gemm_flop_fraction", 1.0) or \
            summary.get("planner", "optimal") != "optimal":
        return ""
    lines = [line.strip() for line in (summary.get("fp32_tensor_core_why") or "").splitlines() if line.strip()]
    why = lines[0] if lines else "FP32 by the plan"
    change = next((line for line in lines if line.startswith("would change it")), "")
    return (f"the plan runs every GEMM/conv in FP32 ({why})" + (f"; {change}" if change else "")
            + "; report.summary['fp32_tensor_core_why'] has the numbers")


def merge_reports(reports: list[Report], source: str, capture: str) -> Report:
    """One report over ``reports`` (the graphs of one capture); ops and casts carry their graph's index."""
    if not reports:
        raise ValueError("merge_reports needs at least one report")
    first = reports[0].data
    ops, casts, passes, alignment = [], [], [], []
    for i, r in enumerate(reports):
        ops += [{**op, "graph": i} for op in r.ops]
        casts += [{**c, "graph": i} for c in r.casts]
        passes += [{**p, "graph": i} for p in r.passes]
        alignment += list(r.alignment)
    summary = dict(reports[0].summary)
    for key in (*_SUMMED, *(k for k in summary if str(k).startswith(_MEMORY_PREFIX))):
        summary[key] = sum(r.summary.get(key, 0) or 0 for r in reports)
    low = sum((r.summary.get("fp16_gemm_flop_fraction", 1.0) or 0.0) * (r.summary.get("gemm_flops", 0) or 0)
              for r in reports)
    summary["fp16_gemm_flop_fraction"] = low / summary["gemm_flops"] if summary["gemm_flops"] else 1.0
    mixed = summary["predicted_time_mixed_s"]
    summary["predicted_speedup_vs_fp32"] = summary["predicted_time_fp32_s"] / mixed if mixed else 1.0
    summary["predicted_speedup_vs_all_fp16"] = summary["predicted_time_all_fp16_s"] / mixed if mixed else 1.0
    summary["dim_values"] = {k: v for r in reports for k, v in (r.summary.get("dim_values") or {}).items()}
    summary["unknown_ops"] = sorted({u for r in reports for u in r.summary.get("unknown_ops", [])})
    why = [r.summary.get("fp32_tensor_core_why") for r in reports]
    summary["fp32_tensor_core_why"] = "\n".join(f"graph {i}: {w}" if len(reports) > 1 else w
                                                 for i, w in enumerate(why) if w)
    saturated = {k: v for r in reports for k, v in (r.summary.get("saturated_constants") or {}).items()}
    if saturated:
        summary["saturated_constants"] = saturated
    summary.update(capture=capture, graphs=len(reports), graph_sources=[r.source for r in reports])
    return Report({**first, "source": source, "summary": summary, "ops": ops, "casts": casts,
                   "passes": passes, "alignment": alignment})


__all__ = ["DEFAULT_PLAN_LIMIT", "Plan", "PlanCache", "all_fp32_note", "beyond_fp16", "call_key", "call_structure",
           "describe_key", "largest_sizes", "leaf_shapes", "merge_reports", "varying_dims"]
