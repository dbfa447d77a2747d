"""The ``torch.compile`` backend: ``torch.compile(model, backend="amp_compiler", options={...})``.

Dynamo hands over each graph it captures (one per graph break); the backend retraces it
to functional core-aten ops, plans it with the same passes as ``amp_compiler.compile`` and
runs the rewritten graph eagerly, or through inductor with ``options={"backend": "inductor"}``
so the remaining casts fuse into neighbouring kernels.

Options (all optional): ``target``, ``dtype``, ``allow``, ``deny``, ``deny_nodes``,
``planner``, ``keep_io_types``, ``default_dim``, ``deny_propagation``, ``deploy``,
``objective`` -- as for ``amp_compiler.compile`` --
``backend`` (None or "inductor"), ``mode`` (inductor's ``torch.compile`` mode, with ``backend="inductor"``:
``torch.compile`` takes ``mode=`` or ``options=``, not both, so a ``mode=`` of its own reaches a backend
without ``options`` and is said not to apply to the eager plans), ``training`` (default: grad mode is on and a parameter
requires grad), ``on_report`` (a callable that receives each graph's ``Report`` when it is
planned) and ``on_run`` (one called with that ``Report`` each time the graph runs: which plan a
call used, when dynamo picks among several) and ``reuse`` (a dict the caller keeps: a graph
identical to one planned before, same code, inputs, weights and mode, gets that plan's runner
and report back instead of a new plan; dynamo compiles the same graph again for guards that do
not change it, such as ``torch.inference_mode()``'s dispatch keys after ``torch.no_grad()``).
The last reports are also kept in ``amp_compiler.backend.reports``.

Weights reach dynamo graphs as inputs. For inference their FP16 copies are made once and
recast only when a parameter changes in place; for training the casts stay in the graph
so gradients reach the FP32 parameters.

The backend is registered under the name ``amp_compiler`` when this module is imported
(``import amp_compiler`` does it when torch is already imported) and, for an installed
package, through the ``torch_dynamo_backends`` entry point, so the name works without
importing anything first.
"""

from __future__ import annotations

import difflib
import warnings
import weakref
from collections import deque
from typing import Any, Callable, Sequence

import torch
from torch import fx

from cost_model.runtime import default_runtime

from .dtypes import normalize_low_dtype
from .fx_io.autograd_functions import check_dynamo_graph
from .fx_io.capture import dynamo_aten_graph, dynamo_weights, views_as_reshapes
from .fx_io.emitter import emit
from .fx_io.importer import import_graph_module, resolve_rule_names
from .fx_io.operand_dtypes import check_operand_dtypes
from .fx_io.plans import all_fp32_note, beyond_fp16, finite_peak
from .plan import make_context, run_passes
from .plan_report import build_report
from .report import Report
from .user_frame import user_stacklevel

NAME = "amp_compiler"
_PLAN_OPTIONS = ("target", "planner", "keep_io_types", "allow", "deny", "deny_nodes", "default_dim", "profile",
                 "deny_propagation", "objective")
_OPTIONS = frozenset(_PLAN_OPTIONS + ("dtype", "backend", "mode", "training", "on_report", "on_run", "source",
                                     "deploy", "reuse"))
#: reports of the last graphs compiled by the backend, newest last
reports: deque[Report] = deque(maxlen=32)
# frames whose all-FP32 plan was said (``_say_if_fp32``), by the graph's first weight (the model's), so that
# another model in the same frame id after ``torch._dynamo.reset()`` is told too
_fp32_said: dict[int, tuple[weakref.ref, set]] = {}  # id(weight): (the weight, its frames said)
_fp32_said_weightless: set = set()  # the same for graphs without weights, by frame and code
_mode_said: set[str] = set()  # torch.compile modes said not to apply to eager plans (``_checked_options``)


