"""compile_training on weight sharing (docs/architecture.md, "Training"): one layer run twice
(``self.l2 = self.l1``, as ALBERT runs its one layer N times) and one weight tied across two
layers. The model keeps its own parameters after the capture, and trains as eager does."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

from amp_compiler.errors import ConversionError  # noqa: E402
from amp_compiler.training import compile_training  # noqa: E402

from .test_training import _assert_same_params, _eager_step  # noqa: E402

F = torch.nn.functional


class _Shared(torch.nn.Module):
    def __init__(self, tie: str) -> None:
        super().__init__()
        self.l1, self.head = torch.nn.Linear(32, 32), torch.nn.Linear(32, 4)
        if tie == "module":
            self.l2 = self.l1
        else:
            self.l2 = torch.nn.Linear(32, 32)
            self.l2.weight = self.l1.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.gelu(self.l2(F.gelu(self.l1(x)))))


@pytest.mark.parametrize("tie", ["module", "weight"])
def test_shared_weights_stay_the_models_own_and_train_as_eager(tie):
    """Before: a layer reached by two paths got the traced FakeTensors back as its parameters."""
    torch.manual_seed(0)
    captured = _Shared(tie)
    eager = _Shared(tie)
    eager.load_state_dict(captured.state_dict())
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 32, generator=g), torch.randint(0, 4, (16,), generator=g)
    opt_c, opt_e = (torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (captured, eager))
    with pytest.warns(UserWarning):  # this small a step is planned FP32 (launch-bound), and says so
        step = compile_training(captured, F.cross_entropy, opt_c, (x, y))
    for _ in range(3):
        step(x, y)
        _eager_step(eager, opt_e, x, y)
    for _, module in captured.named_modules(remove_duplicate=False):
        for p in (*module._parameters.values(), *module._buffers.values()):
            assert p is None or type(p) is torch.nn.Parameter, type(p)
    assert captured.l2.weight is captured.l1.weight
    _assert_same_params(eager, captured, rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(captured(x), eager(x), rtol=1e-4, atol=1e-5)


def _embedding_model(**kw) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.EmbeddingBag(50, 16, **kw), torch.nn.Linear(16, 4))


def _ids() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randint(0, 50, (8, 6)), torch.randint(0, 4, (8,))


def test_habits_it_cannot_train_are_one_line_each_naming_the_fix():
    """Before: a sparse embedding failed inside aten ('aten::ne.Scalar' on 'SparseCPU'), a buffer made
    trainable was 'a parameter that is not the model's', a dict loss named only its type."""
    sparse = _embedding_model(sparse=True)
    with pytest.raises(ConversionError, match=r"^compile_training: module 0: EmbeddingBag\(sparse=True\) makes sparse "
                                        r"gradients.*use sparse=False"):
        compile_training(sparse, F.cross_entropy, torch.optim.SGD(sparse.parameters(), lr=0.1), _ids())
    model = _embedding_model()
    model.register_buffer("temperature", torch.ones(()))
    model.temperature.requires_grad_()
    opt = torch.optim.SGD([*model.parameters(), model.temperature], lr=0.1)
    with pytest.raises(ConversionError, match=r"holds the model's buffer 'temperature', which requires grad.*nn.Parameter"):
        compile_training(model, F.cross_entropy, opt, _ids())
    model = _embedding_model()
    with pytest.raises(ConversionError, match=r"got a dict \('loss', 'acc'\): return its loss tensor \(out\['loss'\]\)"):
        compile_training(model, lambda out, y: {"loss": F.cross_entropy(out, y), "acc": out.argmax(-1).eq(y).float()},
                         torch.optim.SGD(model.parameters(), lr=0.1), _ids())


def test_a_parameter_the_loss_does_not_reach_is_named_with_the_fix():
    """Before: autograd's 'The differentiated Tensor at index 2 appears to not have been used in the graph'."""
    model = torch.nn.ModuleDict({"used": torch.nn.Linear(16, 4), "spare_head": torch.nn.Linear(16, 4)})
    model.forward = lambda x: model["used"](x)
    batch = (torch.randn(8, 16), torch.randint(0, 4, (8,)))
    with pytest.raises(ConversionError, match=r"^compile_training: parameter spare_head.weight \(and 1 more\): gets "
                                              r"no gradient.*requires_grad_\(False\)"):
        compile_training(model, F.cross_entropy, torch.optim.SGD(model.parameters(), lr=0.1), batch)
    model["spare_head"].requires_grad_(False)
    with pytest.warns(UserWarning):  # planned FP32 at this size, and said
        step = compile_training(model, F.cross_entropy, torch.optim.SGD(model.parameters(), lr=0.1), batch)
    assert float(step(*batch)) > 0


class _Switch(torch.nn.Module):
    """A Python flag the forward branches on, and a call counter it writes (state, not a flag)."""

    def __init__(self) -> None:
        super().__init__()
        self.l1, self.l2 = torch.nn.Linear(16, 16), torch.nn.Linear(16, 4)
        self.residual, self.calls = False, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        h = F.gelu(self.l1(x))
        return self.l2(h + x if self.residual else h)


def test_a_flag_changed_mid_training_is_captured_again_and_a_counter_is_not():
    """Before: the step captured with ``residual=False`` kept training that graph after ``residual = True``."""
    torch.manual_seed(0)
    captured, eager = _Switch(), _Switch()
    eager.load_state_dict(captured.state_dict())
    opt_c, opt_e = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (captured, eager))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
    with pytest.warns(UserWarning):  # planned FP32 at this size, and said
        step = compile_training(captured, F.cross_entropy, opt_c, (x, y))
    step(x, y)  # the traced forward's counter write is state: no recapture, no warning
    _eager_step(eager, opt_e, x, y)
    captured.residual = eager.residual = True
    with pytest.warns(UserWarning, match=r"residual False -> True since the step was captured"):
        step(x, y)
    _eager_step(eager, opt_e, x, y)
    assert len(step.captures) == 2  # the example's and the flag's (plain SGD keeps no state)
    _assert_same_params(eager, captured, rtol=1e-4, atol=1e-5)


def test_a_value_set_at_every_step_is_dropped_from_the_watch_with_advice():
    """A temperature annealed as a Python float at every step would capture at every step: after
    ``RESTLESS`` captures it is taken as state, and the warning says to make it a tensor buffer."""
    from amp_compiler.fx_io.flags import RESTLESS
    model = _Switch()
    model.temperature = 1.0
    batch = (torch.randn(8, 16), torch.randint(0, 4, (8,)))
    with pytest.warns(UserWarning):
        step = compile_training(model, F.cross_entropy, torch.optim.SGD(model.parameters(), lr=0.1), batch)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        for i in range(RESTLESS + 3):
            model.temperature = 1.0 / (i + 2)
            step(*batch)
    messages = [str(w.message) for w in said]
    assert sum("taken as state" in m and "tensor buffer" in m for m in messages) == 1, messages
    assert len(step.captures) <= RESTLESS
