"""Backward through an inference plan (``docs/architecture.md``, "Capture routes and shapes").

An eval-mode ``AmpModule`` (compiled with ``training`` unset) folds its weights into FP16
constants, so its outputs had no ``grad_fn``: ``loss.backward()`` after a quick evaluation failed
with torch's "element 0 of tensors does not require grad", naming nothing of ours. Where the
eager model would have built a graph (grad mode on, a parameter requiring grad),
``guard_outputs`` passes the floating outputs that do not require grad through ``_NoWeightGrad``
(a copy, as eager's outputs are new tensors), whose backward raises one error naming
``model.train()`` and ``training=True``. ``torch.no_grad``/``inference_mode`` calls pay nothing. An
eval-mode part upstream of a trained one (a frozen feature extractor whose parameters still require
grad) raises too, since its backward cannot tell: the message names ``torch.no_grad()`` and
``requires_grad_(False)``, as eager needs them to skip that part's backward.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree

_ANCHOR = torch.zeros((), requires_grad=True)  # the input that makes the copies require grad; never gets one


class _NoWeightGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, source: str, anchor: torch.Tensor, *outs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.source = source
        return tuple(o.clone() for o in outs)  # clones: an input returned as-is is a view users cannot modify

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        raise RuntimeError(
            f"amp_compiler: backward through {ctx.source}'s inference (eval-mode) plan, whose weights are folded "
            f"into FP16 constants: no gradient reaches the parameters; call model.train() (or amp_model.train()) "
            f"before the forward you backpropagate through, or compile(..., training=True) to keep gradients in "
            f"eval mode; a frozen part feeding a trained one: call it under torch.no_grad(), or requires_grad_(False) "
            f"its parameters")


def guard_outputs(out: Any, source: str) -> Any:
    """``out`` with its floating tensors that do not require grad made to raise ``_NoWeightGrad``'s error
    on backward (call only where grad mode is on and the model has a parameter requiring grad)."""
    leaves, spec = pytree.tree_flatten(out)
    at = [i for i, t in enumerate(leaves)
          if isinstance(t, torch.Tensor) and t.is_floating_point() and not t.requires_grad]
    if not at:
        return out
    for i, t in zip(at, _NoWeightGrad.apply(source, _ANCHOR, *(leaves[i] for i in at))):
        leaves[i] = t
    return pytree.tree_unflatten(leaves, spec)


__all__ = ["guard_outputs"]
