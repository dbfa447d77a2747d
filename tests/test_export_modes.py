"""An ONNX file exported in training mode (``onnx_io/train_mode.py``): its Dropout nodes drop values
and its BatchNormalization nodes use the batch's statistics at inference. Conversion keeps the
model's behaviour, validation passed (both sessions drew the same mask), and nothing was said."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from amp_compiler import convert_onnx
from tests.builders import fin, model, weight


def _dropout_model(training: bool | None, bn_training: int = 0):
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="proj"),
             helper.make_node("Constant", [], ["train"], name="flag",
                              value=numpy_helper.from_array(np.array(bool(training)))),
             helper.make_node("Dropout", ["h", "", "train" if training is not None else ""], ["d"], name="drop"),
             helper.make_node("BatchNormalization", ["d", "s", "b", "mean", "var"],
                              ["y", "new_mean", "new_var"] if bn_training else ["y"], name="norm",
                              training_mode=bn_training)]
    inits = [weight("W", 16, 16), *(numpy_helper.from_array(np.full(16, v, np.float32), n)
                                    for n, v in (("s", 1.0), ("b", 0.0), ("mean", 0.0), ("var", 1.0)))]
    return model(nodes, [fin("x", 4, 16)], [fin("y", 4, 16)], inits)


def test_dropout_and_batch_norm_left_in_training_mode_are_said_once():
    report = convert_onnx(_dropout_model(True, bn_training=1)).report
    note = report.summary["exported_in_training"]
    assert note.startswith("exported in training mode: 2 Dropout/BatchNormalization/drop-path nodes (drop, norm)")
    assert "export after model.eval()" in note
    assert report.to_text().splitlines()[2].startswith("! exported in training mode: 2 ")  # first, under the title
    assert "exported in training mode" in report.to_html()


def test_an_inference_export_says_nothing():
    for training in (False, None):
        assert "exported_in_training" not in convert_onnx(_dropout_model(training)).report.summary


def _drop_path_model(keep_mask: bool) -> object:
    """A residual branch under stochastic depth as the dynamo exporter writes ``drop_path`` in train mode
    (``x / keep * floor(keep + rand)``); with ``keep_mask=False`` the draw is used as it is (ViT-MAE's
    patch-shuffle noise in eval mode), which is no training-mode behaviour."""
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="proj"),
             helper.make_node("RandomUniformLike", ["h"], ["u"], name="draw", dtype=TensorProto.FLOAT)]
    if keep_mask:
        nodes += [helper.make_node("Add", ["keep", "u"], ["shifted"], name="shift"),
                  helper.make_node("Floor", ["shifted"], ["mask"], name="floor")]
    nodes += [helper.make_node("Mul", ["h", "mask" if keep_mask else "u"], ["y"], name="apply")]
    inits = [weight("W", 16, 16), numpy_helper.from_array(np.array(0.9, np.float32), "keep")]
    return model(nodes, [fin("x", 4, 16)], [fin("y", 4, 16)], inits)


def test_a_drop_path_left_in_training_mode_is_said_and_other_random_draws_are_not():
    """A CvT exported by the dynamo exporter through a wrapper in train mode kept its stochastic depth
    (RandomUniformLike -> Add -> Floor, no Dropout node): its outputs were random and nothing said so."""
    note = convert_onnx(_drop_path_model(True)).report.summary["exported_in_training"]
    assert note.startswith("exported in training mode: 1 Dropout/BatchNormalization/drop-path nodes (draw)")
    assert "exported_in_training" not in convert_onnx(_drop_path_model(False)).report.summary


def test_a_random_like_op_without_dtype_reads_its_input_in_its_own_dtype():
    """RandomUniformLike without ``dtype`` writes its input's dtype. It stays FP32 (deny) while the GEMM
    feeding it went FP16: its output became FP16 where the plan wanted FP32, and the converted model
    failed ONNX's check ("B has inconsistent type tensor(float16)"). Its input now takes its dtype."""
    m = _drop_path_model(True)
    del m.graph.node[1].attribute[:]  # the draw without dtype, as ONNX allows
    converted, report = convert_onnx(m)
    draw = next(n for n in converted.graph.node if n.name == "draw")
    producer = {o: n for n in converted.graph.node for o in n.output}[draw.input[0]]
    assert producer.op_type == "Cast" and producer.attribute[0].i == TensorProto.FLOAT
