"""Numerics torture set: small models built to break "everything FP16", and how each tool fares.

    python -m benchmarks.torture
    python -m benchmarks.torture --tools amp-compiler ort-float16 --no-readme

Each case is a transformer-sized piece (batch 4 x 256 tokens x 1024 features, so that the
cost model has real GEMM work to put in FP16 and does not keep the model FP32 merely
because it is small) with inputs that FP32 handles and FP16 does not:

* ``exp_no_max``       -- a softmax written out without subtracting the max (Exp, ReduceSum, Div)
                          on logits up to ~15: exp overflows FP16 above 11.1;
* ``sum_pool``         -- mean pooling written as ReduceSum / count over 256 tokens of
                          activations ~1000: the sum passes 65504 (the mean does not);
* ``rms_norm``         -- a T5-style RMSNorm (Pow, ReduceMean, Add eps, Sqrt, Div) on
                          activations ~1000: the mean square passes 65504;
* ``layer_norm_decomposed`` -- LayerNorm written out (ReduceMean, Sub, Pow, ReduceMean, Sqrt, Div)
                          on activations ~1000;
* ``softmax_big_logits``  -- attention scores of magnitude ~1e5 (a GEMM on large activations)
                          flowing into Softmax: the scores themselves do not fit FP16;
* ``layer_norm_big_input`` -- LayerNormalization on a residual stream of magnitude ~1e5;
* ``mask_1e9``         -- attention with an additive mask built as (1 - mask) * -1e9, with
                          padding rows whose keys are all masked;
* ``tiny_weights``     -- a projection whose weights are ~1e-8, below FP16's smallest
                          subnormal (5.96e-8), followed by LayerNorm (its activations are tiny too);
* ``tiny_weights_rescaled`` -- the same weights with a separate 1e8 scale (weight-norm /
                          dequantisation style), so that only the stored constants are out of range.

Every tool converts each model with ``keep_io_types=True`` in its own process (as in
``benchmarks.peers``). ModelOpt AutoCast gets the test inputs as its calibration data (its
range rule keeps ops whose calibrated I/O exceed 512 in FP32; without data it would see
U(-1, 1) inputs). amp-compiler runs four ways: as it is by default (static rules, deny
propagation and the cost model, no data), with the test inputs as ``calibration_inputs`` (ops
that would hold an activation above 65504/2, or only FP16 subnormals, stay FP32), with
``deny_propagation=False`` (TF's rule, on by default, turned off: infer ops fed by a deny op are
left to the cost model), and with
``planner="all"`` (every op its rules allow in FP16 is FP16, whatever the cost model says:
what the rules alone protect). The output of every tool is run on ONNX Runtime (CPU) and
compared with the FP32 model: max|out - fp32| / max|fp32| over the outputs, "inf/NaN"
when non-finite values appear where FP32 has none. Tolerance: 1e-2.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from . import common
from .common import TOOL_LABELS, fmt_err

TOLERANCE = 1e-2
B, S, D = 4, 256, 1024
OPSET = 18

#: tool variant -> (converter, its options); "calibrated" variants get the test inputs as calibration data
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "amp-compiler": ("amp-compiler", {}),
    "amp-compiler:calibrated": ("amp-compiler", {"calibrate": True}),
    "amp-compiler:no-deny-propagation": ("amp-compiler", {"deny_propagation": False}),
    "amp-compiler:all": ("amp-compiler", {"planner": "all"}),
    "ort-float16": ("ort-float16", {}),
    "occ-float16": ("occ-float16", {}),
    "modelopt-autocast": ("modelopt-autocast", {"calibrate": True}),
}
TORTURE_TOOLS = tuple(VARIANTS)
LABELS = {**TOOL_LABELS, "amp-compiler:calibrated": "amp-compiler, calibrated",
          "amp-compiler:all": "amp-compiler, planner=all",
          "amp-compiler:no-deny-propagation": "amp-compiler, no deny propagation",
          "modelopt-autocast": "ModelOpt AutoCast, calibrated"}
FULL_FP16 = ("ort-float16", "occ-float16")
OUR_VARIANTS = ("amp-compiler", "amp-compiler:calibrated", "amp-compiler:no-deny-propagation")


class Case:
    def __init__(self, name: str, what: str, model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
        self.name, self.what, self.model, self.feeds = name, what, model, feeds


def _w(rng, name, *shape, scale=None):
    scale = scale if scale is not None else 1.0 / math.sqrt(shape[0])
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def _c(name, value, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def _model(name, nodes, inputs, outputs, inits) -> onnx.ModelProto:
    g = helper.make_graph(nodes, name, inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)])
    m.ir_version = 8
    return onnx.shape_inference.infer_shapes(m)


def _x(name="x", shape=(B, S, D)):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def _y(name="y"):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, None)


def _n(op, ins, outs, **kw):
    return helper.make_node(op, ins, outs, name=f"{op}_{outs[0]}", **kw)


def build_cases(seed: int = 0) -> list[Case]:
    rng = np.random.default_rng(seed)
    cases = []

    # -- exp without max subtraction: logits = x @ W scaled to reach ~15
    nodes = [_n("MatMul", ["x", "W"], ["logits"]), _n("Exp", ["logits"], ["e"]),
             _n("ReduceSum", ["e", "axes"], ["s"], keepdims=1), _n("Div", ["e", "s"], ["p"]),
             _n("MatMul", ["p", "W2"], ["y"])]
    m = _model("exp_no_max", nodes, [_x()], [_y()],
               [_w(rng, "W", D, D), _w(rng, "W2", D, D), _c("axes", [-1], np.int64)])
    x = (rng.standard_normal((B, S, D)) * 4.0).astype(np.float32)  # logits ~ N(0, 4): max ~ 15-20
    cases.append(Case("exp_no_max", "softmax written as Exp/ReduceSum/Div, logits up to ~18", m, {"x": x}))

    # -- sum pooling over tokens
    nodes = [_n("MatMul", ["x", "W"], ["h"]), _n("Relu", ["h"], ["r"]),
             _n("ReduceSum", ["r", "axes"], ["s"], keepdims=0), _n("Div", ["s", "count"], ["mean"]),
             _n("MatMul", ["mean", "W2"], ["y"])]
    m = _model("sum_pool", nodes, [_x()], [_y()],
               [_w(rng, "W", D, D), _w(rng, "W2", D, D), _c("axes", [1], np.int64), _c("count", float(S))])
    x = (rng.standard_normal((B, S, D)) * 1000.0).astype(np.float32)  # relu(h) ~ 400 on average: sums ~ 1e5
    cases.append(Case("sum_pool", "mean pooling as ReduceSum/count over 256 tokens of activations ~1000", m,
                      {"x": x}))

    # -- RMSNorm (T5 style) on large activations
    def rms(prefix, inp, out):
        return [_n("Pow", [inp, "two"], [f"{prefix}sq"]),
                _n("ReduceMean", [f"{prefix}sq", "axes"], [f"{prefix}ms"], keepdims=1),
                _n("Add", [f"{prefix}ms", "eps"], [f"{prefix}mse"]),
                _n("Sqrt", [f"{prefix}mse"], [f"{prefix}rms"]),
                _n("Div", [inp, f"{prefix}rms"], [f"{prefix}n"]),
                _n("Mul", [f"{prefix}n", "gamma"], [out])]

    nodes = [_n("MatMul", ["x", "W0"], ["h"]), *rms("a_", "h", "hn"), _n("MatMul", ["hn", "W"], ["y"])]
    m = _model("rms_norm", nodes, [_x()], [_y()],
               [_w(rng, "W0", D, D), _w(rng, "W", D, D), _c("two", 2.0), _c("eps", 1e-6), _c("axes", [-1], np.int64),
                numpy_helper.from_array(np.ones(D, np.float32), "gamma")])
    x = (rng.standard_normal((B, S, D)) * 1000.0).astype(np.float32)
    cases.append(Case("rms_norm", "T5-style RMSNorm (Pow/ReduceMean/Sqrt/Div) on activations ~1000", m, {"x": x}))

    # -- LayerNorm written out, on large activations
    nodes = [_n("MatMul", ["x", "W0"], ["h"]),
             _n("ReduceMean", ["h", "axes"], ["mu"], keepdims=1), _n("Sub", ["h", "mu"], ["d"]),
             _n("Pow", ["d", "two"], ["d2"]), _n("ReduceMean", ["d2", "axes"], ["var"], keepdims=1),
             _n("Add", ["var", "eps"], ["vare"]), _n("Sqrt", ["vare"], ["std"]), _n("Div", ["d", "std"], ["n"]),
             _n("Mul", ["n", "gamma"], ["g"]), _n("Add", ["g", "beta"], ["ln"]), _n("MatMul", ["ln", "W"], ["y"])]
    m = _model("layer_norm_decomposed", nodes, [_x()], [_y()],
               [_w(rng, "W0", D, D), _w(rng, "W", D, D), _c("two", 2.0), _c("eps", 1e-5), _c("axes", [-1], np.int64),
                numpy_helper.from_array(np.ones(D, np.float32), "gamma"),
                numpy_helper.from_array(np.zeros(D, np.float32), "beta")])
    x = (rng.standard_normal((B, S, D)) * 1000.0).astype(np.float32)
    cases.append(Case("layer_norm_decomposed", "LayerNorm written out (ReduceMean/Sub/Pow/Sqrt/Div) on "
                      "activations ~1000", m, {"x": x}))

    # -- softmax on scores beyond FP16 range: q = x Wq, k = x Wk with x ~ 30 -> scores ~ 1e5
    dh = 64
    nodes = [_n("MatMul", ["x", "Wq"], ["q"]), _n("MatMul", ["x", "Wk"], ["k"]), _n("MatMul", ["x", "Wv"], ["v"]),
             _n("Transpose", ["k"], ["kt"], perm=[0, 2, 1]), _n("MatMul", ["q", "kt"], ["scores"]),
             _n("Softmax", ["scores"], ["p"], axis=-1), _n("MatMul", ["p", "v"], ["y"])]
    m = _model("softmax_big_logits", nodes, [_x()], [_y()],
               [_w(rng, "Wq", D, dh), _w(rng, "Wk", D, dh), _w(rng, "Wv", D, dh)])
    x = (rng.standard_normal((B, S, D)) * 40.0).astype(np.float32)
    cases.append(Case("softmax_big_logits", "attention scores ~1e5 (large activations) into Softmax", m, {"x": x}))

    # -- LayerNormalization on a residual stream beyond FP16 range
    nodes = [_n("LayerNormalization", ["x", "gamma", "beta"], ["ln"], axis=-1),
             _n("MatMul", ["ln", "W"], ["h"]), _n("Add", ["x", "h"], ["r"]),
             _n("LayerNormalization", ["r", "gamma", "beta"], ["ln2"], axis=-1), _n("MatMul", ["ln2", "W2"], ["y"])]
    m = _model("layer_norm_big_input", nodes, [_x()], [_y()],
               [_w(rng, "W", D, D), _w(rng, "W2", D, D), numpy_helper.from_array(np.ones(D, np.float32), "gamma"),
                numpy_helper.from_array(np.zeros(D, np.float32), "beta")])
    x = (rng.standard_normal((B, S, D)) * 3e4).astype(np.float32)  # |x| up to ~1.5e5
    cases.append(Case("layer_norm_big_input", "LayerNormalization on a residual stream of magnitude ~1e5", m,
                      {"x": x}))

    # -- additive attention mask (1 - mask) * -1e9, padded rows fully masked
    nodes = [_n("MatMul", ["x", "Wq"], ["q"]), _n("MatMul", ["x", "Wk"], ["k"]), _n("MatMul", ["x", "Wv"], ["v"]),
             _n("Transpose", ["k"], ["kt"], perm=[0, 2, 1]), _n("MatMul", ["q", "kt"], ["s0"]),
             _n("Mul", ["s0", "scale"], ["s1"]),
             _n("Sub", ["one", "mask"], ["inv"]), _n("Mul", ["inv", "neg"], ["bias"]),
             _n("Add", ["s1", "bias"], ["scores"]), _n("Softmax", ["scores"], ["p"], axis=-1),
             _n("MatMul", ["p", "v"], ["y"])]
    m = _model("mask_1e9", nodes, [_x(), _x("mask", (B, S, S))], [_y()],
               [_w(rng, "Wq", D, dh), _w(rng, "Wk", D, dh), _w(rng, "Wv", D, dh), _c("scale", dh ** -0.5),
                _c("one", 1.0), _c("neg", -1e9)])
    x = rng.standard_normal((B, S, D)).astype(np.float32)
    mask = np.ones((B, S, S), np.float32)
    lengths = [S, S - 40, S // 2, 17]
    for b, n in enumerate(lengths):
        mask[b, :, n:] = 0.0  # padded keys
        mask[b, n:, :] = 0.0  # padded queries: whole rows masked
    cases.append(Case("mask_1e9", "attention with an additive (1 - mask) * -1e9 mask, fully masked padding rows",
                      m, {"x": x, "mask": mask}))

    # -- weights below FP16's smallest subnormal
    nodes = [_n("MatMul", ["x", "Wtiny"], ["h"]), _n("LayerNormalization", ["h", "gamma", "beta"], ["ln"], axis=-1),
             _n("MatMul", ["ln", "W"], ["y"])]
    m = _model("tiny_weights", nodes, [_x()], [_y()],
               [_w(rng, "Wtiny", D, D, scale=1e-8), _w(rng, "W", D, D),
                numpy_helper.from_array(np.ones(D, np.float32), "gamma"),
                numpy_helper.from_array(np.zeros(D, np.float32), "beta")])
    x = rng.standard_normal((B, S, D)).astype(np.float32)
    cases.append(Case("tiny_weights", "projection with weights ~1e-8 (below FP16's 5.96e-8), then LayerNorm: "
                      "the activations are ~1e-7 too", m, {"x": x}))

    # -- the same tiny weights with their scale kept apart (weight-norm / dequantisation style)
    nodes = [_n("MatMul", ["x", "Wtiny"], ["h0"]), _n("Mul", ["h0", "rescale"], ["h"]),
             _n("LayerNormalization", ["h", "gamma", "beta"], ["ln"], axis=-1), _n("MatMul", ["ln", "W"], ["y"])]
    m = _model("tiny_weights_rescaled", nodes, [_x()], [_y()],
               [_w(rng, "Wtiny", D, D, scale=1e-8), _c("rescale", 1e8), _w(rng, "W", D, D),
                numpy_helper.from_array(np.ones(D, np.float32), "gamma"),
                numpy_helper.from_array(np.zeros(D, np.float32), "beta")])
    x = rng.standard_normal((B, S, D)).astype(np.float32)
    cases.append(Case("tiny_weights_rescaled", "weights ~1e-8 whose product is rescaled by a constant 1e8 "
                      "before LayerNorm", m, {"x": x}))
    return cases


#: ops whose kernels accumulate in FP32 on a GPU (tensor-core GEMMs, cuDNN/ORT-CUDA softmax,
#: normalisation and reduction kernels): the emulator computes them in FP32 and rounds the result
_FP32_ACCUMULATING = ("MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum", "Softmax", "LogSoftmax",
                      "LayerNormalization", "BatchNormalization", "InstanceNormalization", "GroupNormalization",
                      "ReduceSum", "ReduceMean", "ReduceSumSquare", "ReduceL2", "ReduceLogSumExp", "AveragePool",
                      "GlobalAveragePool")


def fp16_storage_outputs(model_path: str | Path, feeds: dict[str, np.ndarray]) -> tuple[list | None, str]:
    """Run a model the way a GPU would store it: every tensor in the dtype the graph declares.

    ONNX Runtime's CPU provider has few FP16 kernels: it wraps FP16 nodes in casts and
    merges neighbouring ones into FP32 islands, so an FP16 tensor that would overflow on a
    GPU may never exist on the CPU. This emulator (ONNX's reference evaluator) runs each
    op on its declared dtypes: elementwise FP16 ops round their results to FP16 (numpy
    computes them in FP32 and rounds, as GPU kernels do); GEMMs, softmax, normalisations
    and reductions compute in FP32 and round their output (FP32 accumulation, as on GPUs).
    """
    from onnx.reference import ReferenceEvaluator
    from onnx.reference.ops import load_op

    from amp_compiler.analysis import sort_nodes, topologically_sorted

    model = onnx.load(str(model_path))
    if not topologically_sorted(model.graph):  # ONNX Runtime sorts what it loads; the evaluator does not
        sort_nodes(model.graph)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), OPSET)
    new_ops = []
    for op_type in sorted({n.op_type for n in model.graph.node} & set(_FP32_ACCUMULATING)):
        base = load_op("", op_type, opset)
        first_only = op_type == "LayerNormalization"  # Mean / InvStdDev are FP32 by schema

        def _run(self, *args, _base=base, _first_only=first_only, **kwargs):
            half = any(isinstance(a, np.ndarray) and a.dtype == np.float16 for a in args)
            args = tuple(a.astype(np.float32) if isinstance(a, np.ndarray) and a.dtype == np.float16 else a
                         for a in args)
            outs = _base._run(self, *args, **kwargs)
            if half:
                outs = tuple(o.astype(np.float16) if isinstance(o, np.ndarray) and o.dtype == np.float32
                             and (k == 0 or not _first_only) else o for k, o in enumerate(outs))
            return outs

        new_ops.append(type(op_type, (base,), {"_run": _run, "op_domain": ""}))
    try:
        sess = ReferenceEvaluator(model, new_ops=new_ops)
        names = set(sess.input_names)
        with np.errstate(all="ignore"):
            return [np.asarray(o) for o in sess.run(None, {k: v for k, v in feeds.items() if k in names})], ""
    except Exception as exc:  # noqa: BLE001 - a model the evaluator cannot run is a cell
        return None, "emulator failed: " + common._one_line(exc)


def _score(ref, outputs) -> dict[str, Any]:
    err = common.max_rel_error(ref, outputs)
    return {"finite": bool(all(np.isfinite(o).all() for o in outputs)), "max_rel_error": err,
            "within_tolerance": err <= TOLERANCE}


def run_case(case: Case, tools: tuple[str, ...], log: Callable[[str], None], work: Path,
             cuda: bool = False) -> dict[str, Any]:
    """One case through every tool; ``cuda`` also runs each output on ONNX Runtime's CUDA EP (a GPU
    machine with onnxruntime-gpu), against the same FP32 reference from the CPU."""
    src = work / f"{case.name}.onnx"
    onnx.save_model(case.model, src)
    calib = work / f"{case.name}.npz"
    np.savez(calib, **case.feeds)
    ref, why = common.ort_outputs(src, case.feeds)
    entry: dict[str, Any] = {"case": case.name, "what": case.what, "fp32_finite": bool(
        ref is not None and all(np.isfinite(r).all() for r in ref)), "tools": {}}
    if ref is None:
        entry["fp32_error"] = why
        return entry
    emulated, why = fp16_storage_outputs(src, case.feeds)  # sanity: FP32 through the emulator matches ORT
    entry["fp32_emulator_error"] = common.max_rel_error(ref, emulated) if emulated is not None else why
    if cuda:  # FP32 on the GPU against the CPU: the floor of every CUDA cell (TF32, kernel order)
        on_gpu, why = common.ort_outputs(src, case.feeds, provider="CUDAExecutionProvider")
        entry["fp32_cuda_error"] = common.max_rel_error(ref, on_gpu) if on_gpu is not None else why
    for tool in tools:
        base_tool, variant = VARIANTS[tool]
        python, unavailable = common.python_for(base_tool, log=log)
        if unavailable:
            entry["tools"][tool] = {"ok": False, "error": unavailable}
            continue
        options = {k: v for k, v in variant.items() if k != "calibrate"}
        if variant.get("calibrate"):
            options["calibration_data"] = str(calib)
        out = work / f"{case.name}.{tool.replace(':', '-')}.onnx"
        res = common.run_tool(base_tool, src, out, python=python, options=options)
        cell: dict[str, Any] = {"ok": bool(res.get("ok"))}
        if not res.get("ok"):
            cell["error"] = res.get("error")
        else:
            outputs, why = common.ort_outputs(out, case.feeds)
            cell["loads"] = outputs is not None
            if outputs is None:
                cell["error"] = why
            else:
                cell.update(_score(ref, outputs))
            emulated, why = fp16_storage_outputs(out, case.feeds)
            cell["fp16_storage"] = _score(ref, emulated) if emulated is not None else {"error": why}
            if cuda:
                on_gpu, why = common.ort_outputs(out, case.feeds, provider="CUDAExecutionProvider")
                cell["cuda"] = _score(ref, on_gpu) if on_gpu is not None else {"error": why}
            if "summary" in res:
                cell["fp16_nodes"] = res["summary"].get("fp16_nodes")
                cell["nodes"] = res["summary"].get("nodes")
        entry["tools"][tool] = cell
        log(f"  {case.name:22s} {LABELS[tool]:30s} ORT {_fmt_cell(_mode_cell(cell, 'ort'), cell)}; "
            f"FP16 storage {_fmt_cell(_mode_cell(cell, 'fp16_storage'), cell)}")
    return entry


MODES = (("ort", "ONNX Runtime 1.x CPU provider"), ("fp16_storage", "FP16 storage emulation (GPU-like)"),
         ("cuda", "ONNX Runtime CUDA EP, on a GPU"))


def _modes(results: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The evaluation modes these results hold (the CUDA one only from a GPU machine)."""
    has_cuda = any("cuda" in c for e in results for c in e["tools"].values())
    return [(m, t) for m, t in MODES if m != "cuda" or has_cuda]


