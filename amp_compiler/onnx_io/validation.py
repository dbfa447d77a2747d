"""Input validation of the ONNX importer: a model is either well formed or a one-line ``ConversionError``.

The importer calls ``validate_model`` before it builds the IR. Checks, in order, each
naming the file, the node or tensor, and the reason:

1. Header (here): an IR version and opsets this onnx knows, an opset for every domain used.
2. Structure (``structure``): SSA names, dangling inputs, cycles; out-of-order graphs sorted.
3. Tensors (``tensor_checks``): data types, dims, data sizes, external data inside the folder.
4. onnx's structural checker (``inference``) on a copy without tensor data.
5. Strict type and shape inference (``inference``) on that copy.

Returns the types inference found, which the importer uses where the model declares
none. On large models step 5 runs in a forked child beside steps 2-4 (``forked``), its error
raised after theirs. ``check_emitted`` runs steps 4 and 5 again on the converted model.
docs/architecture.md, "Input handling".
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator

import onnx
from onnx import GraphProto, ModelProto

from ..errors import ConversionError
from . import forked
from .forked import ForkedWork
from .inference import emitted_light_copy, infer, inferred_types, light_copy, run_checker
from .structure import check_structure, holds_subgraphs, subgraphs
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

    Inference (step 5, and ``symbolic_dims``) runs in a forked child from the model as it is after
    step 1, while steps 2-4 run here (``_Inference``); its error is raised after theirs, as when it
    ran last. May rename values reused by sibling subgraphs and sort out-of-order nodes, in place.
    """
    opsets = check_header(model, source)
    inference = _Inference.start(model, source)
    try:
        facts = check_structure(model, source, opsets)
        if facts.changed:
            inference.drop()  # the child infers the model as it was
        main_rows, nested = facts.main_rows, bool(facts.subgraph_paths)
        if rows is not None and main_rows is not None:
            rows.extend(main_rows)
        if subgraph_paths is not None:
            subgraph_paths.extend(facts.subgraph_paths)
        check_tensors(model, source, base_dir, raw, main_rows, nested)
        light = _checked_copy(model, source, main_rows, nested)
    except BaseException:  # steps 2-4 come first: the child's answer is not needed
        inference.drop()
        raise
    outputs = None if main_rows is None else (o for row in main_rows for o in row[1])
    return inference.result(functools.partial(inferred_after_check, light, source, nested, outputs))


def _checked_copy(model: ModelProto, source: str, main_rows: list[tuple] | None, nested: bool) -> ModelProto:
    """Step 4: the light copy of ``model``, which onnx's checker passed. ``main_rows``: the structure
    check's rows, where it kept them; ``nested``: whether it found subgraphs."""
    stand_ins: list[onnx.TensorProto] = []
    if main_rows is None:
        light = light_copy(model, stand_ins, nested=nested)
    else:
        light = light_copy(model, stand_ins, [row[4] for row in main_rows], [row[6] for row in main_rows], nested)
    run_checker(light, source, stand_ins)
    return light


def inferred_after_check(light: ModelProto, source: str, nested: bool, outputs: Iterable[str] | None = None
                         ) -> dict[str, tuple[int, tuple | None]]:
    """Step 5 on ``light`` (a ``light_copy`` that passed onnx's checker), and the symbols a Reshape
    made up written as arithmetic of the inputs' dims (``symbolic_dims``): the types
    ``validate_model`` returns. ``nested``: as ``light_copy`` takes it; ``outputs``: the main graph's
    node outputs, where the caller read them (else read off ``light`` where needed)."""
    light, consistent = infer(light, source)
    types = inferred_types(light, nested)
    # not where declared shapes disagree with inference (the emitted file would carry shapes the
    # model's own contradict)
    if consistent and relate_dims(light, types, outputs):
        types = inferred_types(light, nested)
    return types


def _inferred_from_scratch(model: ModelProto, source: str) -> dict[str, tuple[int, tuple | None]]:
    """``inferred_after_check`` of ``model``'s light copy: the forked child's work. It reads each node's
    attributes, and its op type where it has no subgraphs, not the structure check's whole rows
    (0.25 s at 112k nodes where ``structure.node_rows`` takes 0.4 s, on the child's critical path)."""
    nodes = model.graph.node
    attributes = [node.attribute[:] for node in nodes]
    nested = holds_subgraphs(attributes)
    op_types = None if nested else [node.op_type for node in nodes]
    return inferred_after_check(light_copy(model, None, attributes, op_types, nested), source, nested)


class _Inference:
    """Step 5 of ``validate_model`` beside steps 2-4: onnx's inference is C++ holding the GIL (about
    1.2 s at 112k nodes, and ONNX Runtime's symbolic inference after it Python), so on Linux, from
    ``forked.FORK_FROM_NODES`` nodes, a forked child infers the model as it is after step 1 while the
    parent checks it on another core (``forked.may_fork``). docs/architecture.md, "Input handling"."""

    def __init__(self, child: ForkedWork | None) -> None:
        self._child = child

    @classmethod
    def start(cls, model: ModelProto, source: str) -> _Inference:
        """Fork the child where that is safe and pays."""
        if not forked.may_fork(model):
            return cls(None)
        return cls(ForkedWork.start(functools.partial(_inferred_from_scratch, model, source)))

    def drop(self) -> None:
        """End the child unheard: the parent's checks failed, or changed the model since the fork."""
        if self._child is not None:
            self._child.abandon()
            self._child = None

    def result(self, inline: Callable[[], dict]) -> dict[str, tuple[int, tuple | None]]:
        """The child's types, or its ``ConversionError``; ``inline()`` where no child infers (none
        forked, or dropped). A child that ended without an answer is replaced by its work run here."""
        if self._child is None:
            return inline()
        child, self._child = self._child, None
        return child.finish()


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


@contextmanager
def checking_emitted(model: ModelProto, source: str, pending: Iterable = (), nested: bool = True,
                     op_types: Iterable[str] | None = None) -> Iterator[None]:
    """``check_emitted`` while the block runs: onnx's checker and inference are C++ holding the GIL
    (about 1.5 s at 112k nodes), so on Linux, from the only Python thread, a forked child runs
    them on the model as it is at entry while the block goes on on another core (``forked``). The
    child writes nothing but its verdict; its ``ConversionError`` is raised when the block ends, ahead
    of any error of the block's own (as when the check ran first); a child that ended without a verdict
    (killed) is replaced by the check run here, on the model as the block left it. Elsewhere, on
    small models, or where no process can be forked (out of memory), the check runs inline at entry.
    docs/architecture.md, "ONNX emitter"."""
    check = functools.partial(check_emitted, model, source, list(pending), nested, op_types)
    child = ForkedWork.start(check) if forked.may_fork(model) else None
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

