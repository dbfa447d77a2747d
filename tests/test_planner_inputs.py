"""Validation inputs drawn the way the model sees them, and the CLI's planning flags."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.builders import fin, model, weight
from amp_compiler.cli import main  # noqa: E402  isort: skip
from amp_compiler.input_gen import model_inputs  # noqa: E402  isort: skip


def _text_model(vocab=1000, d=64):
    nodes = [helper.make_node("Gather", ["table", "input_ids"], ["emb"], name="lookup"),
             helper.make_node("Cast", ["attention_mask"], ["m"], name="mask_cast", to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["m", "axes"], ["m3"], name="unsq"),
             helper.make_node("Mul", ["emb", "m3"], ["h"], name="masked"),
             helper.make_node("MatMul", ["h", "W"], ["y"], name="proj")]
    inits = [weight("table", vocab, d), weight("W", d, d), helper.make_tensor("axes", TensorProto.INT64, [1], [2])]
    return model(nodes, [fin("input_ids", 2, 64, dtype=TensorProto.INT64),
                         fin("attention_mask", 2, 64, dtype=TensorProto.INT64)], [fin("y", 2, 64, d)], inits)


def test_token_ids_span_the_embedding_table_and_masks_are_ones():
    feeds, how = model_inputs(_text_model(vocab=1000))
    ids = feeds["input_ids"]
    assert ids.min() >= 0 and ids.max() < 1000 and ids.max() > 500  # the whole table, not {0, 1}
    assert (feeds["attention_mask"] == 1).all()
    assert how == {"input_ids": "token ids in [0, 1000) (rows of table)", "attention_mask": "mask of ones"}


def test_images_in_unit_range_and_audio_in_plus_minus_one():
    nodes = [helper.make_node("Relu", ["pixel_values"], ["a"], name="r"),
             helper.make_node("Relu", ["input_values"], ["b"], name="s")]
    m = model(nodes, [fin("pixel_values", 2, 3, 8, 8), fin("input_values", 2, 1600)],
              [fin("a", 2, 3, 8, 8), fin("b", 2, 1600)])
    feeds, how = model_inputs(m)
    assert 0 <= feeds["pixel_values"].min() and feeds["pixel_values"].max() <= 1
    assert -1 <= feeds["input_values"].min() < -0.5 and 0.5 < feeds["input_values"].max() <= 1
    assert how["pixel_values"] == "images in [0, 1]" and how["input_values"] == "audio in [-1, 1]"


def test_cli_deploy_objective_and_how_inputs_were_drawn(tmp_path):
    src = tmp_path / "m.onnx"
    src.write_bytes(_text_model().SerializeToString())
    out = tmp_path / "r.json"
    assert main([str(src), "--dry-run", "--validate", "--deploy", "tensorrt", "--objective", "memory",
                 "--report", str(out), "-q"]) == 0
    s = json.loads(out.read_text())["summary"]
    assert s["runtime_profile"] == "tensorrt" and s["objective"] == "memory"
    assert s["inputs_drawn"]["input_ids"].startswith("token ids in [0, 1000)")
    assert s["predicted_memory_mixed_bytes"] <= s["predicted_memory_fp32_bytes"]
    np.testing.assert_array_less(0, [s["predicted_memory_all_fp16_bytes"], s["fusion_groups"]])


def test_calibration_without_inputs_draws_them_as_the_model_sees_them():
    from amp_compiler.onnx_api import convert_onnx

    summary = convert_onnx(_text_model(vocab=1000), calibrate=True)[1].summary
    assert summary["inputs_drawn"]["input_ids"] == "token ids in [0, 1000) (rows of table)"
    assert "inputs_drawn" not in convert_onnx(_text_model(vocab=1000))[1].summary


def _float_input_model():
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="proj"),
             helper.make_node("Relu", ["h"], ["y"], name="act")]
    return model(nodes, [fin("x", 8, 64)], [fin("y", 8, 64)], [weight("W", 64, 64)])


def test_validation_feeds_each_model_its_declared_input_dtypes(tmp_path):
    """Without keep_io_types the converted model takes FP16 inputs: it is fed the same values in FP16."""
    import onnx

    src, dst, rep = tmp_path / "m.onnx", tmp_path / "o.onnx", tmp_path / "r.json"
    src.write_bytes(_float_input_model().SerializeToString())
    assert main([str(src), "-o", str(dst), "--no-keep-io-types", "--planner", "all", "--validate",
                 "--report", str(rep), "-q"]) == 0
    assert onnx.load(str(dst)).graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT16
    validation = json.loads(rep.read_text())["validation"]
    assert validation["passed"] and 0 < validation["max_rel_error"] < 1e-2


def test_validation_budget_defaults_to_the_dtype_s_precision(tmp_path):
    src, rep = tmp_path / "m.onnx", tmp_path / "r.json"
    src.write_bytes(_float_input_model().SerializeToString())
    budgets = {}
    for dtype in ("fp16", "bf16"):
        assert main([str(src), "--dry-run", "--dtype", dtype, "--validate", "--runtime", "reference",
                     "--report", str(rep), "-q"]) == 0
        budgets[dtype] = json.loads(rep.read_text())["validation"]["tolerance"]
    assert budgets == {"fp16": 0.01, "bf16": 0.05}
    assert main([str(src), "--dry-run", "--dtype", "bf16", "--validate", "--runtime", "reference",
                 "--tolerance", "0.001", "--report", str(rep), "-q"]) in (0, 1)
    assert json.loads(rep.read_text())["validation"]["tolerance"] == 0.001


def _batch_one_export():
    """An export specialised to batch 1 behind a symbolic batch dim (the dynamo exporter with a
    batch-1 example): it runs only when ``batch`` is 1, and its Reshape target says so."""
    nodes = [helper.make_node("Reshape", ["pixel_values", "flat"], ["f"], name="flatten"),
             helper.make_node("MatMul", ["f", "W"], ["y"], name="head")]
    inits = [helper.make_tensor("flat", TensorProto.INT64, [2], [1, 48]), weight("W", 48, 16)]
    return model(nodes, [fin("pixel_values", "batch", 3, 4, 4)], [fin("y", 1, 16)], inits)


def _batch_three_export():
    """A batch fixed by a broadcast (an Add of a [3, 16] constant): no Reshape nor declared shape
    says so, so the inputs are drawn at the default size and the FP32 run fails."""
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="proj"),
             helper.make_node("Add", ["h", "B"], ["y"], name="bias")]
    return model(nodes, [fin("x", "batch", 16)], [fin("y", "batch", 16)], [weight("W", 16, 16), weight("B", 3, 16)])


def test_validation_draws_a_dim_the_graph_pins_at_its_one_size(tmp_path, capsys):
    """Drawn at the default batch of 2, the batch-1 export's FP32 run failed ``--validate`` until
    the user found ``--dim batch=1``; the Reshape target pins it, and the report says so."""
    src, dst, rep = tmp_path / "m.onnx", tmp_path / "o.onnx", tmp_path / "r.json"
    src.write_bytes(_batch_one_export().SerializeToString())
    assert main([str(src), "-o", str(dst), "--validate", "--report", str(rep)]) == 0
    drawn = json.loads(rep.read_text())["summary"]["inputs_drawn"]["pixel_values"]
    assert "batch = 1, pinned by Reshape 'flatten' of [batch, 3, 4, 4] to [1, 48]" in drawn
    assert "input pixel_values: images in [0, 1]; batch = 1, pinned by Reshape" in capsys.readouterr().out
    assert main([str(src), "-o", str(dst), "--calibrate", "-q"]) == 0
    assert model_inputs(_batch_one_export(), dims={"batch": 4})[0]["pixel_values"].shape == (4, 3, 4, 4)


def test_a_declared_shape_that_specialises_a_dim_pins_it():
    """The dynamo exporter declares the values after a specialisation at their traced size
    (SigLIP's pooled LayerNorm [1, 1, 64] of a [batch, 1, 64] input); ONNX Runtime's optimizer
    trusts the declaration and bakes it into a fused Gemm's Reshape."""
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="proj"),
             helper.make_node("Relu", ["h"], ["y"], name="act")]
    m = model(nodes, [fin("x", "batch", 1, 16)], [fin("y", "batch", 1, 16)], [weight("W", 16, 16)],
              value_info=[fin("h", 1, 1, 16)])
    feeds, how = model_inputs(m)
    assert feeds["x"].shape == (1, 1, 16)
    assert how["x"].endswith("batch = 1, pinned by 'h' declared [1, 1, 16], not [batch, 1, 16]")


