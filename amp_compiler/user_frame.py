"""Where a warning raised during a call should point: the user's line, not torch's or ours.

``warnings.warn(stacklevel=N)`` counts frames, and the frames between a user's ``amp_model(x)`` and
our forward vary (``nn.Module.__call__``'s two, ``torch.compiler.disable``'s wrapper, a
``torch.compile`` around it): a fixed count pointed the eval-mode-with-grad warning at torch's
``module.py``. ``user_stacklevel`` counts them instead.
"""

from __future__ import annotations

import os
import sys

import torch

__all__ = ["user_stacklevel"]

_INTERNAL = tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep for m in (torch, sys.modules[__package__]))


def user_stacklevel() -> int:
    """The ``stacklevel`` for a ``warnings.warn`` made in the function calling this one: the first
    frame outside torch and this package (1 if there is none)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_INTERNAL):
        frame, level = frame.f_back, level + 1
    return level if frame is not None else 1
