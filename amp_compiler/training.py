"""``compile_training``: forward, backward and optimizer captured as one graph, in mixed precision.

The step is written functionally — ``functional_call`` for the forward, ``autograd.grad``
for the backward (seeded with the scaled loss), the functional optimizer for the update,
loss scaling as tensor ops — and traced once with ``make_fx``. Every input that changes
between steps (parameters, optimizer state, scaler state, hyper-parameters, the batch) is
a graph input, so the graph never changes after step 0. The shared passes then plan the
whole step: forward and backward GEMMs go FP16, and propagation stops at the
``unscale_marker`` on each gradient, so the optimizer and master weights stay FP32.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from . import loss_scale as ls
from . import optim as fopt
from .errors import ConversionError


@dataclass
class _StepLayout:
    """How the flat graph inputs/outputs map to parameters, state and the batch."""

    param_names: list[str]
    buffer_names: list[str]
    state_keys: list[str]
    hyper_keys: list[str]
    n_batch: int
    group_of: list[int] = field(default_factory=list)


class TrainStep:
    """``loss = step(*batch)``: one mixed-precision training step, parameters written back."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, graph: Callable,
                 layout: _StepLayout, opt: fopt.FunctionalOptimizer, config: ls.LossScaleConfig,
                 opt_state: dict[str, list[torch.Tensor]], report: Any = None) -> None:
        self.model, self.optimizer, self.graph, self.layout = model, optimizer, graph, layout
        self.opt, self.config, self.report = opt, config, report
        #: the rewritten step graph, and the name of its node behind each report row
        self.graph_module: torch.fx.GraphModule | None = graph if isinstance(graph, torch.fx.GraphModule) else None
        self.report_nodes: dict[str, str] = {}
        self._params = dict(model.named_parameters())
        self._buffers = dict(model.named_buffers())
        self._opt_state = opt_state
        self._scale = torch.tensor(config.init_scale, dtype=torch.float32)
        self._tracker = torch.zeros((), dtype=torch.float32)
        self._skipped = torch.zeros((), dtype=torch.int64)

    # -- running --------------------------------------------------------------------------------
    def __call__(self, *batch: torch.Tensor) -> torch.Tensor:
        if len(batch) != self.layout.n_batch:
            raise TypeError(f"the step takes {self.layout.n_batch} batch tensors, got {len(batch)}")
        flat = self._flat_inputs(batch)
        loss, new_params, new_state, scale, tracker, overflow = _unflatten(self.graph(*flat), self.layout)
        with torch.no_grad():
            for name, value in zip(self.layout.param_names, new_params):
                self._params[name].copy_(value)
        self._opt_state = dict(zip(self.layout.state_keys, new_state))
        self._scale, self._tracker = scale, tracker
        self._skipped = self._skipped + overflow.to(torch.int64)
        return loss

    def _flat_inputs(self, batch) -> list[torch.Tensor]:
        hyper = fopt.hyper_tensors(self.opt, self.optimizer, self.layout.group_of)
        return [*(self._params[n].detach() for n in self.layout.param_names),
                *(self._buffers[n] for n in self.layout.buffer_names),
                *(t for k in self.layout.state_keys for t in self._opt_state[k]),
                *(hyper[k] for k in self.layout.hyper_keys),
                self._scale, self._tracker, *batch]

    # -- state ------------------------------------------------------------------------------------
    @property
    def scale(self) -> float:
        """The current loss scale (reading it synchronises; the step itself never does)."""
        return float(self._scale)

    @property
    def skipped_steps(self) -> int:
        return int(self._skipped)

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer_state": {k: [t.clone() for t in v] for k, v in self._opt_state.items()},
                "scale": self._scale.clone(), "growth_tracker": self._tracker.clone(),
                "skipped_steps": self._skipped.clone(), "loss_scale": self.config.mode}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        missing = {"optimizer_state", "scale", "growth_tracker", "skipped_steps"} - set(state)
        if missing:
            raise KeyError(f"state_dict lacks {sorted(missing)}")
        self._opt_state = {k: [t.clone() for t in v] for k, v in state["optimizer_state"].items()}
        self._scale = state["scale"].clone()
        self._tracker = state["growth_tracker"].clone()
        self._skipped = state["skipped_steps"].clone()


def _unflatten(outputs, layout: _StepLayout):
    outputs = list(outputs)
    n_p, n_s = len(layout.param_names), len(layout.state_keys)
    loss = outputs[0]
    new_params = outputs[1:1 + n_p]
    flat_state = outputs[1 + n_p:1 + n_p + n_s * n_p]
    new_state = [flat_state[i * n_p:(i + 1) * n_p] for i in range(n_s)]
    scale, tracker, overflow = outputs[1 + n_p + n_s * n_p:]
    return loss, new_params, new_state, scale, tracker, overflow


