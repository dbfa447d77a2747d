"""compile_training on recipes found by trying it as a user would (docs/architecture.md, "Training"):
each test is a habit that had trained wrong or failed, against eager PyTorch on the same seed."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

from amp_compiler.errors import ConversionError  # noqa: E402
from amp_compiler.training import compile_training  # noqa: E402

from .test_training import _batch  # noqa: E402

F = torch.nn.functional


def _quiet_compile(*args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "the plan runs the whole step in FP32": known for a model this small
        return compile_training(*args, **kw)


def _spectral_mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    spectral = torch.nn.utils.parametrizations.spectral_norm(torch.nn.Linear(16, 32))
    return torch.nn.Sequential(spectral, torch.nn.ReLU(), torch.nn.Linear(32, 4))


def test_compiling_does_not_run_a_parametrization_and_its_buffers_follow_eager():
    """``spectral_norm``'s power iteration updates its ``_u``/``_v`` buffers on every read of the
    weight: a check at compile time had read ``module.weight``, one iteration eager never ran."""
    captured, eager = _spectral_mlp(), _spectral_mlp()
    x, y = _batch()
    before = {n: b.clone() for n, b in captured.named_buffers()}
    step = _quiet_compile(captured, F.cross_entropy, torch.optim.SGD(captured.parameters(), lr=0.1), (x, y))
    for name, b in captured.named_buffers():
        torch.testing.assert_close(b, before[name], rtol=0, atol=0)
    opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    for _ in range(2):
        step(x, y)
        opt.zero_grad()
        F.cross_entropy(eager(x), y).backward()
        opt.step()
    for (name, a), (_, b) in zip(eager.named_buffers(), captured.named_buffers()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=name)


def test_the_steps_warnings_point_at_the_users_line():
    """The all-FP32 warning said at compile had pointed at training.py (a fixed stacklevel counted from
    the step's call, one frame short from ``compile_training``)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    x, y = _batch()
    with pytest.warns(UserWarning) as said:
        step = compile_training(model, F.cross_entropy, torch.optim.SGD(model.parameters(), lr=0.1), (x, y))
        step(*_batch(n=8))  # another batch size: "capturing step variant 2"
    assert len(said) >= 2
    assert [w.filename for w in said] == [__file__] * len(said)


def _bn_dropout_mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(),
                               torch.nn.Dropout(0.3), torch.nn.Linear(32, 4))


def test_a_submodule_switched_to_eval_after_compiling_is_followed():
    """Freezing batch-norm statistics (``bn.eval()`` in a training model, a fine-tuning habit) had kept
    running the capture made in train mode: batch statistics, running stats still updated, dropout on."""
    captured, eager = _bn_dropout_mlp(), _bn_dropout_mlp()
    x, y = _batch()
    step = _quiet_compile(captured, F.cross_entropy, torch.optim.SGD(captured.parameters(), lr=0.1), (x, y))
    opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    for i in range(4):
        if i == 2:
            for model in (captured, eager):
                model[1].eval()
                model[3].eval()
        torch.manual_seed(i)
        loss = step(x, y)
        torch.manual_seed(i)
        opt.zero_grad()
        eager_loss = F.cross_entropy(eager(x), y)
        eager_loss.backward()
        opt.step()
        torch.testing.assert_close(loss, eager_loss.detach(), rtol=1e-5, atol=1e-6)
    assert int(captured[1].num_batches_tracked) == 2
    for (name, a), (_, b) in zip(eager.state_dict().items(), captured.state_dict().items()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=name)


