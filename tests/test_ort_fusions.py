"""Written-out norms kept FP32 behind an FP16 producer load in ONNX Runtime (default optimisation).

ONNX Runtime's LayerNorm fusion absorbs a leading FP16->FP32 Cast, making an ill-typed
LayerNormalization(X: fp16, Scale: fp32); the emitter writes that cast as CastLike
(amp_compiler/onnx_io/ort_fusions.py). RMSNorms (T5: Div by the root, Llama: Mul by its reciprocal)
fuse into SimplifiedLayerNormalization, which takes mixed types.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import amp_compiler.onnx_io.emitter as emitter
from amp_compiler import convert_onnx
from amp_compiler.analysis import analyze_model

from .builders import fin, model, nodes_of, run, weight

N, D = 64, 128


def _norm(kind: str):
    """x -> MatMul (FP16) -> written-out norm on activations ~1000 -> MatMul; norm nodes named."""
    mk = helper.make_node
    nodes = [mk("MatMul", ["x", "W0"], ["h"], name="proj_in")]
    if kind == "layer_norm":
        nodes += [mk("ReduceMean", ["h", "axes"], ["mu"], name="mean", keepdims=1),
                  mk("Sub", ["h", "mu"], ["d"], name="sub"), mk("Pow", ["d", "two"], ["d2"], name="pow"),
                  mk("ReduceMean", ["d2", "axes"], ["var"], name="var", keepdims=1),
                  mk("Add", ["var", "eps"], ["vare"], name="add_eps"), mk("Sqrt", ["vare"], ["std"], name="sqrt"),
                  mk("Div", ["d", "std"], ["n"], name="div")]
    else:
        nodes += [mk("Pow", ["h", "two"], ["sq"], name="pow"),
                  mk("ReduceMean", ["sq", "axes"], ["ms"], name="mean", keepdims=1),
                  mk("Add", ["ms", "eps"], ["mse"], name="add_eps"), mk("Sqrt", ["mse"], ["rms"], name="sqrt")]
        nodes += ([mk("Div", ["h", "rms"], ["n"], name="div")] if kind == "rms_t5" else
                  [mk("Reciprocal", ["rms"], ["inv"], name="recip"), mk("Mul", ["h", "inv"], ["n"], name="div")])
    nodes += [mk("Mul", ["n", "gamma"], ["g"], name="scale")]
    out = "g"
    if kind == "layer_norm":
        nodes += [mk("Add", ["g", "beta"], ["ln"], name="shift")]
        out = "ln"
    nodes += [mk("MatMul", [out, "W"], ["y"], name="proj_out")]
    consts = [weight("W0", D, D, scale=D ** -0.5), weight("W", D, D), numpy_helper.from_array(np.float32(2.0), "two"),
              numpy_helper.from_array(np.float32(1e-5), "eps"),
              numpy_helper.from_array(np.array([-1], np.int64), "axes"),
              numpy_helper.from_array(np.linspace(0.5, 1.5, D, dtype=np.float32), "gamma"),
              numpy_helper.from_array(np.linspace(-0.1, 0.1, D, dtype=np.float32), "beta")]
    return model(nodes, [fin("x", N, D)], [fin("y", N, D)], consts)


def _convert(m, tail_fp32: bool):
    named = {n.name for n in m.graph.node}  # an RMSNorm has no shift (a pattern matching nothing is refused)
    tail = [n for n in ("div", "scale", "shift") if n in named] if tail_fp32 else []
    return convert_onnx(m, planner="all", deny_propagation=True, exclude_nodes=tail)


@pytest.mark.parametrize("tail_fp32", [True, False], ids=["fp32-tail", "planned-tail"])
@pytest.mark.parametrize("kind", ["layer_norm", "rms_t5", "rms_llama"])
def test_written_out_norm_kept_fp32_behind_fp16_producer_loads_and_runs_in_ort(kind, tail_fp32, tmp_path):
    m = _norm(kind)
    out, report = _convert(m, tail_fp32)
    ops = {o["name"]: o for o in report.ops}
    assert ops["proj_in"]["precision"] == "float16"  # the producer is FP16 ...
    assert ops["pow"]["precision"] == ops["mean"]["precision"] == "float32"  # ... the norm's statistics FP32
    # deny propagation stops at the normalised value (bounded, as LayerNormalization's): the tail is planned
    assert ops["scale"]["precision"] == ("float32" if tail_fp32 else "float16")
    path = tmp_path / "m.onnx"
    path.write_bytes(out.SerializeToString())
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])  # default: all optimisations
    x = np.random.default_rng(0).standard_normal((N, D)).astype(np.float32) * 1000
    got, ref = sess.run(None, {"x": x})[0], run(m, {"x": x})[0]
    assert np.max(np.abs(got - ref)) / np.max(np.abs(ref)) < 1e-2
    # CastLike exactly where ONNX Runtime's LayerNorm fusion would absorb a Cast into a mixed-type node
    assert len(nodes_of(out, "CastLike")) == (kind == "layer_norm" and tail_fp32)
    # the common ruler prices a CastLike as the cast it is
    assert analyze_model(out).casts == len(nodes_of(out, "Cast")) + len(nodes_of(out, "CastLike"))


@pytest.mark.parametrize("kind", ["layer_norm", "rms_t5", "rms_llama"])
def test_written_out_norm_with_default_options_loads_and_runs_in_ort(kind, tmp_path):
    """What a user gets: whatever the planner decides, the norm's statistics stay FP32 and ONNX
    Runtime (all optimisations, its fusions included) loads the output and matches FP32."""
    m = _norm(kind)
    out, report = convert_onnx(m)
    ops = {o["name"]: o for o in report.ops}
    assert ops["pow"]["precision"] == ops["mean"]["precision"] == "float32"
    path = tmp_path / "m.onnx"
    path.write_bytes(out.SerializeToString())
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((N, D)).astype(np.float32) * 1000
    got, ref = sess.run(None, {"x": x})[0], run(m, {"x": x})[0]
    assert np.max(np.abs(got - ref)) / np.max(np.abs(ref)) < 1e-2


def test_without_castlike_ort_refuses_the_fused_layer_norm(monkeypatch, tmp_path):
    """The case the emitter guards against is real: a plain Cast makes ONNX Runtime's fusion ill-typed."""
    monkeypatch.setattr(emitter, "castlike_casts", lambda graph: set())
    out, _ = _convert(_norm("layer_norm"), tail_fp32=True)
    path = tmp_path / "m.onnx"
    path.write_bytes(out.SerializeToString())
    with pytest.raises(Exception, match="LayerNormalization"):
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def test_castlike_only_from_the_opset_where_ort_fuses_before_provider_assignment(tmp_path):
    m = _norm("layer_norm")
    m.opset_import[0].version = 16  # LayerNormalization is not an ONNX op yet: ORT fuses later, mixed types allowed
    for node in nodes_of(m, "ReduceMean"):  # axes is an attribute before opset 18
        del node.input[1:]
        node.attribute.append(helper.make_attribute("axes", [-1]))
    out, _ = _convert(m, tail_fp32=True)
    assert not nodes_of(out, "CastLike") and nodes_of(out, "Cast")
    path = tmp_path / "m.onnx"
    path.write_bytes(out.SerializeToString())
    ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])  # loads with plain Casts
