"""One captured variant of the training step: trace, plan, emit (docs/architecture.md, "Training").

A variant is fixed by the batch shapes, whether it applies the update (the last micro-batch)
or only accumulates gradients, the optimizer's state layout and baked hyper-parameters, and
every submodule's train/eval mode; ``training.TrainStep`` keeps one per key. The step is written
functionally — forward and ``autograd.grad`` backward (seeded with ``loss / N * scale``) under
one reparametrisation by the step's parameters (a gradient checkpoint's recompute sees them),
the optimizer's own traced update (``optim.trace_update``) — and traced
with ``make_fx``. Graph inputs, in order: trainable parameters, frozen parameters, buffers,
optimizer-state tensors, one lr (and betas) per group, scale, growth tracker, accumulated gradients (if
any), the batch's tensors (its tree's leaves, ``train_batch.py``: the tree is rebuilt for the model and
``loss_fn``). Outputs: the loss, then the accumulated gradients (accumulating variant) or the new
parameters, new state tensors, scale, tracker, found-inf flag, gradient norm and, with ``keep_grads``,
the unscaled gradients (updating variant). A flushing variant (``TrainStep.flush``) is an updating one
with no batch and no forward: it applies the accumulated gradients of an unfinished accumulation (its
"loss" output is 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from . import loss_scale as ls
from . import optim as fopt
from .errors import ConversionError
from .fx_io.capture import capture_error
from .fx_io.capture_failure import tracing_quiet
from .fx_io.swap import swapped
from .train_batch import BatchTree, takes_keywords


@dataclass
class Variant:
    """What one capture computes, and how its flat inputs and outputs are laid out."""

    update: bool  # apply the optimizer (last micro-batch) or only accumulate
    has_acc: bool  # takes accumulated gradients from earlier micro-batches
    n_batch: int  # batch tensors (the tree's tensor leaves)
    flush: bool = False  # no batch, no forward: apply the accumulated gradients (TrainStep.flush)
    tree: BatchTree | None = None  # the batch's structure and constants (train_batch.py): the items rebuilt
    state_in: fopt.StateLayout | None = None
    state_out: fopt.StateLayout | None = None
    fp32_nodes: set[str] = field(default_factory=set)


@dataclass
class Setup:
    """Everything about the model and options that every variant shares."""

    model: torch.nn.Module
    loss_fn: Callable
    optimizer: torch.optim.Optimizer
    config: ls.LossScaleConfig
    trainable: list[str]  # in the optimizer's param-group order
    frozen: list[str]
    buffers: list[str]
    group_sizes: list[int]
    n_targets: int = 1
    accumulation_steps: int = 1
    max_grad_norm: float | None = None
    keep_grads: bool = False
    all_reduce: Callable | None = None  # DDP: sums gradients over ranks inside the step
    trainable_order: tuple[str, ...] = ()  # the names that required grad when compiled (model order)
    max_grad_value: float | None = None  # clip_grad_value_'s bound, applied before max_grad_norm
    ddp: torch.nn.Module | None = None  # the DistributedDataParallel wrapper, for its no_sync() flag

    def tensors(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        return dict(self.model.named_parameters()), dict(self.model.named_buffers())


def _refuse_unused(names: list[str], grads: tuple) -> None:
    """A trainable parameter the loss does not reach: eager's optimizer skips it (``grad`` is None), the
    captured step would update it; said with the fix (it had failed in autograd: 'appears to not have
    been used in the graph')."""
    unused = [name for name, g in zip(names, grads) if g is None]
    if unused:
        more = f" (and {len(unused) - 1} more)" if len(unused) > 1 else ""
        raise ConversionError("compile_training", f"parameter {unused[0]}{more}",
                              "gets no gradient (the loss does not depend on it in this step): freeze it, "
                              "requires_grad_(False), while it is unused; unfreezing it later captures again")


def _what(loss: Any) -> str:
    """What a loss_fn returned instead of a scalar, and for a dict (a ``ModelOutput``) which key to return."""
    if isinstance(loss, torch.Tensor):
        return f"shape {tuple(loss.shape)} (reduce it: .mean() or .sum())"
    if isinstance(loss, Mapping):
        keys = ", ".join(repr(k) for k in list(loss)[:4])
        if "loss" in loss:
            return f"a {type(loss).__name__} ({keys}): return its loss tensor (out['loss'])"
        return (f"a {type(loss).__name__} ({keys}) with no 'loss' (a transformers model computes one only when "
                f"given labels=): compute the loss from its outputs in loss_fn, or return the loss's entry")
    return type(loss).__name__


@dataclass
class Traced:
    """A traced step; a symbolic one also says which calls it takes and names its batch symbols."""

    gm: torch.fx.GraphModule
    accepts: Callable[[list[torch.Tensor]], bool] | None = None  # flat inputs -> the graph takes them
    symbols: dict[tuple[int, int], str] = field(default_factory=dict)  # (batch item, dim) -> symbol


def trace_variant(setup: Setup, variant: Variant, states: list[dict[str, Any]], scale: torch.Tensor,
                  tracker: torch.Tensor, acc: list[torch.Tensor], batch: tuple,
                  dynamic: Mapping[int, frozenset[int]] | None = None) -> Traced:
    """Trace one variant of the step with ``make_fx`` (fake tensors: nothing runs, nothing changes);
    ``dynamic`` (batch item -> dims) traces those batch dims symbolic, everything else static."""
    params, buffers = setup.tensors()
    trainable = [params[n] for n in setup.trainable]
    n_p, n_f, n_b = len(setup.trainable), len(setup.frozen), len(setup.buffers)
    variant.state_in = fopt.state_layout(states)
    update_fn = None
    if variant.update:
        opt_gm, variant.state_out = fopt.trace_update(setup.optimizer, trainable, states, setup.group_sizes)
        update_fn = fopt.graph_callable(opt_gm)
    n_s = sum(len(k) for k in variant.state_in.keys)
    n_l = len(fopt.hyper_tensors(setup.optimizer))
    fp32 = variant.fp32_nodes
    config, n_acc = setup.config, setup.accumulation_steps

    def _forward_backward(data, p, f, b, scale):
        items = variant.tree.unflatten(list(data)) if variant.tree is not None else tuple(data)
        inputs, targets = items[:len(items) - setup.n_targets], items[len(items) - setup.n_targets:]
        p_req = [t.detach().requires_grad_(True) for t in p]
        named = {**dict(zip(setup.trainable, p_req)), **dict(zip(setup.frozen, f)), **dict(zip(setup.buffers, b))}
        # forward and backward both see the step's parameters: a gradient checkpoint recomputes its segment
        # during the backward, after functional_call would have put the module's own back (architecture.md, "Training")
        with swapped(setup.model, named):
            outputs = setup.model(**inputs[0]) if takes_keywords(setup.model, inputs) else setup.model(*inputs)
            loss = setup.loss_fn(outputs, *targets)
            if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
                raise ConversionError("compile_training", "loss_fn", f"must return a scalar tensor, got {_what(loss)}")
            with ls.fp32_ops(fp32):
                seed = loss.float() / n_acc * scale if n_acc > 1 else loss.float() * scale
            grads = torch.autograd.grad(seed, p_req, allow_unused=True)  # the backward seed is the scaled loss
        _refuse_unused(setup.trainable, grads)
        return loss, [ls.unscale_marker(g) for g in grads]  # FP32 from here on (the planner stops FP16 here)

    def step(*flat):
        p, f = list(flat[:n_p]), list(flat[n_p:n_p + n_f])
        b = list(flat[n_p + n_f:n_p + n_f + n_b])
        pos = n_p + n_f + n_b
        st, lrs = list(flat[pos:pos + n_s]), list(flat[pos + n_s:pos + n_s + n_l])
        pos += n_s + n_l
        scale, tracker = flat[pos], flat[pos + 1]
        pos += 2
        prev = list(flat[pos:pos + n_p]) if variant.has_acc else None
        if variant.flush:  # the accumulated gradients as they are (marked: FP32 from here, as below)
            loss, grads = scale.new_zeros(()), [ls.unscale_marker(a) for a in prev]
        else:
            loss, grads = _forward_backward(flat[pos + (n_p if variant.has_acc else 0):], p, f, b, scale)
            if prev is not None:
                grads = [a + g for a, g in zip(prev, grads)]
        if not variant.update:
            return (loss.detach(), *grads)
        with ls.fp32_ops(fp32):  # the optimizer's arithmetic that does not read a gradient (step counts,
            # bias corrections, lr) is upstream of no unscale marker: it is denied low precision by name
            if setup.all_reduce is not None:
                grads = setup.all_reduce(grads)
            grads = [g * (1.0 / scale) for g in grads]
            overflow = ls.found_inf(grads) if config.mode != "none" else scale.new_zeros((), dtype=torch.bool)
            if setup.max_grad_value is not None:  # after found_inf: a clamped inf would hide the overflow
                grads = [g.clamp(-setup.max_grad_value, setup.max_grad_value) for g in grads]
            if setup.max_grad_norm is not None:
                grads, norm = ls.clip_grad_norm(grads, setup.max_grad_norm)
            else:
                norm = scale.new_zeros(())
            out = update_fn([*(t.detach() for t in p), *grads, *st, *lrs])
            new_p, new_st = ls.skip_if(overflow, out[:n_p], p), out[n_p:]
            old = dict(zip(_state_names(variant.state_in), st))
            new_st = [torch.where(overflow, old[k], v) if k in old else v
                      for k, v in zip(_state_names(variant.state_out), new_st)]
            new_scale, new_tracker = ls.next_scale(config, scale, tracker, overflow)
        kept = grads if setup.keep_grads else []
        return (loss.detach(), *new_p, *new_st, new_scale, new_tracker, overflow, norm, *kept)

    example = [*trainable, *(params[n] for n in setup.frozen), *(buffers[n] for n in setup.buffers),
               *(s[k] for s, keys in zip(states, variant.state_in.keys) for k in keys),
               *fopt.hyper_tensors(setup.optimizer, scale.device), scale, tracker, *(acc if variant.has_acc else []),
               *batch]
    example = [t.detach() for t in example]
    try:
        # under the compiling flag, as torch.compile and torch.export trace: models take their traceable
        # paths (transformers' MoE experts call a custom op, not grouped_mm, whose meta kernel wants BF16)
        with fopt.compiling(), tracing_quiet():  # a failure is our one error, not fake_tensor's logs
            traced = _trace_symbolic(step, example, len(batch), dynamic) if dynamic else \
                Traced(make_fx(step, tracing_mode="fake")(*example))  # one fake mode for every node's meta
    except ConversionError:
        raise
    except Exception as exc:  # noqa: BLE001 - named as compile's are: the user's line, the construct, the fix
        found = capture_error(exc, type(setup.model).__name__, "make_fx (tracing the training step)")
        raise ConversionError("compile_training", f"{found.source}, {found.where}", found.reason) from None
    fp32.update(ls.scale_carriers(traced.gm, n_p + n_f + n_b + n_s + n_l))  # values of the scale alone stay FP32
    return traced


def _trace_symbolic(step: Callable, example: list[torch.Tensor], n_batch: int,
                    dynamic: Mapping[int, frozenset[int]]) -> Traced:
    """``make_fx`` on fake inputs whose ``dynamic`` batch dims are symbols (a size-1 dim stays 1, as
    everywhere in torch). The graph takes a call whose static batch dims match the example's and
    whose sizes pass the shape environment's guards (docs/architecture.md, "Training")."""
    from torch._dispatch.python import enable_python_dispatcher
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    mode, first = FakeTensorMode(shape_env=ShapeEnv()), len(example) - n_batch
    fakes = []
    for i, t in enumerate(example):
        dims = dynamic.get(i - first, frozenset()) if i >= first else frozenset()
        sizes = [DimDynamic.DYNAMIC if d in dims else DimDynamic.STATIC for d in range(t.dim())]
        fakes.append(mode.from_tensor(t, symbolic_context=StatelessSymbolicContext(dynamic_sizes=sizes)))
    with mode, enable_python_dispatcher():
        gm = make_fx(step, tracing_mode="real")(*fakes)
    shape_env = mode.shape_env
    code = shape_env.produce_guards_expression(fakes)
    static = [tuple(n if not isinstance(n, torch.SymInt) else None for n in f.shape) for f in fakes[first:]]
    symbols = {(j, d): str(n.node.expr) for j, f in enumerate(fakes[first:]) for d, n in enumerate(f.shape)
               if isinstance(n, torch.SymInt) and n.node.expr.is_Symbol}

    def accepts(flat: list[torch.Tensor]) -> bool:
        for want, t in zip(static, flat[first:]):
            if t.dim() != len(want) or any(w is not None and w != n for w, n in zip(want, t.shape)):
                return False
        return code is None or bool(shape_env.evaluate_guards_expression(code, flat))

    return Traced(gm, accepts, symbols)


def _state_names(layout: fopt.StateLayout) -> list[tuple[int, str]]:
    return [(i, k) for i, keys in enumerate(layout.keys) for k in keys]


def plan_variant(setup: Setup, gm: torch.fx.GraphModule, variant: Variant, plan_options: dict[str, Any],
                 size_hints: Mapping[str, int] | None = None):
    """Import the traced step into the IR, run the shared passes, rewrite ``gm`` in place; a symbolic
    step's dims are sized by ``size_hints`` (symbol -> size). Returns the report, the IR op -> node
    names and the FP16 copies of frozen parameters the graph reads (``FoldedWeights``: refresh them
    from the step's inputs before each run)."""
    from .dtypes import normalize_low_dtype
    from .fx_io.emitter import emit
    from .fx_io.importer import WeightSpec, import_graph_module, resolve_rule_names
    from .plan import make_context, run_passes
    from .plan_report import build_report

    opts = dict(plan_options)
    low = normalize_low_dtype(str(opts.pop("dtype")))
    source = f"{type(setup.model).__name__} training step"
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    params, _ = setup.tensors()
    weights = {placeholders[i].name: WeightSpec(name, True, i, params[name])
               for i, name in enumerate(setup.trainable + setup.frozen)}
    imp = import_graph_module(gm, source=source, training=True, weights=weights, size_hints=size_hints)
    for op in imp.graph.ops.values():
        if op.canonical == "unscale_marker":
            for out in op.outputs:
                imp.graph.tensors[out].unscale_marker = True
    ir_of = {node.name: op for op, node in imp.nodes.items()}
    ours = {ir_of[n] for n in variant.fp32_nodes if n in ir_of}
    users = tuple(opts.pop("deny_nodes", ()))
    ctx = make_context(dtype=low, training=True, deny_nodes=set(users) | ours, **opts)
    resolve_rule_names(imp.graph, ctx, source, node_names=users)  # names naming nothing: said, as on compile
    # said as what they are: they had read "node named by the user (--deny-node)" in the report
    ctx.deny_node_reasons = dict.fromkeys(ours, "deny: loss scaling and the optimizer's step arithmetic stay FP32 "
                                                "(compile_training)")
    result = run_passes(imp.graph, ctx, source, imp.dim_values)
    folded = emit(imp, result)
    report = build_report(result)  # after emission: counts the casts the emitter added
    return report, {op: node.name for op, node in imp.nodes.items()}, folded
