"""Grad mode on through an inference plan (``docs/architecture.md``, "Capture routes and shapes").

An eval-mode ``AmpModule`` (compiled with ``training`` unset) folds its weights into FP16
constants, so no gradient reaches its parameters: ``loss.backward()`` after a quick evaluation
fails with torch's "element 0 of tensors does not require grad", naming nothing of ours, and a
frozen feature extractor feeding a trained head (the same calls) trains the head alone, as
intended. The first such call says it, once per module; the outputs are returned as they are
(wrapping them to raise at backward cost a copy of every output of every inference call made
without ``no_grad``, and broke the frozen-extractor case).

The converse: a model left in train mode (``AutoModel.from_config`` and ``XModel(config)`` build one;
only ``from_pretrained`` calls ``eval()``) compiled for inference gets a training plan, with
dropout on and every weight cast at every call, often all FP32 by cost, and the report's advice
named no ``eval()``. Its first call with grad mode off (``no_grad``, ``inference_mode``) says so,
once, unless ``training=True`` was asked for.
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


def warn_train_plan_without_grad(source: str, stacklevel: int = 3) -> bool:
    """Say once that ``source`` runs a train-mode plan with grad mode off; returns True."""
    warnings.warn(f"amp_compiler: {source} runs a train-mode plan under torch.no_grad()/inference_mode(): the model "
                  f"is in train mode, so dropout is on and every weight is cast to FP16 at every call for its "
                  f"gradient (the cost model often keeps such a plan FP32). For inference, call model.eval() (or "
                  f"amp_model.eval()) first: its plan folds the weights once; to keep this plan, "
                  f"compile(..., training=True)", stacklevel=stacklevel)
    return True


__all__ = ["warn_no_weight_grad", "warn_train_plan_without_grad"]
