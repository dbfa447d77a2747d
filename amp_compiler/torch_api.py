"""``amp_compiler.compile``: an FP32 ``nn.Module`` in, a mixed-precision module and its report out.

Two capture routes (``docs/architecture.md``, "Capture routes and shapes"):

* ``torch.export`` (non-strict, aten level), tried first: one ``GraphModule`` per plan,
  planned by the same passes as the ONNX path, the plan written back into it;
* when export cannot capture the model (a data-dependent branch, an output type without
  a pytree, a view export's tracer refuses), ``torch.compile`` with this package's
  backend: dynamo splits the forward at what it cannot trace and every graph is planned;
  the report merges them (``report.summary["capture"]``, ``["graphs"]``).

Only when neither route captures anything does ``compile`` raise: one ``ConversionError``
naming the module and the construct, and what to try next.

The module returned, an ``AmpModule``, shares the model's parameters, buffers and
submodules (its ``state_dict`` is the model's), keeps the forward's signature and output
dtypes, and plans per call shape and per train/eval mode (the model's, at each call; with
gradients kept, per set of parameters that require grad). On both routes a dim seen at a second size gets one
symbolic plan that later sizes share, as ``torch.compile`` does by default: on the export
route the call is captured again with those dims ``Dim.AUTO`` and the plan takes every call
its guards accept; a call no plan takes (other dtypes or non-tensor arguments, a dim the model
pins) is captured and planned again, up to ``max_plans`` plans (least recently used dropped
first, with a warning). ``amp_model.plans`` says how many exist, ``amp_model.report`` is the report of
the plan the last call used.

* inference (``training=False``, the default for a model in eval mode, its layers' mode: a
  ``DataParallel`` or other wrapper made after ``.eval()`` counts as eval): every weight an
  FP16 op reads is cast once, at plan time, into an FP16 buffer and reused; the copy is
  recast automatically if the FP32 master changes in place (``load_state_dict``);
* training (``training=True``, the default for a model in train mode): the casts of the
  weights stay in the graph, so gradients flow to the FP32 parameters; buffers the model
  writes (BatchNorm running statistics) are written back as in eager mode.
"""

from __future__ import annotations

import copy
import functools
import inspect
import warnings
from typing import Any, Callable, Iterable, Mapping

import torch

from .dims import check_sizes
from .dtypes import normalize_low_dtype
from .dynamo_route import DynamoRoute
from .errors import ConversionError
from .export_route import ExportRoute, plan_context
from .fx_io.autograd_functions import CustomBackwardError
from .fx_io.flags import RESTLESS, FlagWatch
from .fx_io.capture_failure import dynamo_or_raise
from .fx_io.inference_grad import warn_no_weight_grad, warn_train_plan_without_grad
from .fx_io.mode import effective_training, module_modes
from .fx_io.model_checks import (HookWatch, SwapWatch, bind_error, refuse_meta, signature, warn_if_hooked,
                                 warn_if_low_precision, warn_if_recurrent)
from .fx_io.operand_dtypes import OperandDtypeError
from .rule_names import RuleNameError
from .fx_io.plans import DEFAULT_PLAN_LIMIT, Plan, all_fp32_note
from .fx_io.serving import CAPTURE_LOCK
from .user_frame import user_stacklevel
from .report import Report

BACKENDS = (None, "inductor")


