"""Serving habits on an ``AmpModule`` (docs/architecture.md, "Capture routes and shapes"): calls from
several threads at once, keyword arguments in another order than the example's."""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")

import amp_compiler  # noqa: E402


class _TwoInputs(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(32, 32), torch.nn.Linear(32, 32)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.a(x) + self.b(y)


def test_kwargs_in_another_order_share_the_plan():
    model = _TwoInputs().eval()
    x, y = torch.randn(4, 32), torch.randn(4, 32)
    amp = amp_compiler.compile(model, example_kwargs={"x": x, "y": y}, planner="all")
    with torch.no_grad():
        out, expected = amp(y=y, x=x), model(x=x, y=y)
    assert amp.plans == 1
    assert torch.allclose(out, expected, atol=1e-2, rtol=1e-2)


def test_threads_capturing_at_once_each_get_their_own_right_outputs():
    """Two threads calling one module with new shapes at once: torch.export's tracing state is the
    process's, so captures are serialised (before: 'Trying to pop empty mode stack' in one thread)."""
    model = _TwoInputs().eval()
    amp = amp_compiler.compile(model, planner="all")
    calls = {n: (torch.randn(n, 32), torch.randn(n, 32)) for n in (1, 2, 3, 5, 7, 9)}
    errors: list[str] = []
    start = threading.Barrier(2)

    def serve(sizes: tuple[int, ...]) -> None:
        start.wait()
        for n in sizes:
            x, y = calls[n]
            try:
                with torch.no_grad():
                    out, expected = amp(x, y=y), model(x, y=y)
                if not torch.allclose(out, expected, atol=1e-2, rtol=1e-2):
                    errors.append(f"batch {n}: wrong output")
            except Exception as error:  # noqa: BLE001 - collected for the assert below
                errors.append(f"batch {n}: {type(error).__name__}: {error}")

    threads = [threading.Thread(target=serve, args=(sizes,)) for sizes in ((1, 3, 7), (2, 5, 9))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert 1 <= amp.plans <= 3  # a static plan, then symbolic ones the later sizes share
