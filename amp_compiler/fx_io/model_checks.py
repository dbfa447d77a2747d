"""Checks of a model and its call before capture (``docs/architecture.md``, "Capture routes and shapes").

* ``bind_error`` / ``signature``: whether a call fits the forward's signature, so an example that
  does not is a ``TypeError`` naming the signature, not a capture failure with advice about tracing;
* ``refuse_meta``: weights or example tensors on the ``meta`` device (no data) cannot be planned nor run;
* ``warn_if_low_precision``: a model whose floating parameters the user already moved to float16 or
  bfloat16 (``model.half()``) is planned from those, so nothing the plan keeps "FP32" has FP32
  weights, and training keeps no FP32 master weights: the warning says to call ``model.float()``;
* ``warn_if_hooked``: forward hooks and pre-hooks run while torch.export or make_fx captures the
  model (dynamo replays their side effects), so what they return is in the graph, but they are not
  called at each call: their side effects (collecting activations, logging) would stop silently;
  the warning names the modules; ``HookWatch``: those registered after the capture, said at the next call;
* ``SwapWatch``: a submodule, parameter or buffer replaced after the capture (``model.head = nn.Linear(...)``,
  ``layer.weight = nn.Parameter(...)``): a plan reads the tensors it was captured with;
* ``warn_if_recurrent``: ``nn.LSTM``/``nn.GRU``/``nn.RNN`` are unrolled by the capture, one set of ops per
  time step, so each sequence length is a capture and a plan of its own: the warning says so.
"""

from __future__ import annotations

import inspect
import operator
import warnings
from collections import Counter
from itertools import chain
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils.hooks import RemovableHandle


def bind_error(model: torch.nn.Module, args: tuple, kwargs: dict) -> str | None:
    """Why ``model.forward`` refuses ``args``/``kwargs`` (``None`` if it takes them or has no signature)."""
    try:
        inspect.signature(model.forward).bind(*args, **kwargs)
    except TypeError as exc:
        return str(exc)
    except ValueError:  # no signature to read (a builtin forward): the capture will say
        return None
    return None


def refuse_meta(model: torch.nn.Module, example: Any, entry: str) -> None:
    """A ``ValueError`` when ``model``'s parameters or buffers, or the tensors of ``example``, are on the
    ``meta`` device (built under ``torch.device("meta")`` to skip initialisation): they have shapes but no
    data, so a plan could be neither checked (FP16 ranges read values) nor run; it had failed on
    "Tensor.item() cannot be called on meta tensors", deep in the capture."""
    names = [name for name, t in chain(model.named_parameters(), model.named_buffers()) if t.is_meta]
    if names:
        raise ValueError(f"amp_compiler.{entry}({type(model).__name__}): the model's weights ({names[0]}"
                         f"{f' and {len(names) - 1} more' if len(names) > 1 else ''}) are on the 'meta' device: "
                         f"shapes without data, which can be neither planned nor run; materialise them first: "
                         f"model.to_empty(device=...), then model.load_state_dict(...) or the model's own init")
    if any(t.is_meta for t in pytree.tree_leaves(example) if isinstance(t, torch.Tensor)):
        raise ValueError(f"amp_compiler.{entry}({type(model).__name__}): the example inputs are on the 'meta' "
                         f"device: shapes without data, which can be neither planned nor run; pass real tensors "
                         f"on the model's device")


def signature(model: torch.nn.Module) -> str:
    try:
        return str(inspect.signature(model.forward))
    except ValueError:
        return "(...)"


def warn_if_recurrent(model: torch.nn.Module, entry: str, stacklevel: int = 3) -> None:
    """Warn that the recurrent modules of ``model`` are unrolled per time step (the first one named)."""
    found = [(name, type(m).__name__) for name, m in model.named_modules() if isinstance(m, torch.nn.RNNBase)]
    if found:
        name, kind = found[0]
        warnings.warn(f"amp_compiler.{entry}({type(model).__name__}): {kind} {name or '<root>'}"
                      f"{f' and {len(found) - 1} more' if len(found) > 1 else ''} is unrolled by the capture into "
                      f"its ops for every time step (FP16 where the plan converts them): each sequence length is "
                      f"captured and planned apart, slowly for long sequences; pad to a few fixed lengths, or "
                      f"compile the modules around it", stacklevel=stacklevel)


#: modules whose hooks only record outputs a forward returns when asked: transformers installs them the
#: first time a model is called with ``output_hidden_states``/``output_attentions``, and the capture
#: returns what they record, so a warning that they "are not called" (no hook of the user's) was false
_OUTPUT_RECORDERS = ("transformers.utils.output_capturing",)


def hook_ids(model: torch.nn.Module) -> dict[int, str]:
    """The handle ids of the forward hooks and pre-hooks on ``model``'s modules, with the module's name
    (less the libraries' output recorders, ``_OUTPUT_RECORDERS``)."""
    return {hid: name or "<root>" for name, m in model.named_modules()
            for hid, hook in (*m._forward_hooks.items(), *m._forward_pre_hooks.items()) if not _recorder(hook)}


