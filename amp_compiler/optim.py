"""The user's own ``torch.optim`` update, traced once into a pure graph (docs/architecture.md, "Training").

Rather than re-implementing each optimizer, ``trace_update`` runs the optimizer's own
``step()`` over working copies of the parameters and of its state, with ``foreach``/``fused``
off (one op per tensor, which the planner and the emitter read) and ``capturable`` on where
the optimizer has it (step counts stay tensors), under ``torch.compiler``'s compiling flag
(so ``_get_value`` keeps tensors instead of calling ``.item()``). ``make_fx(functionalize(...))``
turns its in-place updates into a pure graph. Each group's learning rate is a graph input
(a 0-d FP32 tensor, so schedulers never force a re-capture); where an optimizer uses it as
a Python scalar (``alpha=-lr``) the traced ``_local_scalar_dense`` is rewritten into tensor
arithmetic, so the graph never synchronises with the host. ``betas`` are graph inputs too (two
0-d tensors per group): ``OneCycleLR``/``CyclicLR`` cycle ``betas[0]`` with the lr at every step,
and as constants they were a new capture per step. So are ``weight_decay`` and ``momentum`` (a
weight-decay schedule, ``cycle_momentum``): the optimizers branch on them in Python
(``if weight_decay != 0``, ``if momentum > 0``), which a traced tensor cannot answer, so while
``step()`` is traced their comparisons with 0 answer from the value's sign (``_SignedHypers``),
which is what the capture key holds of them. Every other hyper-parameter is a constant of the
graph and part of the capture key (training.py re-captures when one changes).
"""

from __future__ import annotations

import collections
import contextlib
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from .errors import ConversionError

#: optimizers that cannot be one graph: LBFGS re-evaluates the loss through a closure,
#: SparseAdam needs sparse gradients, Adafactor branches on values read back to the host
UNSUPPORTED = {"LBFGS": "needs a closure that re-evaluates the loss several times per step",
               "SparseAdam": "needs sparse gradients, the step's gradients are dense",
               # its trace failed deep in make_fx: "Could not guard on data-dependent expression Eq(u0, 1)"
               "Adafactor": "reads its step count and parameter/update norms as Python numbers (.item()) and "
                            "takes min/max of them at every step, which one graph cannot hold"}
_FORCED = {"foreach": False, "fused": False}
_VOLATILE = ("params", "lr", "initial_lr", "foreach", "fused", "capturable", "differentiable")
#: hyper-parameters passed as graph inputs, after each group's lr (schedulers change them every step)
_RUNTIME = ("betas",)
#: single numbers passed as graph inputs (schedules change them), keyed by their sign only (``_SignedHypers``)
_SIGNED = ("weight_decay", "momentum")


def check(optimizer: Any) -> None:
    """Refuse, before anything is captured or changed, an optimizer the step cannot trace."""
    name = type(optimizer).__name__
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ConversionError("compile_training", f"optimizer {name}", "is not a torch.optim.Optimizer")
    if name in UNSUPPORTED:
        raise ConversionError("compile_training", f"optimizer {name}", f"not supported: it {UNSUPPORTED[name]}")
    refuse_step_hooks(optimizer)
    for group in optimizer.param_groups:
        lr = group.get("lr")
        if isinstance(lr, torch.Tensor) and lr.requires_grad or not isinstance(lr, (int, float, torch.Tensor)):
            raise ConversionError("compile_training", f"optimizer {name}", "lr must be a number")
        if any(torch.is_complex(p) for p in group["params"]):
            raise ConversionError("compile_training", f"optimizer {name}", "complex parameters are not supported")


