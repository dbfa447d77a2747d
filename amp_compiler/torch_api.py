"""``amp_compiler.compile``: an FP32 ``nn.Module`` in, a mixed-precision module and its report out.

The model's forward is captured once with ``torch.export`` (aten level), planned by the
same passes as the ONNX path, and the plan is written back into the captured
``GraphModule``: the module returned *is* that GraphModule, with the model's parameters
(shared, FP32), its forward signature, its output dtypes, and a ``.report``.

* inference (``training=False``, the default for a model in eval mode): every weight an
  FP16 op reads is cast once, at compile time, into an FP16 buffer and reused; the copy
  is recast automatically if the FP32 master changes in place (``load_state_dict``);
* training (``training=True``, the default for a model in train mode): the casts of the
  weights stay in the graph, so gradients flow to the FP32 parameters; buffers the model
  writes (BatchNorm running statistics) are written back as in eager mode.

The graph is specialised to the mode it was captured in and to the example inputs'
shapes unless ``dynamic_shapes`` says otherwise (``torch.export`` semantics).
"""

from __future__ import annotations

import types
from typing import Any, Iterable

import torch
from torch import fx

from cost_model.runtime import default_runtime

from .dtypes import normalize_low_dtype
from .fx_io.capture import export_graph
from .fx_io.emitter import FOLDED_ATTR, emit
from .fx_io.importer import aten_op_types, import_graph_module
from .plan import make_context, run_passes

BACKENDS = (None, "inductor")


class _RefreshFolded:
    """Forward pre-hook: recast the folded FP16 weights whose FP32 master changed."""

    def __init__(self, root: fx.GraphModule) -> None:
        self.root = root

    def __call__(self, module: torch.nn.Module, args: Any) -> None:
        folded = getattr(self.root, FOLDED_ATTR, None)
        if folded is not None and folded.entries:
            folded.refresh(self.root)


def _pin_mode(gm: fx.GraphModule, training: bool, source: str) -> None:
    """``train()``/``eval()`` keep the captured mode and refuse the other with a clear message."""
    torch.nn.Module.train(gm, training)

    def train(self, mode: bool = True):
        if bool(mode) != training:
            have, want = ("train", "eval") if training else ("eval", "train")
            raise RuntimeError(
                f"amp_compiler: {source} was compiled in {have} mode; the captured graph is specialised "
                f"to it (dropout, batch-norm statistics), so it cannot switch to {want} mode. "
                f"Compile model.{want}() separately.")
        return self

    gm.train = types.MethodType(train, gm)
    gm.eval = types.MethodType(lambda self: self.train(False), gm)


def compile(model: torch.nn.Module, example_inputs: Any = (), *, example_kwargs: dict | None = None,
            target: str = "h100", dtype: torch.dtype | str = torch.float16, allow: Iterable[str] = (),
            deny: Iterable[str] = (), deny_nodes: Iterable[str] = (), planner: str = "optimal",
            backend: str | None = None, training: bool | None = None, keep_io_types: bool = True,
            dynamic_shapes: Any = None, default_dim: int = 8, profile=None,
            deny_propagation: bool = False, deploy: str | None = None,
            objective: str = "time") -> torch.nn.Module:
    """Plan and apply mixed precision on ``model``; returns the rewritten module with ``.report``.

    ``example_inputs`` (a tensor or a tuple) and ``example_kwargs`` are what ``model`` is
    called with; their shapes size the cost model (``dynamic_shapes``, as for
    ``torch.export``, lets other sizes run). ``target`` is the device the plan is for,
    ``dtype`` float16 or bfloat16, ``planner`` "optimal" (min-cut) or "greedy". ``allow`` /
    ``deny`` force op classes by aten op (``"addmm"``, ``"aten.addmm.default"``) or canonical
    name (``"gemm"``); ``deny_nodes`` keeps ops named as in the report FP32. ``training``
    (default: ``model.training``) keeps the weight casts in the graph so gradients reach the
    FP32 parameters; otherwise FP16 weights are folded once. ``keep_io_types`` keeps the
    outputs' dtypes. ``backend="inductor"`` hands the rewritten graph to ``torch.compile`` so
    the remaining casts fuse into neighbouring kernels. ``deny_propagation`` as for
    ``convert_onnx`` (infer ops fed by deny ops stay FP32). ``deploy`` names the runtime
    profile the cost model prices (default: ``inductor`` with ``backend="inductor"``, else
    ``eager``); ``objective`` ``"time"`` or ``"memory"``. Raises ``ConversionError`` naming the
    construct when the model cannot be captured.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}: use None or 'inductor'")
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"amp_compiler.compile takes an nn.Module, got {type(model).__name__}")
    low = normalize_low_dtype(str(dtype))
    training = model.training if training is None else bool(training)
    ctx = make_context(target=target, dtype=low, planner=planner, keep_io_types=keep_io_types, allow=allow,
                       deny=deny, deny_nodes=deny_nodes, training=training, default_dim=default_dim,
                       profile=profile, deny_propagation=deny_propagation,
                       runtime=deploy or default_runtime("torch", backend), objective=objective)
    args = example_inputs if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    source = type(model).__name__
    gm = export_graph(model, tuple(args), example_kwargs, source=source, dynamic_shapes=dynamic_shapes)
    imp = import_graph_module(gm, source=source, training=training, low_dtype=low, default_dim=default_dim)
    ctx.allow, ctx.deny = aten_op_types(imp.graph, ctx.allow), aten_op_types(imp.graph, ctx.deny)
    report = run_passes(imp.graph, ctx, source, imp.dim_values)
    emit(imp)
    _pin_mode(gm, model.training, source)
    gm.report = report
    hook = _RefreshFolded(gm)
    if backend == "inductor":
        compiled = torch.compile(gm, backend="inductor")
        compiled.register_forward_pre_hook(hook)
        return compiled
    gm.register_forward_pre_hook(hook)
    return gm


__all__ = ["compile"]