def test_pins_are_solved_only_from_equations_with_one_free_symbol():
    from amp_compiler.onnx_io.pinned_dims import solve

    free = {"batch", "seq"}
    pins = solve([(("batch", 3, 4), (1, 12), "r1"), (("4*batch", 16), (64,), "r2")], free)
    assert {d: (p.size, p.why) for d, p in pins.items()} == {"batch": (1, "r1")}
    assert solve([(("batch", "seq", 8), (2, 64), "r")], free) == {}  # two symbols: no one size
    assert solve([(("batch", "seq", 8), ("seq", 16), "r")], free)["batch"].size == 2  # seq cancels
    assert solve([(("batch", 3), (1, 3), "a"), (("batch", 3), (2, 3), "b")], free) == {}  # contradictory
    assert solve([(("batch", 5), (12,), "r")], free) == {}  # not divisible: no size fits
    assert solve([(("seq + 1", 4), (8,), "r")], free) == {}  # not a product
    assert solve([(("other", 4), (8,), "r")], free) == {}  # not an input's dim


def test_a_batch_fixed_where_nothing_says_so_fails_validation_with_a_hint(tmp_path, capfd):
    """``--dim`` sizes the validation inputs as it sizes the plan; where the FP32 model fails on
    the sizes drawn, the error says them and how to change them, in one line (ONNX Runtime's
    own log of the failure, written to the process's stderr, had come first)."""
    src, dst = tmp_path / "m.onnx", tmp_path / "o.onnx"
    src.write_bytes(_batch_three_export().SerializeToString())
    assert main([str(src), "-o", str(dst), "--validate"]) == 2
    lines = capfd.readouterr().err.strip().splitlines()
    assert len([line for line in lines if not line.startswith("[")]) == 1, lines  # progress lines start with [
    err = lines[-1]
    assert "the FP32 model" in err and "x [2, 16]" in err and "--dim NAME=SIZE" in err
    assert not dst.exists()
    assert main([str(src), "-o", str(dst), "--validate", "--dim", "batch=3", "-q"]) == 0
    assert main([str(src), "-o", str(dst), "--calibrate", "--dim", "batch=3", "-q"]) == 0


