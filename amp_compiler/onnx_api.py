"""``convert_onnx``: an FP32 ONNX model in, a mixed-precision ONNX model and its report out."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from onnx import ModelProto

from cost_model.runtime import default_runtime

from .errors import ConversionError
from .gcpause import gc_paused
from .onnx_io.emitter import emit
from .onnx_io.files import load_model
from .onnx_io.importer import import_model
from .plan import make_context, run_passes
from .report import Report


@gc_paused  # a few objects per node stay alive until the end: full collections only cost time
def convert_onnx(model_or_path: ModelProto | str | os.PathLike, *, target: str = "h100", dtype: str = "fp16",
                 keep_io_types: bool = True, allow: Iterable[str] = (), deny: Iterable[str] = (),
                 deny_nodes: Iterable[str] = (), planner: str = "optimal", default_dim: int = 8,
                 dim_values: dict[str, int] | None = None, profile=None, progress=None,
                 source: str | None = None, calibrate: bool = False,
                 calibration_inputs: dict | None = None,
                 base_dir: str | os.PathLike | None = None,
                 deny_propagation: bool = False, deploy: str | None = None,
                 objective: str = "time") -> tuple[ModelProto, Report]:
    """Plan and apply mixed precision on an ONNX model.

    ``model_or_path`` is a ``ModelProto`` (left unmodified: a copy is converted) or a
    path to an ``.onnx`` file. ``dim_values`` sizes symbolic dims for the cost model
    (others take ``default_dim``). ``calibrate=True`` runs the FP32 model once on ONNX
    Runtime (``calibration_inputs``, or seeded random inputs) and keeps in FP32 the ops
    whose activations would overflow FP16 or be subnormal in it throughout. Returns the
    converted model and the report.

    ``planner`` chooses how the eligible region is labelled:

    * ``"optimal"`` (default): exact minimum of the predicted time including casts
      (s-t min-cut over the cost model's numbers);
    * ``"greedy"``: the TF-style painter (allow ops, and infer/clear ops between them);
    * ``"all"``: every op that may legally and safely run in ``dtype`` does, whatever
      the cost model says and whether or not a tensor-core op is in reach. Deny and
      unknown ops, ops whose schema refuses the low dtype, and ops reading constants
      out of its range stay FP32 as always. Useful as the "everything FP16" baseline
      and for conformance runs over single-op models.
    ``deny_propagation=True`` applies TF's rule: an infer op fed by a deny op through
    infer/clear ops stays FP32 too (the range of a Pow or reduction output is unknown; this
    keeps a T5-style RMSNorm out of FP16 without calibration data, at the price of more FP32
    elementwise work, e.g. GPT-2's tanh-GELU after its Pow).
    ``deploy``: the runtime the model will run on, whose fusions and launch costs the cost
    model prices (``cost_model/runtime.py``; default ``"ort-cuda"``, ONNX Runtime's CUDA EP).
    ``objective``: ``"time"`` (near-ties go to the plan with less memory) or ``"memory"``.
    ``base_dir``: for a ``ModelProto`` loaded without its external data
    (``onnx_io.files.load_model(path, external_data="lazy")``), the folder the data is
    in. Such tensors are read in chunks and never held whole; folded constants made
    from them are cast while saving, so save the result with ``onnx_io.files.save_model``.
    Raises ``ConversionError`` (file, op or tensor, reason) for models it cannot convert.
    """
    ctx = make_context(target=target, dtype=dtype, planner=planner, keep_io_types=keep_io_types, allow=allow,
                       deny=deny, deny_nodes=deny_nodes, default_dim=default_dim, profile=profile,
                       progress=progress, deny_propagation=deny_propagation,
                       runtime=deploy or default_runtime("onnx"), objective=objective)
    if isinstance(model_or_path, ModelProto):
        model = ModelProto()
        model.CopyFrom(model_or_path)
        source = source or model.graph.name or "model"
    else:
        base_dir = Path(model_or_path).resolve().parent
        source = source or str(model_or_path)
        model = load_model(model_or_path)
    if progress:
        progress("import")
    imp = import_model(model, source=source, default_dim=default_dim, validate=True,
                       base_dir=str(base_dir) if base_dir is not None else None)
    drawn: dict[str, str] = {}
    if calibrate or calibration_inputs is not None:
        if progress:
            progress("calibrate activation ranges on ONNX Runtime")
        drawn = _calibrate(model, imp.graph, calibration_inputs, ctx.low_dtype)
    report = run_passes(imp.graph, ctx, source, dim_values)
    if drawn:
        report.summary["inputs_drawn"] = drawn  # how the calibration inputs were made
    if progress:
        progress("emit")
    return emit(imp), report


def _calibrate(model: ModelProto, graph, feeds: dict | None, low_dtype: str) -> dict[str, str]:
    """Mark what the FP32 run shows FP16 cannot hold; returns how default inputs were drawn ({} if given)."""
    from .calibrate import activation_ranges, mark_ranges
    from .input_gen import model_inputs

    drawn: dict[str, str] = {}
    if feeds is None:
        feeds, drawn = model_inputs(model)
    ranges = activation_ranges(model, graph, feeds)
    graph.meta["calibrated_unsafe"] = mark_ranges(graph, ranges, low_dtype=low_dtype)
    return drawn


__all__ = ["ConversionError", "convert_onnx"]
