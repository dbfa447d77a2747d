"""Decoders exported with a KV cache: the attention mask's ``total_sequence`` is the past length
plus the new tokens', for the drawn inputs and for the plan (``onnx_io/derived_dims.py``,
docs/architecture.md "Input handling")."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from amp_compiler import convert_onnx
from amp_compiler.cli import main

from .builders import fin, model, weight

WIDTH = 16


def _kv_decoder(present: str = "total_sequence", masked: bool = True) -> onnx.ModelProto:
    """One attention step: ``present = Concat(past, x @ W)`` (declared ``present``: the TorchScript
    exporter names the mask's dim, the dynamo one writes the sum), scores against it plus the mask
    (``[batch, total_sequence]``; ``masked=False``: read by nothing, as where GPT-2 only slices
    it), as a cached decoder's export has them."""
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["k"], name="k_proj"),
        helper.make_node("Concat", ["past_key", "k"], ["present_key"], name="cache", axis=1),
        helper.make_node("Transpose", ["present_key"], ["kt"], name="kt", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["x", "kt"], ["scores"], name="scores"),
        helper.make_node("Cast", ["attention_mask"], ["maskf"], name="maskf", to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["maskf", "axis1"], ["mask3"], name="mask3"),
        helper.make_node("Add", ["scores", "mask3"] if masked else ["scores", "axis1f"], ["masked"], name="masked"),
        helper.make_node("Softmax", ["masked"], ["probs"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["probs", "present_key"], ["y"], name="context"),
    ]
    axis1 = onnx.numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1")
    return model(nodes,
                 [fin("x", "batch", "sequence", WIDTH), fin("past_key", "batch", "past_sequence", WIDTH),
                  fin("attention_mask", "batch", "total_sequence", dtype=TensorProto.INT64)],
                 [fin("y", "batch", "sequence", WIDTH), fin("present_key", "batch", present, WIDTH)],
                 [weight("W", WIDTH, WIDTH), axis1, onnx.numpy_helper.from_array(np.float32(0), "axis1f")])


def merged_decoder(step: onnx.ModelProto) -> onnx.ModelProto:
    """``step`` twice, as the two branches of an ``If`` on ``use_cache_branch``: a merged decoder's form."""
    outer = {vi.name for vi in step.graph.input} | {t.name for t in step.graph.initializer}

    def branch(tag: str) -> onnx.GraphProto:
        g = onnx.GraphProto()
        g.CopyFrom(step.graph)
        g.name = tag
        del g.input[:], g.initializer[:]
        rename = {n: f"{tag}/{n}" for node in g.node for n in node.output}
        for node in g.node:
            node.name = f"{tag}/{node.name}"
            node.input[:] = [rename.get(n, n) if n not in outer else n for n in node.input]
            node.output[:] = [rename[n] for n in node.output]
        for vi in g.output:
            vi.name = rename[vi.name]
        return g

    return model([helper.make_node("If", ["use_cache_branch"], [o.name for o in step.graph.output], name="if",
                                   then_branch=branch("past"), else_branch=branch("first"))],
                 [*step.graph.input, fin("use_cache_branch", 1, dtype=TensorProto.BOOL)], list(step.graph.output),
                 list(step.graph.initializer))


@pytest.mark.parametrize("present", ["total_sequence", "past_sequence + sequence"])
def test_a_cached_decoder_validates_with_the_mask_as_long_as_past_and_new_tokens(tmp_path, present):
    """Every dim drawn at 2 gave a mask of 2 columns against 2 + 2 keys: the FP32 run failed
    ``--validate`` (a GPT-2 exported with past_key_values in the field check, by either exporter:
    the dynamo one relates the mask's dim to nothing)."""
    src, dst, rep = tmp_path / "decoder.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    onnx.save(_kv_decoder(present), str(src))
    assert main([str(src), "-o", str(dst), "--validate", "--report", str(rep), "-q"]) == 0
    report = json.loads(rep.read_text())
    assert report["validation"]["passed"]
    drawn = report["summary"]["inputs_drawn"]
    assert "total_sequence = past_sequence + sequence = 4" in drawn["attention_mask"]
    assert drawn["past_key"].startswith("KV cache")  # not "images in [0, 1]", as rank 4 ones were
    assert main([str(src), "-o", str(dst), "--validate", "--dim", "past_sequence=5", "-q"]) == 0


def test_the_plan_sizes_total_sequence_from_the_past_length_given():
    """``--dim past_sequence=100`` had left the mask's dim (and the MatMul reading the declared
    ``present``) at the default 8, pricing attention over 8 keys instead of 108."""
    past, default = 100, 8
    report = convert_onnx(_kv_decoder(), dim_values={"past_sequence": past})[1]
    assert report.summary["dim_values"]["total_sequence"] == past + default
    context = next(op for op in report.ops if op["name"] == "context")
    assert context["flops"] == 2 * default * default * (past + default) * WIDTH


