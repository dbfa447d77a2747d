"""A piece of work run in a forked child while the caller goes on on another core.

onnx's checker and shape inference are C++ that hold the GIL (seconds at 100k nodes), so a
thread would not run beside them: on Linux, a forked child runs them on the model as it was at
the fork, and sends back its result (marshalled) or its ``ConversionError``. Used on both sides
of a conversion (``validation.validate_model``, ``validation.checking_emitted``);
docs/architecture.md, "Input handling" and "ONNX emitter".
"""

from __future__ import annotations

import gc
import json
import marshal
import os
import signal
import sys
import threading
import warnings
from typing import Any, Callable, NoReturn

from onnx import ModelProto

from ..errors import ConversionError

#: main-graph nodes from which work is forked: below, onnx's check takes under a tenth of a second
FORK_FROM_NODES = 10_000
_SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: the first byte of a child's answer: its result follows (marshalled), or its error (JSON)
_RESULT, _ERROR = b"R", b"E"


def may_fork(model: ModelProto) -> bool:
    """Large enough to gain, and safe to fork: Linux (fork without exec is unsafe on macOS), called from
    the only Python thread (another could hold a lock the child's Python code needs), torch not
    imported (its thread pools and any CUDA context are not the child's to inherit), SIGCHLD left at
    its default (the child stays ours to reap: its pid is not reused before). Native library threads
    may run (numpy's OpenBLAS pool stops itself at a fork)."""
    if not hasattr(os, "fork") or not sys.platform.startswith("linux") or len(model.graph.node) < FORK_FROM_NODES:
        return False
    return (threading.current_thread() is threading.main_thread() and threading.active_count() == 1
            and "torch" not in sys.modules and signal.getsignal(signal.SIGCHLD) == signal.SIG_DFL)


class ForkedWork:
    """``work`` (no arguments, returning what ``marshal`` writes: dicts, tuples, strings, numbers,
    None) run in a forked child; its answer comes back through a pipe."""

    def __init__(self, work: Callable[[], Any], pid: int, read: int) -> None:
        self._work, self._pid, self._read = work, pid, read

    @classmethod
    def start(cls, work: Callable[[], Any]) -> ForkedWork | None:
        """Fork the child; None where the system refuses a pipe or a process."""
        try:
            read, write = os.pipe()
        except OSError:
            return None
        for stream in (sys.stdout, sys.stderr):  # nothing buffered is written twice if the child writes
            try:
                stream.flush()
            except (AttributeError, OSError, ValueError):  # None, closed
                pass
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)  # none lands before the child's handlers
        try:
            with warnings.catch_warnings():  # Python 3.12+ warns of any native thread (OpenBLAS's): see may_fork
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
            if pid == 0:
                os.close(read)
                _child(work, write)
        except OSError:  # ENOMEM, EAGAIN: a process of this size cannot be had
            os.close(read)
            return None
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
            os.close(write)
        return cls(work, pid, read)

    def finish(self) -> Any:
        """Wait for the answer: return the work's result, raise its ``ConversionError``, or run the work
        here where the child gave no answer (killed, out of memory)."""
        answer = self._reap()
        kind, body = answer[:1], answer[1:]
        if kind == _ERROR:
            raise ConversionError(*json.loads(body)) from None
        if kind == _RESULT:
            try:
                return marshal.loads(body)
            except (EOFError, ValueError, TypeError):  # cut short: the child died while writing
                pass
        return self._work()

    def abandon(self) -> None:
        """End the child unheard."""
        os.kill(self._pid, signal.SIGKILL)
        self._reap()

    def _reap(self) -> bytes:
        try:
            with os.fdopen(self._read, "rb") as pipe:
                answer = pipe.read()
        except BaseException:  # Ctrl-C, SIGTERM while waiting: nobody reads the answer
            os.kill(self._pid, signal.SIGKILL)
            self._wait()
            raise
        self._wait()
        return answer

    def _wait(self) -> None:
        try:
            os.waitpid(self._pid, 0)
        except ChildProcessError:  # reaped by someone's waitpid(-1): its answer was read all the same
            pass


def _child(work: Callable[[], Any], fd: int) -> NoReturn:
    """The forked child: run ``work``, write its answer to ``fd``, leave by ``os._exit`` whatever
    happens (no ``finally`` or ``atexit`` of the parent's runs here, no buffer is flushed twice)."""
    status = 1
    try:
        for signum in _SIGNALS:  # the parent's handlers (the CLI's SIGTERM) would unwind its code here
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
        gc.disable()  # a collection would touch, so copy, every page the parent shares
        try:
            answer = _RESULT + marshal.dumps(work())
        except ConversionError as exc:
            answer = _ERROR + json.dumps([exc.source, exc.where, exc.reason]).encode()
        with os.fdopen(fd, "wb") as pipe:
            pipe.write(answer)
        status = 0
    finally:
        os._exit(status)
