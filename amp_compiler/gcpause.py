"""Pause Python's cyclic garbage collector while a graph is built and planned.

Converting a model allocates a few objects per node (ops, tensors, their lists and
dicts) that all stay alive until the conversion ends. Each full collection walks every
live object, so on a 100k-node graph the collector alone cost several seconds and made
conversion time grow faster than the node count. Reference counting still frees
everything that is not in a cycle; the collector runs again as soon as the conversion
returns. Nested pauses are fine; a collector the caller had disabled stays disabled.
"""

from __future__ import annotations

import functools
import gc
import threading
from contextlib import contextmanager
from typing import Callable, Iterator, TypeVar

F = TypeVar("F", bound=Callable)

_lock = threading.Lock()
_depth = 0
_was_enabled = False


@contextmanager
def paused_gc() -> Iterator[None]:
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()


def gc_paused(fn: F) -> F:
    """Decorator form of ``paused_gc``."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with paused_gc():
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


__all__ = ["gc_paused", "paused_gc"]
