"""Fine-tuning recipes through compile_training, against eager PyTorch: frozen parameters,
gradient clipping (and seeing the gradients), gradient accumulation, changing batch shapes.

Tiny MLP, default plan (FP32 on a model this small, but for a frozen layer's forward GEMM:
its weights are constants stored FP16 once, a near-tie), so parity is to float rounding.
"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

from amp_compiler.errors import ConversionError  # noqa: E402
from amp_compiler.training import compile_training  # noqa: E402

from .test_training import _assert_same_params as _close  # noqa: E402
from .test_training import _eager_step  # noqa: E402

F = torch.nn.functional


def _mlp(frozen_first=False):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    if frozen_first:
        model[0].requires_grad_(False)
    return model


def _data(n=64, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 16, generator=g), torch.randint(0, 4, (n,), generator=g)


def _compile(model, opt, batch, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return compile_training(model, F.cross_entropy, opt, batch, **kw)


def test_frozen_parameters_get_no_gradient_state_or_update():
    eager, captured = _mlp(frozen_first=True), _mlp(frozen_first=True)
    opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-2)  # frozen ones in the optimizer too, as users do
    opt_c = torch.optim.AdamW(captured.parameters(), lr=1e-2)
    x, y = _data()
    step = _compile(captured, opt_c, (x, y))
    frozen = captured[0].weight.detach().clone()
    for _ in range(3):
        _eager_step(eager, opt_e, x, y)
        step(x, y)
    _close(eager, captured, rtol=1e-2, atol=1e-3)  # the frozen layer's GEMM runs FP16 (module docstring)
    assert torch.equal(captured[0].weight, frozen)
    assert captured[0].weight not in opt_c.state and captured[2].weight in opt_c.state
    graph = step.graph_module.graph
    assert sum("unscale_marker" in str(n.target) for n in graph.nodes) == 2  # gradients of layer 2 only
    fp16 = _mlp(frozen_first=True)
    step = _compile(fp16, torch.optim.AdamW(fp16.parameters(), lr=1e-2), (x, y), planner="greedy")
    casts = {c["tensor"] for c in step.report.casts}
    assert step.report.summary["fp16_gemm_flop_fraction"] == 1.0
    assert "2.weight" in casts and not {"0.weight", "0.bias"} & casts  # frozen: cast once when compiled, not per step



@pytest.mark.parametrize("planner", ["greedy", "optimal"])  # the frozen GEMM folded FP16; the default
def test_frozen_parameters_loaded_after_compiling_are_the_ones_trained_on(planner):
    """Resuming: a fresh model compiled, then a checkpoint loaded. The frozen layer's FP16 copy made at
    capture is recast from the loaded weights (it had stayed at the random init: a silently wrong loss)."""
    checkpoint = _mlp(frozen_first=True)
    with torch.no_grad():
        for p in checkpoint.parameters():
            p.mul_(-2.0)
    eager, captured = _mlp(frozen_first=True), _mlp(frozen_first=True)
    opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    opt_c = torch.optim.AdamW(captured.parameters(), lr=1e-2)
    x, y = _data()
    step = _compile(captured, opt_c, (x, y), planner=planner)
    eager.load_state_dict(checkpoint.state_dict())
    captured.load_state_dict(checkpoint.state_dict())
    for _ in range(2):
        expected = F.cross_entropy(eager(x), y)
        _eager_step(eager, opt_e, x, y)
        torch.testing.assert_close(step(x, y), expected, rtol=1e-2, atol=1e-3)
    _close(eager, captured, rtol=1e-2, atol=1e-3)



@pytest.mark.filterwarnings("ignore:compile_training. capturing", "ignore:compile_training. the plan runs")
@pytest.mark.parametrize("planner", ["greedy", "optimal"])
def test_a_step_survives_torch_save_and_continues_identically(planner):
    """``torch.save`` of the whole step (model, optimizer and scaler with it): with a frozen layer folded
    FP16 it had failed to load ('_CodeOnlyModule' has no attribute '_amp_folded...'), and after a symbolic
    capture (batches of several sizes) to save (a local shape-guard function); captures are made again."""
    import io

    model = _mlp(frozen_first=True)
    x, y = _data()
    step = _compile(model, torch.optim.AdamW(model.parameters(), lr=1e-2), (x, y), planner=planner)
    for n in (64, 48, 40):  # the third size is traced symbolic
        step(x[:n], y[:n])
    assert any(c.accepts is not None for c in step._captures.values())  # noqa: SLF001
    buffer = io.BytesIO()
    torch.save(step, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert loaded.model is not model and loaded.scale == step.scale
    for _ in range(2):
        assert torch.equal(loaded(x, y), step(x, y))
    _close(model, loaded.model, rtol=0, atol=0)


@pytest.mark.filterwarnings("ignore:compile_training. capturing", "ignore:compile_training. the plan runs")
def test_unfreezing_a_layer_mid_training_captures_again_and_trains_it():
    """A backbone unfrozen at epoch 2 (its parameters in the optimizer from the start, as users do):
    the step notices, captures again with the scale and optimizer state kept, and trains it as eager
    does (it had raised 'compile the step again', whose fresh scaler restarts at 65536)."""
    eager, captured = _mlp(frozen_first=True), _mlp(frozen_first=True)
    opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    opt_c = torch.optim.AdamW(captured.parameters(), lr=1e-2)
    x, y = _data()
    step = _compile(captured, opt_c, (x, y), loss_scale=1024.0)
    step(x, y)
    _eager_step(eager, opt_e, x, y)
    eager[0].requires_grad_(True)
    captured[0].requires_grad_(True)
    before = captured[0].weight.detach().clone()
    with pytest.warns(UserWarning, match="require grad changed.*4 trainable, 0 frozen"):
        step(x, y)
    _eager_step(eager, opt_e, x, y)
    step(x, y)
    _eager_step(eager, opt_e, x, y)
    assert not torch.equal(captured[0].weight, before) and captured[0].weight in opt_c.state
    assert step.scale == 1024.0
    _close(eager, captured, rtol=1e-2, atol=1e-3)


def _clipped_runs(clip, **step_options):
    """Three SGD steps, eager with ``clip(parameters)`` between backward and step, and captured with
    ``step_options``; yields ``(step, clip's result, eager gradients before clipping)`` after each."""
    eager, captured = _mlp(), _mlp()
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.5)
    x, y = _data()
    step = _compile(captured, torch.optim.SGD(captured.parameters(), lr=0.5), (x, y), keep_grads=True,
                    **step_options)
    for _ in range(3):
        opt_e.zero_grad()
        F.cross_entropy(eager(x), y).backward()
        raw = [p.grad.clone() for p in eager.parameters()]
        result = clip(eager.parameters())
        opt_e.step()
        step(x, y)
        yield step, result, raw
    _close(eager, captured)
    for (_, p), q in zip(captured.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)  # the clipped, unscaled gradients