def amp_compiler_backend(gm: fx.GraphModule, example_inputs: Sequence[Any], options: dict | None = None,
                         **kwargs: Any) -> Callable:
    """Dynamo backend: plan and apply mixed precision on one captured graph."""
    opts = _checked_options({**(options or {}), **kwargs})
    low = normalize_low_dtype(str(opts.get("dtype", torch.float16)))
    compile_id = getattr(gm, "meta", {}).get("dynamo_compile_id")  # frame/graph, as in TORCH_LOGS
    source = opts.get("source") or f"torch.compile graph {compile_id if compile_id is not None else len(reports)}"
    specs = dynamo_weights(gm, example_inputs)
    training = opts.get("training")
    if training is None:
        training = torch.is_grad_enabled() and any(s.is_parameter and s.value.requires_grad for s in specs.values())
    reuse = opts.get("reuse")
    same = _graph_key(gm, example_inputs, specs, bool(training)) if reuse is not None else None
    if same is not None and same in reuse:
        return reuse[same]
    if training:
        check_dynamo_graph(gm, source)  # its backward() would be lost in the retrace
    aten = dynamo_aten_graph(gm, example_inputs, source, training=bool(training))
    check_operand_dtypes(aten, source, (s.value for s in specs.values() if s.is_parameter))
    placeholders = [n for n in aten.graph.nodes if n.op == "placeholder"]
    weights = {placeholders[i].name: spec for i, spec in specs.items()}
    plan_opts = {k: opts[k] for k in _PLAN_OPTIONS if k in opts}
    plan_opts["runtime"] = opts.get("deploy") or default_runtime("torch", opts.get("backend"))  # what it runs on
    ctx = make_context(dtype=low, training=bool(training), **plan_opts)
    peaks = {p.name: finite_peak(example_inputs[i]) for i, p in enumerate(placeholders)  # finfo.min masks
             if p.name not in weights and i < len(example_inputs)
             and isinstance(example_inputs[i], torch.Tensor) and beyond_fp16(example_inputs[i])}
    imp = import_graph_module(aten, source=source, training=bool(training), weights=weights,
                              default_dim=ctx.default_dim, input_peaks=peaks)
    resolve_rule_names(imp.graph, ctx, source, node_names=opts.get("deny_nodes") or ())
    result = run_passes(imp.graph, ctx, source, imp.dim_values)
    folded = emit(imp, result)
    report = build_report(result)  # after emission: counts the casts the emitter added
    reports.append(report)
    if opts.get("on_report"):
        opts["on_report"](report)
    if not opts.get("on_report") and not opts.get("on_run"):  # else the caller has the reports (compile's route)
        _say_if_fp32(report, compile_id, gm, specs)
    aten.report = report
    inner: Callable = aten
    if opts.get("backend") == "inductor":
        from torch._inductor import list_mode_options
        from torch._inductor.compile_fx import compile_fx

        patches = list_mode_options(opts["mode"]) if opts.get("mode") else None
        inner = compile_fx(views_as_reshapes(aten), list(example_inputs), config_patches=patches)
    on_run = opts.get("on_run")
    if not folded.entries and on_run is None:
        runner = inner
    else:
        def runner(*args: Any) -> Any:
            if on_run is not None:
                on_run(report)
            if folded.entries:
                folded.refresh(aten, args)
            return inner(*args)

    if same is not None:
        reuse[same] = runner
    return runner