class AmpModule(torch.nn.Module):
    """The mixed-precision module ``compile`` returns: the model's weights, planned per call shape."""

    def __init__(self, model: torch.nn.Module, route, source: str, options: dict,
                 route_for: Callable[[bool], Any], recompile: dict) -> None:
        super().__init__()
        # the model's own dicts: parameters(), state_dict() and load_state_dict() are the model's
        self.__dict__.update(_parameters=model._parameters, _buffers=model._buffers, _modules=model._modules)
        self.training = effective_training(model)
        # options: compile's keywords, for the submodules generate calls apart (an encoder)
        self.__dict__.update(_route=route, _last=None, _source=source, _options=options, _encoder=None,
                             _recompile=recompile)  # compile's other keywords (training, dynamic_shapes), for deepcopy
        # one route per train/eval mode (and, keeping gradients, per set of trainable parameters): the
        # others are made (planned on their first call) by route_for
        self.__dict__.update(_routes={}, _route_for=route_for)
        self.__dict__.update(_flags=FlagWatch(model), _hooks=HookWatch(model), _swaps=SwapWatch(model))
        self.__dict__.update(_mode=self._route_key())

    @property
    def capture(self) -> str:
        """Which route captured the model: ``"torch.export"`` or dynamo's."""
        return self._route.name

    def _all_plans(self) -> list[Plan]:
        """The plans of both modes' routes, the current mode's last."""
        return [p for route in (*self._routes.values(), self._route) for p in route.plans]

    @property
    def plans(self) -> int:
        """How many plans (call shapes, in either train/eval mode) this module holds now."""
        return len(self._all_plans())

    @property
    def report(self) -> Report | None:
        """The report of the plan the last call used (the example's until another shape is called).
        ``None`` where there is none, with a warning saying why (it had been a bare ``None``: compiled
        without an example, ``print(amp_model.report)`` before the first call printed "None")."""
        report = self._last.report if self._last is not None else None
        if report is None:
            warnings.warn(f"amp_compiler: AmpModule({self._source}).report is None: {self._why_no_report()}",
                          stacklevel=user_stacklevel())
        return report

    def _why_no_report(self) -> str:
        if self._last is not None:  # a call beyond max_plans ran the FP32 model (dynamo's eager_on_recompile)
            return (f"the last call ran the FP32 model, no plan (max_plans={self._options['max_plans']} plans held: "
                    f"raise max_plans); amp_model.reports lists the plans held")
        if self.__dict__.get("_dropped"):
            return ("its plans were dropped (made for the model's old dtypes) and it plans again on its next call: "
                    "call it, then read the report")
        return ("nothing is planned yet: compiled without example inputs (or copied), it plans on its first call, "
                "as torch.compile does; call it first, or pass the example to compile(model, (x,)) (or "
                "example_kwargs=) to plan, and have the report, at compile time")

    @property
    def reports(self) -> list[tuple[str, Report | None]]:
        """``(call shapes, report)`` of each plan held, least recently used first."""
        return [(p.shapes, p.report) for p in self._all_plans()]

    @torch.compiler.disable  # torch.compile(amp_model) runs the plans as they are (docs/architecture.md)
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with CAPTURE_LOCK.running():  # not while another thread's capture holds fakes in the module's slots
            swapped = self._swaps.swapped()
            if swapped:  # plans read the tensors they were captured with (model_checks.SwapWatch)
                if self.plans:
                    warnings.warn(f"amp_compiler: AmpModule({self._source}): {swapped} was replaced since its "
                                  f"plans were made, which read the old one's weights: planned again",
                                  stacklevel=user_stacklevel())
                self._drop_plans()
        self._follow_mode()
        first = isinstance(self._route, _FirstCall)
        if not first:  # a first call captures the hooks there are (and warns of them)
            self._hooks.check("AmpModule", stacklevel=user_stacklevel() + 1)
        plan, out = self._route.call(args, kwargs)
        if first:
            self._hooks.reset()
        flags = self._flags.values()
        if flags != self._mode[2]:  # the forward wrote them: state, not flags (fx_io/flags.py)
            self._rekey(self._flags.forget(self._mode[2], flags))
        if isinstance(self._route, _FirstCall):  # compiled without an example: its first call chose the route
            self.__dict__["_route"] = self._route.route
        self.__dict__["_last"] = plan
        self._say_if_fp32(plan)
        with CAPTURE_LOCK.running():
            if self._swaps.swapped():  # the forward itself replaced them (dynamo runs its Python): state
                self._swaps.reset()
        if self._mode[1] is None and not self.__dict__.get("_grad_said") and torch.is_grad_enabled() and \
                any(p.requires_grad for p in self._route.model.parameters()):  # said once (fx_io/inference_grad.py)
            self.__dict__["_grad_said"] = warn_no_weight_grad(f"AmpModule({self._source})",
                                                              stacklevel=user_stacklevel() + 1)
        if self._mode[0] and any(self._mode[1] or ()) and self._recompile.get("training") is None and \
                not torch.is_grad_enabled() and not self.__dict__.get("_no_grad_said"):  # left in train mode, called for inference: said once
            self.__dict__["_no_grad_said"] = warn_train_plan_without_grad(f"AmpModule({self._source})",
                                                                          stacklevel=user_stacklevel() + 1)
        return out

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        """The model's own ``generate`` (transformers), with every forward call it makes run by this
        module's plans: on a shallow copy of the model whose ``forward`` is this module (the
        copy shares the model's weights, config and generation config). An encoder-decoder's
        encoder, which generate calls apart, is planned on its first call with this module's
        options (``generate_encoder``)."""
        model = self._route.model
        if not callable(getattr(model, "generate", None)):
            raise AttributeError(f"{self._source} has no generate() to run (not a transformers generation model)")
        view = copy.copy(model)
        view.forward = functools.wraps(model.forward)(lambda *a, **k: self(*a, **k))
        if getattr(getattr(model, "config", None), "is_encoder_decoder", False) and hasattr(model, "get_encoder"):
            if self._encoder is None:
                self.__dict__["_encoder"] = _PlannedOnFirstCall(model.get_encoder(), self._options)
            view.get_encoder = lambda *a, **k: self._encoder
        return view.generate(*args, **kwargs)

    @property
    def generate_encoder(self) -> "AmpModule | None":
        """The encoder's ``AmpModule`` that ``generate`` runs (an encoder-decoder, once generate ran)."""
        return self._encoder.amp if self._encoder is not None else None

    def __getattr__(self, name: str) -> Any:
        """Submodules, parameters and buffers (the model's own); ``graph``/``code``/``graph_module``
        of the last plan (export route); the model's data attributes (``config``,
        ``generation_config``). A method of the model is refused with a pointer: it would run
        the FP32 model, not the plans."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            gm = self.__dict__.get("_last") and self.__dict__["_last"].graph_module
            if name in ("graph", "code", "graph_module") and gm is not None:
                return gm if name == "graph_module" else getattr(gm, name)
            route = self.__dict__.get("_route")
            try:
                if route is None:  # not set up yet (unpickling, copying)
                    raise AttributeError(name)
                value = getattr(route.model, name)
            except AttributeError:
                source = self.__dict__.get("_source", "model")
                raise AttributeError(f"'AmpModule' object has no attribute {name!r} (nor has the {source} "
                                     f"it plans)") from None
            if inspect.ismethod(value):
                raise AttributeError(
                    f"amp_compiler: {self._source}.{name}() would run the FP32 model, not the plans; the "
                    f"AmpModule plans forward (its calls) and generate(): call model.{name}() on the model "
                    f"itself, or compile the submodule it runs") from None
            return value

    def train(self, mode: bool = True) -> "AmpModule":
        """Sets the model's mode (``model.train(mode)``); the next call runs that mode's plans."""
        self._route.model.train(mode)
        self.training = bool(mode)
        return self

    def _route_key(self) -> tuple[bool, tuple[bool, ...] | None, tuple, tuple[bool, ...]]:
        """The model's mode, where its plans keep gradients which parameters require them (a frozen one
        is folded into an FP16 constant: unfrozen, it would get no gradient), its Python flags (a capture
        bakes their branches in: fx_io/flags.py) and every submodule's train/eval flag (a batch norm
        switched to ``eval()`` inside a model in train mode had kept the capture made with batch statistics)."""
        model, training = self._route.model, self._recompile.get("training")
        mode = effective_training(model)  # a wrapper made after .eval() is in train mode at its root only
        keeps = mode if training is None else training
        return (mode, tuple(p.requires_grad for p in model.parameters()) if keeps else None, self._flags.values(),
                module_modes(model))

    def _say_if_fp32(self, plan: Plan | None) -> None:
        """Warn once per module when a plan runs every GEMM/conv in FP32 (``all_fp32_note``): the
        report says why, but a user who does not read it would think the module mixed precision."""
        note = all_fp32_note(plan.report) if plan is not None and plan.report is not None else ""
        if note and not self.__dict__.get("_fp32_said"):
            self.__dict__["_fp32_said"] = True
            warnings.warn(f"amp_compiler: AmpModule({self._source}): {note}", stacklevel=user_stacklevel())

    def _follow_mode(self) -> None:
        """Run the plans of the model's current mode (``am.train()``/``eval()``, or the model's own),
        Python flags and trainable parameters: a graph is captured in one mode (dropout, batch-norm statistics), with
        the frozen parameters folded, so each has its route, planned on its first call
        (docs/architecture.md, "Capture routes and shapes")."""
        key = self._route_key()
        if key == self._mode:
            return
        if key not in self._routes and key[2] != self._mode[2]:
            restless = self._flags.restless(self._mode[2], key[2])
            if restless:  # a counter, not a flag: watched no more
                names = ", ".join(self._flags.slots[i][2] for i in restless)
                self._rekey(self._flags.drop(set(restless)))
                warnings.warn(f"amp_compiler: AmpModule({self._source}): {names} changed between calls "
                              f"{RESTLESS} times: taken as state, not a flag, so its changes no longer plan again "
                              f"(a branch on it keeps the value its plan was captured with; a value that varies by call "
                              f"belongs in a tensor buffer, which the plans read)", stacklevel=user_stacklevel())
                return self._follow_mode()
            warnings.warn(f"amp_compiler: AmpModule({self._source}): {self._flags.describe(self._mode[2], key[2])} "
                          f"since its plans were made, which baked the old value in: planned again for the new "
                          f"one (as torch.compile recompiles)", stacklevel=user_stacklevel())
        self._routes[self._mode] = self._route
        route = self._routes.pop(key, None) or self._route_for(key[0])
        self.__dict__.update(_route=route, _mode=key)
        self.training = key[0]

    def _drop_plans(self) -> None:
        """Forget every plan (made for other weights or dtypes): the next call plans again, with the
        model's modules and flags watched as they are now."""
        self.__dict__.update(_flags=FlagWatch(self._route.model), _routes={}, _last=None, _dropped=True)
        self._swaps.reset()
        mode = self._route_key()
        self.__dict__.update(_mode=mode, _route=self._route_for(mode[0]))

    def _rekey(self, drop: Callable[[tuple], tuple]) -> None:
        """Re-key the routes after the flags watch dropped attributes (``drop`` removes them from a key)."""
        self.__dict__.update(_mode=(*self._mode[:2], drop(self._mode[2]), *self._mode[3:]),
                             _routes={(*k[:2], drop(k[2]), *k[3:]): route for k, route in self._routes.items()})

    def _apply(self, fn, recurse: bool = True):
        """``.to(device)`` moves the plans' graphs and folded copies; a dtype change (``.double()``,
        ``.to(torch.float64)``) drops the plans, made for the old dtypes, and the next call plans again
        (the folded FP16 copies had been converted too: "mat1 and mat2 must have the same dtype"), as
        does a conversion making new tensors (``to_empty()``), which the plans would not read."""
        model = self._route.model
        before = [t.dtype for t in (*model.parameters(), *model.buffers())]
        super()._apply(fn, recurse)
        # new dtypes, or new tensors (to_empty(): a meta model compiled without an example, materialised)
        if before != [t.dtype for t in (*model.parameters(), *model.buffers())] or self._swaps.swapped():
            self._drop_plans()
        for plan in self._all_plans():
            if plan.graph_module is not None:
                plan.graph_module._apply(fn, recurse)
        # amp_model.half(): the ops the plans keep FP32 would run on FP16 weights, unsaid
        warn_if_low_precision(self._route.model, "AmpModule", stacklevel=4,
                              fix="the plans already run in mixed precision; keep the module float32 "
                                  "(amp_model.float())")
        return self

    def extra_repr(self) -> str:
        return f"capture={self.capture!r}, plans={self.plans}"

    def __deepcopy__(self, memo: dict) -> "AmpModule":
        """An independent ``AmpModule`` over a deep copy of the model, with the same options, planned on
        its first call (copying the plans had kept their graphs running the original's weights)."""
        return compile(copy.deepcopy(self._route.model, memo), **self._options, **self._recompile)

    def __copy__(self) -> "AmpModule":
        new = AmpModule.__new__(AmpModule)  # shares model and plans, as copy.copy did before __reduce_ex__
        # the other mode's route and the replaced-module watch: its own (one copy replanning leaves the other's)
        new.__dict__.update(self.__dict__, _routes=dict(self._routes), _swaps=copy.copy(self._swaps))
        return new

    def __reduce_ex__(self, protocol: int) -> Any:
        raise TypeError(f"amp_compiler: an AmpModule ({self._source}) cannot be pickled or torch.save()d: its "
                        f"plans are captured graphs of this process; save amp_model.state_dict() (the model's) and "
                        f"compile the loaded model again")


