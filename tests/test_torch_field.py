"""What a new user of the PyTorch inference path meets on models and calls the other tests do not
build: the errors they get name the cause to fix."""

from __future__ import annotations

import pytest
import torch

import amp_compiler
from amp_compiler.errors import ConversionError


class _Heads(torch.nn.Module):
    """Attention-like reshape whose head count does not divide the width (a bad config): the model
    itself fails on every call, eagerly too."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(12, 12)

    def forward(self, x):
        return self.proj(x).view(x.shape[0], x.shape[1], 5, -1).sum(-1)


@pytest.mark.parametrize("example", [True, False])
def test_a_call_the_model_itself_cannot_run_is_said_so_not_blamed_on_capture(example):
    """Both routes failed and the error told the user to make "that construct traceable (torch.where/
    torch.cond ...)", with dynamo's fake-tensor text, when the model fails on the call in eager
    PyTorch as well: the inputs (or the model's config) are what to fix."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 12), torch.nn.ReLU(), _Heads()).eval()
    x = torch.randn(2, 3, 4)
    with pytest.raises(ConversionError) as caught:
        if example:
            amp_compiler.compile(model, (x,))
        else:
            amp_compiler.compile(model)(x)
    text = str(caught.value)
    assert "fails on this call in eager PyTorch too" in text, text
    assert "module 2 (_Heads)" in text and "view" in text, text
    assert "construct traceable" not in text and "FakeTensor" not in text, text