def _mode_cell(cell: dict[str, Any], mode: str) -> dict[str, Any] | None:
    if not cell.get("ok"):
        return None
    if mode == "ort":
        return cell if cell.get("loads") else None
    got = cell.get(mode, {})
    return got if "max_rel_error" in got else None


def verdicts(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per evaluation mode and case: which full-FP16 peers break, and does amp-compiler (default) hold?"""
    out: dict[str, Any] = {}
    for mode, _ in _modes(results):
        per_case = {}
        for entry in results:
            tools = entry["tools"]
            broken = [t for t in FULL_FP16 if t in tools and (c := _mode_cell(tools[t], mode)) is not None
                      and not c["within_tolerance"]]
            ours = {}
            for variant in OUR_VARIANTS:
                c = _mode_cell(tools.get(variant, {}), mode)
                ours[variant] = None if c is None else {"finite": c["finite"], "within_tolerance": c["within_tolerance"]}
            per_case[entry["case"]] = {"full_fp16_peers_break": broken, "amp_compiler": ours}
        out[mode] = per_case
    return out


def _fmt_cell(c: dict[str, Any] | None, raw: dict[str, Any]) -> str:
    if c is None:
        why = raw.get("error") or raw.get("fp16_storage", {}).get("error") or "not run"
        return f"failed: {why}"[:70]
    mark = "" if c["within_tolerance"] else (" ✗" if c["finite"] else " ✗ non-finite")
    return fmt_err(c["max_rel_error"]) + mark


def render(data: dict[str, Any]) -> str:
    tools = data["tools"]
    headers = ["case", *[LABELS[t] for t in tools]]
    lines = [f"Generated by `{data['command']}` on {data['date']} ({common.provenance(data)}). Cells: max relative "
             f"error against the FP32 model on ONNX Runtime, max over outputs of max|out - fp32| / max|fp32| "
             f"(tolerance {TOLERANCE:g}; ✗ = over it, 'non-finite' = inf/NaN where FP32 is finite). amp-compiler "
             f"cells also give FP16 ops / all ops."]
    for mode, title in _modes(data["results"]):
        rows = []
        for entry in data["results"]:
            row = [entry["case"]]
            for t in tools:
                raw = entry["tools"].get(t, {})
                cell = _fmt_cell(_mode_cell(raw, mode), raw)
                if t.startswith("amp-compiler") and raw.get("nodes"):
                    cell += f" ({raw.get('fp16_nodes')}/{raw.get('nodes')})"
                row.append(cell)
            rows.append(row)
        title = title.replace("1.x", data["versions"].get("onnxruntime", "?"))
        lines += ["", f"**{title}**", "", common.md_table(headers, rows, align="l" + "r" * len(tools))]
        v = data["verdicts"][mode]
        broken = [c for c, x in v.items() if x["full_fp16_peers_break"]]
        held = {variant: [c for c in broken if (v[c]["amp_compiler"].get(variant) or {}).get("within_tolerance")]
                for variant in OUR_VARIANTS}
        lines += ["", f"The full-FP16 peers (ORT / OCC float16) break {len(broken)} of {len(v)} cases here"
                      + (f" ({', '.join(broken)})" if broken else "")
                      + "; amp-compiler stays finite and within tolerance in "
                      + "; ".join(f"{len(cases)} of them {how}" + (f" ({', '.join(cases)})" if cases else "")
                                  for how, cases in zip(("by default", "calibrated", "without deny propagation"),
                                                        held.values())) + "."]
        overall = [c for c, x in v.items() if (x["amp_compiler"].get("amp-compiler") or {}).get("within_tolerance")]
        missed = [c for c in v if c not in overall]
        lines += ["", f"Over all {len(v)} cases amp-compiler by default stays finite and within tolerance in "
                      f"{len(overall)}" + (f" (all but {', '.join(missed)})" if missed else "") + "."]
    lines += ["", "Cases:", ""]
    lines += [f"- `{e['case']}`: {e['what']}" for e in data["results"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m benchmarks.torture", description=__doc__.split("\n\n")[0])
    p.add_argument("--tools", nargs="+", default=list(TORTURE_TOOLS), choices=TORTURE_TOOLS)
    p.add_argument("--cases", nargs="+", default=None)
    p.add_argument("--cuda", action="store_true",
                   help="also run every output on ONNX Runtime's CUDA EP (needs a GPU and onnxruntime-gpu)")
    p.add_argument("--results-name", default="torture.json", help="results file under benchmarks/results")
    p.add_argument("--results-dir", type=Path, default=common.RESULTS_DIR)
    p.add_argument("--readme-section", default=None,
                   help="README section to write (default: torture-table; torture-cuda-table with --cuda)")
    p.add_argument("--render", type=Path, metavar="RESULTS_JSON",
                   help="write the README section from a results file made earlier (on a GPU machine); runs nothing")
    p.add_argument("--no-readme", action="store_true")
    args = p.parse_args(argv)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    section = args.readme_section or ("torture-cuda-table" if args.cuda else "torture-table")
    if args.render:
        data = json.loads(args.render.read_text())
        section = args.readme_section or ("torture-cuda-table" if "cuda" in data.get("verdicts", {}) else "torture-table")
        common.update_readme_section(section, render(data))
        print(render(data))
        return 0
    header = common.run_header("torture", argv, ("onnx", "onnxruntime", "onnxconverter-common"))  # the code that runs
    cases = [c for c in build_cases() if args.cases is None or c.name in args.cases]
    work = Path(tempfile.mkdtemp(prefix="amp-torture-"))
    try:
        results = [run_case(c, tuple(args.tools), log, work, cuda=args.cuda) for c in cases]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    data = {**header,
            "tools": list(args.tools), "tolerance": TOLERANCE, "results": results}
    data["verdicts"] = verdicts(results)
    if args.no_readme:
        print(render(data))
        log(f"results: {common.write_json(args.results_name, data, args.results_dir)}")
    else:
        common.publish(args.results_name, section, data, render(data), True, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