class _Named(torch.nn.Module):
    """A transformers-style model: keyword inputs, a dict output holding a loss only given labels."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        logits = self.linear(x)
        return {"logits": logits} if labels is None else {"loss": F.cross_entropy(logits, labels), "logits": logits}


def test_a_loss_less_output_names_what_the_step_takes():
    """An output without a loss had read "return its loss tensor (out[the loss's key])"."""
    model = _Named()
    x, y = _batch()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ConversionError, match=r"got a dict \('logits'\) with no 'loss'.*given labels="):
        compile_training(model, lambda out, labels: out, opt, (x, y))
    step = _quiet_compile(model, lambda out: out["loss"], opt, (x, y), n_targets=0)
    with pytest.raises(ValueError, match=r"takes 2 batch tensors \(like the example batch\), got 1 \(a dict: "
                                         r"\('x', 'labels'\)\)"):
        step(x=x, labels=y)  # compiled for positional tensors
    before = model.linear.weight.detach().clone()
    step(x, y)  # positionally, the model's own loss (labels=) trains
    assert not torch.equal(before, model.linear.weight)


def test_an_example_batch_of_one_tensor_is_refused_not_split_into_rows():
    """``tuple(x)`` had split a bare tensor batch into its rows: the first rows the model's inputs,
    the last its target, and the step trained on that without a word."""
    model = _Named()
    x, _ = _batch()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match=r"example batch is one tensor of shape \(\d+, \d+\).*\(x, y\), or \(x,\) "
                                         r"with n_targets=0"):
        compile_training(model, lambda out: out["loss"], opt, x)


def _tiny_gpt2():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2, n_positions=32, bos_token_id=0,
                                     eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(config)


def test_a_hugging_face_dict_batch_trains_as_model_of_its_keywords_does_in_eager():
    """``model(**batch).loss``, the Hugging Face habit, had been refused ("the step takes tensors in order"):
    a dict batch (a collator's ``BatchEncoding``) is the model's keyword inputs, its None and bool entries
    constants of the capture; ``step(batch)`` and ``step(**batch)`` both take it, as eager's loop does."""
    transformers = pytest.importorskip("transformers")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 64, (4, 8), generator=g)
    mask = torch.ones_like(ids)
    mask[0, 6:] = 0
    batch = transformers.BatchEncoding({"input_ids": ids, "attention_mask": mask, "labels": ids,
                                        "token_type_ids": None, "use_cache": False})
    eager, captured = _tiny_gpt2(), _tiny_gpt2()
    opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    step = _quiet_compile(captured, lambda out: out.loss, torch.optim.SGD(captured.parameters(), lr=0.1), batch)
    for i in range(3):
        loss = step(batch) if i % 2 == 0 else step(**batch)
        opt.zero_grad()
        eager_loss = eager(**batch).loss
        eager_loss.backward()
        opt.step()
        torch.testing.assert_close(loss, eager_loss.detach(), rtol=1e-5, atol=1e-6)
    for (name, a), (_, b) in zip(eager.named_parameters(), captured.named_parameters()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=name)
    assert len(step.captures) == 1
    assert step.captures[0]["batch_shapes"] == [(4, 8), (4, 8), (4, 8)]  # the tensors; None and False are constants
    with pytest.raises(ValueError, match=r"batch has the keys \('input_ids', 'labels'\), the example's "
                                         r"\('input_ids', 'attention_mask', 'labels', 'token_type_ids', 'use_cache'\)"):
        step({"input_ids": ids, "labels": ids})


class _Nested(torch.nn.Module):
    """A model of nested inputs: a (features, extra) pair and a dict taken as one argument."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(16, 4)
        self.gate = torch.nn.Linear(16, 4)

    def forward(self, pair: tuple, batch: dict) -> torch.Tensor:
        x, extra = pair
        out = self.linear(x) * batch["scale"]
        return out + self.gate(extra["z"]) if batch["add"] else out - self.gate(extra["z"])


def test_nested_batches_and_their_constants_key_the_captures_and_match_eager():
    """Tuples, lists and dicts nest in a batch; a bool leaf (a flag the forward branches on) is a constant
    of the capture: another value is a capture of its own, not the first one's branch run again."""
    x, y = _batch()
    z = torch.randn(64, 16, generator=torch.Generator().manual_seed(3))

    def batch(add):
        return ((x, {"z": z}), {"scale": torch.full((1,), 0.5), "add": add}, y)

    eager, captured = _Nested(), _Nested()
    opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    with pytest.raises(ValueError, match=r"batch item 1\['scale'\] of the example batch is a ndarray"):
        compile_training(captured, F.cross_entropy, torch.optim.SGD(captured.parameters(), lr=0.1),
                         ((x, {"z": z}), {"scale": z.numpy(), "add": True}, y))
    step = _quiet_compile(captured, F.cross_entropy, torch.optim.SGD(captured.parameters(), lr=0.1), batch(True))
    said_new = []
    for add in (True, False, True, False):
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            loss = step(*batch(add))
        if not add and not said_new:
            said_new = [str(w.message) for w in said]
        opt.zero_grad()
        eager_loss = F.cross_entropy(eager(*batch(add)[:2]), y)
        eager_loss.backward()
        opt.step()
        torch.testing.assert_close(loss, eager_loss.detach(), rtol=1e-5, atol=1e-6)
    for (name, a), (_, b) in zip(eager.named_parameters(), captured.named_parameters()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=name)
    assert len(step.captures) == 2  # one per value of the constant, which the warning names
    assert any("capturing step variant 2 (batch constants batch item 1['add']=False, update)" in m for m in said_new)
    with pytest.raises(ValueError, match=r"batch item 0\[1\]\['z'\] is a float, the example's is a tensor"):
        step((x, {"z": 1.0}), {"scale": torch.ones(1), "add": True}, y)


