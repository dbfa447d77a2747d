"""What a PyTorch user's set-up gets: the why-lines count casts at parameters apart from the graph's
inputs and outputs (``passes/explain.py``), a wrapper made after ``.eval()`` is planned for
inference (``fx_io/mode.py``), and a size argument of the wrong kind is named."""

from __future__ import annotations

import torch

import amp_compiler


def test_parameters_cast_every_call_are_named_as_such():
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    x = torch.randn(4, 64)
    why = amp_compiler.compile(mlp.train(), x).report.summary["fp32_tensor_core_why"]
    assert "its casts: 4 at parameters cast every call (training mode keeps their FP32 master copy), " \
           "2 at graph inputs/outputs" in why, why
    # eval mode folds the weights' casts: FP16 (a near tie of launches), nothing to explain
    assert not amp_compiler.compile(mlp.eval(), x).report.summary["fp32_tensor_core_why"]


def test_a_wrapper_made_after_eval_plans_for_inference():
    """``nn.DataParallel(model.eval())`` (or a user's wrapper) is a new module, in train mode at its
    root while every layer with weights is in eval mode: read as training, every weight stayed FP32
    and was cast each call, and the plan was all FP32 by cost."""

    class Wrapper(torch.nn.Module):  # reshapes the output, as users do before export or serving
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x).flatten()

    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).eval()
    x = torch.randn(4, 64)
    for wrapped in (torch.nn.DataParallel(mlp), Wrapper(mlp)):
        assert wrapped.training and not mlp.training
        amp = amp_compiler.compile(wrapped, x)
        assert not amp.training
        assert amp.report.summary["fp16_gemm_flop_fraction"] == 1.0, amp.report.summary["fp32_tensor_core_why"]
        torch.testing.assert_close(amp(x).float().reshape(-1), mlp(x).reshape(-1), atol=2e-2, rtol=2e-2)
    wrapped.train()  # every layer in train mode now: planned for training, weights cast each call
    assert amp_compiler.compile(wrapped, x).training


def test_compile_names_a_default_dim_of_the_wrong_kind():
    """``default_dim="8"`` failed deep in the cost model: "'<' not supported between 'str' and 'int'"."""
    import pytest

    with pytest.raises(ValueError, match=r"default_dim must be a positive int, got '8'"):
        amp_compiler.compile(torch.nn.Linear(8, 8), torch.ones(2, 8), default_dim="8")


def test_an_example_the_model_cannot_run_is_one_error_without_torchs_tracebacks():
    """A wrong example shape failed both routes with our one ConversionError, after 282 lines of
    fake-tensor tracebacks torch's loggers printed on stderr (a process of its own: torch's log
    handler holds the stderr it found at import)."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import torch, amp_compiler\n"
            "try:\n"
            "    amp_compiler.compile(torch.nn.Linear(8, 8), torch.ones(2, 9))\n"
            "except amp_compiler.ConversionError as exc:\n"
            "    print('refused:', exc)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[1])
    assert "refused:" in done.stdout and "a and b must have same reduction dim" in done.stdout, done.stdout
    assert "Traceback" not in done.stderr and "fake_tensor" not in done.stderr, done.stderr[:2000]
