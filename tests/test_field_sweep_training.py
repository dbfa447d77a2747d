"""compile_training on recipes the field sweep tried that the other training tests do not name."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

from amp_compiler.training import compile_training  # noqa: E402

F = torch.nn.functional


class _Keyworded(torch.nn.Module):
    """A model of keyword inputs that returns its loss, as a Hugging Face model given ``labels`` does."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.hidden, self.head = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)

    def forward(self, features: torch.Tensor, scale: torch.Tensor, labels: torch.Tensor) -> dict:
        logits = self.head(torch.relu(self.hidden(features * scale)))
        return {"loss": F.cross_entropy(logits, labels)}


def _quiet_compile(*args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "the plan runs the whole step in FP32": known for a model this small
        return compile_training(*args, **kw)


def test_a_dict_batch_whose_keys_come_in_another_order_trains_as_the_examples_order_does():
    """A collator that builds its dict in another order than the example's (labels first) had been
    refused ("has the keys ... in another order"): ``model(**batch)`` does not care about the order,
    so neither does the step; it is the same capture, and the same numbers as eager."""
    g = torch.Generator().manual_seed(0)
    example = {"features": torch.randn(8, 16, generator=g), "scale": torch.full((1,), 0.5),
               "labels": torch.randint(0, 4, (8,), generator=g)}
    reordered = {k: example[k] for k in ("labels", "scale", "features")}
    eager, captured = _Keyworded(), _Keyworded()
    opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    step = _quiet_compile(captured, lambda out: out["loss"], torch.optim.SGD(captured.parameters(), lr=0.1), example)
    for batch in (reordered, example, reordered):
        loss = step(batch)
        opt.zero_grad()
        eager_loss = eager(**batch)["loss"]
        eager_loss.backward()
        opt.step()
        torch.testing.assert_close(loss, eager_loss.detach(), rtol=1e-5, atol=1e-6)
    step(**reordered)  # as keywords too
    for (name, a), (_, b) in zip(eager.named_parameters(), captured.named_parameters()):
        assert not torch.equal(a, b), name  # the keyword call updated the compiled model once more
    assert len(step.captures) == 1
    with pytest.raises(ValueError, match=r"batch has the keys \('labels', 'features'\), the example's "):
        step({"labels": example["labels"], "features": example["features"]})  # a key missing is still refused
