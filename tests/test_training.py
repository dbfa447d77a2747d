"""compile_training's captured step: optimizer parity, loss scaling, overflow skips, state."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from amp_compiler import loss_scale as ls  # noqa: E402
from amp_compiler.errors import ConversionError  # noqa: E402
from amp_compiler.training import TrainStep, capture_step  # noqa: E402


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def _batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(64, 16, generator=g), torch.randint(0, 4, (64,), generator=g)


def _fp32_step(model, optimizer, loss_scale="dynamic", **scaler):
    config = ls.LossScaleConfig.parse(loss_scale, **scaler)
    gm, layout, opt, state = capture_step(model, torch.nn.functional.cross_entropy, optimizer, _batch(), config)
    return TrainStep(model, optimizer, gm, layout, opt, config, state), gm


OPTIMIZERS = {
    "sgd_momentum_wd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-4),
    "sgd_plain": lambda p: torch.optim.SGD(p, lr=0.1),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=1e-4),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2),
}


@pytest.mark.parametrize("name", OPTIMIZERS)
@pytest.mark.parametrize("loss_scale", ["none", "dynamic", 1024.0])
def test_captured_step_matches_torch_optimizer(name, loss_scale):
    eager, captured = _mlp(), _mlp()
    opt_eager, opt_captured = OPTIMIZERS[name](eager.parameters()), OPTIMIZERS[name](captured.parameters())
    step, _ = _fp32_step(captured, opt_captured, loss_scale)
    x, y = _batch()
    for i in range(6):
        opt_eager.zero_grad()
        torch.nn.functional.cross_entropy(eager(x), y).backward()
        opt_eager.step()
        step(x, y)
        if i == 2:  # a learning-rate change between steps must take effect without recapture
            for opt in (opt_eager, opt_captured):
                for group in opt.param_groups:
                    group["lr"] *= 0.5
    for a, b in zip(eager.parameters(), captured.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_step_graph_has_no_host_sync_and_marks_every_gradient():
    model = _mlp()
    _, gm = _fp32_step(model, torch.optim.SGD(model.parameters(), lr=0.1))
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert "getitem" in " ".join(targets)  # the graph is what we think it is
    host_syncs = {"aten._local_scalar_dense.default", "aten.item.default", "aten.is_nonzero.default"}
    assert not host_syncs & set(targets)
    markers = [t for t in targets if "unscale_marker" in t]
    assert len(markers) == len(list(model.parameters()))


def test_overflow_skips_the_update_and_halves_the_scale_then_grows_back():
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    step, _ = _fp32_step(model, opt, growth_interval=3)
    x, y = _batch()
    for _ in range(2):  # some optimizer state worth protecting
        step(x, y)
    before = [p.detach().clone() for p in model.parameters()]
    state_before = step.state_dict()["optimizer_state"]
    bad = x.clone()
    bad[0, 0] = 3e38  # activations overflow: the gradients hold inf/NaN
    step(bad, y)
    assert step.skipped_steps == 1
    assert step.scale == 2.0 ** 15
    for a, b in zip(before, model.parameters()):
        assert torch.equal(a, b)  # parameters bit-identical
    for key, tensors in step.state_dict()["optimizer_state"].items():
        for a, b in zip(state_before[key], tensors):
            assert torch.equal(a, b), key  # optimizer state (moments, step counts) too
    for _ in range(3):
        step(x, y)
    assert step.skipped_steps == 1
    assert step.scale == 2.0 ** 16  # grown back after growth_interval clean steps
    assert not any(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_state_dict_round_trip_resumes_identically():
    x, y = _batch()
    a, b = _mlp(), _mlp()
    opt_a, opt_b = torch.optim.AdamW(a.parameters(), lr=1e-2), torch.optim.AdamW(b.parameters(), lr=1e-2)
    step_a, _ = _fp32_step(a, opt_a)
    step_b, _ = _fp32_step(b, opt_b)
    for _ in range(3):
        step_a(x, y)
    step_b.load_state_dict(step_a.state_dict())
    b.load_state_dict(a.state_dict())
    for _ in range(2):
        la, lb = step_a(x, y), step_b(x, y)
    assert torch.equal(la, lb)
    assert step_b.scale == step_a.scale


def test_unsupported_optimizer_is_a_clear_error():
    model = _mlp()
    with pytest.raises(ConversionError, match="optimizer RMSprop: not supported; use torch.optim.SGD, Adam or AdamW"):
        _fp32_step(model, torch.optim.RMSprop(model.parameters()))
    with pytest.raises(ConversionError, match="nesterov=True is not supported"):
        _fp32_step(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True))