def test_a_waveform_is_drawn_and_planned_one_second_long():
    """Two samples (validation) or eight (the plan's default dim) are shorter than any speech
    encoder's first convolution: HuBERT's frames came out empty, the plan priced on nothing."""
    from amp_compiler.onnx_api import convert_onnx

    nodes = [helper.make_node("Unsqueeze", ["input_values", "axes"], ["x"], name="channel"),
             helper.make_node("Conv", ["x", "K"], ["y"], name="feature_conv", strides=[5])]
    inits = [helper.make_tensor("axes", TensorProto.INT64, [1], [1]), weight("K", 8, 1, 10)]
    m = model(nodes, [fin("input_values", "batch", "samples")], [fin("y", "batch", 8, "frames")], inits)
    feeds, how = model_inputs(m)
    assert feeds["input_values"].shape == (2, 16000) and how["input_values"] == "audio in [-1, 1]"
    assert model_inputs(m, dims={"samples": 400, "batch": 1})[0]["input_values"].shape == (1, 400)
    summary = convert_onnx(m)[1].summary
    assert summary["dim_values"] == {"samples": 16000} and summary["gemm_flops"] > 1e6
    assert convert_onnx(m, dim_values={"samples": 800})[1].summary["dim_values"] == {"samples": 800}


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_an_image_with_dynamic_sides_is_drawn_and_planned_224_pixels(tmp_path, layout):
    """A vision model exported with dynamic height and width (detection, segmentation) was drawn
    as 2 x 2 images, which its 4 x 4 patchify stem refused, failing a default --validate, and
    was planned on 8 x 8 images."""
    from amp_compiler.onnx_api import convert_onnx

    nodes = [helper.make_node("Conv", ["x", "K"], ["y"], name="patchify", strides=[4, 4])]
    if layout == "nhwc":
        nodes.insert(0, helper.make_node("Transpose", ["pixel_values"], ["x"], name="to_nchw", perm=[0, 3, 1, 2]))
        image = fin("pixel_values", "batch", "height", "width", 3)
    else:
        nodes[0].input[0] = "pixel_values"
        image = fin("pixel_values", "batch", 3, "height", "width")
    m = model(nodes, [image], [fin("y", "batch", 16, "h", "w")], [weight("K", 16, 3, 4, 4)])
    feeds, how = model_inputs(m)
    assert feeds["pixel_values"].shape == ((2, 3, 224, 224) if layout == "nchw" else (2, 224, 224, 3))
    assert how["pixel_values"] == "images in [0, 1]"
    assert model_inputs(m, dims={"height": 32})[0]["pixel_values"].shape[1:3] in ((3, 32), (32, 224))
    assert convert_onnx(m)[1].summary["dim_values"] == {"height": 224, "width": 224}
    src, dst = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(m, str(src))
    assert main([str(src), "-o", str(dst), "--validate", "-q"]) == 0
    rank4_cache = model([helper.make_node("Relu", ["past_key"], ["k"], name="r")],
                        [fin("past_key", "batch", 3, "past", 8)], [fin("k", "batch", 3, "past", 8)])
    assert model_inputs(rank4_cache)[0]["past_key"].shape == (2, 3, 2, 8)  # not an image: no sides