def capture_step(model: torch.nn.Module, loss_fn: Callable, optimizer: torch.optim.Optimizer,
                 example_batch: tuple, config: ls.LossScaleConfig, n_targets: int = 1):
    """Trace one functional training step; returns (GraphModule, layout, functional optimizer, state)."""
    opt = fopt.describe(optimizer)
    params = dict(model.named_parameters())
    trainable = [n for n, p in params.items() if p.requires_grad]
    index = {id(p): g for g, group in enumerate(optimizer.param_groups) for p in group["params"]}
    missing = [n for n in trainable if id(params[n]) not in index]
    if missing:
        raise ConversionError("compile_training", f"parameter {missing[0]}", "is not in the optimizer's param_groups")
    buffers = dict(model.named_buffers())
    state = fopt.init_state(opt, [params[n] for n in trainable])
    layout = _StepLayout(trainable, list(buffers), list(state), list(opt.hyper_names),
                         len(example_batch), [index[id(params[n])] for n in trainable])
    n_p, n_b = len(trainable), len(buffers)

    def step(*flat):
        p = list(flat[:n_p])
        b = list(flat[n_p:n_p + n_b])
        pos = n_p + n_b
        st = {}
        for key in layout.state_keys:
            st[key] = list(flat[pos:pos + n_p])
            pos += n_p
        hyper = {k: flat[pos + i] for i, k in enumerate(layout.hyper_keys)}
        pos += len(layout.hyper_keys)
        scale, tracker = flat[pos], flat[pos + 1]
        batch = flat[pos + 2:]
        inputs, targets = batch[:len(batch) - n_targets], batch[len(batch) - n_targets:]
        p_req = [t.detach().requires_grad_(True) for t in p]
        out = torch.func.functional_call(model, {**dict(zip(trainable, p_req)), **dict(zip(buffers, b))}, inputs)
        loss = loss_fn(out, *targets)
        grads = torch.autograd.grad(loss * scale, p_req)  # the backward seed is the scaled loss
        inv = 1.0 / scale
        grads = [ls.unscale_marker(g * inv) for g in grads]
        overflow = ls.found_inf(grads) if config.mode != "none" else torch.zeros((), dtype=torch.bool)
        new_p, new_st = fopt.update(opt, [t.detach() for t in p], grads, st, hyper)
        new_p = ls.skip_if(overflow, new_p, p)
        flat_state = []
        for key in layout.state_keys:
            flat_state += ls.skip_if(overflow, new_st[key], st[key])
        new_scale, new_tracker = ls.next_scale(config, scale, tracker, overflow)
        return (loss.detach(), *new_p, *flat_state, new_scale, new_tracker, overflow)

    example = [*(params[n].detach() for n in trainable), *buffers.values(),
               *(t for k in layout.state_keys for t in state[k]),
               *fopt.hyper_tensors(opt, optimizer, layout.group_of).values(),
               torch.tensor(config.init_scale), torch.zeros(()), *example_batch]
    was_training = model.training
    model.train()
    try:
        gm = make_fx(step, tracing_mode="fake")(*example)  # one fake mode for every node's meta
    except ConversionError:
        raise
    except Exception as exc:  # tracing errors name the construct in their message
        raise ConversionError("compile_training", type(model).__name__,
                              f"the training step could not be captured as one graph: "
                              f"{str(exc).splitlines()[0]}") from None
    finally:
        model.train(was_training)
    return gm, layout, opt, state


def compile_training(model: torch.nn.Module, loss_fn: Callable, optimizer: torch.optim.Optimizer,
                     example_batch: tuple, *, loss_scale: Any = "dynamic", target: str = "h100",
                     dtype: torch.dtype | str = torch.float16, backend: str | None = None,
                     planner: str = "optimal", allow=(), deny=(), deny_nodes=(), n_targets: int = 1,
                     init_scale: float = 2.0 ** 16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                     growth_interval: int = 2000, deny_propagation: bool = False) -> TrainStep:
    """One captured, mixed-precision training step: ``loss = step(*batch)``.

    ``batch`` is the model's inputs followed by ``n_targets`` targets; the loss is
    ``loss_fn(model(*inputs), *targets)``. ``optimizer`` is a ``torch.optim`` SGD, Adam or
    AdamW over ``model``'s parameters; its hyper-parameters are read at every step.
    ``loss_scale`` is ``"dynamic"`` (torch.amp's defaults: 2**16, x2 after 2000 clean
    steps, x0.5 on overflow), a number (constant scale) or ``"none"``. The step writes
    the new parameters into ``model``; ``step.report`` is the per-op report of the step
    graph (forward, backward and optimizer).
    """
    from .dtypes import normalize_low_dtype
    from .fx_io.emitter import emit
    from .fx_io.importer import WeightSpec, import_graph_module
    from .plan import make_context, run_passes
    from .plan_report import build_report

    if backend not in (None, "inductor"):
        raise ValueError(f"unknown backend {backend!r}: use None or 'inductor'")
    config = ls.LossScaleConfig.parse(loss_scale) if loss_scale in (None, "none") else \
        ls.LossScaleConfig.parse(loss_scale, growth_factor=growth_factor, backoff_factor=backoff_factor,
                                 growth_interval=growth_interval)
    if config.mode == "dynamic":
        config = ls.LossScaleConfig("dynamic", init_scale, growth_factor, backoff_factor, growth_interval)
    example_batch = tuple(example_batch)
    gm, layout, opt, state = capture_step(model, loss_fn, optimizer, example_batch, config, n_targets)
    low = normalize_low_dtype(str(dtype))
    source = f"{type(model).__name__} training step"
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    params = dict(model.named_parameters())
    weights = {placeholders[i].name: WeightSpec(name, True, i, params[name])
               for i, name in enumerate(layout.param_names)}
    imp = import_graph_module(gm, source=source, training=True, weights=weights)
    for op in imp.graph.ops.values():
        if op.canonical == "unscale_marker":
            for out in op.outputs:
                imp.graph.tensors[out].unscale_marker = True
    ctx = make_context(target=target, dtype=low, planner=planner, allow=allow, deny=deny, deny_nodes=deny_nodes,
                       training=True, deny_propagation=deny_propagation)
    result = run_passes(imp.graph, ctx, source, imp.dim_values)
    emit(imp, result)
    report = build_report(result)  # after emission: counts the casts the emitter added
    runner = torch.compile(gm, backend="inductor") if backend == "inductor" else gm
    step = TrainStep(model, optimizer, runner, layout, opt, config, state, report)
    step.graph_module = gm
    step.report_nodes = {op: node.name for op, node in imp.nodes.items()}
    return step
