"""The train/eval mode a model behaves in, as its weights see it (docs/architecture.md,
"Capture routes and shapes").

``model.training`` is the root module's flag alone. A wrapper made after ``.eval()`` —
``nn.DataParallel(model.eval())``, a user's ``Wrapper(model.eval())`` to reshape outputs — is in
train mode at its root (a new module is) while every layer holding weights is in eval mode; read
as training, the plan kept every weight FP32 and cast it each call, for gradients nobody asked for.
"""

from __future__ import annotations

import torch


def effective_training(model: torch.nn.Module) -> bool:
    """True if any module holding parameters or buffers of its own is in train mode; the root's
    flag for a model with none."""
    holders = [m for m in model.modules()
               if next(m.parameters(recurse=False), None) is not None or next(m.buffers(recurse=False), None) is not None]
    return any(m.training for m in holders) if holders else model.training


def module_modes(model: torch.nn.Module) -> tuple[bool, ...]:
    """Every submodule's ``training`` flag, in ``modules()`` order: a trace bakes each one in (a
    batch norm switched to ``eval()`` inside a training model normalises by its running statistics
    and stops updating them), so a capture is keyed by all of them, not by the root's alone."""
    return tuple(m.training for m in model.modules())


__all__ = ["effective_training", "module_modes"]
