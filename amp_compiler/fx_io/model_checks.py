"""Checks of a model and its call before capture (``docs/architecture.md``, "Capture routes and shapes").

* ``bind_error`` / ``signature``: whether a call fits the forward's signature, so an example that
  does not is a ``TypeError`` naming the signature, not a capture failure with advice about tracing;
* ``warn_if_low_precision``: a model whose floating parameters the user already moved to float16 or
  bfloat16 (``model.half()``) is planned from those, so nothing the plan keeps "FP32" has FP32
  weights, and training keeps no FP32 master weights: the warning says to call ``model.float()``;
* ``warn_if_hooked``: forward hooks and pre-hooks run while torch.export or make_fx captures the
  model (dynamo replays their side effects), so what they return is in the graph, but they are not
  called at each call: their side effects (collecting activations, logging) would stop silently;
  the warning names the modules; ``HookWatch``: those registered after the capture, said at the next call;
* ``warn_if_recurrent``: ``nn.LSTM``/``nn.GRU``/``nn.RNN`` are unrolled by the capture, one set of ops per
  time step, so each sequence length is a capture and a plan of its own: the warning says so.
"""

from __future__ import annotations

import inspect
import warnings
from collections import Counter

import torch
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


def hook_ids(model: torch.nn.Module) -> dict[int, str]:
    """The handle ids of the forward hooks and pre-hooks on ``model``'s modules, with the module's name."""
    return {hid: name or "<root>" for name, m in model.named_modules()
            for hid in (*m._forward_hooks, *m._forward_pre_hooks)}


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


def _named(found: list[str]) -> str:
    return found[0] + (f" and {len(found) - 1} more modules" if len(found) > 1 else "")


def warn_if_low_precision(model: torch.nn.Module, entry: str, stacklevel: int = 3,
                          fix: str = "call model.float() before compiling") -> None:
    """Warn when most floating parameters of ``model`` are not float32 (``model.half()`` before compiling,
    or on the compiled module: ``fix`` says what to do)."""
    dtypes = Counter(p.dtype for p in model.parameters() if p.is_floating_point())
    low = sum(n for dtype, n in dtypes.items() if dtype in (torch.float16, torch.bfloat16))
    if not low or low * 2 < sum(dtypes.values()):
        return
    dtype = max((d for d in dtypes if d in (torch.float16, torch.bfloat16)), key=dtypes.__getitem__)
    warnings.warn(f"amp_compiler.{entry}({type(model).__name__}): {low} of {sum(dtypes.values())} floating "
                  f"parameters are {dtype}, not float32; mixed precision plans from FP32 weights (the ops it keeps "
                  f"FP32, training's master weights and optimizer), so these stay {dtype}: {fix}", stacklevel=stacklevel)


def scripted_submodule(model: torch.nn.Module) -> str:
    """``path (Class)`` of the first ``torch.jit.script``-ed module in ``model`` ('' if none): neither
    capture route traces into TorchScript (export calls it with its own arguments and fails)."""
    for name, module in model.named_modules():
        if isinstance(module, torch.jit.ScriptModule):
            return f"{name or '<root>'} ({getattr(module, 'original_name', type(module).__name__)})"
    return ""
