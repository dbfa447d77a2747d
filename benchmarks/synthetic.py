"""Synthetic transformer-shaped ONNX graphs of a chosen node count, for scaling runs.

Each block is a pre-LN transformer layer (LayerNorm, QKV GEMMs, attention with
Softmax, output projection, residual Adds, FFN with Gelu) plus a ReduceMean and a
Pow that stay FP32, so the planner sees allow, infer, clear and deny ops and casts.
Weights are shared between blocks, so a 100k-node graph stays small on disk.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

NODES_PER_BLOCK = 24


def transformer_graph(n_nodes: int, hidden: int = 256, seq: int = 128, batch: int = 8, heads: int = 4,
                      seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    head_dim = hidden // heads

    def w(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.02).astype(np.float32), name)

    inits = [w("Wq", hidden, hidden), w("Wk", hidden, hidden), w("Wv", hidden, hidden), w("Wo", hidden, hidden),
             w("W1", hidden, 4 * hidden), w("W2", 4 * hidden, hidden), w("ln_g", hidden), w("ln_b", hidden),
             numpy_helper.from_array(np.array([batch, seq, heads, head_dim], np.int64), "split_shape"),
             numpy_helper.from_array(np.array([batch, seq, hidden], np.int64), "merge_shape"),
             numpy_helper.from_array(np.array(head_dim ** -0.5, np.float32), "scale"),
             numpy_helper.from_array(np.array(2.0, np.float32), "two")]
    nodes = []
    x = "x"
    blocks = max(1, n_nodes // NODES_PER_BLOCK)
    for b in range(blocks):
        p = f"b{b}_"

        def node(op, ins, outs=None, **attrs):
            outs = outs or [f"{p}{op.lower()}{len(nodes)}"]
            nodes.append(helper.make_node(op, ins, outs, name=f"{p}{op}_{len(nodes)}", **attrs))
            return outs[0]

        h = node("LayerNormalization", [x, "ln_g", "ln_b"], axis=-1)
        heads_ = []
        for wname in ("Wq", "Wk", "Wv"):
            t = node("MatMul", [h, wname])
            t = node("Reshape", [t, "split_shape"])
            heads_.append(node("Transpose", [t], perm=[0, 2, 1, 3]))
        q, k, v = heads_
        kt = node("Transpose", [k], perm=[0, 1, 3, 2])
        s = node("MatMul", [q, kt])
        s = node("Mul", [s, "scale"])
        s = node("Softmax", [s], axis=-1)
        a = node("MatMul", [s, v])
        a = node("Transpose", [a], perm=[0, 2, 1, 3])
        a = node("Reshape", [a, "merge_shape"])
        a = node("MatMul", [a, "Wo"])
        x1 = node("Add", [x, a])
        h2 = node("LayerNormalization", [x1, "ln_g", "ln_b"], axis=-1)
        f = node("MatMul", [h2, "W1"])
        f = node("Gelu", [f])
        f = node("MatMul", [f, "W2"])
        sq = node("Pow", [f, "two"])  # an auxiliary statistic: deny ops that force casts
        stat = node("ReduceMean", [sq], keepdims=1)
        f = node("Add", [f, stat])
        x = node("Add", [x1, f])
    g = helper.make_graph(nodes, "synthetic_transformer",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, seq, hidden])],
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, [batch, seq, hidden])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
    m.ir_version = 9
    return m
