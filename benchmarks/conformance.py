"""Conformance run over the ONNX backend node tests (``onnx.backend.test.case.node``).

The ``onnx`` package ships about 1,900 single-op test models (plus the function-
expanded versions of function ops) with reference inputs and outputs; they are
generated in-process (``collect_testcases``), no data files are needed. For every
case with a floating-point (FP32, FP16, BF16 or FP64) graph input or output this run:

1. runs the original model on ONNX Runtime (CPU) and compares it with the reference
   (``|ort - ref| <= 1e-3*|ref| + 1e-5*max|ref|``); a case ORT cannot load, run or
   reproduce in FP32 is listed separately ("ORT cannot run the FP32 model") and does
   not count against us -- it is still converted and checked;
2. converts it with ``convert_onnx(..., planner="all")``: single-op models are far too
   small for the cost model to pick FP16 (launch overhead dominates), so the run
   forces every op that may legally and safely run in FP16 into FP16;
3. checks the converted model with ``onnx.checker.check_model(full_check=True)`` (a
   failure counts unless the source model fails the checker too);
4. loads it in ONNX Runtime, runs the reference inputs, checks the outputs keep their
   dtypes and compares them with the reference at an FP16 tolerance (below).

A case ends in one of three columns:

* **converted** -- the converted model computes values in FP16 that the source computed
  in FP32 (it holds more FP16 values than the source) and all outputs match;
* **kept FP32** -- nothing was lowered, with the report's reason: deny class (numerics),
  unknown op, schema without FP16, no FP16 kernel in ORT, constant out of FP16 range,
  no float compute of its own (the op reads any dtype: Shape, ArgMax, Cast's input),
  source not FP32 (FP64/BF16 data), already FP16 in the source; outputs still match;
* **failing** -- a crash (an exception other than ``ConversionError``), a refusal
  (``ConversionError``), a checker failure, a converted model ORT will not load or run
  although it runs the original, an output dtype or shape change, or values outside
  the tolerance.

FP16 tolerance, element-wise, for float outputs (``ref`` is the reference output):

    |got - ref| <= RTOL * |ref| + ATOL * max(|ref|)          RTOL = 1e-2, ATOL = 1e-3

FP16 keeps 11 significant bits: rounding the inputs alone moves each by up to 2**-11
(4.9e-4) relatively, and one FP16 op adds as much again, so 1e-2 leaves room for a
few roundings plus FP16 accumulation in reductions. The absolute term, scaled by the
output's largest magnitude, covers cancellation (``a - b`` near zero has no relative
accuracy in any precision once its inputs are rounded). NaN must match NaN and
infinities must match in sign. Integer, bool and string outputs must match exactly.
(ORT's CPU provider runs most FP16 ops through casts to FP32, so this checks the
conversion -- ports, casts, attributes, initializers -- and FP16 storage rounding,
not FP16 arithmetic on a GPU.)

Usage::

    python -m benchmarks.conformance [--filter SUBSTR] [--json out.json] [--verbose]
                                     [--planner all|optimal|greedy]

Prints the table by op (converted / kept FP32 / failing / ORT cannot run, with the
reasons), the failing cases, the cases ORT cannot run in FP32, the totals and the run
time. Exits 1 if the done-when of the conformance run is not met: 0 crashes, 0 checker
failures, 0 load failures, and >= 99 % of the float cases ORT runs in FP32
converted-and-matching or kept FP32 with a reason.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
import warnings
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

import numpy as np
import onnx
from onnx import ModelProto, TensorProto, numpy_helper

RTOL = 1e-2
ATOL = 1e-3
# ORT "runs the FP32 model" when it reproduces the reference at the suite's rtol (1e-3), with the
# absolute term scaled like ours (FP32 sums such as DFT's carry ~1e-7 relative error per term).
FP32_RTOL = 1e-3
FP32_ATOL = 1e-5
REQUIRED_PASS_RATE = 0.99
PLANNER = "all"

# statuses of a case
CONVERTED, KEPT, FAILING = "converted", "kept_fp32", "failing"
ORT_UNRUNNABLE, NOT_FLOAT = "ort_unrunnable", "not_float"

# failure kinds (status FAILING)
CRASH, REFUSED, CHECKER, LOAD, RUN, DTYPE, MISMATCH = (
    "crash", "conversion_error", "checker", "load", "run", "dtype", "mismatch")

_FLOAT_CODES = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE}


@dataclass
class CaseResult:
    name: str
    op: str
    status: str
    reason: str = ""  # kept FP32: reason category; failing: failure kind; ORT-unrunnable: ORT's error
    detail: str = ""
    low_ops: int = 0  # ops the report puts in FP16
    new_fp16_values: int = 0  # FP16 values in the converted model beyond those of the source (> 0: converted)
    ops: int = 0
    max_err: float = 0.0  # worst |got-ref| / (RTOL|ref| + ATOL max|ref|) over float outputs (<= 1 passes)
    time_s: float = 0.0


@dataclass
class Summary:
    cases: int = 0
    float_cases: int = 0
    ort_unrunnable: int = 0
    counted: int = 0  # float cases ORT runs in FP32
    converted: int = 0
    kept_fp32: int = 0
    failing: int = 0
    crashes: int = 0  # exceptions other than ConversionError
    refused: int = 0  # ConversionError: the converter named the op and the reason (counted as failing)
    checker_failures: int = 0
    load_failures: int = 0
    converted_op_types: int = 0  # distinct ops (test families) with a case converted and matching
    kept_by_reason: dict[str, int] = field(default_factory=dict)
    failing_by_kind: dict[str, int] = field(default_factory=dict)
    pass_rate: float = 0.0
    planner: str = PLANNER
    time_s: float = 0.0

    @property
    def ok(self) -> bool:
        return (self.crashes == 0 and self.checker_failures == 0 and self.load_failures == 0
                and self.pass_rate >= REQUIRED_PASS_RATE)


# -- collecting the cases ------------------------------------------------------------------------

def collect_cases(filter_: str | None = None) -> list[Any]:
    """The node test cases of the installed ``onnx`` (generated in-process, ~10 s)."""
    from onnx.backend.test.case import node as node_cases

    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        with np.errstate(all="ignore"):
            cases = list(node_cases.collect_testcases())
    seen: set[str] = set()
    unique = []
    for c in cases:  # collect_testcases appends to a module-level list: guard against repeats
        if c.name not in seen:
            seen.add(c.name)
            unique.append(c)
    if filter_:
        unique = [c for c in unique if filter_ in c.name]
    return unique


def _op_of(case: Any, base_ops: dict[str, str]) -> str:
    """The op a case tests: its one node's type; "<op> (expanded)" for a function op's expansion."""
    nodes = case.model.graph.node
    if "_expanded" in case.name:
        base = case.name.split("_expanded")[0]
        return base_ops.get(base, nodes[0].op_type if nodes else "?") + " (expanded)"
    return nodes[0].op_type if nodes else "?"


def _value_types(model: ModelProto) -> Iterable[int]:
    def elem(tp):
        which = tp.WhichOneof("value")
        if which == "tensor_type":
            yield tp.tensor_type.elem_type
        elif which == "sequence_type":
            yield from elem(tp.sequence_type.elem_type)
        elif which == "optional_type":
            yield from elem(tp.optional_type.elem_type)
    for vi in (*model.graph.input, *model.graph.output):
        yield from elem(vi.type)


def is_float_case(model: ModelProto) -> bool:
    return any(t in _FLOAT_CODES for t in _value_types(model))


def _fp32_io(model: ModelProto) -> bool:
    return any(t == TensorProto.FLOAT for t in _value_types(model))


# -- values --------------------------------------------------------------------------------------

def _to_value(x: Any) -> Any:
    if isinstance(x, TensorProto):
        return numpy_helper.to_array(x)
    if isinstance(x, list):
        return [_to_value(v) for v in x]
    if x is None:
        return None
    return np.asarray(x)


def _feeds(model: ModelProto, inputs: list[Any]) -> dict[str, Any]:
    initializers = {i.name for i in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in initializers]
    return {n: _to_value(v) for n, v in zip(names, inputs)}


def _session(model: ModelProto):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _run(sess, feeds: dict[str, Any]) -> list[Any]:
    names = {i.name for i in sess.get_inputs()}
    feeds = {k: v for k, v in feeds.items() if k in names}
    if not any(_is_exotic(v) for v in feeds.values()):
        try:
            outs = sess.run(None, feeds)
        except RuntimeError as exc:  # an output numpy cannot hold (bfloat16, float8): read its bytes
            if "Numpy type" not in str(exc):
                raise
        else:  # ORT hands float8 outputs back as uint8: view them in their own dtype
            for i, o in enumerate(sess.get_outputs()):
                code = _ORT_TYPES.get(o.type)
                if code is not None and isinstance(outs[i], np.ndarray) and outs[i].dtype.kind == "u":
                    outs[i] = outs[i].view(onnx.helper.tensor_dtype_to_np_dtype(code))
            return outs
    return _run_ort_values(sess, feeds)


# ONNX Runtime's Python API has no numpy type for bfloat16 and float8 (ml_dtypes arrays): such tensors
# go in and out as raw bytes. Packed sub-byte types (int4, int2, float4) are left out.
_EXOTIC = {"bfloat16": TensorProto.BFLOAT16, "float8_e4m3fn": TensorProto.FLOAT8E4M3FN,
           "float8_e4m3fnuz": TensorProto.FLOAT8E4M3FNUZ, "float8_e5m2": TensorProto.FLOAT8E5M2,
           "float8_e5m2fnuz": TensorProto.FLOAT8E5M2FNUZ}

_ORT_TYPES = {f"tensor({TensorProto.DataType.Name(code).lower()})": code for code in _EXOTIC.values()}


def _is_exotic(v: Any) -> bool:
    return isinstance(v, np.ndarray) and v.dtype.name in _EXOTIC


def _run_ort_values(sess, feeds: dict[str, Any]) -> list[Any]:
    import ctypes

    import onnxruntime as ort

    values = {}
    for k, v in feeds.items():
        if _is_exotic(v):
            raw = np.ascontiguousarray(v).view(np.uint16 if v.dtype.itemsize == 2 else np.uint8)
            values[k] = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(raw, _EXOTIC[v.dtype.name])
        elif isinstance(v, np.ndarray):
            values[k] = ort.OrtValue.ortvalue_from_numpy(v)
        else:
            raise RuntimeError(f"input {k!r}: a {type(v).__name__} cannot be fed as an OrtValue")
    outs = []
    for o in sess.run_with_ort_values(None, values):
        try:
            outs.append(o.numpy())
            continue
        except RuntimeError:
            pass
        code = o.element_type()
        if code not in _EXOTIC.values():
            raise RuntimeError(f"output type {TensorProto.DataType.Name(code)} has no numpy type")
        buf = ctypes.string_at(o.data_ptr(), o.tensor_size_in_bytes())
        outs.append(np.frombuffer(buf, dtype=onnx.helper.tensor_dtype_to_np_dtype(code)).reshape(o.shape()).copy())
    return outs


def _is_floating(a: np.ndarray) -> bool:
    return a.dtype.kind == "f" or a.dtype.name in _EXOTIC


def compare(ref: Any, got: Any, rtol: float, atol: float, atol_abs: float = 0.0) -> tuple[bool, float, str]:
    """(passes, worst error / allowed error, note).

    Element-wise ``|got - ref| <= rtol*|ref| + atol*max|ref| + atol_abs``; NaNs and infinities must
    match, integer/bool outputs exactly, sequences element by element.
    """
    if isinstance(ref, list) or isinstance(got, list):
        if not isinstance(ref, list) or not isinstance(got, list) or len(ref) != len(got):
            return False, float("inf"), "sequence length or kind differs"
        worst = 0.0
        for r, g in zip(ref, got):
            ok, err, note = compare(r, g, rtol, atol, atol_abs)
            worst = max(worst, err)
            if not ok:
                return False, worst, note
        return True, worst, ""
    if ref is None or got is None:
        return (ref is None) == (got is None), 0.0, "" if (ref is None) == (got is None) else "optional differs"
    ref, got = np.asarray(ref), np.asarray(got)
    if ref.shape != got.shape:
        return False, float("inf"), f"shape {got.shape} != reference {ref.shape}"
    if not _is_floating(ref):
        same = bool(np.array_equal(ref, got))
        return same, 0.0 if same else float("inf"), "" if same else "integer/bool output differs"
    r, g = ref.astype(np.float64), got.astype(np.float64)
    if ref.size == 0:
        return True, 0.0, ""
    r_nan, g_nan = np.isnan(r), np.isnan(g)
    r_inf, g_inf = np.isinf(r), np.isinf(g)
    if not np.array_equal(r_nan, g_nan):
        return False, float("inf"), "NaN positions differ"
    if not np.array_equal(r_inf, g_inf) or not np.array_equal(r[r_inf], g[g_inf]):
        return False, float("inf"), "infinities differ"
    finite = ~(r_nan | r_inf)
    if not finite.any():
        return True, 0.0, ""
    r, g = r[finite], g[finite]
    if not np.all(np.isfinite(g)):
        return False, float("inf"), "non-finite value where the reference is finite"
    allowed = rtol * np.abs(r) + atol * float(np.max(np.abs(r))) + atol_abs
    diff = np.abs(g - r)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(allowed > 0, diff / np.where(allowed > 0, allowed, 1), np.where(diff > 0, np.inf, 0))
    worst = float(np.max(ratio))
    ok = worst <= 1.0
    return ok, worst, "" if ok else f"max |err| {float(np.max(diff)):.3g} (max |ref| {float(np.max(np.abs(r))):.3g})"


def _compare_all(refs: list[Any], gots: list[Any], rtol: float, atol: float,
                 atol_abs: float = 0.0) -> tuple[bool, float, str]:
    if len(refs) != len(gots):
        return False, float("inf"), f"{len(gots)} outputs, reference has {len(refs)}"
    worst, note = 0.0, ""
    ok = True
    for i, (r, g) in enumerate(zip(refs, gots)):
        o_ok, err, o_note = compare(_to_value(r), g, rtol, atol, atol_abs)
        worst = max(worst, err)
        if not o_ok and ok:
            ok, note = False, f"output {i}: {o_note}"
    return ok, worst, note


# -- the reasons a case stays FP32 -----------------------------------------------------------------

def _kept_reason(report, model: ModelProto) -> tuple[str, str]:
    """(category, the report's reason of the op that decides) for a case with no op converted."""
    if not _fp32_io(model) and not any(i.data_type == TensorProto.FLOAT for i in model.graph.initializer):
        kinds = sorted({TensorProto.DataType.Name(t).lower() for t in _value_types(model) if t in _FLOAT_CODES})
        return SOURCE_NOT_FP32, f"float data is {', '.join(kinds)}; the converter lowers FP32 only"
    if not report.ops:
        return NO_FLOAT_COMPUTE, "only casts in the source: the casts pass merged them into the output cast"
    rows = [(_category(o["reason"]), o) for o in report.ops]
    low = [o for o in report.ops if o["precision"] == "float16"]
    if low and all(o["precision"] in ("float16", "n/a") for o in report.ops):
        return ALREADY_LOW, f"{low[0]['op_type']}: its float data is FP16 in the source; nothing to lower"
    for category, op in rows:
        if category != NO_FLOAT_COMPUTE:
            return category, f"{op['op_type']}: {op['reason']}"
    return NO_FLOAT_COMPUTE, f"{rows[0][1]['op_type']}: {rows[0][1]['reason']}"


DENY_NUMERICS, UNKNOWN_OP, SCHEMA_NO_FP16, NO_KERNEL = ("deny (numerics)", "unknown op", "schema has no FP16",
                                                         "no FP16 kernel in ORT")
CONSTANT_RANGE, SOURCE_NOT_FP32, NO_FLOAT_COMPUTE = ("constant out of FP16 range", "source not FP32",
                                                     "no float compute (reads any dtype)")
ALREADY_LOW = "already FP16 in the source"
NUMERICS_RULE = "numerics rule (trig argument, reduction-eps chain)"
#: phrases of the numerics pass's chain rules (passes/numerics_chains.py)
_NUMERICS_PHRASES = ("of an unbounded argument", "computes the argument of", "of a reduction plus eps")


def _category(reason: str) -> str:
    """Reason category of one op of the report; ``other: ...`` marks a reason this run does not expect."""
    if reason.startswith("deny"):
        return DENY_NUMERICS
    if reason.startswith("unknown"):
        return UNKNOWN_OP
    if "does not accept" in reason:
        return SCHEMA_NO_FP16
    if "kernel" in reason and "FP16" in reason:
        return NO_KERNEL
    if "rather than clamped" in reason:
        return CONSTANT_RANGE
    if any(phrase in reason for phrase in _NUMERICS_PHRASES):
        return NUMERICS_RULE
    if "keeps its source dtype" in reason:
        return SOURCE_NOT_FP32
    if "no float data" in reason or "runs in float64" in reason:  # a Cast to double computes no FP32 either
        return NO_FLOAT_COMPUTE
    if "by the cost model" in reason:  # planner="optimal" only
        return "cost model (FP16 not faster)"
    if "not connected to a tensor-core op" in reason:  # planners other than "all"
        return "no tensor-core op in reach"
    if "greedy painter" in reason:
        return "greedy painter: not between low ops"
    return "other: " + reason[:60]


# -- one case ------------------------------------------------------------------------------------

def run_case(case: Any, op: str, planner: str = PLANNER) -> CaseResult:
    from amp_compiler import convert_onnx
    from amp_compiler.errors import ConversionError

    start = time.perf_counter()
    model: ModelProto = case.model
    res = CaseResult(case.name, op, NOT_FLOAT)
    if not is_float_case(model):
        return res
    inputs, refs = case.data_sets[0]
    feeds = _feeds(model, list(inputs))
    # 1. the FP32 original on ORT
    ort_error = None
    try:
        sess = _session(model)
        fp32_out = _run(sess, feeds)
        ok, _, note = _compare_all(list(refs), fp32_out, FP32_RTOL, FP32_ATOL, case.atol)
        if not ok:
            ort_error = f"ORT FP32 result differs from the reference: {note}"
    except Exception as exc:  # noqa: BLE001 - any ORT failure puts the case in the separate list
        ort_error = f"{type(exc).__name__}: {_first_line(exc)}"
    # 2. convert
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            converted, report = convert_onnx(model, planner=planner, source=case.name)
    except ConversionError as exc:
        return _fail(res, REFUSED, str(exc), start, ort_error)
    except Exception as exc:  # noqa: BLE001
        return _fail(res, CRASH, f"{type(exc).__name__}: {_first_line(exc)}", start, ort_error)
    res.ops = sum(1 for o in report.ops)
    if _fp32_io(model):  # ops of a model with FP32 data that now run low were converted by us
        res.low_ops = sum(1 for o in report.ops if o["precision"] in ("float16", "bfloat16"))
    res.new_fp16_values = max(0, _count_fp16_values(converted) - _count_fp16_values(model))
    # 3. checker
    try:
        onnx.checker.check_model(converted, full_check=True)
    except Exception as exc:  # noqa: BLE001
        if _checker_ok(model):
            return _fail(res, CHECKER, _first_line(exc), start, ort_error)
    # 4. ORT on the converted model
    if ort_error is not None:  # converted and checked, but ORT cannot tell whether it is right
        res.status, res.reason, res.time_s = ORT_UNRUNNABLE, ort_error, time.perf_counter() - start
        return res
    try:
        csess = _session(converted)
    except Exception as exc:  # noqa: BLE001
        return _fail(res, LOAD, _first_line(exc), start, None)
    try:
        got = _run(csess, feeds)
    except Exception as exc:  # noqa: BLE001
        return _fail(res, RUN, _first_line(exc), start, None)
    dtype_note = _dtype_change(csess, fp32_out, got)
    if dtype_note:
        return _fail(res, DTYPE, dtype_note, start, None)
    ok, worst, note = _compare_all(list(refs), got, RTOL, ATOL)
    res.max_err = worst
    if not ok:
        return _fail(res, MISMATCH, note, start, None)
    if res.low_ops and res.new_fp16_values:
        res.status = CONVERTED
    else:
        res.status = KEPT
        res.reason, res.detail = _kept_reason(report, model)
    res.time_s = time.perf_counter() - start
    return res


def _count_fp16_values(model: ModelProto) -> int:
    """FP16 tensors the model declares or infers (graph I/O, value_info, initializers), subgraphs included."""
    try:
        model = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - counts what is declared
        pass

    def walk(g) -> int:
        n = sum(1 for vi in (*g.input, *g.output, *g.value_info)
                if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type == TensorProto.FLOAT16)
        n += sum(1 for t in g.initializer if t.data_type == TensorProto.FLOAT16)
        for node in g.node:
            for a in node.attribute:
                for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                    n += walk(sub)
        return n

    return walk(model.graph)


def _checker_ok(model: ModelProto) -> bool:
    try:
        onnx.checker.check_model(model, full_check=True)
        return True
    except Exception:  # noqa: BLE001
        return False


def _dtype_change(sess, before: list[Any], after: list[Any]) -> str:
    for i, (a, b) in enumerate(zip(before, after)):
        if isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype != b.dtype:
            return f"output {i} is {b.dtype}, the original gives {a.dtype}"
    return ""


def _fail(res: CaseResult, kind: str, detail: str, start: float, ort_error: str | None) -> CaseResult:
    res.status, res.reason, res.detail = FAILING, kind, detail
    if ort_error is not None and kind in (MISMATCH, LOAD, RUN):
        res.status, res.reason = ORT_UNRUNNABLE, ort_error
    res.time_s = time.perf_counter() - start
    return res


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


# -- the whole run -------------------------------------------------------------------------------

def run_conformance(filter_: str | None = None, progress: bool = False,
                    planner: str = PLANNER) -> tuple[list[CaseResult], Summary]:
    """Run every case (or those whose name contains ``filter_``); returns per-case results and totals."""
    start = time.perf_counter()
    cases = collect_cases(filter_)
    base_ops = {c.name: c.model.graph.node[0].op_type for c in cases
                if len(c.model.graph.node) == 1 and "_expanded" not in c.name}
    results = []
    for i, case in enumerate(cases):
        results.append(run_case(case, _op_of(case, base_ops), planner))
        if progress and (i + 1) % 200 == 0:
            print(f"  {i + 1}/{len(cases)} cases, {time.perf_counter() - start:.0f} s", file=sys.stderr)
    summary = summarize(results)
    summary.planner = planner
    summary.time_s = time.perf_counter() - start
    return results, summary


def summarize(results: list[CaseResult]) -> Summary:
    s = Summary(cases=len(results))
    kept, failing = Counter(), Counter()
    for r in results:
        if r.status == NOT_FLOAT:
            continue
        s.float_cases += 1
        if r.status == ORT_UNRUNNABLE:
            s.ort_unrunnable += 1
            continue
        s.counted += 1
        if r.status == CONVERTED:
            s.converted += 1
        elif r.status == KEPT:
            s.kept_fp32 += 1
            kept[r.reason] += 1
        else:
            s.failing += 1
            failing[r.reason] += 1
    # crashes and checker failures count wherever they happen, ORT-unrunnable cases included
    s.crashes = sum(1 for r in results if r.status == FAILING and r.reason == CRASH)
    s.refused = sum(1 for r in results if r.status == FAILING and r.reason == REFUSED)
    s.checker_failures = sum(1 for r in results if r.status == FAILING and r.reason == CHECKER)
    s.load_failures = sum(1 for r in results if r.status == FAILING and r.reason in (LOAD, RUN))
    s.kept_by_reason, s.failing_by_kind = dict(kept.most_common()), dict(failing.most_common())
    s.converted_op_types = len({r.op.replace(" (expanded)", "") for r in results if r.status == CONVERTED})
    s.pass_rate = (s.converted + s.kept_fp32) / s.counted if s.counted else 1.0
    return s


def format_table(results: list[CaseResult], summary: Summary, verbose: bool = False) -> str:
    by_op: dict[str, Counter] = defaultdict(Counter)
    reasons: dict[str, set] = defaultdict(set)
    for r in results:
        if r.status == NOT_FLOAT:
            continue
        by_op[r.op][r.status] += 1
        if r.status in (KEPT, FAILING):
            reasons[r.op].add(r.reason)
    lines = [f"{'op':<34} {'converted':>9} {'kept FP32':>9} {'failing':>7} {'ORT n/a':>7}  reasons"]
    for op in sorted(by_op):
        c = by_op[op]
        lines.append(f"{op[:34]:<34} {c[CONVERTED]:>9} {c[KEPT]:>9} {c[FAILING]:>7} {c[ORT_UNRUNNABLE]:>7}  "
                     + "; ".join(sorted(reasons[op])))
    fails = [r for r in results if r.status == FAILING]
    if fails:
        lines += ["", f"failing cases ({len(fails)}):"]
        lines += [f"  {r.name} [{r.op}] {r.reason}: {r.detail}" for r in fails]
    unrunnable = [r for r in results if r.status == ORT_UNRUNNABLE]
    if unrunnable:
        lines += ["", f"ORT cannot run the FP32 model ({len(unrunnable)} cases; not counted):"]
        lines += [f"  {r.name} [{r.op}]: {r.reason}" for r in unrunnable]
    if verbose:
        kept = [r for r in results if r.status == KEPT]
        lines += ["", f"kept FP32 ({len(kept)} cases):"]
        lines += [f"  {r.name} [{r.op}] {r.reason}: {r.detail}" for r in kept]
    s = summary
    lines += [
        "",
        f"cases: {s.cases}, float cases: {s.float_cases}, ORT cannot run in FP32: {s.ort_unrunnable}, "
        f"counted: {s.counted}",
        f"converted to FP16 and matching: {s.converted} ({s.converted_op_types} ops)",
        f"kept FP32 with a reason: {s.kept_fp32}"
        + (" (" + ", ".join(f"{k}: {v}" for k, v in s.kept_by_reason.items()) + ")" if s.kept_by_reason else ""),
        f"failing: {s.failing}"
        + (" (" + ", ".join(f"{k}: {v}" for k, v in s.failing_by_kind.items()) + ")" if s.failing_by_kind else ""),
        f"crashes: {s.crashes}, refused with a ConversionError: {s.refused}, checker failures: "
        f"{s.checker_failures}, load/run failures: {s.load_failures}",
        f"pass rate: {100 * s.pass_rate:.2f} % (required {100 * REQUIRED_PASS_RATE:.0f} %) -> "
        + ("OK" if s.ok else "NOT MET"),
        f"tolerance: |got - ref| <= {RTOL:g}*|ref| + {ATOL:g}*max|ref|; planner={s.planner!r}; "
        f"run time {s.time_s:.1f} s",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.conformance", description=__doc__.split("\n\n")[0])
    p.add_argument("--filter", metavar="SUBSTR", help="only cases whose name contains SUBSTR")
    p.add_argument("--json", metavar="OUT.json", help="write every case's result and the summary")
    p.add_argument("-v", "--verbose", action="store_true", help="also list every case kept FP32")
    p.add_argument("--planner", default=PLANNER, choices=["all", "optimal", "greedy"],
                   help="planner to convert with (default: all; the cost-model planners keep nearly every "
                        "single-op case FP32, which checks robustness but not FP16 numerics)")
    args = p.parse_args(argv)
    results, summary = run_conformance(args.filter, progress=True, planner=args.planner)
    print(format_table(results, summary, args.verbose))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": {**asdict(summary), "ok": summary.ok},
                       "tolerance": {"rtol": RTOL, "atol_scaled": ATOL},
                       "cases": [asdict(r) for r in results]}, f, indent=1, default=float)
    return 0 if summary.ok else 1


if __name__ == "__main__":
    sys.exit(main())