def _recorder(hook) -> bool:
    fn = getattr(hook, "func", hook)  # a functools.partial's function
    return getattr(fn, "__module__", "") in _OUTPUT_RECORDERS


def warn_if_hooked(model: torch.nn.Module, entry: str, stacklevel: int = 3) -> None:
    """Warn that the forward hooks and pre-hooks of ``model``'s modules run at capture only (first named)."""
    found = list(dict.fromkeys(hook_ids(model).values()))
    if found:
        warnings.warn(f"amp_compiler.{entry}({type(model).__name__}): the forward hooks of {_named(found)} run "
                      f"only while the model is captured: what they return is in the graph, but they are not "
                      f"called again, so their side effects (collecting activations, logging) stop; register "
                      f"it on the module amp_compiler.compile returns, or return what you need from forward",
                      stacklevel=stacklevel)


class HookWatch:
    """The forward hooks registered on a compiled model's modules after its capture: the plans (either
    route; dynamo does not guard on hooks) never call them, so the next call says so, once per hook.
    A registration anywhere moves ``RemovableHandle.next_id``; only then are the modules walked."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.reset()

    def reset(self) -> None:
        """Hooks present now count as captured (a capture warns of them itself: ``warn_if_hooked``)."""
        self.seen, self.counter = set(hook_ids(self.model)), RemovableHandle.next_id

    def check(self, entry: str, stacklevel: int = 5,
              fix: str = "register it on the module amp_compiler.compile returns (called at every call)") -> None:
        if RemovableHandle.next_id == self.counter:
            return
        now = hook_ids(self.model)
        new = list(dict.fromkeys(name for hid, name in now.items() if hid not in self.seen))
        self.seen, self.counter = self.seen | set(now), RemovableHandle.next_id
        if new:
            warnings.warn(f"amp_compiler.{entry}({type(self.model).__name__}): the forward hook registered on "
                          f"{_named(new)} after compiling is not called: what runs was captured before it; "
                          f"{fix}, or compile the hooked model again", stacklevel=stacklevel)


class SwapWatch:
    """The submodules, parameters and buffers of a compiled model, by identity: an export plan reads the
    tensors it was captured with, so one replaced after it (``model.head = nn.Linear(...)``,
    ``layer.weight = nn.Parameter(...)``) had kept running the old weights, silently. ``swapped()``
    names the first slot holding another object than at ``reset()`` ('' if none), reading every module's
    non-empty ``_modules``/``_parameters``/``_buffers`` (~35 µs for a BERT-base). It holds the objects and
    compares them, not their ids, which a new object could take over from a freed one."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.reset()

    def reset(self) -> None:
        # the non-empty dicts (a slot added where there was none is not what a plan reads)
        named = [(name, d) for name, m in self.model.named_modules()
                 for d in (m._modules, m._parameters, m._buffers) if d]
        self.names, self.dicts = [name for name, _ in named], [d for _, d in named]
        self.held = list(chain.from_iterable(map(dict.values, self.dicts)))

    def swapped(self) -> str:
        now = list(chain.from_iterable(map(dict.values, self.dicts)))
        if len(now) == len(self.held) and all(map(operator.is_, now, self.held)):
            return ""
        names = [f"{name}.{k}" if name else k for name, d in zip(self.names, self.dicts) for k in d]
        changed = (names[i] for i, (a, b) in enumerate(zip(now, self.held)) if a is not b)
        return next(changed, "a submodule added or removed")


def _named(found: list[str]) -> str:
    return found[0] + (f" and {len(found) - 1} more modules" if len(found) > 1 else "")


def warn_if_low_precision(model: torch.nn.Module, entry: str, stacklevel: int = 3,
                          fix: str = "call model.float() before compiling") -> None:
    """Warn when most floating parameters of ``model`` are not float32 (``model.half()`` or ``.double()``
    before compiling, or on the compiled module: ``fix`` says what to do). A float64 model had been left
    all float64, unplanned, with the report's first line the only word of it."""
    dtypes = Counter(p.dtype for p in model.parameters() if p.is_floating_point())
    other = sum(n for dtype, n in dtypes.items() if dtype != torch.float32)
    if not other or other * 2 < sum(dtypes.values()):
        return
    dtype = max((d for d in dtypes if d != torch.float32), key=dtypes.__getitem__)
    stays = ("float64 ops are not planned: nothing runs in reduced precision" if dtype == torch.float64 else
             f"these stay {dtype}")
    warnings.warn(f"amp_compiler.{entry}({type(model).__name__}): {other} of {sum(dtypes.values())} floating "
                  f"parameters are {dtype}, not float32; mixed precision plans from FP32 weights (the ops it keeps "
                  f"FP32, training's master weights and optimizer), so {stays}: {fix}", stacklevel=stacklevel)


def scripted_submodule(model: torch.nn.Module) -> str:
    """``path (Class)`` of the first ``torch.jit.script``-ed module in ``model`` ('' if none): neither
    capture route traces into TorchScript (export calls it with its own arguments and fails)."""
    for name, module in model.named_modules():
        if isinstance(module, torch.jit.ScriptModule):
            return f"{name or '<root>'} ({getattr(module, 'original_name', type(module).__name__)})"
    return ""