def refuse_step_hooks(optimizer: torch.optim.Optimizer) -> None:
    """Refuse step hooks (the optimizer's or torch's global ones): ``step()`` is traced once, so a hook
    ran once at capture on traced tensors (an EMA ``lerp_`` of the real weights failed there, "Please
    convert all Tensors to FakeTensors") and never at a step, silently."""
    from torch.optim import optimizer as base

    kinds = [name for name, hooks in (
        ("register_step_pre_hook", getattr(optimizer, "_optimizer_step_pre_hooks", None)),
        ("register_step_post_hook", getattr(optimizer, "_optimizer_step_post_hooks", None)),
        ("register_optimizer_step_pre_hook", getattr(base, "_global_optimizer_pre_hooks", None)),
        ("register_optimizer_step_post_hook", getattr(base, "_global_optimizer_post_hooks", None)),
    ) if hooks]
    if kinds:
        raise ConversionError("compile_training", f"optimizer {type(optimizer).__name__}",
                              f"has step hooks ({', '.join(kinds)}): its step() is traced once into the step's "
                              f"graph, so a hook would run once at capture, on traced tensors, and never at a "
                              f"step: remove it and call what it does after each step(...)")


def hyper_key(optimizer: torch.optim.Optimizer) -> tuple:
    """The hyper-parameters baked into the graph as constants (everything but lr and the flags), and the
    sign of each ``_SIGNED`` one passed as an input (the optimizer's Python branches on it are baked)."""
    signed = _signed_keys(optimizer)
    return tuple(tuple((k, ("sign", _sign(v)) if k in signed and _scalar(v) else _hashable(v))
                       for k, v in sorted(g.items())
                       if k not in _VOLATILE and not (k in _RUNTIME and _runtime(v)))
                 for g in optimizer.param_groups)


def _runtime(value: Any) -> bool:
    """A ``_RUNTIME`` hyper-parameter passed as graph inputs: a tuple of numbers (or 0-d tensors)."""
    return isinstance(value, (tuple, list)) and all(isinstance(v, (int, float, torch.Tensor)) for v in value)


def _scalar(value: Any) -> bool:
    """A real number, or a one-element real tensor not requiring grad: a ``_SIGNED`` graph input."""
    if isinstance(value, torch.Tensor):
        return value.numel() == 1 and not value.requires_grad and not value.is_complex()
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _sign(value: Any) -> int:
    v = float(value)
    return (v > 0) - (v < 0)


def _signed_keys(optimizer: torch.optim.Optimizer) -> tuple[str, ...]:
    """The ``_SIGNED`` hyper-parameters passed as inputs: those of torch's own optimizers, whose ``step()``
    reads them only by arithmetic and comparisons with 0. A ``step()`` of another source (a subclass
    overriding it, a third-party optimizer) might read them otherwise: its values stay constants."""
    step = getattr(type(optimizer).step, "__module__", "") or ""
    return _SIGNED if step.startswith("torch.optim") else ()


def _group_hypers(group: dict[str, Any], signed: tuple[str, ...]) -> list[tuple[str, int]]:
    """``(key, how many tensors)`` of a group's graph-input hyper-parameters, lr first (0: one number)."""
    return [("lr", 0)] + [(k, len(group[k])) for k in _RUNTIME if k in group and _runtime(group[k])] + \
        [(k, 0) for k in signed if k in group and _scalar(group[k])]


def hyper_tensors(optimizer: torch.optim.Optimizer, device: torch.device | None = None) -> list[torch.Tensor]:
    """The graph-input hyper-parameters (``_group_hypers``) as 0-d FP32 tensors, group by group, on the
    parameters' device."""
    def scalar(v: Any) -> torch.Tensor:
        return torch.as_tensor(v, dtype=torch.float32, device=device).detach().clone().reshape(())

    signed = _signed_keys(optimizer)
    return [scalar(v) for g in optimizer.param_groups for k, n in _group_hypers(g, signed)
            for v in ((g[k],) if n == 0 else g[k])]


