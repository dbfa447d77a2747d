"""``torch.no_grad()`` inside a forward planned for training (docs/architecture.md, "Capture routes
and shapes"; "FX emitter", case 6): what the block computes gets no gradient (a teacher's weights,
spectral norm's power iteration) and a buffer it writes stays out of the autograd graph, as in eager."""

import copy

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrizations

import amp_compiler


def _model(kind: str) -> nn.Module:
    torch.manual_seed(0)
    head = nn.Linear(32, 8)
    head = parametrizations.spectral_norm(head) if kind == "parametrization" else nn.utils.spectral_norm(head)
    return nn.Sequential(nn.Linear(32, 32), nn.ReLU(), head).train()


@pytest.mark.parametrize("kind", ["parametrization", "hook"])
def test_spectral_norm_trains_like_eager(kind):
    model, x = _model(kind), torch.randn(4, 32)
    eager = copy.deepcopy(model)
    eager(x).sum().backward()
    amp = amp_compiler.compile(model, (x,), training=True)
    amp(x).sum().backward()
    for (name, b), (_, b_eager) in zip(model.named_buffers(), eager.named_buffers()):
        assert not b.requires_grad and b.grad_fn is None, name  # had been a node of the autograd graph
        torch.testing.assert_close(b, b_eager, atol=1e-3, rtol=1e-3)  # one power iteration, as eager
    for (name, p), (_, p_eager) in zip(model.named_parameters(), eager.named_parameters()):
        assert type(p.grad) is torch.Tensor, name  # the spectral norm's weight had a FakeTensor gradient
        torch.testing.assert_close(p.grad, p_eager.grad, atol=2e-2, rtol=2e-2)


class Distilled(nn.Module):
    def __init__(self):
        super().__init__()
        self.student, self.teacher = nn.Linear(32, 32), nn.Linear(32, 32)

    def forward(self, x):
        with torch.no_grad():
            target = self.teacher(x)
        return ((self.student(x) - target) ** 2).mean()


@pytest.mark.parametrize("entry", ["compile", "torch.compile backend"])
def test_a_no_grad_teacher_gets_no_gradient(entry):
    torch.manual_seed(0)
    model, x = Distilled().train(), torch.randn(4, 32)
    eager = copy.deepcopy(model)
    eager(x).backward()
    torch._dynamo.reset()
    compiled = amp_compiler.compile(model, (x,)) if entry == "compile" else torch.compile(model, backend="amp_compiler")
    compiled(x).backward()
    assert eager.teacher.weight.grad is None and model.teacher.weight.grad is None  # had been 855 (summed |grad|)
    torch.testing.assert_close(model.student.weight.grad, eager.student.weight.grad, atol=2e-2, rtol=2e-2)