def test_clipping_matches_unscale_then_clip_grad_norm_and_gradients_are_visible():
    for step, norm, _ in _clipped_runs(lambda ps: torch.nn.utils.clip_grad_norm_(ps, 0.05), max_grad_norm=0.05):
        torch.testing.assert_close(step.grad_norm, norm, rtol=1e-5, atol=1e-6)
    assert norm > 0.05  # clipping was active
    assert set(step.grads()) == {n for n, _ in step.model.named_parameters()}


def test_max_grad_value_matches_unscale_then_clip_grad_value():
    """``clip_grad_value_`` had no place in the captured step (called after it, it clips nothing)."""
    runs = list(_clipped_runs(lambda ps: torch.nn.utils.clip_grad_value_(ps, 0.01), max_grad_value=0.01))
    assert any(float(g.abs().max()) > 0.01 for _, _, raw in runs for g in raw)  # clipping was active
    assert max(float(g.abs().max()) for g in runs[-1][0].grads().values()) <= 0.01
    model = _mlp()
    with pytest.raises(ValueError, match="max_grad_value must be > 0"):
        _compile(model, torch.optim.SGD(model.parameters(), lr=0.5), _data(), max_grad_value=0)


def test_accumulation_updates_on_the_nth_call_like_eager_accumulation_of_loss_over_n():
    eager, captured = _mlp(), _mlp()
    opt_e = torch.optim.Adam(eager.parameters(), lr=1e-2)
    x, y = _data(96)
    micro = [(x[i:i + 32], y[i:i + 32]) for i in (0, 32, 64)]
    step = _compile(captured, torch.optim.Adam(captured.parameters(), lr=1e-2), micro[0], accumulation_steps=3,
                    max_grad_norm=1.0)
    for _ in range(2):
        opt_e.zero_grad()
        for xb, yb in micro:
            (F.cross_entropy(eager(xb), yb) / 3).backward()
        torch.nn.utils.clip_grad_norm_(eager.parameters(), 1.0)
        opt_e.step()
        before = [p.detach().clone() for p in captured.parameters()]
        step(*micro[0])
        step(*micro[1])
        assert all(torch.equal(a, b) for a, b in zip(before, captured.parameters()))  # not yet
        step(*micro[2])
    _close(eager, captured)


