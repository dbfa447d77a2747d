"""Shapes behind ONNX Runtime's fused ops (an ``ORT_ENABLE_EXTENDED`` file): ``FusedMatMul``,
``FusedGemm`` and ``FusedConv`` get the standard op's shape, so the GEMMs after them are priced on
the model's own dims, not ``--default-dim`` (``onnx_io/contrib_shapes.py``)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.builders import fin, weight
from amp_compiler import convert_onnx  # noqa: E402  isort: skip
from amp_compiler.dims import names_in  # noqa: E402  isort: skip
from amp_compiler.onnx_io.importer import import_model  # noqa: E402  isort: skip

MS = "com.microsoft"


def _model(nodes, inputs, outputs, inits):
    g = helper.make_graph(nodes, "fused", inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    m.ir_version = 8
    return m


def _attention(trans_b: bool = True):
    """Scores by ``FusedMatMul`` (K transposed by the op, scaled by ``alpha``), as ORT's
    MatMulScaleFusion and TransposeMatMul fusion write them, then softmax, the value GEMM and a projection."""
    k_shape = ("batch", "seq", 64) if trans_b else ("batch", 64, "seq")
    nodes = [helper.make_node("FusedMatMul", ["q", "k"], ["scores"], domain=MS, alpha=0.125,
                              transA=0, transB=int(trans_b), name="qk"),
             helper.make_node("Softmax", ["scores"], ["probs"], axis=-1, name="softmax"),
             helper.make_node("MatMul", ["probs", "v"], ["context"], name="pv"),
             helper.make_node("MatMul", ["context", "Wo"], ["y"], name="out_proj")]
    return _model(nodes, [fin("q", "batch", "seq", 64), fin("k", *k_shape), fin("v", "batch", "seq", 64)],
                  [fin("y", "batch", "seq", 64)], [weight("Wo", 64, 64)])


@pytest.mark.parametrize("trans_b", [True, False])
def test_values_after_a_fused_matmul_keep_the_inputs_dims(trans_b):
    graph = import_model(_attention(trans_b), validate=True).graph
    assert graph.tensors["scores"].shape == ("batch", "seq", "seq")
    assert graph.tensors["context"].shape == ("batch", "seq", 64)
    _, report = convert_onnx(_attention(trans_b), dim_values={"batch": 2, "seq": 256})
    assert "guessed_gemm_sizes" not in report.summary
    flops = {o["name"]: o["flops"] for o in report.ops}
    assert flops["pv"] == 2 * 2 * 256 * 256 * 64  # sized by --dim, not by the default 8


def test_fused_gemm_and_fused_conv_outputs_take_gemm_and_conv_shapes():
    nodes = [helper.make_node("FusedConv", ["img", "Wc", "bc"], ["feat"], domain=MS, activation="Relu",
                              kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2], name="conv"),
             helper.make_node("GlobalAveragePool", ["feat"], ["pooled"], name="pool"),
             helper.make_node("Flatten", ["pooled"], ["flat"], axis=1, name="flatten"),
             helper.make_node("FusedGemm", ["flat", "Wg", "bg"], ["hidden"], domain=MS, activation="Relu",
                              transB=1, name="fc"),
             helper.make_node("MatMul", ["hidden", "Wh"], ["y"], name="head")]
    m = _model(nodes, [fin("img", "batch", 3, "h", "w")], [fin("y", "batch", 10)],
               [weight("Wc", 16, 3, 3, 3), numpy_helper.from_array(np.zeros(16, np.float32), "bc"),
                weight("Wg", 32, 16), numpy_helper.from_array(np.zeros(32, np.float32), "bg"), weight("Wh", 32, 10)])
    graph = import_model(m, validate=True).graph
    feat = graph.tensors["feat"].shape  # a stride-2 3x3 conv padded by 1: ceil(h / 2)
    assert feat[:2] == ("batch", 16) and [names_in(d) for d in feat[2:]] == [{"h"}, {"w"}], feat
    graph.set_dim_sizes(8, {"batch": 1, "h": 223, "w": 224})
    assert graph.concrete_shape("feat") == [1, 16, 112, 112]
    assert graph.tensors["hidden"].shape == ("batch", 32)
    assert graph.tensors["hidden"].dtype == "float32"