class _SignedHypers(torch.overrides.TorchFunctionMode):
    """While ``step()`` is traced, a comparison of a ``_SIGNED`` hyper-parameter (a traced tensor) with 0
    is a Python bool, from the sign it had at capture (part of the capture key): the optimizers branch
    on ``weight_decay != 0`` or ``momentum > 0``, which a traced tensor cannot answer. Every other use
    is the tensor's own (arithmetic, or an ``alpha=`` scalar that ``_scalars_to_tensors`` rewrites)."""

    _COMPARE = {getattr(torch._C.TensorBase, name): test for names, test in (
        (("eq", "__eq__"), lambda s: s == 0), (("ne", "__ne__", "__bool__"), lambda s: s != 0),
        (("gt", "__gt__"), lambda s: s > 0), (("ge", "__ge__"), lambda s: s >= 0),
        (("lt", "__lt__"), lambda s: s < 0), (("le", "__le__"), lambda s: s <= 0)) for name in names}

    def __init__(self) -> None:
        super().__init__()
        self.signs: dict[int, tuple[torch.Tensor, int]] = {}  # id -> (the tensor, kept alive; its sign)

    def add(self, t: torch.Tensor, sign: int) -> torch.Tensor:
        self.signs[id(t)] = (t, sign)
        return t

    def __torch_function__(self, func, types, args=(), kwargs=None):
        test = self._COMPARE.get(func)
        known = self.signs.get(id(args[0])) if test is not None and args else None
        if known is not None and known[0] is args[0] and (len(args) == 1 or _is_zero(args[1])):
            return test(known[1])
        return func(*args, **(kwargs or {}))


