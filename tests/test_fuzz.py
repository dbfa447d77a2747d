"""Seeded mutation fuzzing of the ONNX path (issue 5): never an unhandled exception.

Valid models (an MLP, an attention block, a conv net, If/Loop/Scan with outer-scope
captures, a partly-FP16 model, a QDQ model, a custom-domain function, a bag of
reductions/int/shape ops) are mutated at random -- dtypes, shapes, dangling inputs,
duplicated names, cycles, node order, attributes, op types, domains, opsets, IR
versions, graph I/O, tensor data, external-data references, and raw bytes of the
serialized file -- inside the main graph and inside subgraphs, one to three mutations
at a time. Each mutant goes through ``convert_onnx`` (bytes mutants through
``files.load_model`` first) with a random planner, dtype and keep_io_types, and must:

* fail with ``ConversionError`` (one line: file, node or tensor, reason), or
* convert to a model that passes ``onnx.checker``, with ``full_check`` (strict type
  and shape inference) whenever the mutant itself passes it -- the converter never
  turns a valid model into an invalid one -- and leave the mutant it was given as it
  was; one converted model in ten is also saved (inline or with external data) and
  the file checked.

Anything else is a failure, reported with the seed that reproduces it.

Bounded in time: ``AMP_FUZZ_SECONDS`` (default 40), ``AMP_FUZZ_SEED`` (default 0),
``AMP_FUZZ_MAX_CASES``. Run longer with ``AMP_FUZZ_SECONDS=600 pytest tests/test_fuzz.py -s``;
``python tests/test_fuzz.py [seconds] [seed]`` prints the statistics. Case ``i`` of seed
``s`` is reproduced by ``run_case(s * 1_000_003 + i)``.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import pytest
from onnx import AttributeProto, GraphProto, ModelProto, NodeProto
from onnx import TensorProto as TP
from onnx import helper
from onnx import numpy_helper as nh

if __name__ == "__main__":  # python tests/test_fuzz.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from amp_compiler.errors import ConversionError  # noqa: E402
from amp_compiler.onnx_api import convert_onnx  # noqa: E402
from amp_compiler.onnx_io import files  # noqa: E402

FUZZ_SECONDS = float(os.environ.get("AMP_FUZZ_SECONDS", "40"))
FUZZ_SEED = int(os.environ.get("AMP_FUZZ_SEED", "0"))
FUZZ_MAX_CASES = int(os.environ.get("AMP_FUZZ_MAX_CASES", "1000000"))
MIN_CASES = 50  # a run that gets through fewer proves little


# -- valid base models ------------------------------------------------------------------------------

def _w(rng, name, *shape, scale=None, dtype=np.float32) -> TP:
    scale = scale if scale is not None else 1 / np.sqrt(shape[0])
    return nh.from_array((rng.standard_normal(shape) * scale).astype(dtype), name)


def _c(name, values, dtype) -> TP:
    return nh.from_array(np.asarray(values, dtype=dtype), name)


def _vi(name, elem, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes, inputs, outputs, inits=(), *, opset=18, value_info=(), domains=(), functions=()) -> ModelProto:
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits), value_info=list(value_info))
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
    m = helper.make_model(g, opset_imports=opsets, functions=list(functions))
    m.ir_version = 8
    return m


def base_mlp(rng) -> ModelProto:
    n = helper.make_node
    return _model([n("MatMul", ["x", "W0"], ["h"], name="mm0"), n("Add", ["h", "b0"], ["hb"], name="bias"),
                   n("Relu", ["hb"], ["r"], name="relu"), n("MatMul", ["r", "W1"], ["y"], name="mm1")],
                  [_vi("x", TP.FLOAT, ["batch", 64])], [_vi("y", TP.FLOAT, ["batch", 32])],
                  [_w(rng, "W0", 64, 64), _w(rng, "b0", 64, scale=0.1), _w(rng, "W1", 64, 32)],
                  value_info=[_vi("h", TP.FLOAT, ["batch", 64])])


def base_attention(rng) -> ModelProto:
    n, d, s = helper.make_node, 32, 8
    nodes = [n("LayerNormalization", ["x", "ln_g", "ln_b"], ["ln"], name="ln", axis=-1, epsilon=1e-5),
             n("MatMul", ["ln", "Wqkv"], ["qkv"], name="qkv"),
             n("Split", ["qkv", "split"], ["q", "k", "v"], name="split", axis=-1),
             n("Transpose", ["k"], ["kt"], name="kt", perm=[0, 2, 1]),
             n("MatMul", ["q", "kt"], ["scores"], name="scores"),
             n("Div", ["scores", "sqrt_d"], ["scaled"], name="scale"),
             n("Constant", [], ["mask"], name="mask", value=_c("mask_v", np.triu(np.full((s, s), -1e9), 1), np.float32)),
             n("Add", ["scaled", "mask"], ["masked"], name="add_mask"),
             n("Softmax", ["masked"], ["p"], name="softmax", axis=-1),
             n("MatMul", ["p", "v"], ["ctx"], name="ctx"),
             n("Shape", ["x"], ["xs"], name="shape"),
             n("Gather", ["xs", "zero"], ["b"], name="gather_b", axis=0),
             n("Unsqueeze", ["b", "zero1"], ["b1"], name="unsq"),
             n("Concat", ["b1", "rest"], ["newshape"], name="concat", axis=0),
             n("Reshape", ["ctx", "newshape"], ["ctx2"], name="reshape"),
             n("MatMul", ["ctx2", "Wo"], ["o"], name="out_proj"),
             n("Add", ["x", "o"], ["res"], name="residual"),
             n("Mul", ["res", "half"], ["g0"], name="gelu_half"),
             n("Div", ["res", "sqrt2"], ["g1"], name="gelu_div"),
             n("Erf", ["g1"], ["g2"], name="gelu_erf"),
             n("Add", ["g2", "one"], ["g3"], name="gelu_add"),
             n("Mul", ["g0", "g3"], ["y"], name="gelu_mul")]
    inits = [_c("ln_g", np.ones(d), np.float32), _c("ln_b", np.zeros(d), np.float32), _w(rng, "Wqkv", d, 3 * d),
             _c("split", [d, d, d], np.int64), _c("sqrt_d", np.sqrt(d), np.float32), _c("zero", 0, np.int64),
             _c("zero1", [0], np.int64), _c("rest", [s, d], np.int64), _w(rng, "Wo", d, d),
             _c("half", 0.5, np.float32), _c("sqrt2", np.sqrt(2), np.float32), _c("one", 1.0, np.float32)]
    return _model(nodes, [_vi("x", TP.FLOAT, ["batch", s, d])], [_vi("y", TP.FLOAT, ["batch", s, d])], inits)


def base_convnet(rng) -> ModelProto:
    n = helper.make_node
    nodes = [n("Conv", ["x", "Wc", "bc"], ["c1"], name="conv1", pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
             n("BatchNormalization", ["c1", "bn_s", "bn_b", "bn_m", "bn_v"], ["bn"], name="bn", epsilon=1e-5),
             n("Relu", ["bn"], ["r1"], name="relu1"),
             n("MaxPool", ["r1"], ["p1"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
             n("Conv", ["p1", "Wc2"], ["c2"], name="conv2", kernel_shape=[3, 3]),
             n("GlobalAveragePool", ["c2"], ["gap"], name="gap"),
             n("Flatten", ["gap"], ["flat"], name="flatten", axis=1),
             n("Gemm", ["flat", "Wg", "bg"], ["y"], name="fc", transB=1)]
    inits = [_w(rng, "Wc", 8, 3, 3, 3, scale=0.2), _w(rng, "bc", 8, scale=0.1), _c("bn_s", np.ones(8), np.float32),
             _c("bn_b", np.zeros(8), np.float32), _c("bn_m", np.zeros(8), np.float32),
             _c("bn_v", np.ones(8), np.float32), _w(rng, "Wc2", 16, 8, 3, 3, scale=0.1),
             _w(rng, "Wg", 10, 16, scale=0.25), _w(rng, "bg", 10, scale=0.1)]
    return _model(nodes, [_vi("x", TP.FLOAT, [1, 3, 16, 16])], [_vi("y", TP.FLOAT, [1, 10])], inits)


def base_control_flow(rng) -> ModelProto:
    n, d = helper.make_node, 32
    then_b = helper.make_graph([n("MatMul", ["r", "W1"], ["t1"], name="then_mm")], "then", [],
                               [_vi("t1", TP.FLOAT, [4, d])])
    else_b = helper.make_graph([n("MatMul", ["r", "W2"], ["e1"], name="else_mm"), n("Neg", ["e1"], ["e2"], name="neg")],
                               "else", [], [_vi("e2", TP.FLOAT, [4, d])])
    body = helper.make_graph([n("MatMul", ["acc_in", "W1"], ["a1"], name="body_mm"),
                              n("Tanh", ["a1"], ["acc_out"], name="body_tanh"),
                              n("Identity", ["cond_in"], ["cond_out"], name="body_cond")], "body",
                             [_vi("i", TP.INT64, []), _vi("cond_in", TP.BOOL, []), _vi("acc_in", TP.FLOAT, [4, d])],
                             [_vi("cond_out", TP.BOOL, []), _vi("acc_out", TP.FLOAT, [4, d])])
    sbody = helper.make_graph([n("MatMul", ["xi", "W2"], ["p"], name="scan_mm"),
                               n("Add", ["s_in", "p"], ["s_out"], name="scan_add"),
                               n("Identity", ["p"], ["o"], name="scan_id")], "sbody",
                              [_vi("s_in", TP.FLOAT, [4, d]), _vi("xi", TP.FLOAT, [4, d])],
                              [_vi("s_out", TP.FLOAT, [4, d]), _vi("o", TP.FLOAT, [4, d])])
    nodes = [n("MatMul", ["x", "W0"], ["h"], name="mm0"), n("Relu", ["h"], ["r"], name="relu"),
             n("If", ["c"], ["yi"], name="if", then_branch=then_b, else_branch=else_b),
             n("Loop", ["trip", "", "yi"], ["yl"], name="loop", body=body),
             n("Unsqueeze", ["yl", "zero1"], ["yl3"], name="unsq"),
             n("Concat", ["yl3", "yl3"], ["seq"], name="concat", axis=0),
             n("Scan", ["s0", "seq"], ["y", "ys"], name="scan", body=sbody, num_scan_inputs=1)]
    inits = [_w(rng, "W0", d, d), _w(rng, "W1", d, d), _w(rng, "W2", d, d), _c("trip", 2, np.int64),
             _c("zero1", [0], np.int64), _c("s0", np.zeros((4, d)), np.float32)]
    return _model(nodes, [_vi("x", TP.FLOAT, [4, d]), _vi("c", TP.BOOL, [])],
                  [_vi("y", TP.FLOAT, [4, d]), _vi("ys", TP.FLOAT, [2, 4, d])], inits)


def base_partly_fp16(rng) -> ModelProto:
    n = helper.make_node
    return _model([n("Cast", ["x"], ["x16"], name="c0", to=TP.FLOAT16), n("MatMul", ["x16", "W0"], ["h16"], name="mm0"),
                   n("Cast", ["h16"], ["h"], name="c1", to=TP.FLOAT), n("Sigmoid", ["h"], ["s"], name="sig"),
                   n("MatMul", ["s", "W1"], ["y"], name="mm1")],
                  [_vi("x", TP.FLOAT, [8, 32])], [_vi("y", TP.FLOAT, [8, 32])],
                  [_w(rng, "W0", 32, 32, dtype=np.float16), _w(rng, "W1", 32, 32)])


def base_qdq(rng) -> ModelProto:
    n = helper.make_node
    nodes = [n("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="q"), n("DequantizeLinear", ["xq", "xs", "xz"], ["xd"], name="dq"),
             n("DequantizeLinear", ["Wq", "ws", "wz"], ["Wd"], name="dqw"), n("MatMul", ["xd", "Wd"], ["h"], name="mm0"),
             n("Relu", ["h"], ["r"], name="relu"), n("MatMul", ["r", "W1"], ["y"], name="mm1")]
    inits = [_c("xs", 0.05, np.float32), _c("xz", 0, np.int8), _c("Wq", rng.integers(-64, 64, (32, 32)), np.int8),
             _c("ws", 0.01, np.float32), _c("wz", 0, np.int8), _w(rng, "W1", 32, 32)]
    return _model(nodes, [_vi("x", TP.FLOAT, [8, 32])], [_vi("y", TP.FLOAT, [8, 32])], inits)


def base_custom(rng) -> ModelProto:
    n = helper.make_node
    fn = helper.make_function("com.example", "Square", ["a"], ["b"], [n("Mul", ["a", "a"], ["b"])],
                              [helper.make_opsetid("", 18)])
    nodes = [n("MatMul", ["x", "W0"], ["h"], name="mm0"), n("Square", ["h"], ["sq"], name="square", domain="com.example"),
             n("MyOp", ["sq"], ["r"], name="custom", domain="com.example", alpha=0.5),
             n("MatMul", ["r", "W1"], ["y"], name="mm1")]
    return _model(nodes, [_vi("x", TP.FLOAT, [8, 32])], [_vi("y", TP.FLOAT, [8, 32])],
                  [_w(rng, "W0", 32, 32), _w(rng, "W1", 32, 32)], value_info=[_vi("r", TP.FLOAT, [8, 32])],
                  domains=["com.example"], functions=[fn])


def base_misc(rng) -> ModelProto:
    n = helper.make_node
    nodes = [n("MatMul", ["x", "W0"], ["h"], name="mm0"),
             n("ReduceMean", ["h", "axes"], ["mean"], name="mean", keepdims=1),
             n("Sub", ["h", "mean"], ["hc"], name="center"), n("Pow", ["hc", "two"], ["sq"], name="pow"),
             n("ReduceSum", ["sq", "axes"], ["ss"], name="sum", keepdims=1), n("Sqrt", ["ss"], ["norm"], name="sqrt"),
             n("Add", ["norm", "eps"], ["norm_e"], name="add_eps"), n("Div", ["hc", "norm_e"], ["hn"], name="normalize"),
             n("Exp", ["hn"], ["e"], name="exp"), n("Log", ["e"], ["le"], name="log"),
             n("Greater", ["le", "zero_f"], ["pos"], name="gt"), n("Where", ["pos", "le", "zero_f"], ["relu"], name="where"),
             n("Cast", ["pos"], ["pos_i"], name="to_int", to=TP.INT64),
             n("CumSum", ["relu", "axis1"], ["cs"], name="cumsum"),
             n("Shape", ["cs"], ["shape"], name="shape"),
             n("ConstantOfShape", ["shape"], ["ones"], name="ones", value=_c("one_v", [1.0], np.float32)),
             n("Mul", ["cs", "ones"], ["cs1"], name="mul_ones"),
             n("Expand", ["bias", "shape"], ["bias_e"], name="expand"), n("Add", ["cs1", "bias_e"], ["z"], name="add_bias"),
             n("MatMul", ["z", "W1"], ["y"], name="mm1"),
             n("ReduceMax", ["pos_i"], ["count"], name="rmax", keepdims=0)]
    inits = [_w(rng, "W0", 16, 16), _c("axes", [1], np.int64), _c("two", 2.0, np.float32), _c("eps", 1e-6, np.float32),
             _c("zero_f", 0.0, np.float32), _c("axis1", 1, np.int64), _w(rng, "bias", 16, scale=0.1),
             _w(rng, "W1", 16, 16)]
    return _model(nodes, [_vi("x", TP.FLOAT, [4, 16])], [_vi("y", TP.FLOAT, [4, 16]), _vi("count", TP.INT64, [])], inits)


BASES: dict[str, Callable[[np.random.Generator], ModelProto]] = {
    "mlp": base_mlp, "attention": base_attention, "convnet": base_convnet, "control_flow": base_control_flow,
    "partly_fp16": base_partly_fp16, "qdq": base_qdq, "custom": base_custom, "misc": base_misc,
}
_BASE_CACHE: dict[str, bytes] = {}


def base_model(name: str) -> ModelProto:
    if name not in _BASE_CACHE:
        _BASE_CACHE[name] = BASES[name](np.random.default_rng(1)).SerializeToString()
    m = ModelProto()
    m.ParseFromString(_BASE_CACHE[name])
    return m


# -- where to mutate --------------------------------------------------------------------------------

def _graphs(m: ModelProto) -> list[GraphProto]:
    out = []

    def walk(g: GraphProto) -> None:
        out.append(g)
        for node in g.node:
            for a in node.attribute:
                if a.HasField("g"):
                    walk(a.g)
                for sub in a.graphs:
                    walk(sub)

    walk(m.graph)
    return out


def _graph(m: ModelProto, rng) -> GraphProto:
    """The main graph half of the time, else any (sub)graph."""
    graphs = _graphs(m)
    return graphs[0] if rng.random() < 0.5 or len(graphs) == 1 else graphs[int(rng.integers(len(graphs)))]


def _pick(rng, seq):
    seq = list(seq)
    return seq[int(rng.integers(len(seq)))] if seq else None


def _value_infos(m: ModelProto):
    return [vi for g in _graphs(m) for vi in (*g.input, *g.output, *g.value_info) if vi.type.HasField("tensor_type")]


def _names(g: GraphProto) -> list[str]:
    return [i.name for i in g.input] + [t.name for t in g.initializer] + [o for n in g.node for o in n.output if o]


_DTYPES = [v for v in TP.DataType.values()] + [99, -3]
_OPS = ["Relu", "MatMul", "Add", "Softmax", "Cast", "Reshape", "Transpose", "Conv", "Gemm", "LayerNormalization",
        "Identity", "Concat", "Split", "If", "Loop", "Bogus", "Constant", "Shape", "ReduceSum", "Where", "Resize"]


# -- mutators: each mutates in place and returns a description, or None when it does not apply --------

def mut_elem_type(m, rng):
    vi = _pick(rng, _value_infos(m))
    if vi is None:
        return None
    vi.type.tensor_type.elem_type = int(_pick(rng, _DTYPES))
    return f"dtype of {vi.name} -> {vi.type.tensor_type.elem_type}"


def mut_init_dtype(m, rng):
    t = _pick(rng, [t for g in _graphs(m) for t in g.initializer])
    if t is None:
        return None
    t.data_type = int(_pick(rng, _DTYPES))
    return f"initializer {t.name} data_type -> {t.data_type}"


def mut_dtype_attr(m, rng):
    node = _pick(rng, [n for g in _graphs(m) for n in g.node if n.op_type in ("Cast", "ConstantOfShape", "Constant")])
    if node is None:
        return None
    for a in node.attribute:
        if a.type == AttributeProto.INT:
            a.i = int(_pick(rng, _DTYPES))
        elif a.type == AttributeProto.TENSOR:
            a.t.data_type = int(_pick(rng, _DTYPES))
    return f"dtype attribute of {node.name}"


def mut_dim(m, rng):
    vi = _pick(rng, [v for v in _value_infos(m) if v.type.tensor_type.HasField("shape")])
    if vi is None:
        return None
    dims = vi.type.tensor_type.shape.dim
    choice = rng.integers(4)
    if choice == 0 or not len(dims):
        vi.type.tensor_type.ClearField("shape")
        return f"shape of {vi.name} dropped"
    d = dims[int(rng.integers(len(dims)))]
    if choice == 1:
        d.dim_param = _pick(rng, ["batch", "seq", "n", "?"])
    elif choice == 2:
        d.dim_value = int(_pick(rng, [0, 1, 2, 3, 7, 64, 10 ** 9]))
    else:
        d.dim_value = -int(rng.integers(1, 5))
    return f"a dim of {vi.name} changed"


def mut_rank(m, rng):
    vi = _pick(rng, [v for v in _value_infos(m) if v.type.tensor_type.HasField("shape")])
    if vi is None:
        return None
    dims = vi.type.tensor_type.shape.dim
    if rng.random() < 0.5 and len(dims):
        del dims[int(rng.integers(len(dims)))]
    else:
        dims.add().dim_value = int(rng.integers(1, 9))
    return f"rank of {vi.name} changed"


def mut_init_dims(m, rng):
    t = _pick(rng, [t for g in _graphs(m) for t in g.initializer])
    if t is None:
        return None
    choice = rng.integers(4)
    if choice == 0 and len(t.dims) > 1:
        dims = list(t.dims)[::-1]
        del t.dims[:]
        t.dims.extend(dims)
    elif choice == 1:
        t.dims.append(int(rng.integers(1, 4)))
    elif choice == 2 and len(t.dims):
        t.dims[int(rng.integers(len(t.dims)))] = int(_pick(rng, [0, 1, 5, -2]))
    else:
        del t.dims[:]
    return f"dims of initializer {t.name} -> {list(t.dims)}"


def mut_dangling(m, rng):
    g = _graph(m, rng)
    node = _pick(rng, [n for n in g.node if n.input])
    if node is None:
        return None
    k = int(rng.integers(len(node.input)))
    node.input[k] = f"ghost_{int(rng.integers(1000))}"
    return f"input {k} of {node.name or node.op_type} dangling"


def mut_remove(m, rng):
    g = _graph(m, rng)
    what = rng.integers(4)
    seq = [g.node, g.initializer, g.input, g.value_info][what]
    if not len(seq):
        return None
    k = int(rng.integers(len(seq)))
    name = seq[k].name
    del seq[k]
    return f"removed {['node', 'initializer', 'input', 'value_info'][what]} {name}"


def mut_dup_name(m, rng):
    g = _graph(m, rng)
    names = _names(g)
    node = _pick(rng, [n for n in g.node if n.output])
    if node is None or not names:
        return None
    k = int(rng.integers(len(node.output)))
    node.output[k] = _pick(rng, names)
    return f"output {k} of {node.name or node.op_type} renamed to {node.output[k]}"


def mut_dup_entry(m, rng):
    g = _graph(m, rng)
    what = rng.integers(3)
    seq = [g.node, g.initializer, g.input][what]
    if not len(seq):
        return None
    seq.append(seq[int(rng.integers(len(seq)))])
    return f"duplicated a {['node', 'initializer', 'input'][what]}"


def mut_cycle(m, rng):
    g = _graph(m, rng)
    if not len(g.node):
        return None
    i = int(rng.integers(len(g.node)))
    j = int(rng.integers(i, len(g.node)))
    src, dst = g.node[j], g.node[i]
    outs = [o for o in src.output if o]
    if not outs or not len(dst.input):
        return None
    dst.input[int(rng.integers(len(dst.input)))] = _pick(rng, outs)
    return f"{dst.name or dst.op_type} reads {src.name or src.op_type}'s output (cycle or self-loop)"


def mut_order(m, rng):
    g = _graph(m, rng)
    nodes = list(g.node)
    if len(nodes) < 2:
        return None
    order = rng.permutation(len(nodes))
    copies = []
    for k in order:
        c = NodeProto()
        c.CopyFrom(nodes[k])
        copies.append(c)
    del g.node[:]
    g.node.extend(copies)
    return "node order shuffled"


def mut_attr(m, rng):
    node = _pick(rng, [n for g in _graphs(m) for n in g.node])
    if node is None:
        return None
    choice = rng.integers(5)
    if choice == 0 and len(node.attribute):
        k = int(rng.integers(len(node.attribute)))
        name = node.attribute[k].name
        del node.attribute[k]
        return f"attribute {name} of {node.name} deleted"
    if choice == 1:
        node.attribute.append(helper.make_attribute(_pick(rng, ["axis", "foo", "perm", "to", "alpha"]),
                                                    _pick(rng, [1, 0.5, "s", [1, 2], [0.5]])))
        return f"attribute added to {node.name}"
    a = _pick(rng, node.attribute)
    if a is None:
        return None
    if choice == 2:  # another type under the same name
        new = helper.make_attribute(a.name, _pick(rng, [3, 2.5, "x", [0, 1], [1.5, 2.5]]))
        a.CopyFrom(new)
        return f"attribute {a.name} of {node.name} retyped"
    if choice == 3 and a.type in (AttributeProto.INT, AttributeProto.INTS):
        if a.type == AttributeProto.INT:
            a.i = int(_pick(rng, [-9, -1, 0, 2, 5, 2 ** 40]))
        else:
            del a.ints[:]
            a.ints.extend(int(v) for v in rng.integers(-3, 5, int(rng.integers(0, 5))))
        return f"attribute {a.name} of {node.name} value changed"
    if a.type == AttributeProto.GRAPH:
        a.g.CopyFrom(helper.make_graph([], "empty", [], []))
        return f"subgraph {a.name} of {node.name} emptied"
    if a.type == AttributeProto.TENSOR:
        a.t.raw_data = b"\x00" * int(rng.integers(0, 9))
        return f"tensor attribute {a.name} of {node.name} corrupted"
    return None


def mut_op(m, rng):
    node = _pick(rng, [n for g in _graphs(m) for n in g.node])
    if node is None:
        return None
    if rng.random() < 0.7:
        node.op_type = _pick(rng, _OPS)
    else:
        node.domain = _pick(rng, ["com.example", "ai.onnx.ml", "com.microsoft", "bogus.domain", "ai.onnx"])
    return f"node {node.name} -> {node.domain}::{node.op_type}"


def mut_opset(m, rng):
    choice = rng.integers(4)
    if choice == 0 and len(m.opset_import):
        m.opset_import[0].version = int(rng.integers(1, 31))
        return f"opset -> {m.opset_import[0].version}"
    if choice == 1 and len(m.opset_import):
        del m.opset_import[int(rng.integers(len(m.opset_import)))]
        return "an opset_import removed"
    if choice == 2:
        m.opset_import.append(helper.make_opsetid(_pick(rng, ["", "ai.onnx", "com.example"]), int(rng.integers(1, 30))))
        return "an opset_import added"
    m.ir_version = int(rng.integers(0, 20))
    return f"ir_version -> {m.ir_version}"


def mut_graph_io(m, rng):
    g = _graph(m, rng)
    choice = rng.integers(4)
    if choice == 0 and len(g.output):
        g.output[int(rng.integers(len(g.output)))].name = _pick(rng, _names(g) + ["ghost_out"])
        return "a graph output renamed"
    if choice == 1:
        del g.output[:]
        return "graph outputs removed"
    if choice == 2 and len(g.input):
        g.input[int(rng.integers(len(g.input)))].name = _pick(rng, _names(g) + ["ghost_in"])
        return "a graph input renamed"
    g.input.append(_vi(_pick(rng, _names(g) + ["extra"]), TP.FLOAT, [2]))
    return "a graph input added"


def mut_data(m, rng):
    t = _pick(rng, [t for g in _graphs(m) for t in g.initializer])
    if t is None:
        return None
    choice = rng.integers(5)
    if choice == 0:
        raw = t.raw_data
        t.raw_data = raw[: int(rng.integers(0, len(raw) + 1))] if raw else b"\x01\x02\x03"
        return f"raw_data of {t.name} cut"
    if choice == 1 and t.data_type == TP.FLOAT and t.raw_data:
        values = np.frombuffer(t.raw_data, np.float32).copy()
        values[int(rng.integers(values.size))] = _pick(rng, [np.nan, np.inf, -np.inf, 1e10, -7e4, 1e-30])
        t.raw_data = values.tobytes()
        return f"a value of {t.name} made extreme"
    if choice == 2 and t.raw_data:
        t.ClearField("raw_data")
        t.float_data.extend([1.0] * int(rng.integers(0, 5)))
        return f"{t.name} moved to float_data"
    if choice == 3:
        t.data_location = TP.EXTERNAL
        entry = t.external_data.add()
        entry.key, entry.value = "location", _pick(rng, ["w.bin", "../w.bin", "/etc/passwd", ""])
        return f"{t.name} made external (no file)"
    t.ClearField("raw_data")
    return f"data of {t.name} removed"


MUTATORS: dict[str, Callable] = {
    "dtype": mut_elem_type, "init_dtype": mut_init_dtype, "dtype_attr": mut_dtype_attr, "dim": mut_dim,
    "rank": mut_rank, "init_dims": mut_init_dims, "dangling": mut_dangling, "remove": mut_remove,
    "duplicate_name": mut_dup_name, "duplicate_entry": mut_dup_entry, "cycle": mut_cycle, "order": mut_order,
    "attribute": mut_attr, "op": mut_op, "opset": mut_opset, "graph_io": mut_graph_io, "data": mut_data,
}


def mutate_bytes(data: bytes, rng) -> tuple[bytes, str]:
    data = bytearray(data)
    choice = rng.integers(3)
    if choice == 0:
        cut = int(rng.integers(0, len(data)))
        return bytes(data[:cut]), f"truncated to {cut} bytes"
    if choice == 1:
        for _ in range(int(rng.integers(1, 8))):
            k = int(rng.integers(len(data)))
            data[k] ^= 1 << int(rng.integers(8))
        return bytes(data), "bits flipped"
    k = int(rng.integers(len(data)))
    junk = rng.integers(0, 256, int(rng.integers(1, 64)), dtype=np.uint8).tobytes()
    return bytes(data[:k] + junk + data[k:]), "junk inserted"


# -- one case -------------------------------------------------------------------------------------

def _checker(model: ModelProto, full: bool) -> bool:
    try:
        onnx.checker.check_model(model, full_check=full)
        return True
    except Exception:  # noqa: BLE001 - any refusal by onnx counts
        return False


def run_case(seed: int, workdir: Path | None = None) -> dict:
    """Mutate, convert, judge. Returns {outcome, base, mutations, options, error}."""
    rng = np.random.default_rng(seed)
    base = _pick(rng, sorted(BASES))
    model = base_model(base)
    kinds, mutations = [], []
    for _ in range(int(rng.integers(1, 4))):
        kind = _pick(rng, sorted(MUTATORS))
        try:
            desc = MUTATORS[kind](model, rng)
        except (ValueError, IndexError):  # the mutator could not apply to this mutant: a fuzzer matter
            desc = None
        if desc:
            kinds.append(kind)
            mutations.append(desc)
    options = {"planner": _pick(rng, ["all", "all", "optimal", "greedy"]), "dtype": _pick(rng, ["fp16", "fp16", "bf16"]),
               "keep_io_types": bool(rng.random() < 0.8)}
    result = {"seed": seed, "base": base, "kinds": kinds, "mutations": mutations, "options": options}
    try:
        if rng.random() < 0.12 and workdir is not None:  # through the file loader, bytes mutated
            data, desc = mutate_bytes(model.SerializeToString(), rng)
            kinds.append("bytes")
            mutations.append(desc)
            path = workdir / f"case{seed}.onnx"
            path.write_bytes(data)
            try:
                model = files.load_model(path)
            finally:
                path.unlink()
        before = model.SerializeToString()
        converted, _ = convert_onnx(model, source=f"fuzz-{seed}", **options)
    except ConversionError as exc:
        result.update(outcome="refused", error=exc.reason)
        return result
    except Exception as exc:  # noqa: BLE001 - what the fuzzer hunts
        result.update(outcome="unhandled", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
        return result
    if model.SerializeToString() != before:
        result.update(outcome="bad output", error="convert_onnx modified the model it was given")
    elif not _checker(converted, full=False) and _checker(model, full=False):  # not ONNX Runtime's own ops
        result.update(outcome="bad output", error=_checker_error(converted, False))  # (onnx_io/ort_onnx_ops.py)
    elif _checker(model, full=True) and not _checker(converted, full=True):
        result.update(outcome="bad output", error="full_check fails on the output but not the input: "
                                                  + _checker_error(converted, True))
    else:
        result.update(outcome="converted", error=None)
        if workdir is not None and rng.random() < 0.1:  # and it saves, inline or as external data
            saved = workdir / f"out{seed}.onnx"
            try:
                files.save_model(converted, saved, external=bool(rng.random() < 0.5))
                onnx.checker.check_model(str(saved))
            except Exception as exc:  # noqa: BLE001
                result.update(outcome="bad output", error=f"saving: {type(exc).__name__}: {exc}",
                              traceback=traceback.format_exc())
            finally:
                for leftover in (saved, saved.with_name(saved.name + ".data")):
                    leftover.unlink(missing_ok=True)
    return result


def _checker_error(model: ModelProto, full: bool) -> str:
    try:
        onnx.checker.check_model(model, full_check=full)
        return ""
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def fuzz(seconds: float, seed: int, max_cases: int = FUZZ_MAX_CASES) -> dict:
    deadline = time.monotonic() + seconds
    outcomes: Counter = Counter()
    kinds: Counter = Counter()
    refusals: Counter = Counter()
    failures: list[dict] = []
    cases = 0
    with tempfile.TemporaryDirectory(prefix="amp-fuzz-") as tmp:
        while cases < max_cases and time.monotonic() < deadline:
            result = run_case(seed * 1_000_003 + cases, Path(tmp))
            cases += 1
            outcomes[result["outcome"]] += 1
            kinds.update(result["kinds"])
            if result["outcome"] == "refused":
                refusals[_reason_kind(result["error"])] += 1
            elif result["outcome"] not in ("converted",):
                failures.append(result)
    return {"cases": cases, "seconds": seconds, "seed": seed, "outcomes": outcomes, "kinds": kinds,
            "refusals": refusals, "failures": failures}


def _reason_kind(reason: str) -> str:
    for prefix in ("invalid ONNX model", "type inference failed", "shape inference failed", "external data",
                   "not produced", "defined twice", "cycle", "raw_data", "data type", "element type", "opset",
                   "IR version", "negative dimension", "has no data", "corrupt", "truncated", "not an ONNX model",
                   "domain", "shadows", "values but its shape", "type and shape inference failed"):
        if prefix in reason:
            return prefix
    return reason[:50]


def summary(stats: dict) -> str:
    lines = [f"fuzz: {stats['cases']} cases in {stats['seconds']:.0f} s (seed {stats['seed']}): "
             + ", ".join(f"{k} {v}" for k, v in stats["outcomes"].most_common()),
             "  mutations applied: " + ", ".join(f"{k} {v}" for k, v in stats["kinds"].most_common()),
             "  refusal reasons: " + ", ".join(f"{k} {v}" for k, v in stats["refusals"].most_common(12))]
    for f in stats["failures"][:5]:
        lines.append(f"  FAILURE seed={f['seed']} base={f['base']} {f['options']} mutations={f['mutations']}: "
                     f"{f['outcome']}: {f['error']}\n{f.get('traceback', '')}")
    return "\n".join(lines)


# -- tests ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(BASES))
def test_base_models_are_valid_and_convert(name):
    """The fuzzer starts from valid models: each passes full_check and converts to one that does."""
    model = base_model(name)
    onnx.checker.check_model(model, full_check=True)
    for planner in ("all", "optimal"):
        converted, report = convert_onnx(model, planner=planner, source=name)
        onnx.checker.check_model(converted, full_check=True)
    if name not in ("custom",):  # "all" puts something in FP16: the fuzzer exercises casts and folding
        converted, report = convert_onnx(model, planner="all", source=name)
        assert any(o["precision"] == "float16" for o in report.ops)


def test_mutation_fuzzing_has_no_unhandled_exception(capsys):
    stats = fuzz(FUZZ_SECONDS, FUZZ_SEED)
    with capsys.disabled():
        print("\n" + summary(stats))
    assert stats["cases"] >= MIN_CASES
    assert stats["outcomes"]["converted"] > 0 and stats["outcomes"]["refused"] > 0
    assert not stats["failures"], summary(stats)


if __name__ == "__main__":
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else FUZZ_SECONDS
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else FUZZ_SEED
    print(summary(fuzz(seconds, seed)))
