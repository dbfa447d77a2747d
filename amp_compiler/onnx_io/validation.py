"""Input validation of the ONNX importer: a model is either well formed or a one-line ``ConversionError``.

The importer calls ``validate_model`` before it builds the IR. Checks, in order, each
naming the file, the node or tensor, and the reason:

1. Header (here): an IR version and opsets this onnx knows, an opset for every domain used.
2. Structure (``structure``): SSA names, dangling inputs, cycles; out-of-order graphs sorted.
3. Tensors (``tensor_checks``): data types, dims, data sizes, external data inside the folder.
4. onnx's structural checker (``inference``) on a copy without tensor data.
5. Strict type and shape inference (``inference``) on that copy.

Returns the types inference found, which the importer uses where the model declares
none. ``check_emitted`` runs steps 4 and 5 again on the converted model. docs/architecture.md,
"Input handling".
"""

from __future__ import annotations

import functools
import gc
import json
import os
import signal
import sys
import threading
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator, NoReturn

import onnx
from onnx import GraphProto, ModelProto

from ..errors import ConversionError
from .inference import emitted_light_copy, infer, inferred_types, light_copy, run_checker
from .structure import check_structure, subgraphs
from .symbolic_dims import relate_dims
from .tensor_checks import check_tensors

#: Cast-1 takes its target type as a string; the Casts the conversion inserts need Cast-6 or newer
_OLDEST_OPSET = 6


def validate_model(model: ModelProto, *, source: str = "model", base_dir: str | Path | None = None,
                   raw: dict[str, bytes] | None = None,
                   rows: list | None = None, subgraph_paths: list[str] | None = None
                   ) -> dict[str, tuple[int, tuple | None]]:
    """Check ``model`` (steps 1-5 above); returns inferred ``{value name: (elem_type, shape)}``.
    ``raw`` receives the float32 initializers' bytes that step 3 reads (``tensor_checks``);
    ``rows`` the main graph's nodes with the fields step 2 read of each (``structure._node_rows``),
    unless step 2 sorted them, for the importer to read no node twice; ``subgraph_paths`` the
    path of every subgraph step 2 found (none: walks for types need not look into the nodes).

    May rename values reused by sibling subgraphs and sort out-of-order nodes, in place.
    """
    opsets = check_header(model, source)
    subgraph_paths = [] if subgraph_paths is None else subgraph_paths
    main_rows = check_structure(model, source, opsets, subgraph_paths)
    if rows is not None and main_rows is not None:
        rows.extend(main_rows)
    nested = bool(subgraph_paths)
    check_tensors(model, source, base_dir, raw, main_rows, nested)
    stand_ins: list[onnx.TensorProto] = []
    light = light_copy(model, stand_ins, main_rows, nested)
    run_checker(light, source, stand_ins)
    light, consistent = infer(light, source)
    types = inferred_types(light, nested)
    # symbols a Reshape made up, written as arithmetic of the inputs' dims; not where declared shapes
    # disagree with inference (the emitted file would carry shapes the model's own contradict)
    outputs = None if main_rows is None else (o for row in main_rows for o in row[1])
    if consistent and relate_dims(light, types, outputs):
        types = inferred_types(light, nested)
    return types


def check_emitted(model: ModelProto, source: str, pending: Iterable = (), nested: bool = True,
                  op_types: Iterable[str] | None = None) -> None:
    """onnx's checker and strict type inference (steps 4-5) on the converted ``model``, before anything
    is written: the input passed them, so a failure here is the conversion's own, said as such instead of
    a file ONNX Runtime refuses at load (a GPT-NeoX saved by ``optimize_model`` had been written with exit
    0 and FP16 flowing into an FP32 LayerNormalization). ``pending``: the weights the model gets when it
    is written (``stream.PendingCast``); ``nested``: the model may hold subgraphs; ``op_types``: its nodes'
    op types, where known."""
    stand_ins: list[onnx.TensorProto] = []
    light = emitted_light_copy(model, (p.meta() for p in pending), stand_ins, nested, op_types)
    try:
        run_checker(light, source, stand_ins)
        infer(light, source)
    except ConversionError as exc:
        raise ConversionError(source, exc.where, f"the converted model fails ONNX's check ({exc.reason}): "
                                                 "a bug in amp-compiler, so nothing was written; please report "
                                                 "it with the model. --deny-node on that node, or --planner "
                                                 "greedy, may avoid it meanwhile") from None


#: main-graph nodes from which ``checking_emitted`` forks: below, the check takes under a tenth of a second
FORK_FROM_NODES = 10_000
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def checking_emitted(model: ModelProto, source: str, pending: Iterable = (), nested: bool = True,
                     op_types: Iterable[str] | None = None) -> Iterator[None]:
    """``check_emitted`` while the block runs: onnx's checker and inference are C++ holding the GIL
    (about 1.5 s at 112k nodes), so on Linux, from the only Python thread, a forked child runs
    them on the model as it is at entry while the block goes on on another core. The child writes
    nothing but its verdict; its ``ConversionError`` is raised when the block ends, ahead of any
    error of the block's own (as when the check ran first); a child that ended without a verdict
    (killed) is replaced by the check run here, on the model as the block left it. Elsewhere, on
    small models, or where no process can be forked (out of memory), the check runs inline at entry.
    docs/architecture.md, "ONNX emitter"."""
    check = functools.partial(check_emitted, model, source, list(pending), nested, op_types)
    child = _CheckChild.start(check) if _may_fork(model) else None
    if child is None:
        check()
        yield
        return
    try:
        yield
    except Exception:
        child.finish()
        raise
    except BaseException:  # Ctrl-C, SIGTERM: nobody waits for the verdict
        child.abandon()
        raise
    child.finish()


