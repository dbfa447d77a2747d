"""What a first ``amp-compile`` run on an exported ONNX file meets outside the zoo's models: every
error names the file, whichever stage raised it."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from amp_compiler.cli import main


def _bf16_model(input_dtype: int) -> onnx.ModelProto:
    """x -> Cast(bf16) -> MatMul(bf16 W) -> Cast(float) -> y: a model already in BF16, as
    ``model.to(torch.bfloat16)`` exports it (ONNX Runtime's CPU provider has no BF16 MatMul)."""
    w = numpy_helper.from_array(np.ones((16, 16), np.float32), "W32")
    nodes = [helper.make_node("Cast", ["x"], ["xb"], name="to_bf16", to=TensorProto.BFLOAT16),
             helper.make_node("Cast", ["W32"], ["W"], name="w_bf16", to=TensorProto.BFLOAT16),
             helper.make_node("MatMul", ["xb", "W"], ["yb"], name="mm"),
             helper.make_node("Cast", ["yb"], ["y"], name="to_f32", to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "bf16", [helper.make_tensor_value_info("x", input_dtype, [2, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_model_errors_raised_without_a_file_name_it(tmp_path, capsys):
    """Inputs that cannot be drawn for a BF16 graph input, and ONNX Runtime refusing "the converted
    model", had printed no file at all; the line now starts with the input's path."""
    for case, dtype, extra in (("drawn", TensorProto.BFLOAT16, []), ("ort", TensorProto.FLOAT, ["--inputs", "x.npz"])):
        path = tmp_path / f"{case}.onnx"
        onnx.save(_bf16_model(dtype), path)
        np.savez(tmp_path / "x.npz", x=np.ones((2, 16), np.float32))
        extra = [str(tmp_path / e) if e.endswith(".npz") else e for e in extra]
        status = main([str(path), "-o", str(tmp_path / "out.onnx"), "--validate", *extra])
        err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("amp-compile")]  # not progress
        assert status == 2 and len(err) == 1, err
        assert err[0].startswith(f"amp-compile: error: {path}: "), err[0]
        assert ("graph input 'x'" if case == "drawn" else "ONNX Runtime") in err[0]
        assert not (tmp_path / "out.onnx").exists()


def test_option_errors_are_not_given_the_models_name(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(_bf16_model(TensorProto.FLOAT), path)
    assert main([str(path), "--dry-run", "--dim", "seq"]) == 2
    assert capsys.readouterr().err.strip() == "amp-compile: error: --dim seq: expected NAME=SIZE with a positive integer size"
