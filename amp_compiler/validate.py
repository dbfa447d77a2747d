"""Run the FP32 original and the converted model on ONNX Runtime and compare their outputs."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import onnx
from onnx import ModelProto

from .errors import ConversionError
from .metrics import error_stats
from .onnx_io.bf16_emulation import declares_bf16
from .onnx_io.probe import run_exposed
from .onnx_io.selection import index_selected_outputs, selection_margin
from .overflow import probed_runs, runnable


def random_inputs(model: ModelProto, *, seed: int = 0, default_dim: int = 2,
                  int_high: int = 2) -> dict[str, np.ndarray]:
    """Random feeds for the model's graph inputs: N(0,1) floats, ints in [0, int_high)."""
    from .input_gen import graph_input_specs

    rng = np.random.default_rng(seed)
    feeds = {}
    for name, shape, dtype in graph_input_specs(model, default_dim):
        if np.issubdtype(dtype, np.floating) or dtype == _BF16:
            feeds[name] = rng.standard_normal(shape).astype(np.float32).astype(dtype)
        elif dtype is np.bool_:
            feeds[name] = rng.integers(0, 2, shape).astype(np.bool_)
        else:
            feeds[name] = rng.integers(0, int_high, shape).astype(dtype)
    return feeds


def load_inputs(path: str | Path, model: ModelProto | None = None) -> dict[str, np.ndarray]:
    """Arrays of an ``.npz`` file by name; with ``model``, every graph input must be among them."""
    try:
        with np.load(path) as data:
            feeds = {k: data[k] for k in data.files}
    except (OSError, ValueError) as exc:
        raise ConversionError(str(path), "", f"cannot read inputs (.npz expected): {exc}") from None
    if model is not None:
        initializers = {i.name for i in model.graph.initializer}
        missing = [i.name for i in model.graph.input if i.name not in initializers and i.name not in feeds]
        if missing:
            raise ConversionError(str(path), f"graph input {missing[0]!r}",
                                  f"has no array in the file (arrays: {', '.join(sorted(feeds)) or 'none'})")
        for i in model.graph.input:  # numpy.savez writes a bfloat16 array as raw 2-byte records ('|V2')
            value = feeds.get(i.name)
            if i.type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16 and isinstance(value, np.ndarray) \
                    and value.dtype == np.dtype("V2"):
                feeds[i.name] = value.view(_BF16)
    return feeds


def run_reference(model: ModelProto, feeds: dict[str, np.ndarray], *, label: str = "model") -> list[np.ndarray]:
    """Run ``model`` with ONNX's numpy reference evaluator: every op rounds to its declared dtype.

    Slow, but exact about FP16: ONNX Runtime's CPU provider runs FP16 ops it has no kernel
    for in FP32 and keeps their intermediates in FP32, which hides FP16 rounding.
    """
    from onnx.reference import ReferenceEvaluator

    from .reference_ops import REFERENCE_FIXES

    try:
        sess = ReferenceEvaluator(model, new_ops=REFERENCE_FIXES)
        names = set(sess.input_names)
        return list(sess.run(None, {k: v for k, v in feeds.items() if k in names}))
    except Exception as exc:  # the evaluator raises whatever its op implementations raise
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if label == "the FP32 model":  # the source model itself: the evaluator, not the plan, failed
            detail += " (ONNX's reference evaluator cannot run the source model; --runtime ort can)"
        raise ConversionError(label, "reference evaluator", detail) from None


#: graph rewrites validation sessions leave out. ONNX Runtime's CPU provider (1.32) dies of a
#: segmentation fault while building the session for an FP16 Transpose moving a batch dim
#: (``perm=[1, 0, 2]``) into a MatMul, when MatmulTransposeFusion and the NCHWc layout pass both
#: run: a Longformer exported with ``dynamo=False`` killed ``--validate`` with no message and left
#: its staging folder behind. The fusion only folds the Transpose into the GEMM: the same values.
CPU_DISABLED_OPTIMIZERS = ["MatmulTransposeFusion"]


