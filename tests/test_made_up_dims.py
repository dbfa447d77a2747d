"""Dims ONNX Runtime's symbolic inference used to make up in TorchScript exports are related to the
inputs': folded shape inputs (``onnx_io/shape_folding.py``), an arange written as NonZero
(``onnx_io/nonzero_ranges.py``), Flatten (``onnx_io/symbolic_dims.py``); and Einsum's FLOPs."""

from __future__ import annotations

from onnx import TensorProto, helper

from amp_compiler import convert_onnx
from amp_compiler.report.text import render_text

from .builders import fin, model, weight


def _ints(name: str, *values: int, scalar: bool = False):
    return helper.make_tensor(name, TensorProto.INT64, [] if scalar else [len(values)], list(values))


def _padded_projection(rows=6):
    """x [batch, 6, 32] padded to 16 rows, as a TorchScript export writes ``F.pad(x, (0, 0, 0, pad))``
    with ``pad = (16 - rows % 16) % 16`` read off ``x.shape``: the torch-ordered pads go through
    Concat, Reshape to pairs, a reversing Slice, Transpose, Reshape and Cast; then a projection."""
    nodes = [helper.make_node("Shape", ["x"], ["shape"], name="shape"),
             helper.make_node("Gather", ["shape", "one"], ["rows"], name="rows", axis=0),
             helper.make_node("Mod", ["rows", "window"], ["rest"], name="rest"),
             helper.make_node("Sub", ["window", "rest"], ["short"], name="short"),
             helper.make_node("Mod", ["short", "window"], ["pad"], name="pad"),
             helper.make_node("Unsqueeze", ["pad", "zero"], ["pad1"], name="pad1"),
             helper.make_node("Concat", ["two_zeros", "zero", "pad1"], ["torch_pads"], name="torch_pads", axis=0),
             helper.make_node("ConstantOfShape", ["two"], ["lead"], name="lead",
                              value=helper.make_tensor("v", TensorProto.INT64, [1], [0])),
             helper.make_node("Concat", ["torch_pads", "lead"], ["all_pads"], name="all_pads", axis=0),
             helper.make_node("Reshape", ["all_pads", "pairs"], ["paired"], name="paired"),
             helper.make_node("Slice", ["paired", "minus_one", "far", "zero", "minus_one"], ["reversed"],
                              name="reversed"),
             helper.make_node("Transpose", ["reversed"], ["onnx_order"], name="onnx_order", perm=[1, 0]),
             helper.make_node("Reshape", ["onnx_order", "minus_one"], ["flat"], name="flat"),
             helper.make_node("Cast", ["flat"], ["pads"], name="pads", to=TensorProto.INT64),
             helper.make_node("Pad", ["x", "pads"], ["padded"], name="pad_rows"),
             helper.make_node("MatMul", ["padded", "W"], ["y"], name="proj")]
    ints = [_ints("one", 1, scalar=True), _ints("window", 16, scalar=True), _ints("zero", 0), _ints("two", 2),
            _ints("two_zeros", 0, 0), _ints("pairs", -1, 2), _ints("minus_one", -1), _ints("far", -2**63 + 1)]
    return model(nodes, [fin("x", "batch", rows, 32)], [fin("y", "batch", None, 64)], [weight("W", 32, 64), *ints])


def test_a_pad_computed_from_static_dims_is_sized():
    """A Swin exported with ``dynamo=False`` pads to its window this way: ONNX Runtime's inference
    gave the Pad made-up dims, and 13 of its 17 MatMuls were priced at ``--default-dim`` (87.8 MFLOP
    of 121.7 at batch 8). Folding fixed it first; the ``Mod`` rule alone does too."""
    report = convert_onnx(_padded_projection(), dim_values={"batch": 4})[1]
    assert report.summary["gemm_flops"] == 2 * 4 * 16 * 32 * 64


