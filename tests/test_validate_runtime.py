"""Validation (``amp_compiler/validate.py``): ONNX Runtime's CPU provider survives its own faults on
converted graphs (``CPU_DISABLED_OPTIMIZERS``), and a comparison that is no evidence says so."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import helper

from amp_compiler.cli import main
from tests.builders import fin, model, weight
from tests.test_bad_input import ROOT, leftovers

pytest.importorskip("onnxruntime")


def _seq_first_projection():
    """A Longformer's attention input: [seq, batch, hidden] moved to batch-first, then projected."""
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2], name="seq_first"),
             helper.make_node("MatMul", ["t", "W"], ["h"], name="query"),
             helper.make_node("Relu", ["h"], ["r"], name="act"),
             helper.make_node("MatMul", ["r", "W2"], ["y"], name="out")]
    return model(nodes, [fin("x", 64, 8, 256)], [fin("y", 8, 64, 256)], [weight("W", 256, 256), weight("W2", 256, 256)])


def test_an_fp16_batch_transpose_into_a_matmul_validates(tmp_path):
    """ONNX Runtime's CPU provider died of a segmentation fault building the session for the FP16
    Transpose -> MatMul (its MatmulTransposeFusion with the NCHWc layout pass): --validate ended
    with no message and left its staging folder. A real process, as the crash took pytest down."""
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    src.write_bytes(_seq_first_projection().SerializeToString())
    proc = subprocess.run([sys.executable, "-m", "amp_compiler.cli", str(src), "-o", str(out), "--validate", "-q"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert out.exists() and leftovers(tmp_path) == []
    converted = onnx.load(str(out))
    precision = {n.name: n.doc_string.split(";")[0] for n in converted.graph.node}
    assert precision["seq_first"] == precision["query"] == "amp_compiler: precision=float16"  # the crashing pair


def test_an_fp32_output_below_fp16s_normal_range_is_said_to_underflow(tmp_path, capsys):
    """LeViT from a config: its logits peak at 2e-9, so FP16 loses them (validation failed with
    "max rel error 0.56" and no word why); MobileNetV2's at 1e-25 "PASSED" on ONNX Runtime's CPU
    provider. The note says why and what to do; BF16 holds such values and gets no note."""
    from onnx import numpy_helper

    nodes = [helper.make_node("MatMul", ["pixel_values", "W"], ["h"], name="body"),
             helper.make_node("MatMul", ["h", "V"], ["logits"], name="head")]
    inits = [weight("W", 8, 8), numpy_helper.from_array(np.full((8, 4), 1e-6, np.float32), "V")]
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    src.write_bytes(model(nodes, [fin("pixel_values", 2, 8)], [fin("logits", 2, 4)], inits).SerializeToString())
    main([str(src), "-o", str(out), "--validate", "--runtime", "reference"])
    err = capsys.readouterr().err
    assert "below FP16's smallest normal 6.1e-05: computed in FP16 it underflows" in err
    assert "--calibrate keeps the ops FP16 cannot hold FP32" in err
    assert main([str(src), "-o", str(out), "--validate", "--dtype", "bf16", "--runtime", "reference"]) == 0
    assert "smallest normal" not in capsys.readouterr().err


def test_a_model_with_every_constant_in_external_files_validates(tmp_path, capsys):
    """``onnx.save(..., size_threshold=0)`` puts a Reshape's shape in a file of its own, which ONNX
    Runtime's loader cannot read for shape inference ("Cannot parse data from external tensors"):
    --validate failed on the FP32 model, advising --dim for inputs that were not the cause. The
    FP32 model is now handed to ORT with its data read in; the converted file keeps small tensors inline."""
    import onnxruntime as ort
    from onnx import numpy_helper

    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="proj"),
             helper.make_node("Reshape", ["h", "shape"], ["y"], name="split")]
    inits = [weight("W", 16, 16), numpy_helper.from_array(np.array([2, 2, 8], np.int64), "shape")]
    src, out = tmp_path / "in" / "m.onnx", tmp_path / "o.onnx"
    src.parent.mkdir()
    onnx.save(model(nodes, [fin("x", 2, 16)], [fin("y", 2, 2, 8)], inits), str(src), save_as_external_data=True,
              all_tensors_to_one_file=False, size_threshold=0)
    with pytest.raises(Exception, match="Cannot parse data from external tensors"):
        ort.InferenceSession(str(src))  # what made the FP32 run fail
    for planner in ("all", "optimal"):  # every op FP16 (the overflow check's exposed runs too), and the default
        assert main([str(src), "-o", str(out), "--validate", "--planner", planner, "-q"]) == 0
        ort.InferenceSession(str(out))
        assert leftovers(tmp_path) == []


def test_a_fp32_model_runtime_cannot_load_is_not_blamed_on_the_drawn_inputs():
    """The hint about the inputs we drew is for a run that fails on them, not for a model that does not load."""
    from types import SimpleNamespace

    from amp_compiler.cli import _drawn_inputs_hint
    from amp_compiler.errors import ConversionError

    args = SimpleNamespace(drawn_shapes={"x": [2, 16]})
    run = ConversionError("the FP32 model", "ONNX Runtime", "[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : shape")
    load = ConversionError("the FP32 model", "ONNX Runtime", "cannot load it: [ONNXRuntimeError] : 1 : FAIL")
    assert "--dim NAME=SIZE" in _drawn_inputs_hint(args, run) and _drawn_inputs_hint(args, load) == ""


def test_the_reference_runtime_gathers_elements_along_a_long_axis():
    """onnx's GatherElements went through np.choose (at most 32 choices), then a helper reading one
    element per row: every transformers BERT (token_type_ids gathered from a [1, 512] buffer)
    failed --runtime reference with "cannot reshape array of size 1 into shape (1, 2)"."""
    from amp_compiler.validate import run_model, run_reference

    nodes = [helper.make_node("GatherElements", ["table", "idx"], ["g"], axis=1, name="gather"),
             helper.make_node("Cast", ["g"], ["y"], to=onnx.TensorProto.FLOAT, name="cast")]
    table = onnx.numpy_helper.from_array(np.arange(512, dtype=np.int64)[None] * 3, "table")
    m = model(nodes, [fin("idx", 1, 4, dtype=onnx.TensorProto.INT64)], [fin("y", 1, 4)], [table])
    feeds = {"idx": np.array([[0, 7, 511, -1]], np.int64)}
    got = run_reference(m, feeds)[0]
    np.testing.assert_array_equal(got, run_model(m, feeds)[0])
    np.testing.assert_array_equal(got, [[0, 21, 1533, 1533]])