def onnxruntime():
    """The ``onnxruntime`` module, or a ``ConversionError`` saying how to get it (an install with
    ``--no-deps``, or a broken ``-gpu`` one: "internal error: ModuleNotFoundError" before)."""
    try:
        import onnxruntime as ort
    except ImportError as exc:
        raise ConversionError("", "ONNX Runtime", f"cannot be imported ({exc}): --validate, --calibrate and "
                                                  "--fallback run the model on it; pip install 'amp-compiler[cpu]' "
                                                  "('[gpu]' for onnxruntime-gpu, never both)") from None
    return ort


def run_model(model: ModelProto | str, feeds: dict[str, np.ndarray], providers=None, *,
              label: str = "model", data_dir: str | None = None, bf16_file: bool = False) -> list[np.ndarray]:
    """Run ``model`` on ONNX Runtime (the CPU provider without ``CPU_DISABLED_OPTIMIZERS``); a load or
    run failure is a ``ConversionError`` naming ``label`` (a load failure's reason starts "cannot load
    it"). ``data_dir``: the folder a ``ModelProto``'s external data lies in (read there by ONNX
    Runtime, never loaded into the proto). A model whose constants lie in external files, as
    ``onnx.save(..., size_threshold=0)`` writes, is loaded whole and handed over in memory where
    ORT's own loader cannot read a shape input from one. A model storing values in BF16 (with
    ``bf16_file``, a file too) runs on the CPU provider with BF16 emulated, which has no BF16
    kernels (``onnx_io/bf16_emulation.py``)."""
    providers = providers or ["CPUExecutionProvider"]
    fusions_off: list[str] = []
    if providers == ["CPUExecutionProvider"]:
        from .onnx_io.bf16_emulation import FUSIONS_OFF, for_cpu

        emulated = for_cpu(model, data_dir, always=bf16_file)
        if emulated is not None:
            (model, data_dir), fusions_off = emulated, FUSIONS_OFF
    sess = load_session(model, providers, label=label, data_dir=data_dir, disabled=fusions_off)
    declared = {i.name: i.type for i in sess.get_inputs()}
    try:
        return sess.run(None, {k: _fed(v, declared[k]) for k, v in feeds.items() if k in declared})
    except Exception as exc:
        raise ConversionError(label, "ONNX Runtime", _ort_detail(exc, providers)) from None


_BF16 = np.dtype(ml_dtypes.bfloat16)
#: ONNX Runtime's names of the float input types a BF16 array is widened to (an emulated model's inputs)
_WIDER = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64}


def _fed(value, declared: str):
    """``value`` as ONNX Runtime takes it for an input of type ``declared``: numpy has no BF16 type
    ORT knows, so a BF16 input gets a BF16 ``OrtValue`` of the array's bits (a float array is rounded
    to BF16 first), and a BF16 array fed to a float input (the input of a model whose BF16 storage
    is emulated, ``onnx_io/bf16_emulation.py``) is widened to it. The feeds had been refused for BF16
    inputs ("Numpy_type 256 can't be converted to MLDataType")."""
    if not isinstance(value, np.ndarray):
        return value
    if declared == "tensor(bfloat16)":
        if value.dtype != _BF16:
            if not np.issubdtype(value.dtype, np.floating):
                return value  # ONNX Runtime names the mismatch
            value = value.astype(_BF16)
        bits = np.ascontiguousarray(value).view(np.uint16)
        return onnxruntime().OrtValue.ortvalue_from_numpy_with_onnx_type(bits, onnx.TensorProto.BFLOAT16)
    if value.dtype == _BF16 and declared in _WIDER:
        return value.astype(_WIDER[declared])
    return value


def load_session(model: ModelProto | str, providers: list[str], *, label: str = "model", data_dir: str | None = None,
                 disabled: list[str] | tuple = ()):
    """An ONNX Runtime session of ``model`` as ``run_model`` opens it (``disabled``: graph
    optimizers left out besides ``CPU_DISABLED_OPTIMIZERS``); a load failure is a
    ``ConversionError`` whose reason starts "cannot load it"."""
    ort = onnxruntime()
    opts = ort.SessionOptions()
    opts.log_severity_level = 4  # fatal only: a failure is raised as our one line, not logged by ORT too
    if data_dir is not None:
        opts.add_session_config_entry("session.model_external_initializers_file_folder_path", data_dir)
    disabled = (CPU_DISABLED_OPTIMIZERS if providers == ["CPUExecutionProvider"] else []) + list(disabled)
    payload = model if isinstance(model, str) else model.SerializeToString()
    try:
        try:
            return ort.InferenceSession(payload, opts, providers=providers, disabled_optimizers=disabled)
        except Exception as exc:
            whole = _loaded_whole(model, data_dir, exc)
            if whole is None:
                raise
            return ort.InferenceSession(whole, opts, providers=providers, disabled_optimizers=disabled)
    except Exception as exc:  # onnxruntime raises its own exception types per failure kind
        raise ConversionError(label, "ONNX Runtime", "cannot load it: " + _ort_detail(exc, providers)) from None