@pytest.mark.parametrize("make", [
    lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.04),
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-3),
], ids=["adamw", "sgd"])
def test_a_weight_decay_schedule_costs_no_capture_and_matches_eager(make):
    """A weight-decay schedule (DINO's cosine) sets ``param_group["weight_decay"]`` at every step: a constant
    of the graph, each value had been a capture of its own (seconds each, and the 9th step failed at
    max_captures). It is a graph input now; only its sign is in the capture key (the optimizers branch on
    ``weight_decay != 0`` in Python), so a schedule reaching 0 is one more capture, not one per value."""
    def mlp():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))

    eager, captured = mlp(), mlp()
    opt_eager, opt_captured = make(eager.parameters()), make(captured.parameters())
    step = _quiet_compile(captured, F.cross_entropy, opt_captured, _batch(), max_captures=3)
    decays = [0.04 * (1 + i) for i in range(9)] + [0.0, 0.0, 0.05]  # ... then off, then on again
    for i, wd in enumerate(decays):
        for opt in (opt_eager, opt_captured):
            opt.param_groups[0]["weight_decay"] = wd
        x, y = _batch(seed=i)
        opt_eager.zero_grad()
        F.cross_entropy(eager(x), y).backward()
        opt_eager.step()
        if i == 9:
            with pytest.warns(UserWarning, match=r"'s weight_decay reached or left 0 since a capture"):
                step(x, y)
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # no capture warning for a new value
                step(x, y)
        if i == 8:  # nine values: the state-creating capture and the steady one
            assert len(step.captures) == 2
    assert len(step.captures) == 3  # weight_decay == 0 takes the other branch: one more
    for p, q in zip(eager.parameters(), captured.parameters()):
        torch.testing.assert_close(q.detach(), p.detach(), rtol=1e-5, atol=1e-6)


def test_a_constant_hyper_parameter_schedule_is_told_what_changes_it_not_cycle_momentum():
    """A hyper-parameter that stays a constant of the graph (here the weight decay of an optimizer whose
    ``step()`` is its own, not torch's) changed at every step is a capture per value: it had been advised
    to pass ``cycle_momentum=False``, which changes nothing for it."""
    class OwnStepAdamW(torch.optim.AdamW):
        def step(self, closure=None):
            return super().step(closure)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = OwnStepAdamW(model.parameters(), lr=1e-3, weight_decay=0.04)
    step = _quiet_compile(model, F.cross_entropy, opt, _batch(), max_captures=3)
    step(*_batch())  # the state-creating capture, then the steady one
    with pytest.warns(UserWarning) as said:
        for i in range(3):
            opt.param_groups[0]["weight_decay"] = 0.04 * (i + 2)
            if i < 2:
                step(*_batch())
            else:
                with pytest.raises(ConversionError, match=r"max_captures=3: optimizer OwnStepAdamW's hyper-"
                                                          r"parameters \['weight_decay'\].*keep weight_decay "
                                                          r"constant") as exc:
                    step(*_batch())
    advice = [str(w.message) for w in said if "hyper-parameters" in str(w.message)]
    assert advice and all("weight_decay" in a and "cycle_momentum" not in a for a in advice)
    assert "cycle_momentum" not in str(exc.value)


