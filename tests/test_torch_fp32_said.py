"""A torch-path plan that runs every GEMM/conv in FP32 is said, once, with why and what would change it:
the report held the why-line, but a user who did not read it took the module for mixed precision
(``fx_io.plans.all_fp32_note``; never silently do nothing)."""

from __future__ import annotations

import warnings

import pytest
import torch

import amp_compiler
from amp_compiler import backend

FP32_SAID = r"runs every GEMM/conv in FP32 \(FP32 by cost .*\); would change it: .*fp32_tensor_core_why"


class _FourHeads(torch.nn.Module):
    """Four 16-wide Linears, each on an input of its own to an output of its own: a cast at every input
    and output against microseconds of GEMM, so the default plan keeps them FP32 by cost."""

    def __init__(self) -> None:
        super().__init__()
        self.heads = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(4))

    def forward(self, a, b, c, d):
        return tuple(head(x) for head, x in zip(self.heads, (a, b, c, d)))


def _tiny() -> torch.nn.Module:
    torch.manual_seed(0)
    return _FourHeads().eval()


def _inputs(rows: int) -> tuple[torch.Tensor, ...]:
    return tuple(torch.randn(rows, 16) for _ in range(4))


def _large() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048)).eval()


def test_compile_says_once_that_a_tiny_model_stays_fp32():
    model = _tiny()
    with pytest.warns(UserWarning, match=r"AmpModule\(_FourHeads\): the plan " + FP32_SAID):
        amp = amp_compiler.compile(model, _inputs(2))
    assert amp.report.summary["fp16_gemm_flop_fraction"] == 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once per module, not at each new shape's plan
        with torch.no_grad():
            amp(*_inputs(3))


def test_compile_says_nothing_where_the_gemms_run_low():
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        amp = amp_compiler.compile(_large(), (torch.randn(256, 2048),))
    assert amp.report.summary["fp16_gemm_flop_fraction"] == 1.0


def test_a_planner_the_user_chose_is_not_second_guessed():
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        amp = amp_compiler.compile(_tiny(), _inputs(2), planner="greedy")
    assert amp.report.summary["fp16_gemm_flop_fraction"] == 1.0


def test_the_torch_compile_backend_says_it_once_per_frame(monkeypatch):
    monkeypatch.setattr(backend, "_fp32_said", type(backend._fp32_said)())
    torch._dynamo.reset()
    compiled = torch.compile(_tiny(), backend="amp_compiler")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            for rows in (2, 5, 7):  # a recompile for the second shape: same frame
                compiled(*_inputs(rows))
    said = [str(w.message) for w in caught if "runs every GEMM/conv in FP32" in str(w.message)]
    assert len(said) == 1, said
    assert said[0].startswith("amp_compiler: torch.compile graph 0/")


def _fp32_notes_of_one_call(model: torch.nn.Module) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            torch.compile(model, backend="amp_compiler")(*_inputs(2))
    return [str(w.message) for w in caught if "runs every GEMM/conv in FP32" in str(w.message)]


def test_the_backend_says_it_for_a_model_compiled_after_a_dynamo_reset(monkeypatch):
    """Dynamo's frame ids restart at ``torch._dynamo.reset()``: keyed by them alone, the next model
    compiled in frame 0 (a GPT-2 then a Llama, each all-FP32 at hidden size 64) ran all-FP32 unsaid."""
    monkeypatch.setattr(backend, "_fp32_said", type(backend._fp32_said)())
    torch._dynamo.reset()
    first = _tiny()
    assert len(_fp32_notes_of_one_call(first)) == 1
    torch._dynamo.reset()
    assert len(_fp32_notes_of_one_call(_tiny())) == 1  # frame 0 again
    assert _fp32_notes_of_one_call(first) == []  # the first model was told already