def _loads_as_is(original: ModelProto | str, converted: ModelProto | str) -> None:
    """The overflow check runs both models with intermediate values exposed as outputs, which blocks
    ONNX Runtime's fusions; the converted model is also opened as it is. A BERT saved by
    ``optimize_model`` validated, yet its output failed to load at any optimisation level
    (MatMulAddFusion named a new initializer as one the earlier run had left in the file). Where the
    FP32 model fails the same way, the reason says so: the file, not the conversion."""
    cpu = ["CPUExecutionProvider"]
    try:
        load_session(converted, cpu, label="the converted model")
    except ConversionError as exc:
        try:
            load_session(original, cpu, label="the FP32 model")
        except ConversionError:
            raise ConversionError(exc.source, exc.where, exc.reason + " (the FP32 model fails the same way as it "
                                                                      "is: ONNX Runtime refuses the source file)") from None
        raise


#: what ONNX Runtime (1.32) says when its shape inference needs a constant stored in an external file
_EXTERNAL_SHAPE_INPUT = "Cannot parse data from external tensors"
_PROTOBUF_LIMIT = 2 ** 31 - 1


def _loaded_whole(model: ModelProto | str, data_dir: str | None, exc: Exception) -> bytes | None:
    """``model`` (a path, or a proto whose external data lies in ``data_dir``) with that data read
    in, serialized, where ``exc`` is ORT failing to read a shape input from an external file and
    the whole fits in one protobuf; else None."""
    if _EXTERNAL_SHAPE_INPUT not in str(exc) or not (isinstance(model, str) or data_dir is not None):
        return None
    from onnx.external_data_helper import load_external_data_for_model

    if isinstance(model, str):
        whole = onnx.load(model)
    else:
        whole = ModelProto()
        whole.CopyFrom(model)  # the caller's proto keeps its references
        load_external_data_for_model(whole, data_dir)
    return whole.SerializeToString() if whole.ByteSize() < _PROTOBUF_LIMIT else None


def _ort_detail(exc: Exception, providers: list[str]) -> str:
    """ORT's first line, and what to do where the provider lacks a kernel."""
    detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if "NOT_IMPLEMENTED" in detail:
        detail += (f" (the {providers[0]} has no kernel for it; validate on the target's provider, or with "
                   f"ONNX's reference evaluator: --runtime reference)")
    return detail


def compare_outputs(names: list[str], expected: list[np.ndarray], actual: list[np.ndarray],
                    low: str | None = None) -> list[dict[str, Any]]:
    """Per output: max absolute error and max relative error (``metrics.error_stats``); a note
    where the comparison cannot be read as evidence (``low``: the plan's dtype, "float16" or
    "bfloat16", for the note on outputs it cannot hold)."""
    rows = []
    for name, a, b in zip(names, expected, actual):
        max_abs, rel = error_stats(a, b)
        row = {"name": name, "max_abs_error": max_abs, "max_rel_error": rel}
        if np.shape(a) != np.shape(b):
            row["note"] = f"shape {np.shape(b)} != {np.shape(a)}"
        elif _constant(a):  # MobileViT's zero-initialised classifier: a "pass" that tests nothing
            row["note"] = (f"the FP32 output is {np.asarray(a).flat[0]:g} everywhere: this comparison tests nothing "
                           "(zero-initialised or untrained weights?)")
        elif low is not None and (note := _underflow_note(a, low)):
            row["note"] = note
        rows.append(row)
    return rows


