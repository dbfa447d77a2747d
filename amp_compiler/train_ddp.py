"""DistributedDataParallel inside the captured step (docs/architecture.md, "Training").

``unwrap`` takes the module out of its DDP wrapper (the step calls the module functionally,
so DDP's hooks never run) and returns an ``all_reduce`` that averages the gradients over the
process group with functional collectives, traced into the step graph like any other op.
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