def compile(model: torch.nn.Module, example_inputs: Any = (), *, example_kwargs: dict | None = None,
            target: str = "h100", dtype: torch.dtype | str = torch.float16, allow: Iterable[str] = (),
            deny: Iterable[str] = (), deny_nodes: Iterable[str] = (), planner: str = "optimal",
            backend: str | None = None, training: bool | None = None, keep_io_types: bool = True,
            dynamic_shapes: Any = None, default_dim: int = 8, profile=None,
            deny_propagation: bool = True, max_plans: int = DEFAULT_PLAN_LIMIT, deploy: str | None = None,
            objective: str = "time") -> AmpModule:
    """Plan and apply mixed precision on ``model``; returns an ``AmpModule`` with ``.report``.

    ``example_inputs`` (a tensor or a tuple) and ``example_kwargs`` are what ``model`` is
    called with (none: the first call is the example, as
    with ``torch.compile``); their shapes size the cost model; a dim that takes a second size gets one
    symbolic plan, sized by the largest sizes seen, which later sizes share (a serving loop's lengths, a
    decode loop's steps), on either capture route; calls no plan takes get plans of their own
    (at most ``max_plans``). With ``dynamic_shapes`` (as for ``torch.export``) every call
    shares one symbolic plan sized by the example. ``target`` is the device the plan is for,
    ``dtype`` float16 or bfloat16, ``planner`` "optimal" (min-cut) or "greedy". ``allow`` /
    ``deny`` force op classes by aten op (``"addmm"``, ``"aten.addmm.default"``) or canonical
    name (``"gemm"``); ``deny_nodes`` keeps ops named as in the report FP32. ``training``
    (default: the model's mode, ``fx_io.mode.effective_training``: a wrapper made after ``.eval()``
    is in eval mode) keeps the weight casts in the graph so gradients reach the
    FP32 parameters; otherwise FP16 weights are folded once. The module follows the model's
    train/eval mode (``amp_model.eval()``), each mode planned on its first call. ``keep_io_types`` keeps the
    outputs' dtypes. ``backend="inductor"`` hands the rewritten graphs to inductor so the
    remaining casts fuse into neighbouring kernels. ``deny_propagation`` as for
    ``convert_onnx``. ``deploy`` names the runtime profile the cost model prices (default:
    ``inductor`` with ``backend="inductor"``, else ``eager``); ``objective`` ``"time"``,
    ``"memory"`` or ``"fastest"`` (as for ``convert_onnx``). Raises one ``ConversionError`` naming the module and the construct when
    neither torch.export nor dynamo can capture the model.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}: use None or 'inductor'")
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"amp_compiler.compile takes an nn.Module, got {type(model).__name__}")
    if max_plans < 1:
        raise ValueError(f"max_plans must be >= 1, got {max_plans}")
    check_sizes(None, default_dim)
    low = normalize_low_dtype(str(dtype))
    warn_if_low_precision(model, "compile")
    warn_if_recurrent(model, "compile")
    opts = dict(target=target, dtype=low, planner=planner, keep_io_types=keep_io_types, allow=tuple(allow),
                deny=tuple(deny), deny_nodes=tuple(deny_nodes), training=False, default_dim=default_dim,
                profile=profile, deny_propagation=deny_propagation, backend=backend,
                deploy=deploy, objective=objective)
    plan_context(opts)  # bad options fail before any capture
    _check_not_kwargs(model, example_inputs, example_kwargs)
    args = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    kwargs = dict(example_kwargs or {})
    source = type(model).__name__
    options = {**{k: v for k, v in opts.items() if k != "training"}, "max_plans": max_plans}
    recompile = dict(training=training, dynamic_shapes=dynamic_shapes)

    def capture_in(mode: bool) -> Callable[[tuple, dict], tuple[Any, Plan, tuple]]:
        """The capture of the model in train/eval ``mode``: gradients kept by default in train mode."""
        keep = mode if training is None else bool(training)
        return functools.partial(_capture, model, {**opts, "training": keep}, source, dynamic_shapes, max_plans, keep)

    def route_for(mode: bool) -> _FirstCall:
        return _FirstCall(model, capture_in(mode))

    # torch.compile(model)'s habit: no example, plan on the first call (even where every argument has a default,
    # as a transformers model's have: an empty call is not what the model is called with)
    if not args and not kwargs:
        return AmpModule(model, route_for(effective_training(model)), source, options, route_for, recompile)
    if not _binds(model, args, kwargs):
        raise TypeError(f"amp_compiler.compile({source}): the example does not fit {source}.forward"
                        f"{signature(model)} ({bind_error(model, args, kwargs)}); pass what the model is "
                        "called with: compile(model, (x,), example_kwargs={...}), or no example to plan on "
                        "the first call")
    route, plan, _ = capture_in(effective_training(model))(args, kwargs)
    amp = AmpModule(model, route, source, options, route_for, recompile)
    amp.__dict__["_last"] = plan
    amp._say_if_fp32(plan)
    return amp


def _check_not_kwargs(model: torch.nn.Module, example_inputs: Any, example_kwargs: Any) -> None:
    """A ``TypeError`` for ``example_inputs={"input_ids": ids}`` meant as keyword arguments: its keys
    name the forward's parameters (it had failed on "'dict' object has no attribute 'size'")."""
    if not isinstance(example_inputs, Mapping) or example_kwargs or not example_inputs:
        return
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return
    if all(isinstance(k, str) and k in params for k in example_inputs):
        raise TypeError(f"amp_compiler.compile({type(model).__name__}): example_inputs is a dict of the forward's "
                        f"keyword arguments ({', '.join(example_inputs)}): pass it as example_kwargs=...")