def _underflow_note(value, low: str) -> str:
    """A note when the FP32 output's peak magnitude is below ``low``'s smallest normal: every value
    is subnormal or zero there (LeViT and MobileNetV2 built from a config: their vanishing
    activations reach 1e-9 and 1e-25), so an op computing it in ``low`` loses it, whatever the
    plan elsewhere; ONNX Runtime's CPU provider, running such ops in FP32, can hide that
    (docs/architecture.md, "Numerics")."""
    from .dtypes import short
    from .numerics import RANGES

    a = np.asarray(value)
    if a.size == 0 or not np.issubdtype(a.dtype, np.floating):
        return ""
    peak = float(np.max(np.abs(a[np.isfinite(a)]), initial=0.0))
    rng = RANGES.get(low)
    if rng is None or not 0.0 < peak < rng.min_normal:
        return ""
    name = short(low).upper()
    return (f"the FP32 output peaks at {peak:.3g}, below {name}'s smallest normal {rng.min_normal:.3g}: computed in "
            f"{name} it underflows (untrained weights?); --calibrate keeps the ops {name} cannot hold FP32")


def _constant(value) -> bool:
    a = np.asarray(value)
    return a.size > 1 and np.issubdtype(a.dtype, np.number) and bool(np.all(a == a.flat[0]))


#: how a BF16 model ran on the CPU provider (``onnx_io/bf16_emulation.py``), for the report
BF16_EMULATION = ("bfloat16 emulated on ONNX Runtime's CPU provider (it has no BF16 kernels): each op computes in "
                  "FP32 and every value stored in BF16 is rounded to BF16, as on a GPU")


#: the label of the source model's runs
_FP32 = "the FP32 model"
#: initializer names of position tables (BERT's position_embeddings, GPT-2's wpe, Whisper's embed_positions)
_POSITION_TABLE = re.compile(r"position|pos_?emb|wpe", re.IGNORECASE)
#: ONNX Runtime's error code prefix, and the C++ source line and check of an ORT_ENFORCE failure
_ORT_NOISE = re.compile(r"^\[ONNXRuntimeError\] : \d+ : \w+ : |\S+\.(?:h|cc|cpp):\d+ .*? was false\. ")


def validate(original: ModelProto | str, converted: ModelProto | str, feeds: dict[str, np.ndarray],
             tolerance: float = 1e-2, runner=run_model, low: str | None = None,
             source: str | None = None) -> dict[str, Any]:
    """Run both models on ``feeds``; the result goes into the report's ``validation`` section.

    ``runner`` is ``run_model`` (ONNX Runtime, which also takes file paths) or ``run_reference``;
    ``low``: the plan's low dtype (``compare_outputs``' notes). A one-element boolean graph input
    that is an ``If`` condition (a merged decoder's ``use_cache_branch``) is run both ways, each
    output named with it: one drawn value had validated one branch. Where ONNX Runtime fails to run
    the FP32 model on ``feeds``, the error names ``source`` (default: ``original``'s path) and says
    the source model rejects these inputs (``source_rejects``).
    """
    graph = _graph_only(original)
    names = [o.name for o in graph.graph.output]
    probed = _probed_pair(original, converted, runner) if low == "float16" else None
    # no BF16 kernels on ONNX Runtime's CPU provider: a model storing BF16 values (a --dtype bf16 plan, or a
    # source with BF16 inputs, which an FP16 plan leaves BF16) runs emulated, a file as a proto is
    source_bf16 = runner is run_model and declares_bf16(graph)
    emulated = runner is run_model and (source_bf16 or declares_bf16(converted))
    converted_runner = functools.partial(run_model, bf16_file=True) if emulated else runner
    source_runner = functools.partial(run_model, bf16_file=True) if source_bf16 else runner
    outputs, overflows = [], []
    variants = branch_feeds(graph, feeds)
    for label, variant in variants:
        try:
            if probed is not None:  # the overflow check rides on the same two runs (``overflow.py``)
                (fp32, fp32_runner), (low_model, low_runner) = probed
                expected, actual, rows = probed_runs(fp32, low_model, variant, _as_declared(low_model, variant),
                                                     fp32_runner, low_runner)
                overflows += [{**row, "name": row["name"] + label} for row in rows]
            else:
                expected = source_runner(original, variant, label=_FP32)
                actual = converted_runner(converted, _as_declared(converted, variant), label="the converted model")
        except ConversionError as exc:
            if not fp32_run_refused(exc):
                raise
            raise source_rejects(exc, graph, {name: np.shape(value) for name, value in variant.items()},
                                 source or (original if isinstance(original, str) else "")) from None
        outputs += [{**row, "name": row["name"] + label}
                    for row in compare_outputs(names, expected, actual, low)]
    if probed is not None and runner is run_model and not emulated:  # a BF16 model loads on CPU emulated only
        _loads_as_is(original, converted)
    failing = {o["name"] for o in outputs if not o["max_rel_error"] <= tolerance}
    if failing and len(variants) == 1:
        notes = undetermined_selections(original, failing, feeds, tolerance, source_runner)
        for row in outputs:
            if row["name"] in notes:
                row["note"], row["counted"] = notes[row["name"]], False
    worst = max((o["max_rel_error"] for o in outputs if o.get("counted", True)), default=0.0)
    result = {"tolerance": tolerance, "passed": bool(worst <= tolerance and not overflows), "max_rel_error": worst,
              "outputs": outputs, "error_measure": "max |mixed - fp32| / max |fp32| per output"}
    if probed is not None:
        result["overflows"] = overflows
    if emulated:
        result["emulation"] = BF16_EMULATION
    return result


