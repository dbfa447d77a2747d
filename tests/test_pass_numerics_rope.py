"""Rule 7 end to end: a rotary embedding at 2048 positions, in GPU-like FP16 emulation."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from amp_compiler import convert_onnx
from amp_compiler.validate import compare_outputs, run_reference

from .builders import fin, model, weight

S, H, D = 2048, 2, 64


def _rope_model():
    inv_freq = (1.0 / 10000 ** (np.arange(0, D, 2) / D)).astype(np.float32)
    i64 = lambda name, v: numpy_helper.from_array(np.array(v, dtype=np.int64), name)  # noqa: E731
    nodes = [
        helper.make_node("Cast", ["pos"], ["pos_f"], name="pos_float", to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["pos_f", "ax2"], ["pos_u"], name="pos_col"),
        helper.make_node("Mul", ["pos_u", "inv_freq"], ["angle"], name="angle"),  # [1, S, D/2]
        helper.make_node("Concat", ["angle", "angle"], ["emb"], name="emb", axis=-1),
        helper.make_node("Cos", ["emb"], ["cos"], name="cos"),
        helper.make_node("Sin", ["emb"], ["sin"], name="sin"),
        helper.make_node("Unsqueeze", ["cos", "ax1"], ["cos4"], name="cos4"),
        helper.make_node("Unsqueeze", ["sin", "ax1"], ["sin4"], name="sin4"),
        helper.make_node("Split", ["q"], ["q1", "q2"], name="halves", axis=-1, num_outputs=2),
        helper.make_node("Neg", ["q2"], ["nq2"], name="neg"),
        helper.make_node("Concat", ["nq2", "q1"], ["rq"], name="rotate", axis=-1),
        helper.make_node("Mul", ["q", "cos4"], ["qc"], name="q_cos"),
        helper.make_node("Mul", ["rq", "sin4"], ["qs"], name="q_sin"),
        helper.make_node("Add", ["qc", "qs"], ["qr"], name="rope"),
        helper.make_node("MatMul", ["qr", "W"], ["y"], name="proj"),
    ]
    inits = [numpy_helper.from_array(inv_freq, "inv_freq"), i64("ax1", [1]), i64("ax2", [2]),
             weight("W", D, D, scale=0.1)]
    return model(nodes, [fin("pos", 1, S, dtype=TensorProto.INT64), fin("q", 1, H, S, D)], [fin("y", 1, H, S, D)],
                 inits)


@pytest.mark.parametrize("options", [{}, {"planner": "all"}, {"planner": "all", "dtype": "bf16"}],
                         ids=["default", "all-fp16", "all-bf16"])
def test_rotary_embedding_at_2048_positions_stays_within_tolerance(options):
    m = _rope_model()
    converted, report = convert_onnx(m, **options)
    ops = {o["name"]: o for o in report.ops}
    for name in ("pos_float", "angle", "emb", "cos", "sin"):
        assert ops[name]["precision"] == "float32", (name, ops[name]["reason"])
    if options.get("dtype") != "bf16":  # (Cos-7's schema has no BF16: it is FP32 for that reason first)
        assert "of an unbounded argument" in ops["cos"]["reason"]
    assert "computes the argument of" in ops["angle"]["reason"]
    if options.get("planner") == "all":
        assert ops["proj"]["precision"] != "float32" and ops["q_cos"]["precision"] != "float32"
    rng = np.random.default_rng(0)
    feeds = {"pos": np.arange(S, dtype=np.int64)[None], "q": rng.standard_normal((1, H, S, D)).astype(np.float32)}
    err = compare_outputs(["y"], run_reference(m, feeds), run_reference(converted, feeds))[0]["max_rel_error"]
    assert err < (2e-2 if options.get("dtype") == "bf16" else 5e-3)
