"""A custom torch.autograd.Function in a forward planned for training (docs/architecture.md,
"Capture routes and shapes"): its backward() must not be silently replaced by autograd of
its traced forward; inference plans keep converting it."""

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import amp_compiler
from amp_compiler.fx_io.autograd_functions import CustomBackwardError


class RoundSTE(torch.autograd.Function):
    """Straight-through rounding: autograd of round() is zero, this backward passes gradients on."""

    @staticmethod
    def forward(ctx, x):
        return torch.round(x * 4) / 4

    @staticmethod
    def backward(ctx, grad):
        return grad


class Quantised(nn.Module):
    def __init__(self, reentrant_checkpoint: bool = False):
        super().__init__()
        self.l1, self.l2 = nn.Linear(32, 32), nn.Linear(32, 32)
        self.reentrant_checkpoint = reentrant_checkpoint

    def forward(self, x):
        if self.reentrant_checkpoint:  # torch's own Function: its backward is its forward's gradient
            return self.l2(checkpoint(self.l1, x, use_reentrant=True))
        return self.l2(RoundSTE.apply(self.l1(x)))


X = torch.randn(2, 4, 32)


def test_training_compile_refuses_a_custom_backward_naming_it():
    with pytest.raises(CustomBackwardError, match=r"RoundSTE \(.*test_torch_autograd_function.py:\d+\).*backward"):
        amp_compiler.compile(Quantised().train(), (X,))


def test_inference_compile_converts_it():
    model = Quantised().eval()
    amp = amp_compiler.compile(model, (X,))
    assert amp.report.summary["fp16_nodes"] > 0
    torch.testing.assert_close(amp(X), model(X), atol=0.3, rtol=0.05)  # FP16 may flip a rounding step


def test_backend_refuses_it_in_training_not_under_no_grad():
    model = Quantised().train()
    with pytest.raises(Exception, match="RoundSTE.apply.*not its backward") as info:
        torch.compile(model, backend="amp_compiler")(X)
    assert "CustomBackwardError" in str(info.value)
    torch._dynamo.reset()
    with torch.no_grad():
        assert torch.compile(model, backend="amp_compiler")(X).shape == X.shape


def test_reentrant_checkpoint_still_trains():
    model = Quantised(reentrant_checkpoint=True).train()
    x = X.clone().requires_grad_()  # eager's reentrant checkpoint gives l1 no gradient otherwise
    amp = amp_compiler.compile(model, (x,))
    amp(x).sum().backward()
    assert model.l1.weight.grad is not None and model.l1.weight.grad.abs().sum() > 0