def undetermined_selections(original: ModelProto | str, names: set[str], feeds: dict[str, np.ndarray],
                            tolerance: float, runner=run_model) -> dict[str, str]:
    """Output name -> why its error is not counted, for those of ``names`` chosen by TopK/ArgMax
    indices whose FP32 scores tie closer than ``tolerance`` (``onnx_io/selection.py``): rounding
    within the budget may reorder them. One FP32 run exposing the scores, only where such an output
    is among ``names``."""
    model = original if isinstance(original, ModelProto) else onnx.load(original)
    selected = {name: sel for name, sel in index_selected_outputs(model).items() if name in names}
    if not selected:
        return {}
    initializers = {t.name for t in model.graph.initializer}
    wanted = {sel.scores for sel in selected.values()} | {sel.k for sel in selected.values()
                                                         if sel.k and sel.k not in initializers}
    values = run_exposed(model, sorted(wanted), feeds, runner, _FP32)
    notes = {}
    for name, sel in selected.items():
        margin = selection_margin(sel, values, model)
        if margin is not None and margin < tolerance:
            notes[name] = (f"chosen by {sel.op_type} {sel.node!r}, whose FP32 scores tie within {margin:.2g} of their "
                           f"magnitude, closer than the tolerance {tolerance:g}: rounding within it may reorder them, "
                           f"so this output's error is not counted (validate on real inputs: --inputs FILE.npz)")
    return notes


class InputsRejected(ConversionError):
    """ONNX Runtime refused to run the source (FP32) model on the inputs drawn for it: not a
    conversion problem (``source_rejects``)."""


def fp32_run_refused(exc: ConversionError) -> bool:
    """Whether ``exc`` is ONNX Runtime failing to *run* the FP32 model (validation, calibration,
    fallback), not to load it."""
    return ("FP32 model" in exc.source and exc.where == "ONNX Runtime" and not exc.reason.startswith("cannot load")
            and not isinstance(exc, InputsRejected))


def source_rejects(exc: ConversionError, graph: ModelProto, shapes: dict[str, Any], source: str) -> InputsRejected:
    """The error for ONNX Runtime failing to run the FP32 model on inputs of ``shapes`` (name -> shape):
    the sizes its symbolic dims got, that the source model itself rejects them (not the conversion),
    a position table shorter than the sequence where one is, and ORT's message without its noise.
    ``--dim sequence=512`` on a BERT with 128 positions had read as a broadcast error from deep in
    ONNX Runtime, under ``--validate``, ``--calibrate`` and ``--fallback`` alike (docs/architecture.md,
    "Validation inputs")."""
    sizes = _dim_sizes(graph, shapes)
    used = ", ".join(f"{dim}={size}" for dim, size in sizes.items()) or ", ".join(
        f"{name} {list(shape)}" for name, shape in shapes.items())
    table = _short_position_table(graph, sizes)
    return InputsRejected(source, _FP32, f"ONNX Runtime fails running it on the inputs ({used}): the "
                                         f"source model itself rejects these inputs, not a conversion problem"
                                         f"{'; ' + table if table else ''}; ONNX Runtime: "
                                         f"{_ORT_NOISE.sub('', exc.reason)}")


