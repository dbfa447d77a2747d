"""Where the user's code is: the frames outside torch and this package.

Errors name the user's line (``user_line``: the last user frame of a stack trace torch recorded or
printed), and warnings raised during a call point at it (``user_stacklevel``):
``warnings.warn(stacklevel=N)`` counts frames, and the frames between a user's ``amp_model(x)`` and
our forward vary (``nn.Module.__call__``'s two, ``torch.compiler.disable``'s wrapper, a
``torch.compile`` around it): a fixed count pointed the eval-mode-with-grad warning at torch's
``module.py``.
"""

from __future__ import annotations

import os
import re
import sys

import torch

__all__ = ["is_user_file", "user_line", "user_stacklevel"]

_LIBRARIES = tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep for m in (torch, sys.modules[__package__]))
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)(?:\n    (\S.*))?')


def _library(path: str) -> bool:
    return os.path.abspath(path).startswith(_LIBRARIES)


def is_user_file(path: str) -> bool:
    """A file of the user's code: not torch's, not this package's, not generated (``<string>``)."""
    return not path.startswith("<") and not _library(path)


def user_line(trace: str) -> str:
    """``file:line in function: `code``` of the last user frame in a printed stack ``trace``, else ''."""
    frames = [m for m in _FRAME.finditer(trace) if is_user_file(m.group(1))]
    if not frames:
        return ""
    f = frames[-1]
    return f"{f.group(1)}:{f.group(2)} in {f.group(3)}" + (f": `{f.group(4).strip()}`" if f.group(4) else "")


def user_stacklevel() -> int:
    """The ``stacklevel`` for a ``warnings.warn`` made in the function calling this one: the first
    frame outside torch and this package (a ``python -c`` script's ``<string>`` counts as the
    user's; 1 if there is none)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and _library(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    return level if frame is not None else 1
