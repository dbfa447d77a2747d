"""``AmpModule.generate``: transformers' generation loop with every forward run by the plans, on both
capture routes (a model export captured once hands the calls it cannot capture to dynamo)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import amp_compiler  # noqa: E402

NEW_TOKENS = 10


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Dynamo's recompile limit counts per code object, shared by every transformers model."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _llama():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=4, vocab_size=100)
    return transformers.LlamaForCausalLM(cfg).eval()


def _gpt2():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=1, n_embd=64, n_head=4, vocab_size=100, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg).eval()


def _greedy(model_or_amp, ids):
    return model_or_amp.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)


def test_generate_runs_the_decode_steps_on_one_symbolic_plan():
    """A default decoder (use_cache=True: the dynamo route): generate's steps share the symbolic plan and
    give the FP32 model's tokens."""
    model = _llama()
    ids = torch.randint(0, 100, (1, 8))
    amp = amp_compiler.compile(model, example_kwargs=dict(input_ids=ids))
    out = _greedy(amp, ids)
    assert torch.equal(out, _greedy(model, ids))
    assert out.shape[1] == 8 + NEW_TOKENS
    assert amp.plans <= 4  # the example, generate's prefill, its first step, the symbolic step
    assert amp.report.summary["dim_values"]  # the last step ran the symbolic plan


def test_calls_export_cannot_capture_go_to_dynamo():
    """Compiled on a call export captures (no cache), the model is then called with a cache (as
    generate does): those calls are planned through dynamo instead of failing."""
    model = _gpt2()
    ids = torch.randint(0, 100, (1, 8))
    amp = amp_compiler.compile(model, example_kwargs=dict(input_ids=ids, use_cache=False))
    assert amp.capture == "torch.export"
    out = _greedy(amp, ids)
    assert torch.equal(out, _greedy(model, ids))
    assert amp.report.summary["capture"].startswith("torch.compile")
    assert amp.plans <= 5


def test_generate_on_a_model_without_it_says_so():
    amp = amp_compiler.compile(torch.nn.Linear(8, 8).eval(), torch.randn(2, 8))
    with pytest.raises(AttributeError, match="Linear has no generate"):
        amp.generate(torch.randn(2, 8))


def test_an_encoder_decoder_s_encoder_is_planned_too():
    """generate calls T5's encoder apart (get_encoder()): it is compiled on that first call, with the
    module's options, instead of running as the FP32 submodule."""
    torch.manual_seed(0)
    cfg = transformers.T5Config(d_model=64, d_ff=128, num_layers=1, num_decoder_layers=1, num_heads=4, d_kv=16,
                                vocab_size=100, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    model = transformers.T5ForConditionalGeneration(cfg).eval()
    ids = torch.randint(2, 100, (1, 8))
    amp = amp_compiler.compile(model, example_kwargs=dict(input_ids=ids, decoder_input_ids=ids[:, :1]))
    assert amp.generate_encoder is None
    assert torch.equal(_greedy(amp, ids), _greedy(model, ids))
    encoder = amp.generate_encoder
    assert encoder is not None and encoder.plans == 1
    assert encoder.report.summary["nodes"] > 0 and encoder.report.source == "T5Stack"
    _greedy(amp, ids)
    assert amp.generate_encoder is encoder and encoder.plans == 1  # planned once, reused


def test_the_model_s_data_attributes_read_through_and_its_methods_point_to_the_model():
    """``amp.config`` is the model's; a method of the model would run it in FP32, so it is refused
    with a pointer instead of running silently unplanned."""
    model = _gpt2()
    amp = amp_compiler.compile(model, example_kwargs=dict(input_ids=torch.randint(0, 100, (1, 8))))
    assert amp.config is model.config and amp.generation_config is model.generation_config
    with pytest.raises(AttributeError, match=r"get_output_embeddings\(\) would run the FP32 model, not the plans"):
        amp.get_output_embeddings()
    with pytest.raises(AttributeError, match="no attribute 'nonexistent' \\(nor has the GPT2LMHeadModel"):
        amp.nonexistent
    assert not hasattr(amp, "nonexistent")


def test_compiled_without_an_example_a_transformers_model_plans_on_generates_first_call():
    """``compile(model)`` then ``generate``: every forward argument of a transformers model has a default,
    so the empty call had been captured at compile time and failed ("exactly one of input_ids")."""
    model = _llama()
    ids = torch.randint(0, 100, (1, 8))
    amp = amp_compiler.compile(model)
    assert amp.plans == 0
    out = _greedy(amp, ids)
    assert torch.equal(out, _greedy(model, ids))
    assert amp.plans >= 1 and amp.report is not None


def test_the_first_call_of_a_module_compiled_without_an_example_runs_the_model_once():
    """Dynamo's capture runs the first call; running it again appended the key/values to the caller's
    cache twice (a sampled generate's first tokens then differed from the FP32 model's)."""
    model = _llama()
    ids = torch.randint(0, 100, (2, 8))
    amp = amp_compiler.compile(model)
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        out = amp(input_ids=ids, past_key_values=cache, use_cache=True)
    assert amp.capture.startswith("torch.compile") and cache.get_seq_length() == 8
    assert torch.allclose(out.logits, model(input_ids=ids).logits, atol=1e-4)
