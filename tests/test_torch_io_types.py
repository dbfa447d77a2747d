"""Graph inputs and outputs on the torch path. Inputs are the caller's tensors, cast inside the graph
(they cannot be retyped as an ONNX file's declared inputs are: ``PrecisionGraph.inputs_retypable``);
outputs keep their dtypes by default, and with ``keep_io_types=False`` come back as computed."""

from __future__ import annotations

import copy
import warnings

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
    """Said at compile too: the report's first line had been the only word of it, where ``.half()``
    warned (``model_checks.warn_if_low_precision``)."""
    model = torch.nn.Linear(256, 256).double().eval()
    with pytest.warns(UserWarning, match=r"compile\(Linear\): 2 of 2 floating parameters are torch.float64, not "
                                         r"float32; .*float64 ops are not planned: .*call model.float\(\)"):
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


def test_a_near_tie_names_the_torch_api_s_objective():
    """A tiny decoder's plan is a near-tie slower than FP32 for less memory; the note names the
    compile argument that gives the exact time minimum, not the CLI flag."""
    model = _llama(64, 1000)
    amp = amp_compiler.compile(model, example_kwargs=dict(input_ids=torch.randint(0, 1000, (1, 16)), use_cache=False))
    tie = amp.report.summary["near_tie"]
    assert tie.endswith('(objective="fastest" gives the plan never predicted slower than FP32)')
    assert "--objective" not in tie
    fastest = amp_compiler.compile(model, example_kwargs=dict(input_ids=torch.randint(0, 1000, (1, 16)),
                                                              use_cache=False), objective="fastest")
    summary = fastest.report.summary
    assert summary["predicted_time_mixed_s"] <= summary["predicted_time_fp32_s"] and not summary["near_tie"]


def _llama(width: int, vocab: int):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=width, intermediate_size=2 * width, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=4, vocab_size=vocab)
    return transformers.LlamaForCausalLM(cfg).eval()


def _decode_and_compare(amp, model, ids, steps: int, tolerance: float):
    """Prefill ``ids``, then ``steps`` greedy decode steps on both, each step's logits checked
    against the FP32 model's; returns the last step's output of ``amp``."""
    with torch.no_grad():
        out, ref = amp(input_ids=ids), model(input_ids=ids)
        for _ in range(steps):
            token = ref.logits[:, -1:].argmax(-1)
            out = amp(input_ids=token, past_key_values=out.past_key_values)
            ref = model(input_ids=token, past_key_values=ref.past_key_values)
            assert _rel(out.logits, ref.logits) < tolerance
    return out


@pytest.mark.parametrize("width, options, logits_dtype", [
    (1024, {}, torch.float32),
    (256, {"keep_io_types": False, "target": "a100"}, torch.float16),
], ids=["defaults", "low-io-a100"])
def test_a_decode_loop_shares_one_symbolic_plan_and_stays_low(width, options, logits_dtype):
    """On the dynamo route the first decode step is planned for its shapes and the second, whose
    cache length differs, symbolically: every later step reuses that plan (no capture per token),
    runs most GEMM FLOPs in FP16 and matches the FP32 model. With defaults the logits keep FP32;
    without keep_io_types they come back as the FP16 LM head computed them."""
    model = _llama(width, 1000)
    ids = torch.randint(0, 1000, (1, 16))
    amp = amp_compiler.compile(model, example_kwargs=dict(input_ids=ids), **options)
    assert amp.capture.startswith("torch.compile")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no max_plans warning: the loop stays within three plans
        out = _decode_and_compare(amp, model, ids, steps=6, tolerance=2e-2)
    assert amp.plans == 3  # prefill, first step, then one symbolic plan for every cache length
    summary = amp.report.summary
    assert summary["dim_values"] and summary["fp16_gemm_flop_fraction"] > 0.5
    assert not summary["unknown_ops"]  # the symbolic graph's sym_size reads are no ops on data
    assert out.logits.dtype == logits_dtype


def test_inductor_runs_the_symbolic_decode_plan():
    """With backend="inductor" the symbolic plan's graph (sizes as symbols among its inputs) is handed
    to inductor too: later cache lengths reuse it and match the FP32 model."""
    model = _llama(64, 100)
    ids = torch.randint(0, 100, (1, 8))
    amp = amp_compiler.compile(model, example_kwargs=dict(input_ids=ids), backend="inductor")
    _decode_and_compare(amp, model, ids, steps=4, tolerance=1e-2)
    assert amp.plans == 3 and amp.report.summary["dim_values"]


def test_a_call_beyond_max_plans_warns_and_runs_the_fp32_model():
    """With max_plans=2 (prefill and the first decode step), the second step would need a third
    (symbolic) plan: it warns, says what would help, and returns the FP32 model's answer."""
    model = _llama(64, 100)
    ids = torch.randint(0, 100, (1, 8))
    amp = amp_compiler.compile(model, example_kwargs=dict(input_ids=ids), max_plans=2)
    with torch.no_grad():
        out, ref = amp(input_ids=ids), model(input_ids=ids)
        token = ids[:, -1:]
        out = amp(input_ids=token, past_key_values=out.past_key_values)  # the second plan
        ref = model(input_ids=token, past_key_values=ref.past_key_values)
        with pytest.warns(UserWarning, match=r"max_plans=2 plans; .* ran on the FP32 model \(raise max_plans\)"):
            out = amp(input_ids=token, past_key_values=out.past_key_values)
        ref = model(input_ids=token, past_key_values=ref.past_key_values)
    with pytest.warns(UserWarning, match=r"report is None: the last call ran the FP32 model, no plan \(max_plans=2"):
        assert amp.plans == 2 and amp.report is None  # the last call ran no plan: said
    assert _rel(out.logits, ref.logits) < 1e-5  # the FP32 model's answer
