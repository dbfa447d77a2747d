"""SIGTERM unwinds the run as Ctrl-C does, so a terminated run leaves nothing behind.

``kill``, ``timeout``, a CI job's cancel or a container's stop send SIGTERM, whose default action
ends the process at once: no ``finally`` ran, and the staging folder (``atomic.Staging``: a hidden
``.out.onnx.<hex>.tmp`` beside the output, with a partly written model or ``.data`` file in it)
stayed on disk. Raised as ``Terminated`` instead, it unwinds through the staging's cleanup.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator


class Terminated(BaseException):
    """The process got SIGTERM (a BaseException, as KeyboardInterrupt: no ``except Exception`` stops it)."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated()


@contextlib.contextmanager
def terminate_as_exception() -> Iterator[None]:
    """SIGTERM raises ``Terminated`` inside the block; the previous handler is back after it. Only
    the main thread can set a handler: elsewhere (a caller's worker thread) the block runs as is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
