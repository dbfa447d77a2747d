"""Graph inputs and outputs on the torch path. Inputs are the caller's tensors, cast inside the graph
(they cannot be retyped as an ONNX file's declared inputs are: ``PrecisionGraph.inputs_retypable``);
outputs keep their dtypes by default, and with ``keep_io_types=False`` come back as computed."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import amp_compiler  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Dynamo's recompile limit counts per code object, and transformers wraps every model's
    forward in one function: the decoder's plans here must not use up later tests' budget."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref).abs().max() / ref.abs().max())


def test_float_inputs_are_cast_in_the_graph_and_outputs_stay_low():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512)).eval()
    x = torch.randn(64, 512)
    amp = amp_compiler.compile(model, x, keep_io_types=False, target="a100")
    with torch.no_grad():
        out, ref = amp(x), model(x)
    assert amp.report.summary["fp16_gemm_flop_fraction"] == 1.0
    assert out.dtype == torch.float16  # computed in FP16, returned as such (as under autocast)
    assert _rel(out, ref) < 1e-2
    reasons = {c["reason"] for c in amp.report.casts}
    assert "graph input arrives in the caller's dtype" in reasons
    assert not any("graph output" in r for r in reasons)


def _cache_in(cache, dtype: torch.dtype):
    cache = copy.deepcopy(cache)
    for layer in cache.layers:
        layer.keys, layer.values = layer.keys.to(dtype), layer.values.to(dtype)
    return cache


def test_with_defaults_inputs_and_outputs_keep_their_dtypes():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512)).eval()
    x = torch.randn(64, 512)
    amp = amp_compiler.compile(model, x)
    with torch.no_grad():
        out, ref = amp(x), model(x)
    assert amp.report.summary["fp16_gemm_flop_fraction"] == 1.0
    assert out.dtype == torch.float32 and _rel(out, ref) < 1e-2
    reasons = {c["reason"] for c in amp.report.casts}  # the input cast in, the output cast back
    assert {"graph input arrives in the caller's dtype", "graph output keeps its dtype (keep_io_types)"} <= reasons


@pytest.mark.parametrize("options", [{}, {"keep_io_types": False, "target": "a100"}], ids=["defaults", "low-io-a100"])
def test_decoder_steps_take_caches_in_either_dtype(options):
    """Prefill, then decode steps on the dynamo route fed the cache in FP16 (as autocast or an FP16
    plan returns it) and in FP32: each call gets a plan of its own and matches the FP32 model. With
    defaults the logits keep FP32; without keep_io_types on an A100 (FP16 pays at this width) the
    LM head's FP16 output comes back as computed."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=4, vocab_size=1000)
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 1000, (1, 32))
    amp = amp_compiler.compile(model, example_kwargs=dict(input_ids=ids), **options)
    with torch.no_grad():
        out, ref = amp(input_ids=ids), model(input_ids=ids)
        if options:
            assert amp.report.summary["fp16_gemm_flop_fraction"] > 0.5
            assert out.logits.dtype == torch.float16
        else:
            assert out.logits.dtype == torch.float32
            assert out.past_key_values.layers[0].keys.dtype == torch.float32
        token = ids[:, -1:]
        expected = model(input_ids=token, past_key_values=copy.deepcopy(ref.past_key_values)).logits
        for dtype in (torch.float16, torch.float32):
            step = amp(input_ids=token, past_key_values=_cache_in(out.past_key_values, dtype))
            assert _rel(step.logits, expected) < 2e-2, dtype
    assert amp.plans == 3


def test_a_float64_model_is_reported_not_planned_and_why():
    model = torch.nn.Linear(256, 256).double().eval()
    amp = amp_compiler.compile(model, torch.randn(8, 256, dtype=torch.float64))
    gemm = next(op for op in amp.report.ops if "addmm" in op["op_type"] or "mm" in op["op_type"])
    assert gemm["precision"] == "n/a" and "runs in float64" in gemm["reason"]
    why = amp.report.summary["fp32_tensor_core_why"]
    assert why.startswith("not planned: 1 tensor-core ops, 100% of GEMM/conv FLOPs, run in float64")
    assert "model.float()" in why


def test_what_would_change_an_fp32_plan_is_said_in_the_torch_api_s_words():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Dropout(0.1), torch.nn.Linear(512, 512)).train()
    amp = amp_compiler.compile(model, torch.randn(64, 512))  # training: weight casts each step outweigh the GEMMs
    why = amp.report.summary["fp32_tensor_core_why"]
    assert why.startswith("FP32 by cost (eager)")
    assert 'would change it: backend="inductor" (casts fuse), objective="memory"' in why
    assert "--deploy" not in why


def test_decode_steps_beyond_max_plans_warn_and_run_the_fp32_model():
    """Each cache length is a plan on the dynamo route; past max_plans a step warns, names what would
    help on this route, and still returns the FP32 model's answer."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=4, vocab_size=100)
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 100, (1, 8))
    amp = amp_compiler.compile(model, example_kwargs=dict(input_ids=ids), max_plans=2)
    with torch.no_grad():
        out, ref = amp(input_ids=ids), model(input_ids=ids)
        token = ids[:, -1:]
        out = amp(input_ids=token, past_key_values=out.past_key_values)  # the second plan
        ref = model(input_ids=token, past_key_values=ref.past_key_values)
        with pytest.warns(UserWarning, match="max_plans=2 plans.*runs the FP32 model.*captured by dynamo"):
            out = amp(input_ids=token, past_key_values=out.past_key_values)
        ref = model(input_ids=token, past_key_values=ref.past_key_values)
    assert amp.plans == 2
    assert _rel(out.logits, ref.logits) < 1e-5  # the FP32 model's answer