def _may_fork(model: ModelProto) -> bool:
    """Large enough to gain, and safe to fork: Linux (fork without exec is unsafe on macOS), called from
    the only Python thread (another could hold a lock the child's Python code needs), torch not
    imported (its thread pools and any CUDA context are not the child's to inherit), SIGCHLD left at
    its default (the child stays ours to reap: its pid is not reused before). Native library threads
    may run (numpy's OpenBLAS pool stops itself at a fork): the child runs only onnx's C++."""
    if not hasattr(os, "fork") or not sys.platform.startswith("linux") or len(model.graph.node) < FORK_FROM_NODES:
        return False
    return (threading.current_thread() is threading.main_thread() and threading.active_count() == 1
            and "torch" not in sys.modules and signal.getsignal(signal.SIGCHLD) == signal.SIG_DFL)


class _CheckChild:
    """``check`` (``check_emitted`` with its arguments) run in a forked child; its verdict comes back
    through a pipe: ``passed``, or the ``ConversionError``'s three parts as JSON."""

    def __init__(self, check: Callable[[], None], pid: int, read: int) -> None:
        self._check, self._pid, self._read = check, pid, read

    @classmethod
    def start(cls, check: Callable[[], None]) -> _CheckChild | None:
        """Fork the child; None where the system refuses a pipe or a process."""
        try:
            read, write = os.pipe()
        except OSError:
            return None
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)  # none lands before the child's handlers
        try:
            with warnings.catch_warnings():  # Python 3.12+ warns of any native thread (OpenBLAS's): see _may_fork
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
            if pid == 0:
                os.close(read)
                _child(check, write)
        except OSError:  # ENOMEM, EAGAIN: a process of this size cannot be had
            os.close(read)
            return None
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
            os.close(write)
        return cls(check, pid, read)

    def finish(self) -> None:
        """Wait for the verdict; raise the check's ``ConversionError``, or run the check here where
        the child gave none."""
        verdict = self._reap()
        if verdict == _PASSED:
            return
        if verdict:
            raise ConversionError(*json.loads(verdict)) from None
        self._check()

    def abandon(self) -> None:
        """End the child unheard."""
        os.kill(self._pid, signal.SIGKILL)
        self._reap()

    def _reap(self) -> bytes:
        with os.fdopen(self._read, "rb") as pipe:
            verdict = pipe.read()
        try:
            os.waitpid(self._pid, 0)
        except ChildProcessError:  # reaped by someone's waitpid(-1): its verdict was read all the same
            pass
        return verdict


_PASSED = b"passed"


def _child(check: Callable[[], None], fd: int) -> NoReturn:
    """The forked child: run ``check``, write its verdict to ``fd``, leave by ``os._exit`` whatever
    happens (no ``finally`` or ``atexit`` of the parent's runs here, no buffer is flushed twice)."""
    status = 1
    try:
        for signum in _SIGNALS:  # the parent's handlers (the CLI's SIGTERM) would unwind its code here
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
        gc.disable()  # a collection would touch, so copy, every page the parent shares
        try:
            check()
            verdict = _PASSED
        except ConversionError as exc:
            verdict = json.dumps([exc.source, exc.where, exc.reason]).encode()
        with os.fdopen(fd, "wb") as pipe:
            pipe.write(verdict)
        status = 0
    finally:
        os._exit(status)


def infer_types(model: ModelProto) -> dict[str, tuple[int, tuple | None]]:
    """Best-effort, non-strict inference without any check (the importer's ``validate=False`` path)."""
    light = light_copy(model)
    try:
        light = onnx.shape_inference.infer_shapes(light, check_type=False, strict_mode=False)
    except Exception:  # best effort: values without a type are handled downstream
        pass
    return inferred_types(light)


def check_header(model: ModelProto, source: str) -> dict[str, int]:
    """Known IR version and opsets; returns ``{domain: version}`` ('' for the default domain)."""
    if not model.HasField("graph"):
        raise ConversionError(source, "", "not a valid ONNX model: it has no graph")
    if not model.ir_version:
        raise ConversionError(source, "", "not a valid ONNX model: it has no IR version")
    if model.ir_version < 3:
        raise ConversionError(source, "", f"IR version {model.ir_version} is not supported (3 or newer is needed)")
    if model.ir_version > onnx.IR_VERSION:
        raise ConversionError(source, "", f"IR version {model.ir_version} is newer than onnx {onnx.__version__} "
                                          f"supports (up to {onnx.IR_VERSION})")
    opsets: dict[str, int] = {}
    newest = onnx.defs.onnx_opset_version()
    for o in model.opset_import:
        domain = "" if o.domain in ("", "ai.onnx") else o.domain
        label = f"opset_import {o.domain or 'ai.onnx'}"
        if domain in opsets:
            raise ConversionError(source, label, "is listed twice")
        if o.version < 1:
            raise ConversionError(source, label, f"version {o.version} is not a valid opset version")
        if domain == "" and o.version > newest:
            raise ConversionError(source, label, f"version {o.version} is newer than onnx {onnx.__version__} "
                                                 f"supports (up to {newest})")
        if domain == "" and o.version < _OLDEST_OPSET:
            raise ConversionError(source, label, f"version {o.version} is older than {_OLDEST_OPSET}, the first "
                                                 "whose Cast takes a numeric type; upgrade the model with "
                                                 "onnx.version_converter")
        opsets[domain] = o.version
    if "" not in opsets and _uses_default_domain(model.graph):
        raise ConversionError(source, "", "the model uses ONNX ops but has no opset_import for the default domain")
    return opsets


def _uses_default_domain(g: GraphProto) -> bool:
    for node in g.node:
        if node.domain in ("", "ai.onnx"):
            return True
        if any(_uses_default_domain(sub) for sub in subgraphs(node)):
            return True
    return False

