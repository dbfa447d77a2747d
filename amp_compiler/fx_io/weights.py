"""Folded weights: the low-precision copies of FP32 parameters an inference graph reads.

The casts pass folds the cast of a constant into the constant; on the FX path that is
one FP16 buffer per weight, made at compile time and read by ``get_attr`` (no per-use
and no per-call cast). The FP32 parameter stays the master: the module keeps it, its
``state_dict`` is unchanged (the copies are non-persistent buffers), and a copy is
recast before the next call whenever its master changed in place (``load_state_dict``,
an optimizer step) or moved (``.to(device)``), detected by the tensor's version counter
and storage pointer. Copies are normal tensors even when made under ``torch.inference_mode()``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import nn


@dataclass
class FoldedWeight:
    attr: str  # buffer name in the ``FoldedWeights`` container
    fqn: str  # where the FP32 master lives in the root module ("" for a graph input)
    index: int | None  # the graph input carrying the master (dynamo graphs), else None
    dtype: torch.dtype
    stamp: tuple = ()


def _stamp(t: torch.Tensor) -> tuple:
    return t._version, t.data_ptr(), t.device


def _fetch(root: nn.Module, fqn: str) -> torch.Tensor:
    obj: Any = root
    for part in fqn.split("."):
        obj = getattr(obj, part)
    return obj


def _normal_tensors():
    """No autograd, and not inference mode: a copy made during a first call under
    ``torch.inference_mode()`` is an inference tensor, which a refresh outside it cannot write."""
    return torch.inference_mode(False) if torch.is_inference_mode_enabled() else torch.no_grad()


class FoldedWeights(nn.Module):
    """Container of the folded copies; ``refresh`` recasts the stale ones."""

    def __init__(self) -> None:
        super().__init__()
        self.entries: list[FoldedWeight] = []

    def add(self, master: torch.Tensor, dtype: torch.dtype, fqn: str, index: int | None) -> str:
        """Store ``master`` cast to ``dtype``; returns the buffer's name in this container."""
        base = "".join(c if c.isalnum() else "_" for c in fqn or f"input{index}") + "_" + str(dtype)[6:]
        attr, k = base, 1
        while hasattr(self, attr):
            attr, k = f"{base}_{k}", k + 1
        with _normal_tensors():
            self.register_buffer(attr, master.detach().to(dtype), persistent=False)
        self.entries.append(FoldedWeight(attr, fqn, index, dtype, _stamp(master)))
        return attr

    def refresh(self, root: nn.Module | None = None, args: Sequence[Any] = ()) -> int:
        """Recast copies whose master changed since the last cast; returns how many."""
        n = 0
        for e in self.entries:
            master = args[e.index] if e.index is not None else _fetch(root, e.fqn)
            stamp = _stamp(master)
            if stamp == e.stamp:
                continue
            copy = getattr(self, e.attr)
            with _normal_tensors():
                if copy.device != master.device or copy.shape != master.shape:
                    self.register_buffer(e.attr, master.detach().to(e.dtype), persistent=False)
                else:
                    copy.copy_(master)
            e.stamp = stamp
            n += 1
        return n

    def extra_repr(self) -> str:
        return f"{len(self.entries)} folded weights"


__all__ = ["FoldedWeight", "FoldedWeights"]
