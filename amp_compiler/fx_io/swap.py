"""The training step's reparametrisation (docs/architecture.md, "Training"): the model runs on the
step's traced tensors, then gets its own back.

``torch.nn.utils.stateless._reparametrize_module(..., tie_weights=True)`` restores a module reached
by two paths (``self.l2 = self.l1``, ALBERT's one layer run N times) once per path, the second time
with the traced tensor the first swap left there: the model kept FakeTensors for parameters after
``compile_training``. Here every slot (module, attribute) holding a swapped tensor, under any name
or alias (a tied weight), is set once and restored once.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Mapping

import torch


def _slots(model: torch.nn.Module) -> Iterator[tuple[torch.nn.Module, str, str, torch.Tensor]]:
    """``(module, attribute, name, tensor)`` of every parameter and buffer, each module once."""
    for prefix, module in model.named_modules(remove_duplicate=True):
        for table in (module._parameters, module._buffers):
            for attr, tensor in table.items():
                if tensor is not None:
                    yield module, attr, f"{prefix}.{attr}" if prefix else attr, tensor


def _put(module: torch.nn.Module, attr: str, value: torch.Tensor) -> None:
    table = module._parameters if attr in module._parameters else module._buffers
    table[attr] = value


@contextlib.contextmanager
def swapped(model: torch.nn.Module, named: Mapping[str, torch.Tensor]) -> Iterator[None]:
    """Run ``model`` with the tensors ``named`` (by ``named_parameters``/``named_buffers`` name) in
    place of its own, in every slot that holds the same tensor (tied weights too); restores them."""
    slots = list(_slots(model))
    by_name = {name: tensor for _, _, name, tensor in slots}
    new_by_id = {id(by_name[name]): value for name, value in named.items() if name in by_name}
    missing = [name for name in named if name not in by_name]
    if missing:
        raise KeyError(f"{type(model).__name__} has no parameter or buffer {missing[0]!r}")
    swapped_slots = [(module, attr, tensor) for module, attr, _, tensor in slots if id(tensor) in new_by_id]
    try:
        for module, attr, tensor in swapped_slots:
            _put(module, attr, new_by_id[id(tensor)])
        yield
    finally:
        for module, attr, tensor in swapped_slots:
            _put(module, attr, tensor)


__all__ = ["swapped"]
