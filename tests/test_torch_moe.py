"""Mixture-of-experts decoders (transformers' Mixtral, default config shrunk): the experts' grouped GEMMs.

Under torch.export and torch.compile with FP32 weights, transformers runs each expert projection
through its custom op ``transformers::grouped_mm_fallback`` (one ``torch.mm`` per expert group,
``integrations/moe.py``); the routing sorts expert ids and counts them with ``histc``. The
registry knows all three, so the experts — most of an MoE's FLOPs — are tensor-core work the
planner can lower, with their FLOPs in the report, and nothing is reported unknown. Outside a
compiler transformers calls ``grouped_mm``, whose meta kernel refuses FP32: ``compile_training``
traces under the compiling flag, as torch.compile does, so the model takes the custom op there too.

Every token is routed to all 4 experts (top-4 of 4): with top-2, rounding anywhere upstream of the
router flips near-tied choices of these random weights, and the comparison would measure that.
"""

from __future__ import annotations

import functools
import warnings

import pytest

torch = pytest.importorskip("torch")
T = pytest.importorskip("transformers")

import amp_compiler  # noqa: E402
from benchmarks.torch_amp import rel_error  # noqa: E402

VOCAB = 300


@functools.cache
def _mixtral() -> torch.nn.Module:
    torch.manual_seed(0)
    return T.MixtralForCausalLM(T.MixtralConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
        vocab_size=VOCAB, max_position_embeddings=64, num_local_experts=4, num_experts_per_tok=4))


def _ids(batch: int = 2, seq: int = 16) -> torch.Tensor:
    return torch.randint(3, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seq))


def _expert_ops(report) -> list[dict]:
    return [op for op in report.to_dict()["ops"] if "grouped_mm_fallback" in op["op_type"]]


@pytest.mark.parametrize("planner", ["optimal", "all"], ids=["defaults", "all"])
def test_expert_gemms_are_tensor_core_ops_with_flops_and_nothing_is_unknown(planner):
    """Defaults: this 64-wide model is launch-bound, so the cost model keeps it FP32 and the report's
    first lines say so with the numbers; ``planner="all"`` shows the experts can run FP16."""
    model, ids = _mixtral().eval(), _ids()
    options = {} if planner == "optimal" else {"planner": planner}
    amp = amp_compiler.compile(model, example_kwargs={"input_ids": ids, "use_cache": False}, **options)
    assert amp.capture == "torch.export"
    experts = _expert_ops(amp.report)
    assert len(experts) == 4  # gate_up and down projections of 2 layers
    tokens = ids.numel() * 4  # each token goes to its top-4 experts
    assert {op["flops"] for op in experts} == {2.0 * tokens * 64 * 256, 2.0 * tokens * 128 * 64}
    assert all(op["class"] == "allow" for op in experts)
    if planner == "all":
        assert all(op["precision"] == "float16" for op in experts)
    else:  # never silently FP32: the why names the cost and what the casts border
        why = amp.report.summary["fp32_tensor_core_why"]
        assert all(op["precision"] == "float16" for op in experts) or why.startswith("FP32 by cost"), why
    assert not amp.report.summary.get("unknown_ops")
    with torch.no_grad():
        ref, out = model(input_ids=ids, use_cache=False).logits, amp(input_ids=ids, use_cache=False).logits
    assert out.dtype == torch.float32 and rel_error(ref, out) < 1e-2


class _WithLabels(torch.nn.Module):
    def __init__(self, lm: torch.nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, ids):
        return self.lm(input_ids=ids, labels=ids, use_cache=False)


@pytest.mark.parametrize("planner", ["optimal", "greedy"], ids=["defaults", "greedy"])
def test_compile_training_captures_the_experts_and_matches_eager_fp32(planner):
    ids = _ids(2, 12)
    losses = []
    for compiled in (False, True):
        model = _WithLabels(T.MixtralForCausalLM(_mixtral().config)).train()
        model.load_state_dict({f"lm.{k}": v for k, v in _mixtral().state_dict().items()})
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        if compiled:
            options = {} if planner == "optimal" else {"planner": planner}
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                step = amp_compiler.compile_training(model, lambda out: out.loss, opt, (ids,), n_targets=0,
                                                     **options)
            losses.append([float(step(ids)) for _ in range(3)])
            experts = _expert_ops(step.report)
            assert experts and all(op["class"] == "allow" for op in experts)
            if planner == "greedy":
                assert any(op["precision"] == "float16" for op in experts)
            elif not any(op["precision"] == "float16" for op in experts):  # defaults: FP32 by cost, and said so
                assert any("the plan runs the whole step in FP32" in str(w.message) for w in caught)
        else:
            run = []
            for _ in range(3):
                loss = model(ids).loss
                loss.backward()
                opt.step()
                opt.zero_grad()
                run.append(float(loss))
            losses.append(run)
    assert losses[1] == pytest.approx(losses[0], rel=1e-3)