def _is_zero(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0


def _hashable(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return ("tensor", tuple(v.flatten().tolist()))
    if isinstance(v, (list, tuple)):
        return tuple(_hashable(x) for x in v)
    return v


@dataclass
class StateLayout:
    """Which optimizer-state entries are tensors (graph inputs/outputs) and which are constants."""

    keys: list[list[str]]  # per parameter, its tensor-valued state keys, in order
    constants: list[dict[str, Any]]  # per parameter, its non-tensor state entries

    def signature(self) -> tuple:
        return tuple(tuple(k) for k in self.keys), tuple(tuple(sorted((k, _hashable(v)) for k, v in c.items()))
                                                          for c in self.constants)


def state_layout(states: list[dict[str, Any]]) -> StateLayout:
    keys = [[k for k, v in sorted(s.items()) if isinstance(v, torch.Tensor)] for s in states]
    consts = [{k: v for k, v in s.items() if not isinstance(v, torch.Tensor)} for s in states]
    return StateLayout(keys, consts)


@contextlib.contextmanager
def compiling():
    """``torch.compiler.is_compiling()`` is True, as under torch.compile and torch.export: optimizers keep
    step counts as tensors, and libraries take their traceable paths (train_capture traces the model so)."""
    import torch.compiler as tc
    old = getattr(tc, "_is_compiling_flag", False)
    tc._is_compiling_flag = True
    try:
        yield
    finally:
        tc._is_compiling_flag = old


def trace_update(optimizer: torch.optim.Optimizer, params: list[torch.Tensor], states: list[dict[str, Any]],
                 group_sizes: list[int]) -> tuple[torch.fx.GraphModule, StateLayout]:
    """A pure graph ``(params, grads, state tensors, lrs) -> (new params, new state tensors)``.

    ``params`` are the trainable parameters in param-group order (``group_sizes`` per group),
    ``states`` their current optimizer state (empty dicts before the first step: the graph
    then creates the state, as the optimizer's first ``step()`` would).
    """
    layout_in = state_layout(states)
    out_layout: list[StateLayout] = []

    def update(flat: list[torch.Tensor]) -> list[torch.Tensor]:
        n = len(params)
        ps, gs = flat[:n], flat[n:2 * n]
        pos, cur = 2 * n, []
        for keys, consts in zip(layout_in.keys, layout_in.constants):
            cur.append({**{k: flat[pos + i] for i, k in enumerate(keys)}, **consts})
            pos += len(keys)
        hypers = flat[pos:]
        work = [p.clone() for p in ps]
        for w, g in zip(work, gs):
            w.grad = g
        signs = _SignedHypers()
        with _swapped(optimizer, work, cur, hypers, group_sizes, signs), compiling(), signs:
            optimizer.step()
            new_states = [dict(optimizer.state[w]) for w in work]
        layout = state_layout(new_states)
        out_layout.append(layout)
        return [*work, *(s[k] for s, keys in zip(new_states, layout.keys) for k in keys)]

    example = [*(p.detach() for p in params), *(torch.zeros_like(p) for p in params),
               *(s[k] for s, keys in zip(states, layout_in.keys) for k in keys),
               *hyper_tensors(optimizer, params[0].device if params else None)]
    try:
        gm = make_fx(torch.func.functionalize(update, remove="mutations_and_views"), tracing_mode="fake")(example)
    except Exception as exc:
        raise ConversionError("compile_training", f"optimizer {type(optimizer).__name__}",
                              f"its step() could not be traced: {str(exc).splitlines()[0] if str(exc) else exc!r}") from None
    _scalars_to_tensors(gm)
    return gm, out_layout[-1]


@contextlib.contextmanager
def _swapped(optimizer, work, states, hypers, group_sizes, signs):
    """The optimizer steps ``work`` (with ``states`` and the tensor ``hypers``); everything is restored after."""
    saved_groups = [dict(g) for g in optimizer.param_groups]
    saved_state = optimizer.state
    optimizer.state = collections.defaultdict(dict)
    start, it = 0, iter(hypers)
    signed = _signed_keys(optimizer)
    for group, size in zip(optimizer.param_groups, group_sizes):
        group["params"] = work[start:start + size]
        values = {k: next(it) if n == 0 else tuple(next(it) for _ in range(n)) for k, n in _group_hypers(group, signed)}
        group.update({k: signs.add(v, _sign(group[k])) if k in signed else v for k, v in values.items()})
        group.update({k: v for k, v in _FORCED.items() if k in group})
        if "capturable" in group:
            group["capturable"] = True
        start += size
    for w, s in zip(work, states):
        optimizer.state[w] = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in s.items()}
    try:
        yield
    finally:
        optimizer.state = saved_state
        for group, saved in zip(optimizer.param_groups, saved_groups):
            group.clear()
            group.update(saved)


# -- no host synchronisation ----------------------------------------------------------------------

_aten = torch.ops.aten


def _scalars_to_tensors(gm: torch.fx.GraphModule) -> None:
    """Rewrite ``op(..., alpha/value=_local_scalar_dense(t))`` into tensor arithmetic on ``t``."""
    graph = gm.graph
    for sync in [n for n in graph.nodes if n.target is _aten._local_scalar_dense.default]:
        t = sync.args[0]
        for user in list(sync.users):
            with graph.inserting_before(user):
                user.replace_all_uses_with(_tensor_form(graph, user, sync, t))
            graph.erase_node(user)
        if sync.users:
            raise ConversionError("compile_training", "optimizer step", "reads a tensor as a Python number")
        graph.erase_node(sync)
    graph.lint()
    gm.recompile()


def _tensor_form(graph: torch.fx.Graph, user: torch.fx.Node, sync: torch.fx.Node, t: torch.fx.Node):
    call = graph.call_function
    args, kwargs = list(user.args), dict(user.kwargs)
    target = user.target
    if target in (_aten.add.Tensor, _aten.sub.Tensor) and kwargs.get("alpha") is sync:
        other = call(_aten.mul.Tensor, (args[1], t))
        return call(target, (args[0], other))
    if target in (_aten.addcdiv.default, _aten.addcmul.default) and kwargs.get("value") is sync:
        inner = _aten.div.Tensor if target is _aten.addcdiv.default else _aten.mul.Tensor
        term = call(_aten.mul.Tensor, (call(inner, (args[1], args[2])), t))
        return call(_aten.add.Tensor, (args[0], term))
    if target is _aten.full_like.default and args[1] is sync:  # Rprop's initial step sizes
        return call(_aten.mul.Tensor, (call(_aten.ones_like.default, (args[0],), kwargs), t))
    if target in (_aten.mul.Tensor, _aten.div.Tensor, _aten.add.Tensor, _aten.sub.Tensor) and sync in args:
        return call(target, tuple(t if a is sync else a for a in args), kwargs)
    raise ConversionError("compile_training", f"optimizer step ({target})", "reads a tensor as a Python number")


def graph_callable(gm: torch.fx.GraphModule) -> Callable[[list[torch.Tensor]], list[torch.Tensor]]:
    """Call the traced update inside another trace (its ops are replayed, i.e. inlined)."""
    return lambda flat: list(gm(flat))