def test_flush_applies_an_epochs_unfinished_accumulation_as_eager_stepping_at_the_epochs_end():
    """An epoch of 7 micro-batches with ``accumulation_steps=3``: its last one had stayed accumulated and
    was added, silently, to the next epoch's first update (``zero_grad()`` cannot reach it). ``flush()``
    applies it as eager's ``loss / 3`` accumulation stepping at the end of the epoch does."""
    eager, captured = _mlp(), _mlp()
    opt_e = torch.optim.Adam(eager.parameters(), lr=1e-2)
    x, y = _data(8 * 7, seed=3)
    micro = [(x[i:i + 8], y[i:i + 8]) for i in range(0, 56, 8)]
    step = _compile(captured, torch.optim.Adam(captured.parameters(), lr=1e-2), micro[0], accumulation_steps=3,
                    max_grad_norm=1.0)
    assert step.flush() is False  # nothing pending
    for epoch in (micro, micro[:4]):  # 2 updates and 1 left over, then 1 update and 1 left over
        for i, (xb, yb) in enumerate(epoch):
            (F.cross_entropy(eager(xb), yb) / 3).backward()
            if (i + 1) % 3 == 0 or i + 1 == len(epoch):
                torch.nn.utils.clip_grad_norm_(eager.parameters(), 1.0)
                opt_e.step()
                opt_e.zero_grad()
            step(xb, yb)
        assert step.pending == 1
        before = [p.detach().clone() for p in captured.parameters()]
        assert step.flush() is True and step.pending == 0 and step.flush() is False
        assert not all(torch.equal(a, b) for a, b in zip(before, captured.parameters()))  # it did update
        _close(eager, captured)
    assert sum(row["flush"] for row in step.captures) == 1  # one capture serves every flush
    assert int(step.optimizer.state[next(captured.parameters())]["step"]) == 5  # 3 + 2 updates, as eager's

    # apply=False drops the pending micro-batch: the next update counts only the next three
    step(*micro[0])
    with pytest.warns(UserWarning, match=r"step.state_dict\(\) with 1 micro-batch\(es\) accumulated.*flush\(\)"):
        step.state_dict()
    assert step.flush(apply=False) is True and step.pending == 0
    opt_e.zero_grad()
    for xb, yb in micro[1:4]:
        (F.cross_entropy(eager(xb), yb) / 3).backward()
        step(xb, yb)
    torch.nn.utils.clip_grad_norm_(eager.parameters(), 1.0)
    opt_e.step()
    _close(eager, captured)