def test_a_pad_computed_from_a_dynamic_dim_is_sized_by_it():
    """Where the padded dim is dynamic nothing folds: the padding is ``Mod`` arithmetic of it, which
    ONNX Runtime's inference did not carry (a Longformer's unpadding Slice kept a made-up dim)."""
    for rows, padded in ((6, 16), (40, 48), (32, 32)):
        report = convert_onnx(_padded_projection("rows"), dim_values={"batch": 4, "rows": rows})[1]
        assert report.summary["gemm_flops"] == 2 * 4 * padded * 32 * 64


def _arange_gather():
    """``x[:, torch.arange(x.shape[1])]`` as the TorchScript exporter writes the arange:
    ``NonZero(ConstantOfShape([rows], value=1))``; then a projection of the gathered rows."""
    one = helper.make_tensor("fill", TensorProto.INT64, [1], [1])
    nodes = [helper.make_node("Shape", ["x"], ["shape"], name="shape"),
             helper.make_node("Gather", ["shape", "one"], ["rows"], name="rows", axis=0),
             helper.make_node("Unsqueeze", ["rows", "zero"], ["rows1"], name="rows1"),
             helper.make_node("ConstantOfShape", ["rows1"], ["ones"], name="ones", value=one),
             helper.make_node("NonZero", ["ones"], ["where"], name="where"),
             helper.make_node("Reshape", ["where", "minus_one"], ["index"], name="index"),
             helper.make_node("Gather", ["x", "index"], ["picked"], name="pick", axis=1),
             helper.make_node("MatMul", ["picked", "W"], ["y"], name="proj")]
    ints = [_ints("one", 1, scalar=True), _ints("zero", 0), _ints("minus_one", -1)]
    return model(nodes, [fin("x", "batch", "seq", 32)], [fin("y", "batch", None, 64)], [weight("W", 32, 64), *ints])


def test_an_arange_written_as_nonzero_is_sized():
    """A Longformer exported with ``dynamo=False`` indexes its attention chunks so: 281 dims were
    made up and its Einsums priced at ``--default-dim``; 3 are left."""
    report = convert_onnx(_arange_gather(), dim_values={"batch": 4, "seq": 64})[1]
    assert report.summary["gemm_flops"] == 2 * 4 * 64 * 32 * 64


def test_an_einsum_is_priced_by_its_equation():
    """The Longformer's chunked ``bcxd,bcyd->bcxy`` was priced from its operands' sizes: 1.93 MFLOP
    of a true 0.20 MFLOP (``cost_model/flops.py``)."""
    nodes = [helper.make_node("Einsum", ["q", "k"], ["scores"], name="scores", equation="bcxd,bcyd->bcxy")]
    m = model(nodes, [fin("q", "batch", 3, 8, 16), fin("k", "batch", 3, 8, 16)], [fin("scores", "batch", 3, 8, 8)])
    report = convert_onnx(m, dim_values={"batch": 32})[1]
    assert {op["name"]: op["flops"] for op in report.ops}["scores"] == 2 * 32 * 3 * 8 * 8 * 16


def test_a_flatten_of_symbolic_dims_is_sized():
    """ONNX Runtime's inference has no rule for Flatten and named both its dims anew: a projection of
    ``[batch, seq, 16]`` flattened at axis 2 was priced at 64 rows of 2048 (256x under)."""
    nodes = [helper.make_node("Flatten", ["x"], ["flat"], name="flatten", axis=2),
             helper.make_node("MatMul", ["flat", "W"], ["y"], name="proj")]
    m = model(nodes, [fin("x", "batch", "seq", 16)], [fin("y", None, 16)], [weight("W", 16, 16)])
    report = convert_onnx(m, dim_values={"batch": 64, "seq": 32})[1]
    assert report.summary["gemm_flops"] == 2 * (64 * 32) * 16 * 16


