"""Copying and saving an AmpModule (docs/architecture.md, "Capture routes and shapes"): deepcopy gives
an independent module planned again, pickling is refused with what to save instead, and the
state_dict is the model's."""

import copy
import io
import pickle

import pytest
import torch
from torch import nn

import amp_compiler


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)).eval()


X = torch.randn(4, 32)


def test_deepcopy_runs_its_own_weights():
    model = _mlp()
    amp = amp_compiler.compile(model, (X,))
    twin = copy.deepcopy(amp)
    with torch.no_grad():
        for p in twin.parameters():
            p.mul_(-1)
    assert not any(p is q for p, q in zip(twin.parameters(), model.parameters()))
    expected = nn.Sequential(*copy.deepcopy(list(model)))
    with torch.no_grad():
        for p in expected.parameters():
            p.mul_(-1)
    torch.testing.assert_close(twin(X), expected(X), atol=2e-2, rtol=2e-2)  # had run the original's weights
    torch.testing.assert_close(amp(X), model(X), atol=2e-2, rtol=2e-2)  # the original is untouched
    assert twin.report is not None and twin.capture == amp.capture


@pytest.mark.parametrize("save", [pickle.dumps, lambda m: torch.save(m, io.BytesIO())])
def test_pickling_is_refused_with_what_to_save(save):
    amp = amp_compiler.compile(_mlp(), (X,))
    with pytest.raises(TypeError, match=r"cannot be pickled.*save amp_model.state_dict\(\)"):
        save(amp)  # had been "Can't pickle local object '_ExportRoute._planned.<locals>.run'"


def test_state_dict_round_trips_into_a_fresh_model():
    model = _mlp()
    buffer = io.BytesIO()
    torch.save(amp_compiler.compile(model, (X,)).state_dict(), buffer)
    buffer.seek(0)
    fresh = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)).eval()
    fresh.load_state_dict(torch.load(buffer))
    torch.testing.assert_close(fresh(X), model(X), atol=0, rtol=0)