def _seq2seq_decoder_step() -> onnx.ModelProto:
    """``_kv_decoder`` plus cross-attention over ``encoder_hidden_states`` masked by
    ``encoder_attention_mask`` (``[batch, encoder_sequence]``), as Optimum exports a BART decoder."""
    m = _kv_decoder()
    nodes = [helper.make_node("Transpose", ["encoder_hidden_states"], ["et"], name="et", perm=[0, 2, 1]),
             helper.make_node("MatMul", ["y", "et"], ["cross_scores"], name="cross_scores"),
             helper.make_node("Cast", ["encoder_attention_mask"], ["emf"], name="emf", to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["emf", "axis1"], ["em3"], name="em3"),
             helper.make_node("Add", ["cross_scores", "em3"], ["cross_masked"], name="cross_masked"),
             helper.make_node("Softmax", ["cross_masked"], ["cross_probs"], name="cross_softmax", axis=-1),
             helper.make_node("MatMul", ["cross_probs", "encoder_hidden_states"], ["z"], name="cross_context")]
    m.graph.node.extend(nodes)
    m.graph.input.extend([fin("encoder_hidden_states", "batch", "encoder_sequence", WIDTH),
                          fin("encoder_attention_mask", "batch", "encoder_sequence", dtype=TensorProto.INT64)])
    m.graph.output.append(fin("z", "batch", "sequence", WIDTH))
    return m


def test_an_encoder_mask_is_as_long_as_the_encoder_states_not_the_cache(tmp_path):
    """A seq2seq decoder's ``encoder_attention_mask`` was taken for the cache's mask: the plan
    sized ``encoder_sequence`` as ``past_sequence + 1`` and ``inputs_drawn`` said it masks the
    cache. Its length is the one ``encoder_hidden_states`` declares."""
    from amp_compiler.input_gen import model_inputs

    m = _seq2seq_decoder_step()
    feeds, how = model_inputs(m, dims={"past_sequence": 5, "encoder_sequence": 9})
    assert feeds["encoder_attention_mask"].shape == (2, 9) and feeds["attention_mask"].shape == (2, 7)
    assert how["encoder_attention_mask"] == "mask of ones"
    assert "total_sequence = past_sequence + sequence" in how["attention_mask"]
    sizes = convert_onnx(m, dim_values={"past_sequence": 100})[1].summary["dim_values"]
    assert sizes["total_sequence"] == 108 and "encoder_sequence" not in sizes
    src = tmp_path / "decoder.onnx"
    onnx.save(m, str(src))
    assert main([str(src), "-o", str(tmp_path / "out.onnx"), "--validate", "-q"]) == 0


def test_casts_at_the_cache_inputs_and_outputs_name_no_keep_io_types():
    """A GPT-2 at ``--dim past_sequence=100`` stayed FP32 for its 9 casts at ``past_key_values.*``
    and ``present.*``, and the why line named every option but the one that removes them."""
    kept = convert_onnx(_kv_decoder(), dim_values={"past_sequence": 100})[1].summary["fp32_tensor_core_why"]
    assert "at graph inputs/outputs" in kept
    assert "--no-keep-io-types (3 I/O casts)" in kept
    free = convert_onnx(_kv_decoder(), dim_values={"past_sequence": 100}, keep_io_types=False)[1]
    assert "graph inputs/outputs" not in free.summary["fp32_tensor_core_why"]


def test_a_merged_decoders_token_ids_are_drawn_over_the_table_its_branches_read(tmp_path):
    """A merged decoder (an ``If`` choosing the step with or without the cache) reads its embedding
    table inside the branches: its ``input_ids`` were drawn in {0, 1}, one row of the table; and
    validation ran the one branch its drawn condition chose."""
    def branch(tag: str) -> onnx.GraphProto:
        nodes = [helper.make_node("Gather", ["table", "input_ids"], [f"{tag}_emb"], name=f"{tag}_embed"),
                 helper.make_node("MatMul", [f"{tag}_emb", "W"], [f"{tag}_y"], name=f"{tag}_proj")]
        return helper.make_graph(nodes, tag, [], [fin(f"{tag}_y", "batch", "sequence", WIDTH)])

    merged = model([helper.make_node("If", ["use_cache_branch"], ["y"], name="if", then_branch=branch("past"),
                                     else_branch=branch("first"))],
                   [fin("input_ids", "batch", "sequence", dtype=TensorProto.INT64),
                    fin("use_cache_branch", 1, dtype=TensorProto.BOOL)],
                   [fin("y", "batch", "sequence", WIDTH)], [weight("table", 300, WIDTH), weight("W", WIDTH, WIDTH)])
    src, dst, rep = tmp_path / "merged.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    onnx.save(merged, str(src))
    assert main([str(src), "-o", str(dst), "--validate", "--report", str(rep), "-q"]) == 0
    report = json.loads(rep.read_text())
    assert report["summary"]["inputs_drawn"]["input_ids"].startswith("token ids in [0, 300)")
    # both branches validated: one drawn use_cache_branch had run one of them
    assert [row["name"] for row in report["validation"]["outputs"]] == ["y (use_cache_branch=True)",
                                                                        "y (use_cache_branch=False)"]


def test_a_merged_decoder_plans_total_sequence_from_the_past_length_given():
    """The cache's Concat sits in the If branches of a merged decoder: the cheap test before the
    inference looked at the main graph only, and the plan kept total_sequence at the default."""
    report = convert_onnx(merged_decoder(_kv_decoder(masked=False)), dim_values={"past_sequence": 100})[1]
    assert report.summary["dim_values"]["total_sequence"] == 100 + 8
