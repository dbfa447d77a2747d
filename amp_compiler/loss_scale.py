"""Automatic loss scaling, written as tensor ops so it traces into the step graph.

* the backward seed is the loss times ``scale``;
* every gradient is multiplied by ``1/scale`` and passed through ``unscale_marker`` —
  an identity op the importer turns into the IR's unscale marker, where FP16
  propagation stops (the optimizer and master weights stay FP32);
* ``found_inf`` is one boolean tensor over all gradients;
* the parameter and optimizer-state update is skipped branch-free with ``torch.where``;
* the dynamic scale grows by ``growth_factor`` after ``growth_interval`` clean steps and
  shrinks by ``backoff_factor`` on overflow — no ``.item()``, no host synchronisation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import ConversionError


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
