"""The why-line's "would change it" names only options that, followed, change the plan
(``passes/explain.py``; docs/architecture.md, "The objective")."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

from amp_compiler.onnx_api import convert_onnx
from tests.builders import fin, model, weight

_OPTION = {"--no-keep-io-types": {"keep_io_types": False}, "--objective memory": {"objective": "memory"},
           "--deploy tensorrt|inductor": {"deploy": "tensorrt"}}


def _pre_ln(blocks: int, d: int = 128, tokens: int = 64, vocab: int = 1024):
    """GPT-2's shape below opset 17: per block a written-out LayerNorm (ReduceMean, Sub, Pow,
    ReduceMean, Add eps, Sqrt, Div, scale, shift; its mean and centring FP32 by rule), a GEMM and
    the residual Add; a final norm and a wide head whose output is the graph's."""
    nodes, h = [], "x"
    inits = [numpy_helper.from_array(np.float32(2), "two"), numpy_helper.from_array(np.float32(1e-5), "eps"),
             numpy_helper.from_array(np.ones(d, np.float32), "g"), numpy_helper.from_array(np.zeros(d, np.float32), "b"),
             weight("head", d, vocab)]

    def norm(n: str, x: str) -> str:
        for op, ins, out, kw in (("ReduceMean", [x], "m", {"axes": [-1]}), ("Sub", [x, "m"], "d", {}),
                                 ("Pow", ["d", "two"], "p", {}), ("ReduceMean", ["p"], "v", {"axes": [-1]}),
                                 ("Add", ["v", "eps"], "ve", {}), ("Sqrt", ["ve"], "s", {}), ("Div", ["d", "s"], "n", {}),
                                 ("Mul", ["n", "g"], "gn", {}), ("Add", ["gn", "b"], "y", {})):
            ins = [i if i in (x, "two", "eps", "g", "b") else n + i for i in ins]
            nodes.append(helper.make_node(op, ins, [n + out], name=n + out, **kw))
        return n + "y"

    for i in range(blocks):
        nodes += [helper.make_node("MatMul", [norm(f"ln{i}_", h), f"W{i}"], [f"mm{i}"], name=f"mm{i}"),
                  helper.make_node("Add", [f"mm{i}", h], [f"res{i}"], name=f"res{i}")]
        inits.append(weight(f"W{i}", d, d))
        h = f"res{i}"
    nodes.append(helper.make_node("MatMul", [norm("lnf_", h), "head"], ["y"], name="head"))
    return model(nodes, [fin("x", 1, tokens, d)], [fin("y", 1, tokens, vocab)], inits, opset=14)


@pytest.mark.parametrize("blocks", [3, 4])
def test_each_advised_option_changes_the_plan_and_no_other_is_advised(blocks):
    """A GPT-2 and a ViT exported at opset 14 were told "--no-keep-io-types (1 I/O casts)" though
    their one output cast was paid by the plan either way: following it changed nothing. Here the
    3-block stack's input cast does hold its first GEMM FP32, the 4-block one's does not."""
    summary = convert_onnx(_pre_ln(blocks))[1].summary
    share, why = summary["fp16_gemm_flop_fraction"], summary["fp32_tensor_core_why"]
    assert why.startswith("FP32 by cost") and share < 1
    advice = why.splitlines()[-1]
    for option, kwargs in _OPTION.items():
        followed = convert_onnx(_pre_ln(blocks), **kwargs)[1].summary["fp16_gemm_flop_fraction"]
        assert (option in advice) == (followed > share), (option, share, followed, advice)
    assert ("--no-keep-io-types" in advice) == (blocks == 3)


def test_a_cast_read_by_a_norms_mean_and_centring_counts_once():
    """Each written-out LayerNorm's input cast is read by its ReduceMean and its Sub: the line
    read "5 casts at 5 ReduceMean, 5 at 5 Sub" for GPT-2's 5 casts, as if there were 10; and the
    rule holding them, "(2 ops)" for one norm of five."""
    why = convert_onnx(_pre_ln(4))[1].summary["fp32_tensor_core_why"]
    assert "whatever the plan: 5 casts at 5 ReduceMean + 5 Sub" in why, why
    assert "at 5 Sub," not in why
    # one rule, one count: its reason named each norm's Sub, and the line read "(2 ops)" per norm
    held = next(line for line in why.splitlines() if line.startswith("held FP32 by: "))
    assert held.startswith("held FP32 by: centring (x - mean(x)): its Sub subtracts") and held.endswith("(10 ops)"), held


def test_weights_kept_fp32_by_init_max_bytes_are_named_in_the_advice():
    """Under --init-max-bytes 1000 a BERT stayed FP32 for 13 weights stored FP32 and cast every call;
    the advice named every option but that one. Following it (no limit) converts."""
    summary = convert_onnx(_pre_ln(2), init_max_bytes=1000)[1].summary
    why = summary["fp32_tensor_core_why"]
    assert summary["fp16_gemm_flop_fraction"] < 1 and "at weights stored FP32 and cast every call" in why, why
    assert "a larger --init-max-bytes than 1000 (" in why.splitlines()[-1], why
    assert convert_onnx(_pre_ln(2))[1].summary["fp16_gemm_flop_fraction"] > summary["fp16_gemm_flop_fraction"]