def _dim_sizes(graph: ModelProto, shapes: dict[str, Any]) -> dict[str, int]:
    """The size ``shapes`` give each symbolic dim of ``graph``'s inputs (``batch``, ``sequence``)."""
    sizes: dict[str, int] = {}
    for vi in graph.graph.input:
        if vi.name in shapes:
            for dim, size in zip(vi.type.tensor_type.shape.dim, shapes[vi.name]):
                if dim.dim_param:
                    sizes.setdefault(dim.dim_param, int(size))
    return sizes


def _short_position_table(graph: ModelProto, sizes: dict[str, int]) -> str:
    """Where a Gather reads a position table with fewer rows than a symbolic dim past an input's
    first (its sequence) is sized: which, and the largest size that fits; else ""."""
    later = {d.dim_param for vi in graph.graph.input for d in vi.type.tensor_type.shape.dim[1:] if d.dim_param}
    rows = {t.name: t.dims[0] for t in graph.graph.initializer if len(t.dims) == 2 and _POSITION_TABLE.search(t.name)}
    for node in graph.graph.node:
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        if node.op_type != "Gather" or axis != 0 or not node.input or node.input[0] not in rows:
            continue
        n = rows[node.input[0]]
        over = sorted((d for d in later if sizes.get(d, 0) > n), key=sizes.get)
        if over:
            dim = over[-1]
            return (f"Gather {node.name or node.input[0]!r} reads a position table of {n} rows "
                    f"({node.input[0]!r}) while {dim} is {sizes[dim]}: pass --dim {dim}={n} or less")
    return ""


def _probed_pair(original: ModelProto | str, converted: ModelProto | str, runner):
    """((model, runner), (model, runner)) for the overflow check's exposed runs, or None where a model
    in memory refers to external data it does not hold. A file's graph is read without its tensor data,
    which ONNX Runtime reads from the file's folder (a dynamo export keeps its weights in ``.data``)."""
    pair = []
    for m in (original, converted):
        if isinstance(m, str):
            proto = onnx.load(m, load_external_data=False)
            folder = None if runnable(proto) else str(Path(m).resolve().parent)
            if folder is not None and runner is not run_model:
                return None
            pair.append((proto, runner if folder is None else functools.partial(run_model, data_dir=folder)))
        elif not runnable(m):
            return None
        else:
            pair.append((m, runner))
    return tuple(pair)


def branch_feeds(model: ModelProto, feeds: dict[str, np.ndarray]) -> list[tuple[str, dict[str, np.ndarray]]]:
    """(name suffix, feeds) per value of each one-element boolean input that conditions an ``If``."""
    conditions = {n.input[0] for n in model.graph.node if n.op_type == "If" and n.input}
    switches = [name for name, value in feeds.items() if name in conditions
                and isinstance(value, np.ndarray) and value.dtype == np.bool_ and value.size == 1]
    if not switches:
        return [("", feeds)]
    return [(f" ({name}={flag})", {**feeds, name: np.full_like(feeds[name], flag)})
            for name in switches for flag in (True, False)]


def _graph_only(model: ModelProto | str) -> ModelProto:
    if isinstance(model, str):
        return onnx.load(model, load_external_data=False)
    return model


#: float input types numpy can feed; a BF16 input is left as given (the runtime names the mismatch)
_NUMPY_FLOATS = {1: np.float32, 10: np.float16, 11: np.float64}


def _as_declared(model: ModelProto | str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``feeds`` with float arrays in the dtypes ``model`` declares for its inputs: without
    keep_io_types a converted model's float inputs are FP16, and both models see the same values."""
    declared = {i.name: i.type.tensor_type.elem_type for i in _graph_only(model).graph.input}
    out = {}
    for name, value in feeds.items():
        want = _NUMPY_FLOATS.get(declared.get(name, 0))
        is_float = isinstance(value, np.ndarray) and np.issubdtype(value.dtype, np.floating)
        out[name] = value.astype(want) if is_float and want is not None and value.dtype != want else value
    return out