def test_optimizer_step_hooks_are_refused_naming_them():
    """``step()`` is traced once: a step hook (an EMA of the weights) had run once at capture on traced
    tensors, failing there ("convert all Tensors to FakeTensors") or, harmless there, never again."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    handle = opt.register_step_post_hook(lambda *_: None)
    with pytest.raises(ConversionError, match=r"optimizer AdamW: has step hooks \(register_step_post_hook\).*"
                                              r"never at a step"):
        compile_training(model, F.cross_entropy, opt, _batch())
    handle.remove()
    step = _quiet_compile(model, F.cross_entropy, opt, _batch())
    step(*_batch())
    calls = []
    handle = register_optimizer_step_pre_hook(lambda *_: calls.append(1))
    try:  # registered after compiling, torch's global kind: refused before the step runs
        before = model[0].weight.detach().clone()
        with pytest.raises(ConversionError, match=r"register_optimizer_step_pre_hook"):
            step(*_batch())
        assert torch.equal(before, model[0].weight) and not calls
    finally:
        handle.remove()
    step(*_batch())


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def _eager_sgd(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()


def test_a_torch_compiled_model_trains_its_original_module_and_says_so():
    """``compile_training(torch.compile(model), ...)``: make_fx had traced into inductor's kernels and
    failed ('Cannot access data pointer of Tensor'); the step trains the module torch.compile wraps."""
    captured, eager = _mlp(), _mlp()
    x, y = _batch()
    with pytest.warns(UserWarning, match=r"torch.compile'd module.*backend=\"inductor\""):
        step = compile_training(torch.compile(captured), F.cross_entropy,
                                torch.optim.SGD(captured.parameters(), lr=0.1), (x, y))
    for _ in range(2):
        step(x, y)
    _eager_sgd(eager, x, y, 2)
    for a, b in zip(eager.parameters(), captured.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


def test_the_step_called_inside_torch_compile_runs_as_captured_and_says_so():
    """``torch.compile(step)`` (or a compiled loop calling it): dynamo had traced into the capture and the
    planner and failed there; the step runs outside dynamo, as captured, with one warning."""
    captured, eager = _mlp(), _mlp()
    x, y = _batch()
    step = _quiet_compile(captured, F.cross_entropy, torch.optim.SGD(captured.parameters(), lr=0.1), (x, y),
                          accumulation_steps=2)
    compiled = torch.compile(step)
    with pytest.warns(UserWarning, match="called inside torch.compile") as said:
        compiled(x, y)
        compiled(x, y)
        compiled(x, y)
    assert sum("inside torch.compile" in str(w.message) for w in said) == 1
    assert torch.compile(lambda: step.flush())() is True  # the third micro-batch, applied
    opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    for micro in range(3):
        F.cross_entropy(eager(x), y).div(2).backward()
        if micro % 2 or micro == 2:
            opt.step()
            opt.zero_grad()
    for a, b in zip(eager.parameters(), captured.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


class _DoubledMSE(torch.autograd.Function):
    """A loss with its own backward, which multiplies the incoming gradient (the loss scale) by 2 first."""

    @staticmethod
    def forward(ctx, pred, target):
        ctx.save_for_backward(pred, target)
        return ((pred - target) ** 2).mean()

    @staticmethod
    def backward(ctx, grad):
        pred, target = ctx.saved_tensors
        return grad * 2 * (pred - target) / pred.numel(), None


def test_a_custom_backward_reading_the_loss_scale_skips_no_step():
    """The custom backward's ``grad * 2`` is 2**17 at the default scale: planned FP16 next to the FP16
    GEMMs, it had been cast to inf, so every step was skipped until the scale had backed off to 2**14.
    Values of the scale alone, and the ops reading them, stay FP32 (``loss_scale.scale_carriers``)."""
    captured, eager = _mlp(), _mlp()
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 16, generator=g), torch.randn(32, 4, generator=g)
    step = _quiet_compile(captured, lambda out, t: _DoubledMSE.apply(out, t),
                          torch.optim.SGD(captured.parameters(), lr=0.1), (x, y), planner="greedy")
    for _ in range(3):
        step(x, y)
    assert step.skipped_steps == 0 and step.scale == 2.0 ** 16
    assert step.report.summary["fp16_gemm_flop_fraction"] == 1.0
    opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        _DoubledMSE.apply(eager(x), y).backward()
        opt.step()
    for a, b in zip(eager.parameters(), captured.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-2, atol=1e-3)
