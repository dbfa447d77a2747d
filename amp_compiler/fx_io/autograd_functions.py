"""Custom ``torch.autograd.Function``s in a forward planned for training (docs/architecture.md,
"Capture routes and shapes").

Both capture routes trace a Function's ``forward`` into aten ops, and a training plan lets
autograd differentiate those ops: the Function's own ``backward`` (a straight-through
estimator, a hand-written kernel's gradient) would be silently replaced. Such a forward is
refused with ``CustomBackwardError``; ``compile_training`` runs the real backward (it traces
``autograd.grad``), and inference plans never call a backward. Functions defined inside
torch (a reentrant checkpoint's) are left alone: their backward is their forward's gradient.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Iterator

import torch
from torch import fx

from ..errors import ConversionError


class CustomBackwardError(ConversionError):
    """A training plan would drop a custom ``autograd.Function``'s backward; no other route keeps it."""

    def __init__(self, source: str, where: str) -> None:
        super().__init__(source, where, "training would differentiate the traced forward of this custom "
                         "torch.autograd.Function, not its backward(); use amp_compiler.compile_training "
                         "(it runs the backward), or training=False for inference")


def _user_function(cls: type) -> bool:
    return not (cls.__module__ or "").startswith("torch.")


def _describe(cls: type) -> str:
    try:
        return f"{cls.__qualname__} ({inspect.getsourcefile(cls)}:{inspect.getsourcelines(cls)[1]})"
    except (OSError, TypeError):
        return cls.__qualname__


@contextlib.contextmanager
def recording_functions() -> Iterator[list[type]]:
    """Within the block, the Function classes applied (torch's own too) are appended to the list yielded."""
    found: list[type] = []
    function = torch.autograd.Function
    original = function.__dict__["apply"]

    def apply(cls, *args, **kwargs):
        if cls not in found:
            found.append(cls)
        return original.__func__(cls, *args, **kwargs)

    function.apply = classmethod(apply)
    try:
        yield found
    finally:
        function.apply = original


def check_recorded(found: list[type], source: str) -> None:
    """Raise ``CustomBackwardError`` naming the first user-defined Function ``recording_functions`` saw."""
    user = [cls for cls in found if _user_function(cls)]
    if user:
        raise CustomBackwardError(source, f"custom torch.autograd.Function {_describe(user[0])}")


def check_dynamo_graph(gm: fx.GraphModule, source: str) -> None:
    """Raise ``CustomBackwardError`` if dynamo's graph applies a custom Function (naming its call line)."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and "autograd_function_apply" in str(node.target):
            trace = [line.strip() for line in node.meta.get("stack_trace", "").splitlines() if line.strip()]
            call = next((line for line in reversed(trace) if ".apply(" in line), "")
            frame = next((line for line in reversed(trace) if line.startswith("File ")), "")
            where = f"{frame}: `{call}`" if frame else call
            raise CustomBackwardError(source, f"custom torch.autograd.Function applied at {where or node.name}")


__all__ = ["CustomBackwardError", "check_dynamo_graph", "check_recorded", "recording_functions"]
