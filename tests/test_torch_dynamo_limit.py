"""The dynamo route after some other ``torch.compile`` used up dynamo's recompile limit on the same
forward code (transformers wraps every model's forward in one function)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import amp_compiler  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class Branchy(torch.nn.Module):
    """A branch on a value: torch.export refuses it, so ``compile`` takes the dynamo route."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(256, 256), torch.nn.Linear(256, 256)

    def forward(self, x):
        y = self.a(x)
        if y.sum() > 0:
            y = torch.relu(y)
        return self.b(y)


def test_compile_captures_a_forward_whose_code_hit_dynamos_limit_elsewhere():
    """Dynamo marks a code object run-only once a compile of it hits the limit, for the process: the
    route's raised limit did not undo that, and ``compile`` of another instance failed with "dynamo
    captured no graph" and advice about traceable constructs."""
    torch.manual_seed(0)
    with torch._dynamo.config.patch(recompile_limit=2), torch.no_grad():
        for rows in (2, 3, 4):  # the user's own torch.compile of other instances: the limit is hit
            torch.compile(Branchy().eval(), backend="eager", dynamic=False)(torch.randn(rows, 256))
        model, x = Branchy().eval(), torch.randn(64, 256)
        amp = amp_compiler.compile(model, x)
        assert amp.capture.startswith("torch.compile") and amp.report is not None
        assert amp.report.summary["fp16_gemm_flop_fraction"] > 0
        out, ref = amp(x), model(x)
    assert float((out - ref).abs().max() / ref.abs().max()) < 1e-2
