"""How an ``AmpModule`` takes the calls a server makes (docs/architecture.md, "Capture routes and shapes"):
from several threads, with keyword arguments in any order.

``CAPTURE_LOCK`` keeps captures apart from everything else: torch.export's non-strict tracing
and dynamo's compile patch process-wide state (module ``__call__``, the export-region flag, the
fake mode), so a capture beside another capture or a run breaks both ("Trying to pop empty
mode stack", "fake_mode.in_kernel_invocation must be False"). Runs of planned graphs share it
(``running``), captures hold it alone (``capturing``, which waiting runs let go first).
``kwarg_order`` puts a call's keyword arguments in the forward's order, so ``amp(a=x, b=y)`` and
``amp(b=y, a=x)`` are one call key and one plan.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from typing import Callable, Iterator

import torch

class CaptureLock:
    """A readers-writer lock: plan runs share it, a capture holds it alone; both reentrant per
    thread (a capture runs the plan it made), and a waiting capture goes before new runs. A run
    may capture (an AmpModule inside another's plan): while it waits it runs nothing, so other
    captures do not wait for it, and two such runs on two threads take turns instead of each
    waiting for the other to end."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._writer: int | None = None
        self._depth = self._waiting = 0
        self._readers: dict[int, int] = {}  # runs in progress, by thread
        self._upgrading: set[int] = set()  # runs waiting, inside their run, to capture

    @contextlib.contextmanager
    def capturing(self) -> Iterator[None]:
        me = threading.get_ident()
        with self._cond:
            if self._writer != me:
                self._waiting += 1
                if me in self._readers:
                    self._upgrading.add(me)
                while self._writer is not None or any(t != me and t not in self._upgrading for t in self._readers):
                    self._cond.wait()
                self._upgrading.discard(me)
                self._waiting -= 1
                self._writer = me
            self._depth += 1
        try:
            yield
        finally:
            with self._cond:
                self._depth -= 1
                if not self._depth:
                    self._writer = None
                    self._cond.notify_all()

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        me = threading.get_ident()
        with self._cond:
            if self._writer != me and me not in self._readers:
                while self._writer is not None or self._waiting:
                    self._cond.wait()
            self._readers[me] = self._readers.get(me, 0) + 1
        try:
            yield
        finally:
            with self._cond:
                self._readers[me] -= 1
                if not self._readers[me]:
                    del self._readers[me]
                    self._cond.notify_all()


#: shared by every AmpModule of the process
CAPTURE_LOCK = CaptureLock()


def kwarg_order(model: torch.nn.Module) -> Callable[[dict], dict]:
    """A function putting keyword arguments in ``model.forward``'s parameter order (names the
    signature does not list, taken by ``**kwargs``, after them by name)."""
    try:
        names = list(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):  # no signature to read: by name
        names = []
    rank = {name: i for i, name in enumerate(names)}

    def order(kwargs: dict) -> dict:
        if len(kwargs) < 2:
            return kwargs
        return {k: kwargs[k] for k in sorted(kwargs, key=lambda k: (rank.get(k, len(rank)), k))}
    return order


__all__ = ["CAPTURE_LOCK", "CaptureLock", "kwarg_order"]
