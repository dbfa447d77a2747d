"""``convert_onnx``: an FP32 ONNX model in, a ``ConvertedModel`` (mixed-precision model and report) out."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Mapping

from onnx import ModelProto

from cost_model import load_device
from cost_model.runtime import default_runtime
from passes.user_rules import UserRules

from .custom_ops import custom_ops_from_dict, custom_registry, load_custom_ops
from .dims import check_sizes, names_in
from .errors import ConversionError
from .gcpause import gc_paused
from .input_gen import natural_dims
from .onnx_io.annotate import annotate_model, earlier_fp32, record_modules, walk_nodes
from .onnx_io.common_subexpressions import merge_duplicates
from .onnx_io.emitter import emit
from .onnx_io.files import has_external, load_model_files, materialize, save_model
from .onnx_io.importer import import_model
from .onnx_io.validation import checking_emitted
from .onnx_io.derived_dims import carries_cache, derived_sizes
from .onnx_io.stream import append_pending
from .onnx_io.cpu_layout import cpu_layout_note
from .onnx_io.train_mode import DRAWS, training_mode_note
from .numerics import RANGES
from .plan import make_context, run_passes
from .plan_report import build_report
from .registry import DEFAULT_REGISTRY
from .report import Report
from .rule_names import check_rule_names


@gc_paused  # a few objects per node stay alive until the end: full collections only cost time
def convert_onnx(model_or_path: ModelProto | str | os.PathLike, *, target: str = "h100", dtype: str = "fp16",
                 keep_io_types: bool = True, allow: Iterable[str] = (), deny: Iterable[str] = (),
                 deny_nodes: Iterable[str] = (), planner: str = "optimal", default_dim: int = 8,
                 dim_values: dict[str, int] | None = None, profile=None, progress=None,
                 source: str | None = None, calibrate: bool = False,
                 calibration_inputs: dict | None = None,
                 base_dir: str | os.PathLike | None = None,
                 deny_propagation: bool = True, exclude_nodes: Iterable[str] = (),
                 include_nodes: Iterable[str] = (), force_ops: Iterable[str] = (),
                 max_reduction_depth: int | None = None, init_max_bytes: int | None = None,
                 custom_ops: str | os.PathLike | dict | list | None = None,
                 data_max: float | None = None, annotate: bool = True,
                 deploy: str | None = None, objective: str = "time", copy: bool = True) -> "ConvertedModel":
    """Plan and apply mixed precision on an ONNX model.

    ``model_or_path`` is a ``ModelProto`` (left unmodified: a copy is converted; with
    ``copy=False`` it is converted in place, saving a copy of every weight) or a path to an
    ``.onnx`` file. ``dim_values`` sizes symbolic dims for the cost model
    (others take ``default_dim``). ``calibrate=True`` runs the FP32 model once on ONNX
    Runtime (``calibration_inputs``, or seeded random inputs) and keeps in FP32 the ops
    whose activations would overflow FP16 or be subnormal in it throughout. Returns a
    ``ConvertedModel``: ``result.save(path)``, ``result.model``, ``result.report``, or
    ``model, report = convert_onnx(...)``.

    ``planner`` chooses how the eligible region is labelled:

    * ``"optimal"`` (default): exact minimum of the predicted time including casts
      (s-t min-cut over the cost model's numbers);
    * ``"greedy"``: the TF-style painter (allow ops, and infer/clear ops between them);
    * ``"all"``: every op that may legally and safely run in ``dtype`` does, whatever
      the cost model says and whether or not a tensor-core op is in reach. Deny and
      unknown ops, ops whose schema refuses the low dtype, and ops reading constants
      out of its range stay FP32 as always. Useful as the "everything FP16" baseline
      and for conformance runs over single-op models.
    ``deny_propagation`` (on by default) applies TF's rule: an infer op fed by a deny op through
    infer/clear ops stays FP32 too, up to an op whose output is bounded (the range of a Pow
    or reduction output is unknown); ``False`` opts out (docs/architecture.md, "Passes").
    ``target`` is a device name (``cost_model.DEVICES``), a ``DeviceSpec``, a dict of device
    figures or the path of a JSON file of them (``cost_model.device_from_dict``).
    The rules users bring from ModelOpt AutoCast (``docs/migrating.md``): ``exclude_nodes`` /
    ``include_nodes`` are regular expressions matched at the start of node names (FP32 /
    forced into ``dtype`` where legal; include wins), ``force_ops`` op types forced into
    ``dtype`` where legal, ``max_reduction_depth`` keeps ops accumulating over more elements
    FP32, ``init_max_bytes`` keeps larger initializers FP32 and casts them at run time, and
    ``custom_ops`` (a JSON file path or its dict; ``custom_ops.py``) classifies plugin ops
    (``passes.user_rules``). With calibration, ``data_max`` (AutoCast's) keeps FP32 the ops
    whose activations exceed it (default: half of FP16's maximum).
    ``deploy``: the runtime the model will run on, whose fusions and launch costs the cost
    model prices (``cost_model/runtime.py``; default ``"ort-cuda"``, ONNX Runtime's CUDA EP).
    ``objective``: ``"time"`` (near-ties go to the plan with less memory), ``"memory"`` or
    ``"fastest"`` (the exact time minimum, no tie-break).
    ``base_dir``: for a ``ModelProto`` loaded without its external data
    (``onnx_io.files.load_model(path, external_data="lazy")``), the folder the data is
    in. Such tensors are read in chunks and never held whole; folded constants made
    from them are cast while ``result.save(path)`` streams them.
    ``annotate=False`` leaves the nodes' ``metadata_props``/``doc_string`` without the
    plan's decisions (``onnx_io.annotate``), for byte-minimal files.
    Raises ``ConversionError`` (file, op or tensor, reason) for models it cannot convert.
    """
    if not isinstance(model_or_path, (ModelProto, str, os.PathLike)):
        raise TypeError(f"convert_onnx takes an onnx.ModelProto or the path of an .onnx file, got "
                        f"{type(model_or_path).__name__}")
    check_sizes(dim_values, default_dim)
    registry = custom_registry(_custom_rows(custom_ops)) if custom_ops is not None else None
    ctx = make_context(target=load_device(target), dtype=dtype, planner=planner, keep_io_types=keep_io_types,
                       allow=allow, deny=deny, deny_nodes=deny_nodes, default_dim=default_dim, profile=profile,
                       progress=progress, deny_propagation=deny_propagation,
                       runtime=deploy or default_runtime("onnx"), objective=objective)
    ctx.registry = registry
    ctx.deny_node_reasons = dict(deny_nodes) if isinstance(deny_nodes, Mapping) else None  # the fallback's
    ctx.user_rules = UserRules(exclude_nodes, include_nodes, force_ops, max_reduction_depth, init_max_bytes)
    if isinstance(model_or_path, ModelProto):
        model = model_or_path
        if copy:
            model = ModelProto()
            model.CopyFrom(model_or_path)
        source = source or model.graph.name or "model"
        read_from = []  # lazily loaded external data is protected by save_model itself
    else:
        base_dir = Path(model_or_path).resolve().parent
        source = source or str(model_or_path)
        model, read_from = load_model_files(model_or_path)
    ctx.earlier_fp32 = earlier_fp32(model)  # a model this tool converted before: its FP32 decisions hold
    if progress:
        progress("import")
    imp = import_model(model, registry=registry, source=source, default_dim=default_dim, validate=True,
                       base_dir=str(base_dir) if base_dir is not None else None)
    _check_dim_names(imp.graph, dim_values, source)
    user_nodes = ctx.deny_nodes if ctx.deny_node_reasons is None else \
        [n for n, why in ctx.deny_node_reasons.items() if why.endswith("(--deny-node)")]  # not the fallback's
    check_rule_names(imp.graph, source, registry or DEFAULT_REGISTRY, node_names=user_nodes,
                     op_types={"--deny": ctx.deny, "--allow": ctx.allow, "--force-op": ctx.user_rules.force_ops},
                     patterns={"--exclude-nodes": ctx.user_rules.exclude_nodes,
                               "--include-nodes": ctx.user_rules.include_nodes})
    merged = merge_duplicates(imp, keep=set(ctx.deny_nodes or ()))  # as ONNX Runtime will at load: priced once
    nested = len(imp.graphs) > 1  # subgraphs to look into (else no node's attributes are read)
    op_types = {op.op_type for op in imp.graph.ops.values()}  # no Dropout nor BatchNormalization: no walk
    trained = training_mode_note(model, nested=nested) if op_types & _TRAINING_MODE_OPS else ""  # before emission
    drawn: dict[str, str] = {}
    if calibrate or calibration_inputs is not None:
        if progress:
            progress("calibrate activation ranges on ONNX Runtime")
        if data_max is not None:
            ctx.calibration_margin = RANGES[ctx.low_dtype].max / data_max
        drawn = _calibrate(model, imp.graph, calibration_inputs, dim_values)
    # a waveform's samples are sized as one second of audio and an image's sides as 224 pixels unless
    # --dim says otherwise, a decoder's total_sequence as past_sequence + sequence ("Input handling")
    sizes = {**natural_dims(model), **(dim_values or {})}
    if carries_cache(model, nested=nested):
        sizes.update(derived_sizes(model, sizes, default_dim))
    result = run_passes(imp.graph, ctx, source, sizes or None)
    if progress:
        progress("emit")
    imp.pending = []  # folded weights are cast while the file is written (onnx_io/stream.py)
    converted = emit(imp, result)
    # a file ORT refuses is our bug; checked beside the report and annotations (C++ holding the GIL)
    with checking_emitted(converted, source, imp.pending, nested, op_types | {"Cast"}):
        # after emission: the report describes the emitted model; the IR is this call's alone, so the
        # per-op costs only a full report shows wait until one is read (``Report.data``)
        report = build_report(result, defer_costs=True)
        nodes = list(walk_nodes(converted.graph, nested=len(imp.graphs) > 1))  # the importer met every subgraph
        record_modules(converted, report, nodes)  # the exporter's module paths, for the report's graph
        if drawn:
            report.summary["inputs_drawn"] = drawn  # how the calibration inputs were made
        if trained:
            report.summary["exported_in_training"] = trained
        cpu_only = cpu_layout_note(imp.graph.ops.values())
        if cpu_only:
            report.summary["cpu_layout_ops"] = cpu_only
        if merged:
            report.summary["merged_duplicates"] = (
                f"merged {sum(merged.values())} duplicate ops into their twins ("
                + ", ".join(f"{op} x{n}" for op, n in merged.most_common())
                + "): same op, inputs and attributes, as ONNX Runtime's common-subexpression elimination "
                  "merges them at load")
        if annotate:
            annotate_model(converted, report, nodes)
    return ConvertedModel(converted, report, base_dir, imp.pending, read_from)


_TRAINING_MODE_OPS = frozenset({"Dropout", "BatchNormalization", *DRAWS})  # what ``training_mode_nodes`` looks for


def _check_dim_names(graph, dim_values: dict[str, int] | None, source: str) -> None:
    """A ``--dim`` naming no symbolic dim of the model sizes nothing: a typo (``batch`` for an
    export's ``N``) would plan and validate at the default size with no word said."""
    if not dim_values:
        return
    named = {n for t in graph.tensors.values() if t.shape for d in t.shape if isinstance(d, str)
             for n in names_in(d)}
    unknown = sorted(set(dim_values) - named)
    if unknown:
        declared = sorted({d for name in graph.inputs for d in (graph.tensors[name].shape or ()) if isinstance(d, str)})
        raise ConversionError(source, f"--dim {unknown[0]}={dim_values[unknown[0]]}",
                              f"the model has no symbolic dim named {unknown[0]!r}; its inputs declare "
                              f"{', '.join(declared) if declared else 'none (every input dim is fixed)'}")


def _custom_rows(table) -> list:
    """Rows of a custom-op table given as parsed rows (the CLI), a dict, or a JSON file path."""
    if isinstance(table, list):
        return table
    return custom_ops_from_dict(table) if isinstance(table, dict) else load_custom_ops(str(table))


def _calibrate(model: ModelProto, graph, feeds: dict | None, dims: dict[str, int] | None) -> dict[str, str]:
    """Record each activation's calibrated peak (the numerics pass judges it for the target dtype);
    returns how default inputs were drawn ({} when the caller gave them)."""
    from .calibrate import activation_ranges
    from .input_gen import model_inputs

    drawn: dict[str, str] = {}
    if feeds is None:
        feeds, drawn = model_inputs(model, dims=dims)
    ranges = activation_ranges(model, graph, feeds)
    for name, peak in ranges.items():
        if name in graph.tensors:
            graph.tensors[name].calibrated_peak = peak
    return drawn


class ConvertedModel:
    """What ``convert_onnx`` returns: the converted model, its report, and the one call that saves it.

    ``save(path)`` streams the model to disk (weights that stayed in their external-data
    files are copied or cast chunk by chunk, never held whole; folded in-memory weights are
    cast one by one as they are written, ``onnx_io/stream.py``). ``model`` is a plain,
    self-contained ``ModelProto``: on first access deferred and pending casts are computed and
    weights still in external files are read in (use ``save`` for models too large for that).
    Unpacks (and indexes) as the pair ``model, report = convert_onnx(...)``.
    """

    def __init__(self, proto: ModelProto, report: Report, base_dir: str | os.PathLike | None = None,
                 pending: list | None = None, read_from: Iterable[str | os.PathLike] = ()) -> None:
        self._proto, self.report = proto, report
        self._read_from = list(read_from)  # the source file and its data: never saved over
        self._pending = pending if pending is not None else []  # weights cast while saving (onnx_io/stream.py)
        self._base_dir = str(base_dir) if base_dir is not None else None

    @property
    def model(self) -> ModelProto:
        """The converted ``ModelProto``; ``onnx.save`` works on it."""
        if self._pending:
            append_pending(self._proto, self._pending)
        if has_external(self._proto):
            materialize(self._proto, self._base_dir)
        return self._proto

    def save(self, path: str | os.PathLike, *, external: bool | None = None, protect=(), staging=None) -> Path:
        """Write the model to ``path`` (and ``path.data`` when it has external data); see ``files.save_model``.
        Refuses (``ConversionError``) a path, or a data file, that is the source model or its data."""
        return save_model(self._proto, path, external=external, base_dir=self._base_dir,
                          protect=[*self._read_from, *protect],
                          staging=staging, pending=self._pending)

    def __iter__(self):
        yield self.model
        yield self.report

    def __getitem__(self, index):
        return (self.model, self.report)[index]

    def __len__(self) -> int:
        return 2


__all__ = ["ConversionError", "ConvertedModel", "convert_onnx"]
