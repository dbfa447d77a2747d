"""Automatic loss scaling, written as tensor ops so it traces into the step graph.

* the backward seed is the loss times ``scale``;
* every (scaled) gradient passes through ``unscale_marker`` — an identity op the importer
  turns into the IR's unscale marker, where FP16 propagation stops — and is then multiplied
  by ``1/scale``: unscaling, accumulation, clipping and the optimizer run in FP32 (as
  ``GradScaler.unscale_`` on FP32 ``.grad`` does);
* ``found_inf`` is one boolean tensor over all gradients; ``clip_grad_norm`` is
  ``torch.nn.utils.clip_grad_norm_`` on the unscaled gradients, norm in FP32;
* the seed ``loss * scale`` and the scale's own arithmetic are recorded by ``fp32_ops`` and
  denied low precision by name, so the scale (2**16 is not an FP16 number) is FP32 under
  every planner;
* the parameter and optimizer-state update is skipped branch-free with ``torch.where``;
* the dynamic scale grows by ``growth_factor`` after ``growth_interval`` clean steps and
  shrinks by ``backoff_factor`` on overflow — no ``.item()``, no host synchronisation.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch.fx.experimental.proxy_tensor import get_proxy_mode

from .errors import ConversionError
from .registry import DEFAULT_REGISTRY, DENY


@torch.library.custom_op("amp_compiler::unscale_marker", mutates_args=())
def unscale_marker(x: torch.Tensor) -> torch.Tensor:
    """Identity that marks an unscaled gradient in the captured graph."""
    return x.clone()


@unscale_marker.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


@dataclass(frozen=True)
class LossScaleConfig:
    mode: str = "dynamic"  # dynamic | constant | none
    init_scale: float = 2.0 ** 16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000

    @classmethod
    def parse(cls, loss_scale, **overrides) -> "LossScaleConfig":
        """``"dynamic"``, ``"none"``/``None``, or a number (a constant scale)."""
        if loss_scale is None or loss_scale == "none":
            return cls(mode="none", init_scale=1.0, **overrides)
        if loss_scale == "dynamic":
            return cls(mode="dynamic", **overrides)
        if isinstance(loss_scale, (int, float)) and loss_scale > 0:
            return cls(mode="constant", init_scale=float(loss_scale), **overrides)
        raise ConversionError("compile_training", f"loss_scale={loss_scale!r}",
                              'expected "dynamic", "none" or a positive number')


def found_inf(grads: list[torch.Tensor]) -> torch.Tensor:
    """True when any gradient holds an inf or a NaN (one reduction per gradient, no sync)."""
    flags = torch.stack([(~torch.isfinite(g)).any() for g in grads])
    return flags.any()


def skip_if(overflow: torch.Tensor, new: list[torch.Tensor], old: list[torch.Tensor]) -> list[torch.Tensor]:
    return [torch.where(overflow, o, n) for n, o in zip(new, old)]


def next_scale(config: LossScaleConfig, scale: torch.Tensor, tracker: torch.Tensor,
               overflow: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(new scale, new growth tracker) after a step: torch.amp's rule, branch-free."""
    if config.mode != "dynamic":
        return scale, tracker
    grown = tracker + 1
    grow = grown >= config.growth_interval
    new_scale = torch.where(overflow, scale * config.backoff_factor,
                            torch.where(grow, scale * config.growth_factor, scale))
    new_tracker = torch.where(overflow | grow, torch.zeros_like(tracker), grown)
    return new_scale, new_tracker


def clip_grad_norm(grads: list[torch.Tensor], max_norm: float) -> tuple[list[torch.Tensor], torch.Tensor]:
    """(clipped gradients, total 2-norm): ``clip_grad_norm_``'s arithmetic, branch-free, in FP32.

    An inf/NaN gradient gives an inf/NaN norm; that step is skipped by ``found_inf`` anyway.
    """
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    return [g * coef for g in grads], norm


@contextlib.contextmanager
def fp32_ops(names: set[str]):
    """Add to ``names`` every node traced inside the block (make_fx only): the planner denies them."""
    mode = get_proxy_mode()
    if mode is None:
        yield
        return
    graph = mode.tracer.graph
    before = set(graph.nodes)
    try:
        yield
    finally:
        names.update(n.name for n in graph.nodes if n not in before and n.op == "call_function")


#: ops whose values read no tensor's data (only its shape, or none): the backward seed's ``ones_like``
_DATA_FREE = frozenset("ones_like zeros_like empty_like full_like new_ones new_zeros new_full new_empty "
                       "scalar_tensor full ones zeros".split())


def scale_carriers(gm: torch.fx.GraphModule, scale_index: int) -> set[str]:
    """Names of the nodes that compute values from the loss scale alone (the backward's first gradients:
    the seed's ``ones_like * scale``, a custom ``backward``'s ``g * 2``, expanded to the loss's operand) and
    of the nodes reading one: the planner denies them low precision. The scale is no FP16 number (2**16),
    so an FP16 op reading such a value cast it to inf and every step was skipped until the scale had
    backed off (a custom ``autograd.Function`` loss whose backward ran FP16, as eager's, run by its
    forward's FP32 dtype, never does). docs/architecture.md, "Training"."""
    scale = [n for n in gm.graph.nodes if n.op == "placeholder"][scale_index]
    carriers, readers = {scale}, set()
    for node in gm.graph.nodes:
        if node.op != "call_function" or not any(a in carriers for a in node.all_input_nodes):
            continue
        if all(a in carriers or _data_free(a) for a in node.all_input_nodes):
            carriers.add(node)
        else:
            readers.add(node)
    # an op FP32 by its class (nll_loss_backward: 'loss gradients stay FP32') is left to it: named, it would
    # also change how the planner spreads FP32 around it
    return {n.name for n in (carriers | readers) if n.op == "call_function" and not _deny_class(n)}


def _deny_class(node: torch.fx.Node) -> bool:
    row = DEFAULT_REGISTRY.lookup_aten(getattr(getattr(node.target, "overloadpacket", None), "__name__", ""))
    return row is not None and row.op_class == DENY


def _data_free(node: torch.fx.Node) -> bool:
    """A constant, a value made from a shape (``ones_like``), or a size (a symbolic trace's ``sym_size`` and
    its arithmetic: the static trace's ``div(expand, 64)`` is ``div(expand, s0)`` there)."""
    if node.op == "get_attr" or not isinstance(node.meta.get("val", torch.empty(())), torch.Tensor):
        return True
    packet = getattr(node.target, "overloadpacket", None)
    return node.op == "call_function" and getattr(packet, "__name__", "") in _DATA_FREE
