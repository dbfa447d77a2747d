"""Duplicate computations are merged before planning, as ONNX Runtime merges them at load.

torch's opset-23 export gives every ``RotaryEmbedding`` its own ``Cos`` and ``Sin`` of one angle
tensor; priced one by one (two kernels and two casts a layer) a 2-layer Llama was planned all
FP32, its opset-18 export all FP16 (``amp_compiler/onnx_io/common_subexpressions.py``).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from amp_compiler import convert_onnx

from .builders import fin, model, nodes_of, run

S, D, LAYERS = 64, 128, 4


def _rope(shared: bool) -> onnx.ModelProto:
    """``LAYERS`` x (MatMul -> RotaryEmbedding) on one angle tensor; each layer's Cos and Sin its own
    (as torch's opset-23 exporter writes them) or, ``shared``, one Cos and one Sin for all."""
    mk = helper.make_node
    nodes = [mk("Mul", ["pos", "inv_freq"], ["angle"], name="angle")]
    if shared:
        nodes += [mk("Cos", ["angle"], ["cos"], name="cos"), mk("Sin", ["angle"], ["sin"], name="sin")]
    h = "x"
    for i in range(LAYERS):
        cos, sin = ("cos", "sin") if shared else (f"cos{i}", f"sin{i}")
        if not shared:
            nodes += [mk("Cos", ["angle"], [cos], name=cos), mk("Sin", ["angle"], [sin], name=sin)]
        nodes += [mk("MatMul", [h, f"w{i}"], [f"h{i}"], name=f"proj{i}"),
                  mk("RotaryEmbedding", [f"h{i}", cos, sin], [f"r{i}"], name=f"rope{i}", num_heads=4)]
        h = f"r{i}"
    inv_freq = 1.0 / 10000 ** (np.arange(16, dtype=np.float32) / 16)
    rng = np.random.default_rng(1)  # the same weights in both forms
    consts = [numpy_helper.from_array(inv_freq, "inv_freq"),
              *(numpy_helper.from_array((rng.standard_normal((D, D)) * D ** -0.5).astype(np.float32), f"w{i}")
                for i in range(LAYERS))]
    return model(nodes, [fin("x", 1, "seq", D), fin("pos", 1, "seq", 1)], [fin(h, 1, "seq", D)], consts, opset=23)


def _feeds() -> dict:
    rng = np.random.default_rng(0)
    return {"x": rng.standard_normal((1, S, D)).astype(np.float32),
            "pos": np.arange(S, dtype=np.float32).reshape(1, S, 1)}


@pytest.mark.parametrize("options", [{}, {"deploy": "eager"}], ids=["default", "eager"])
def test_duplicate_trig_ops_are_planned_and_written_once(options):
    dup, shared = convert_onnx(_rope(shared=False), **options), convert_onnx(_rope(shared=True), **options)
    keys = ("fp16_gemm_flop_fraction", "predicted_time_fp32_s", "predicted_time_mixed_s", "casts")
    assert {k: dup.report.summary[k] for k in keys} == pytest.approx({k: shared.report.summary[k] for k in keys})
    assert len(nodes_of(dup.model, "Cos")) == len(nodes_of(dup.model, "Sin")) == 1
    assert "Cos x3" in dup.report.summary["merged_duplicates"] and "Sin x3" in dup.report.summary["merged_duplicates"]
    assert "merged_duplicates" not in shared.report.summary
    got, want = run(dup.model, _feeds())[0], run(_rope(shared=False), _feeds())[0]
    assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < 1e-2


def test_duplicates_that_must_stay_are_left_alone():
    """Graph outputs, random ops, views, different attributes, reads inside a subgraph."""
    mk = helper.make_node
    then = helper.make_graph([mk("Cos", ["a"], ["inner"])], "then", [], [fin("inner", 4)])
    other = helper.make_graph([mk("Sin", ["a"], ["inner2"])], "else", [], [fin("inner2", 4)])
    nodes = [mk("Mul", ["x", "x"], ["a"]),
             mk("Cos", ["a"], ["out1"]), mk("Cos", ["a"], ["out2"]),  # both graph outputs
             mk("RandomNormalLike", ["a"], ["n1"]), mk("RandomNormalLike", ["a"], ["n2"]),
             mk("Identity", ["a"], ["i1"]), mk("Identity", ["a"], ["i2"]),
             mk("Softmax", ["a"], ["s1"], axis=0), mk("Softmax", ["a"], ["s2"], axis=-1),
             mk("Exp", ["a"], ["e1"]), mk("Exp", ["a"], ["e2"]),
             mk("If", ["c"], ["z"], then_branch=then, else_branch=other)]
    for i, pair in enumerate((("n1", "n2"), ("i1", "i2"), ("s1", "s2"), ("e1", "e2"))):
        nodes.append(mk("Sum", list(pair), [f"sum{i}"]))
    outs = [fin("out1", 4), fin("out2", 4), fin("z", 4), *(fin(f"sum{i}", 4) for i in range(4))]
    m = model(nodes, [fin("x", 4), fin("c", dtype=TensorProto.BOOL)], outs, opset=18)
    result = convert_onnx(m)
    counts = {op: len(nodes_of(result.model, op)) for op in ("Cos", "RandomNormalLike", "Identity", "Softmax", "Exp")}
    assert counts == {"Cos": 2, "RandomNormalLike": 2, "Identity": 2, "Softmax": 2, "Exp": 1}
    assert "Exp x1" in result.report.summary["merged_duplicates"]
    x = np.linspace(-1, 1, 4).astype(np.float32)
    got = run(result.model, {"x": x, "c": np.array(True)})
    assert np.allclose(got[6], 2 * np.exp(x * x), rtol=1e-2)  # sum3: the merged Exp read twice


def test_a_node_the_user_names_is_not_merged_away():
    """``--deny-node cos1`` must keep that node (FP32, as named), not merge it into ``cos0``."""
    result = convert_onnx(_rope(shared=False), deny_nodes=["cos1"])
    assert "cos1" in {n.name for n in result.model.graph.node}
    assert {o["name"]: o["precision"] for o in result.report.ops}["cos1"] == "float32"
    said = result.report.summary["merged_duplicates"]
    assert "Cos x2" in said and "Sin x3" in said