def _checked_options(opts: dict) -> dict:
    """The backend's options, refused with the closest known name for an unknown one (a typo had been
    listed among 18 names), and ``torch.compile``'s ``mode``: validated, passed to inductor with
    ``backend="inductor"``, and otherwise said, once per mode, not to apply (it had been dropped silently)."""
    for name in sorted(set(opts) - _OPTIONS):
        close = difflib.get_close_matches(name, sorted(_OPTIONS), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ValueError(f"unknown amp_compiler backend option {name!r}: {hint}known: {sorted(_OPTIONS)}")
    if opts.get("backend") not in (None, "inductor"):
        raise ValueError(f"unknown backend {opts['backend']!r}: use None or 'inductor'")
    mode = opts.get("mode")
    if mode in (None, "default"):
        return opts
    from torch._inductor import list_mode_options

    list_mode_options(mode)  # an unknown mode: torch's error, naming the modes
    if opts.get("backend") != "inductor" and mode not in _mode_said:
        _mode_said.add(mode)
        warnings.warn(f"amp_compiler: torch.compile(mode={mode!r}) sets inductor's options; the amp_compiler "
                      f"backend runs its plans eagerly, so it does not apply. torch.compile takes mode= or "
                      f"options=, not both: pass options={{'backend': 'inductor', 'mode': {mode!r}}} to compile "
                      f"the plans with inductor in that mode", stacklevel=user_stacklevel())
    return opts


def _say_if_fp32(report: Report, compile_id: Any, gm: fx.GraphModule, specs: dict) -> None:
    """Warn when a graph's plan runs every GEMM/conv in FP32 (``all_fp32_note``): once per frame dynamo
    compiles (``compile_id`` frame/recompile) of one model (its first weight), not again at each
    recompile of it. Frame ids restart at ``torch._dynamo.reset()``: keyed by them alone, the next
    model compiled after a reset (in frame 0 again) was not told. (Another instance of a class compiled
    without a reset runs the graph dynamo compiled for the first, whose plan was said.)"""
    note = all_fp32_note(report)
    if not note:
        return
    frame = str(compile_id).split("/")[0] if compile_id is not None else report.source
    weight = next((spec.value for spec in specs.values()), None)
    said = _frames_said(weight) if weight is not None else _fp32_said_weightless
    key = frame if weight is not None else (frame, gm.code)
    if key not in said:
        said.add(key)
        warnings.warn(f"amp_compiler: {report.source}: {note}", stacklevel=user_stacklevel())


def _frames_said(weight: torch.Tensor) -> set:
    """The frames whose all-FP32 note was said for the model holding ``weight`` (a freed weight's id
    may be taken again: its entry is then new)."""
    entry = _fp32_said.get(id(weight))
    if entry is None or entry[0]() is not weight:
        entry = _fp32_said[id(weight)] = (weakref.ref(weight), set())
    return entry[1]


def _graph_key(gm: fx.GraphModule, example_inputs: Sequence[Any], specs: dict, training: bool) -> Any:
    """What a plan of dynamo's graph ``gm`` depends on: its code, each input's shape (symbols by name),
    strides, dtype, device and ``requires_grad``, the identity of its weights, which inputs hold values
    FP16 cannot (planned FP32), and the mode. Not the dispatch keys dynamo also guards on: under
    ``torch.inference_mode()`` a tensor has no autograd keys, and the same graph runs the same.
    ``None`` when an input is neither a tensor nor a number (not compared)."""
    inputs = []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, x in enumerate(example_inputs):
        if isinstance(x, torch.Tensor):
            weight = id(specs[i].value) if i in specs else None
            peak = weight is None and beyond_fp16(x)
            fake = placeholders[i].meta.get("example_value") if i < len(placeholders) else None
            like = fake if isinstance(fake, torch.Tensor) else x  # dynamo's, with its symbolic sizes
            inputs.append((tuple(str(n) for n in like.shape), tuple(str(n) for n in like.stride()), x.dtype,
                           x.device, x.requires_grad, weight, peak))
        elif isinstance(x, (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)):
            inputs.append((type(x).__name__, str(x)))
        else:
            return None
    return gm.code, tuple(inputs), training


def register() -> None:
    """Make ``backend="amp_compiler"`` resolve to this backend (idempotent)."""
    from torch._dynamo.backends import registry

    known = getattr(registry, "_BACKENDS", {})
    if NAME in known or NAME in getattr(registry, "_COMPILER_FNS", {}):
        return  # registered already, or found through the entry point (which imports this module)
    registry.register_backend(amp_compiler_backend, name=NAME)


register()

__all__ = ["NAME", "amp_compiler_backend", "register", "reports"]
