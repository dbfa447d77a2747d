"""compile_training on weight sharing (docs/architecture.md, "Training"): one layer run twice
(``self.l2 = self.l1``, as ALBERT runs its one layer N times) and one weight tied across two
layers. The model keeps its own parameters after the capture, and trains as eager does."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

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