def test_accumulated_overflow_skips_the_whole_update():
    model = _mlp()
    x, y = _data()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    step = _compile(model, opt, (x, y), accumulation_steps=2)
    step(x, y), step(x, y)
    before = [p.detach().clone() for p in model.parameters()]
    bad = x.clone()
    bad[0, 0] = 3e38
    step(bad, y)  # the overflow is in the first micro-batch; the decision is taken on the second
    step(x, y)
    assert step.skipped_steps == 1 and step.scale == 2.0 ** 15
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_changing_batch_shapes_share_parameters_and_state_and_are_bounded():
    eager, captured = _mlp(), _mlp()
    opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    opt_c = torch.optim.AdamW(captured.parameters(), lr=1e-2)
    x, y = _data(100)
    batches = [(x[:64], y[:64]), (x[64:], y[64:]), (x[:64], y[:64]), (x[64:], y[64:])]  # 36: the last batch
    step = _compile(captured, opt_c, batches[0], max_captures=3)
    with pytest.warns(UserWarning, match=r"capturing step variant 2 \(batch shapes \[\(36, 16\), \(36,\)\]"):
        for xb, yb in batches:
            _eager_step(eager, opt_e, xb, yb)
            step(xb, yb)
    _close(eager, captured)
    # the first step creates the optimizer state; then the steady variant at 36, and at 64 again a
    # variant whose batch dim is symbolic: it takes every later batch size
    assert [c["batch_shapes"][0] for c in step.captures] == [(64, 16), (36, 16), (64, 16)]
    for n in (10, 50, 64, 23):
        _eager_step(eager, opt_e, x[:n], y[:n])
        step(x[:n], y[:n])
    _close(eager, captured)
    assert len(step.captures) == 3
    captured.eval()  # a new kind of variant, not a new size: the bound holds
    with pytest.raises(ConversionError, match="would be capture 4 of at most max_captures=3"):
        step(x[:10], y[:10])


class _TokenModel(torch.nn.Module):
    def __init__(self, vocab: int = 50, d: int = 32) -> None:
        super().__init__()
        self.embed, self.mix, self.head = torch.nn.Embedding(vocab, d), torch.nn.Linear(d, d), torch.nn.Linear(d, vocab)

    def forward(self, ids):
        h = self.embed(ids)
        return self.head(torch.relu(self.mix(h)) + h)


def _token_loss(logits, labels):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