def test_a_constant_fp32_output_is_said_to_test_nothing(tmp_path, capsys):
    """A zero-initialised head (transformers' MobileViT from a config) outputs zeros whatever the
    plan: "max rel error 0, PASSED" must not read as evidence."""
    from onnx import numpy_helper

    nodes = [helper.make_node("MatMul", ["pixel_values", "W"], ["h"], name="body"),
             helper.make_node("MatMul", ["h", "Z"], ["logits"], name="head")]
    inits = [weight("W", 8, 8), numpy_helper.from_array(np.zeros((8, 4), np.float32), "Z")]
    src, out, html = tmp_path / "m.onnx", tmp_path / "o.onnx", tmp_path / "r.html"
    src.write_bytes(model(nodes, [fin("pixel_values", 2, 8)], [fin("logits", 2, 4)], inits).SerializeToString())
    assert main([str(src), "-o", str(out), "--validate", "--report", str(html)]) == 0
    captured = capsys.readouterr()
    assert "logits: max abs error 0, max rel error 0; the FP32 output is 0 everywhere" in captured.err
    assert "logits: the FP32 output is 0 everywhere: this comparison tests nothing" in captured.out
    assert "the FP32 output is 0 everywhere" in html.read_text()


def test_a_dim_the_model_does_not_have_is_refused_naming_the_ones_it_has(tmp_path, capsys):
    """``--dim batch=4`` on an export whose dim is ``N`` sized nothing, without a word: the plan and
    the validation ran at the default size."""
    from amp_compiler import ConversionError
    from amp_compiler.onnx_api import convert_onnx

    src, dst = tmp_path / "m.onnx", tmp_path / "o.onnx"
    src.write_bytes(_batch_three_export().SerializeToString())
    assert main([str(src), "-o", str(dst), "--dim", "batch=3", "--dim", "N=4", "-q"]) == 2
    err = capsys.readouterr().err
    assert "--dim N=4: the model has no symbolic dim named 'N'; its inputs declare batch" in err
    assert not dst.exists()
    static = _batch_three_export()
    static.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 3
    with pytest.raises(ConversionError, match=r"inputs declare none \(every input dim is fixed\)"):
        convert_onnx(static, dim_values={"batch": 3})
    assert convert_onnx(_batch_three_export(), dim_values={"batch": 3})[1].summary["dim_values"] == {"batch": 3}


def test_a_loop_trip_count_input_is_drawn_as_several_iterations():
    """An integer input a Loop reads as its trip count (through a Cast) was drawn in {0, 1}: validation
    and calibration then ran its body at most once, measuring nothing of a state that grows per step."""
    body = helper.make_graph(
        [helper.make_node("Mul", ["s_in", "two"], ["s_out"], name="body_double"),
         helper.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond")],
        "body", [fin("i", dtype=TensorProto.INT64), fin("cond_in", dtype=TensorProto.BOOL), fin("s_in", 4)],
        [fin("cond_out", dtype=TensorProto.BOOL), fin("s_out", 4)],
        [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])])
    nodes = [helper.make_node("Cast", ["steps"], ["steps64"], name="cast", to=TensorProto.INT64),
             helper.make_node("Loop", ["steps64", "", "x"], ["y"], name="loop0", body=body)]
    m = model(nodes, [fin("x", 4), fin("steps", dtype=TensorProto.INT32), fin("flags", 3, dtype=TensorProto.INT64)],
              [fin("y", 4)])
    feeds, how = model_inputs(m)
    assert feeds["steps"].dtype == np.int32 and int(feeds["steps"]) == 8
    assert "8 iterations of Loop loop0" in how["steps"]
    assert set(np.unique(feeds["flags"])) <= {0, 1}  # other integers as before
