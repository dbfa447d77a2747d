"""Grad mode on through an inference plan (``docs/architecture.md``, "Capture routes and shapes").

An eval-mode ``AmpModule`` (compiled with ``training`` unset) folds its weights into FP16
constants, so no gradient reaches its parameters: ``loss.backward()`` after a quick evaluation
fails with torch's "element 0 of tensors does not require grad", naming nothing of ours, and a
frozen feature extractor feeding a trained head (the same calls) trains the head alone, as
intended. The first such call says it, once per module; the outputs are returned as they are
(wrapping them to raise at backward cost a copy of every output of every inference call made
without ``no_grad``, and broke the frozen-extractor case).
"""

from __future__ import annotations

import warnings


def warn_no_weight_grad(source: str, stacklevel: int = 3) -> bool:
    """Say once that ``source``'s eval-mode plan gives its parameters no gradient; returns True."""
    warnings.warn(f"amp_compiler: {source} runs its eval-mode plan with grad mode on: its weights are folded FP16 "
                  f"copies, so no gradient reaches its parameters (a backward through it reaches only what "
                  f"feeds it). For inference, call it under torch.no_grad() or torch.inference_mode(); to train "
                  f"it, model.train() (or amp_model.train()) before the forward, or compile(..., training=True)",
                  stacklevel=stacklevel)
    return True


__all__ = ["warn_no_weight_grad"]