def _token_runs(lengths: list[int], seed: int):
    """An eager AdamW model and a captured twin (same weights), the step, and ``run()``: one step
    of each on every padded batch of ``lengths``."""
    torch.manual_seed(0)
    eager, captured = _TokenModel(), _TokenModel()
    captured.load_state_dict(eager.state_dict())
    opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    opt_c = torch.optim.AdamW(captured.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(seed)
    batches = [torch.randint(0, 50, (4, n), generator=g) for n in lengths]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step = compile_training(captured, _token_loss, opt_c, (batches[0], batches[0]))

    def run():
        for ids in batches:
            opt_e.zero_grad()
            _token_loss(eager(ids), ids).backward()
            opt_e.step()
            step(ids, ids)
    return eager, captured, step, run


def test_padding_to_the_longest_sequence_of_each_batch_shares_one_symbolic_capture():
    """transformers' padding collators give every batch its own length: past the first steps one
    symbolic capture takes them all (more lengths than max_captures), and training matches eager."""
    lengths = [16, 20, 24, 31, 17, 40, 22, 33, 27, 19, 45]  # 11 lengths, max_captures 8
    eager, captured, step, run = _token_runs(lengths, seed=2)
    with pytest.warns(UserWarning, match=r"variant 3 \(batch shapes \[\(4, 24\), \(4, 24\)\], update; batch dims "
                                          r"\[\(0, 1\), \(1, 1\)\] traced symbolic, so later sizes reuse it\)"):
        run()
    _close(eager, captured, rtol=1e-4, atol=1e-5)
    assert len(step.captures) == 3  # the first step (state created), one steady length, then the symbolic one
    assert step.report.summary["dim_values"]  # the symbolic variant ran last


def test_a_step_planned_entirely_fp32_says_so_once():
    model = _mlp()
    x, y = _data()
    with pytest.warns(UserWarning, match="the plan runs the whole step in FP32: on h100 the cost model") as record:
        step = compile_training(model, F.cross_entropy, torch.optim.Adam(model.parameters()), (x, y))
        step(x, y)
        step(x, y)  # a second capture (the steady step, the optimizer state exists), no second warning
    assert len(step.captures) == 2
    assert sum("whole step in FP32" in str(w.message) for w in record) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        other = _mlp()
        compile_training(other, F.cross_entropy, torch.optim.SGD(other.parameters(), lr=0.1), (x, y),
                         planner="greedy")  # FP16 GEMMs: nothing to say


class _Pool(torch.nn.Module):
    """Tokens -> mean embedding -> logits: any sequence length."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.out = torch.nn.Embedding(32, 16), torch.nn.Linear(16, 4)

    def forward(self, ids):
        return self.out(self.emb(ids).mean(1))


def test_variable_sequence_length_matches_eager():
    eager, captured = _Pool(), _Pool()
    opt_e, opt_c = torch.optim.SGD(eager.parameters(), lr=0.5), torch.optim.SGD(captured.parameters(), lr=0.5)
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randint(0, 32, (8, n), generator=g), torch.randint(0, 4, (8,), generator=g)) for n in (12, 7, 12)]
    step = _compile(captured, opt_c, batches[0])
    for ids, y in batches:
        _eager_step(eager, opt_e, ids, y)
        step(ids, y)
    _close(eager, captured)
    assert sorted({c["batch_shapes"][0] for c in step.captures}) == [(8, 7), (8, 12)]


def test_a_symbolic_trace_that_fails_falls_back_to_static_captures(monkeypatch):
    """A failed symbolic trace costs one try: the step is captured static, as before, and later
    lengths of that kind are not traced symbolic again."""
    import amp_compiler.train_capture as tc

    tries = []

    def refuse(*args, **kwargs):
        tries.append(1)
        raise RuntimeError("symbolic trace refused (test)")

    monkeypatch.setattr(tc, "_trace_symbolic", refuse)
    eager, captured, step, run = _token_runs([16, 20, 24, 31], seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run()
    _close(eager, captured, rtol=1e-4, atol=1e-5)
    assert len(tries) == 1 and len(step.captures) == 4  # one symbolic try, then one static capture per length


class _Checkpointed(torch.nn.Module):
    """A first layer under ``torch.utils.checkpoint`` (what ``gradient_checkpointing_enable`` does per layer)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)

    def forward(self, x):  # non-reentrant, as transformers' gradient_checkpointing_enable() by default
        return self.b(torch.utils.checkpoint.checkpoint(lambda t: torch.relu(self.a(t)), x, use_reentrant=False))


def test_gradient_checkpointing_is_captured_with_its_recompute_and_matches_eager():
    """The checkpoint recomputes its segment during the backward, after ``functional_call`` had put the
    module's own parameters back: the trace met real parameters and failed ("convert all Tensors to
    FakeTensors")."""
    eager, captured = _Checkpointed(), _Checkpointed()
    opt_eager, opt_captured = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, captured))
    step = _compile(captured, opt_captured, _data())
    for seed in range(3):
        x, y = _data(seed=seed)
        _eager_step(eager, opt_eager, x, y)
        step(x, y)
    _close(captured, eager)
    first = [n for n in step.graph_module.graph.nodes if n.target is torch.ops.aten.addmm.default]
    assert len(first) == 3  # a, b and a again: the checkpointed segment is recomputed in the graph


