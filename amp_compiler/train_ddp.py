"""DistributedDataParallel inside the captured step (docs/architecture.md, "Training").

``unwrap`` takes the module out of its DDP wrapper (the step calls the module functionally,
so DDP's hooks never run) and returns an ``all_reduce`` that averages the gradients over the
process group with functional collectives, traced into the step graph like any other op.
``sync_buffers`` does what DDP's forward does before it runs: broadcast the buffers from rank 0.
"""

from __future__ import annotations

from typing import Callable

import torch


def unwrap(model: torch.nn.Module) -> tuple[torch.nn.Module, Callable | None]:
    """(the module to trace, the gradient all-reduce, or None without DDP)."""
    ddp = getattr(torch.nn.parallel, "DistributedDataParallel", None)
    if ddp is None or not isinstance(model, ddp):
        return model, None
    group = model.process_group
    world = torch.distributed.get_world_size(group)

    def all_reduce(grads: list[torch.Tensor]) -> list[torch.Tensor]:
        from torch.distributed import _functional_collectives as funcol
        return [funcol.all_reduce(g, "sum", group) / world for g in grads]

    return model.module, all_reduce


def check_no_sync(ddp: torch.nn.Module | None, call: int, accumulation_steps: int) -> None:
    """Refuse an updating micro-batch called inside ``ddp.no_sync()``: the step all-reduces and updates
    on every ``accumulation_steps``-th call whatever DDP's flag says, so eager's accumulate-under-no_sync
    loop with ``accumulation_steps=1`` would silently update on every micro-batch."""
    if ddp is None or getattr(ddp, "require_backward_grad_sync", True) or call % accumulation_steps:
        return
    raise ValueError(f"compile_training: step called inside DistributedDataParallel.no_sync() on call {call} of "
                     f"accumulation_steps={accumulation_steps}, which all-reduces and updates: pass "
                     f"accumulation_steps=<micro-batches per update> and call the step without no_sync() "
                     f"(it all-reduces on the last micro-batch only)")


def sync_buffers(ddp: torch.nn.Module | None) -> None:
    """Broadcast the module's buffers from rank 0 before a micro-batch, as DDP's forward does with
    ``broadcast_buffers=True`` (its default): the step calls the module, not DDP, so each rank's
    batch-norm running statistics had drifted on its own data."""
    if ddp is not None and ddp._check_sync_bufs_pre_fwd():  # noqa: SLF001 - DDP's own test and sync
        ddp._sync_buffers()  # noqa: SLF001