def test_gemms_sized_by_a_made_up_dim_are_said_whatever_the_plan():
    """Rows picked by a NonZero of data are unknowable: the report says the GEMM's FLOPs are a guess
    (before, only a plan left FP32 by cost named ``--default-dim``), and says nothing where every
    dim a GEMM reads is the inputs'."""
    nodes = [helper.make_node("NonZero", ["mask"], ["where"], name="where"),
             helper.make_node("Reshape", ["where", "minus_one"], ["index"], name="index"),
             helper.make_node("Gather", ["x", "index"], ["picked"], name="pick", axis=0),
             helper.make_node("MatMul", ["picked", "W"], ["y"], name="proj")]
    m = model(nodes, [fin("x", "batch", 32), fin("mask", "batch", dtype=TensorProto.BOOL)], [fin("y", None, 64)],
              [weight("W", 32, 64), _ints("minus_one", -1)])
    report = convert_onnx(m, dim_values={"batch": 16})[1]
    line = report.summary["guessed_gemm_sizes"]
    assert line.startswith("1 tensor-core ops (100% of GEMM/conv FLOPs)") and "sized 8" in line and "proj" in line
    assert "! " + line[:40] in render_text(report)
    assert "guessed_gemm_sizes" not in convert_onnx(_arange_gather(), dim_values={"batch": 4, "seq": 64})[1].summary


def _patches():
    """MobileViT's unfold as a TorchScript export writes it: ``[batch * patch_area, -1, channels]``,
    the patch area ``int(ceil(height / 2.0))`` in floats, times the batch read off the shape."""
    def dim(i):
        return [helper.make_node("Gather", ["shape", f"i{i}"], [f"d{i}"], name=f"d{i}", axis=0)]
    nodes = [helper.make_node("Shape", ["x"], ["shape"], name="shape"), *dim(0), *dim(2),
             helper.make_node("Cast", ["d2"], ["height"], name="height", to=TensorProto.FLOAT),
             helper.make_node("Div", ["height", "two"], ["half"], name="half"),
             helper.make_node("Ceil", ["half"], ["up"], name="up"),
             helper.make_node("Cast", ["up"], ["area"], name="area", to=TensorProto.INT64),
             helper.make_node("Mul", ["d0", "area"], ["rows"], name="rows"),
             helper.make_node("Unsqueeze", ["rows", "zero"], ["rows1"], name="rows1"),
             helper.make_node("Concat", ["rows1", "rest"], ["target"], name="target", axis=0),
             helper.make_node("Reshape", ["x", "target"], ["patches"], name="patches"),
             helper.make_node("MatMul", ["patches", "W"], ["y"], name="proj")]
    ints = [_ints("i0", 0, scalar=True), _ints("i2", 2, scalar=True), _ints("zero", 0), _ints("rest", -1, 32),
            helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])]
    return model(nodes, [fin("x", "batch", 32, 8, 8)], [fin("y", None, None, 16)], [weight("W", 32, 16), *ints])


def test_a_constant_part_of_a_shape_computed_in_floats_is_folded():
    """ONNX Runtime's inference carries no value through a float Cast: a MobileViT exported with
    ``dynamo=False`` kept 165 made-up dims after its first unfold (75 GEMMs, 14% of the FLOPs)."""
    report = convert_onnx(_patches(), dim_values={"batch": 4})[1]
    assert report.summary["gemm_flops"] == 2 * (4 * 4) * 16 * 32 * 16


def test_an_einsum_index_broadcast_in_one_operand_takes_the_larger_size():
    nodes = [helper.make_node("Einsum", ["a", "b"], ["c"], name="mix", equation="bij,bjk->bik")]
    m = model(nodes, [fin("a", "batch", 8, 16), fin("b", 1, 16, 4)], [fin("c", "batch", 8, 4)])
    report = convert_onnx(m, dim_values={"batch": 32})[1]
    assert {op["name"]: op["flops"] for op in report.ops}["mix"] == 2 * 32 * 8 * 16 * 4