def test_an_infinite_gradient_with_clipping_skips_the_step_and_backs_the_scale_off():
    """``max_grad_norm`` on an inf gradient: the norm is inf, the step is skipped (no raise, unlike
    ``clip_grad_norm_(error_if_nonfinite=True)``), the scale halves and the next step trains."""
    model = _mlp()
    x, y = _data()
    step = _compile(model, torch.optim.Adam(model.parameters(), lr=1e-2), (x, y), max_grad_norm=1.0)
    step(x, y)
    before = [p.detach().clone() for p in model.parameters()]
    bad = x.clone()
    bad[0, 0] = 3e38
    step(bad, y)
    assert not torch.isfinite(step.grad_norm) and step.skipped_steps == 1 and step.scale == 2.0 ** 15
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    step(x, y)
    assert torch.isfinite(step.grad_norm) and step.skipped_steps == 1
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def _said_in_two_steps(step, batch, words):
    """The warnings holding ``words`` that two calls of ``step`` give."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step(*batch)
        step(*batch)
    return [str(w.message) for w in caught if words in str(w.message)]


def test_a_gradient_left_by_an_eager_backward_is_cleared_and_said_once():
    """Without ``keep_grads`` the step's gradients never reach ``p.grad``: one an eager backward left
    there was what ``clip_grad_norm_`` after the step measured and clipped, silently unrelated to the
    update; it is cleared, and the warning points to ``max_grad_norm``."""
    model = _mlp()
    x, y = _data()
    F.cross_entropy(model(x), y).backward()  # a quick eager check before switching to the step
    step = _compile(model, torch.optim.SGD(model.parameters(), lr=0.1), (x, y))
    said = _said_in_two_steps(step, (x, y), "from outside the step")
    assert len(said) == 1 and "max_grad_norm=" in said[0], said
    assert all(p.grad is None for p in model.parameters())
    assert float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)) == 0.0  # nothing stale measured
    with pytest.raises(ValueError, match="max_grad_norm="):
        step.grads()


def test_a_hook_registered_after_compile_training_is_said_at_the_next_step():
    """Registered after the capture, a hook is never called by the step; the next step says so, once."""
    model = _mlp()
    x, y = _data()
    step = _compile(model, torch.optim.SGD(model.parameters(), lr=0.1), (x, y))
    called = []
    model[0].register_forward_pre_hook(lambda *_: called.append(1))
    said = _said_in_two_steps(step, (x, y), "after compiling")
    assert len(said) == 1 and "registered on 0 after compiling is not called" in said[0], said
    assert not called


def test_a_parameter_replaced_after_compiling_is_refused_and_in_place_loads_train():
    """``model[2].weight = nn.Parameter(...)`` after compile_training: the step and the optimizer hold
    the old tensor, so the new one had never trained, without a word. The step refuses before anything
    runs; values copied in place (load_state_dict) train as before."""
    model = _mlp()
    x, y = _data()
    step = _compile(model, torch.optim.SGD(model.parameters(), lr=0.1), (x, y))
    step(x, y)
    fresh = _mlp()
    model.load_state_dict(fresh.state_dict())  # in place: the same tensors, new values
    before = model[2].weight.detach().clone()
    step(x, y)
    assert not torch.equal(model[2].weight, before)  # trained from the loaded values
    model[2].weight = torch.nn.Parameter(torch.zeros(4, 32))
    with pytest.raises(ValueError, match=r"2\.weight was replaced after compile_training.*copy new values in place"):
        step(x, y)
    assert torch.equal(model[2].weight, torch.zeros(4, 32))  # nothing ran


def test_a_pickled_step_still_notices_a_replaced_parameter():
    """The watch travels with ``torch.save(step)`` and compares the loaded model's own slots."""
    import io

    model = _mlp()
    x, y = _data()
    step = _compile(model, torch.optim.SGD(model.parameters(), lr=0.1), (x, y))
    step(x, y)
    buffer = io.BytesIO()
    torch.save(step, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded(x, y)  # captures again, from the loaded model
    loaded.model[0].bias = torch.nn.Parameter(torch.zeros(32))
    with pytest.raises(ValueError, match=r"0\.bias was replaced"):
        loaded(x, y)