def _capture(model: torch.nn.Module, opts: dict, source: str, dynamic_shapes: Any, max_plans: int, training: bool,
             args: tuple, kwargs: dict) -> tuple[Any, Plan, tuple]:
    """The route that captures ``model`` called with ``args``/``kwargs`` (torch.export's, else
    dynamo's), the plan of that call and ``(output,)`` if capturing ran the call (dynamo's), else
    ``()``; one ``ConversionError`` when neither captures it."""
    refuse_meta(model, (args, kwargs), "compile")
    route: Any = ExportRoute(model, opts, source, dynamic_shapes, max_plans)
    try:
        plan = route.first(args, kwargs)
    except ConversionError as export_error:
        if dynamic_shapes is not None or isinstance(export_error, (CustomBackwardError, OperandDtypeError,
                                                                   RuleNameError)):
            raise  # the user asked for torch.export's symbolic shapes, or dynamo would capture the same
        route = DynamoRoute(model, opts, source, max_plans)  # dynamo runs hooks' side effects at each call
        return route, *dynamo_or_raise(route, model, args, kwargs, export_error, training)
    warn_if_hooked(model, "compile", stacklevel=4)  # export ran them once, into the graph
    return route, plan, ()


class _FirstCall:
    """The route of an ``AmpModule`` compiled without an example, until its first call: that call
    captures and plans the model (as ``torch.compile`` does) and hands over to the route it chose."""

    name = "not captured yet (plans on its first call)"

    def __init__(self, model: torch.nn.Module, capture: Callable[[tuple, dict], tuple[Any, Plan, tuple]]) -> None:
        self.model, self.capture, self.route = model, capture, None

    @property
    def plans(self) -> list[Plan]:
        return []

    def call(self, args: tuple, kwargs: dict) -> tuple[Plan, Any]:
        if not _binds(self.model, args, kwargs):  # the model's own TypeError, not a capture failure
            return None, self.model(*args, **kwargs)
        with CAPTURE_LOCK.capturing():
            if self.route is not None:  # another thread's first call captured it meanwhile
                return self.route.call(args, kwargs)
            route, plan, ran = self.capture(args, kwargs)
            self.route = route
        # dynamo's capture ran the call: running it again would repeat its side effects (a cache appended twice)
        return (plan, ran[0]) if ran else self.route.call(args, kwargs)


def _binds(model: torch.nn.Module, args: tuple, kwargs: dict) -> bool:
    return bind_error(model, args, kwargs) is None


class _PlannedOnFirstCall:
    """A submodule ``generate`` calls apart (``get_encoder()``), compiled with ``options`` on its
    first call, whose shapes size the plan. ``forward`` keeps the submodule's signature, which
    generate reads to choose the arguments it passes."""

    def __init__(self, module: torch.nn.Module, options: dict) -> None:
        self.module, self.options, self.amp = module, options, None
        self.forward = functools.wraps(module.forward)(lambda *a, **k: self(*a, **k))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.amp is None:
            self.amp = compile(self.module, args, example_kwargs=kwargs, **self.options)
        return self.amp(*args, **kwargs)


__all__ = ["AmpModule", "compile"]
