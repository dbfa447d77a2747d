"""What a new user of the PyTorch inference path meets on models and calls the other tests do not
build: the errors they get name the cause to fix."""

from __future__ import annotations

import warnings

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


class _Branchy(torch.nn.Module):
    """A branch on a value: export refuses it, so the model is planned through dynamo."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)

    def forward(self, x):
        h = self.a(x)
        if h.sum() > 0:
            h = h * 2
        return self.b(h)


_LATER_CALL = """
import sys, torch, amp_compiler
sys.path.insert(0, {tests!r})
from test_torch_field import _Branchy
model = (_Branchy() if {dynamo} else torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))).eval()
amp = amp_compiler.compile(model, (torch.ones(2, 8),))
print("route:", amp.capture)
with torch.no_grad():
    for bad in (torch.ones(2, 9), torch.ones(2, 8, dtype=torch.float16)):
        try:
            model(bad)
        except Exception as exc:
            own = exc
        try:
            amp(bad)
        except Exception as exc:
            print("raised:", type(exc) is type(own) and str(exc) == str(own), type(exc).__name__,
                  str(exc).splitlines()[0][:40])
"""


@pytest.mark.parametrize("dynamo", [False, True])
def test_a_later_call_the_model_cannot_run_raises_the_model_s_own_error(dynamo):
    """After compiling, a call with an input of the wrong width or dtype raised dynamo's
    ``TorchRuntimeError`` ("Dynamo failed to run FX node with fake tensors ... Hint: Your code may
    result in an error when running in eager"), after torch's loggers printed fake-tensor tracebacks:
    it raises what the model raises, as the model would, and nothing else is printed."""
    import subprocess
    import sys
    from pathlib import Path

    tests = Path(__file__).resolve().parent
    done = subprocess.run([sys.executable, "-c", _LATER_CALL.format(tests=str(tests), dynamo=dynamo)],
                          capture_output=True, text=True, timeout=300, cwd=tests.parent)
    lines = done.stdout.splitlines()
    assert lines[0] == ("route: " + ("torch.compile (dynamo, graph breaks allowed)" if dynamo else "torch.export")), \
        done.stdout + done.stderr[-3000:]
    assert len(lines) == 3 and all(line.startswith("raised: True RuntimeError ") for line in lines[1:]), done.stdout
    assert "fake_tensor" not in done.stderr and "Traceback" not in done.stderr, done.stderr[:3000]


def _dropout_mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Dropout(0.1), torch.nn.Linear(16, 4))


def test_a_model_left_in_train_mode_and_called_for_inference_is_told_to_call_eval():
    """``AutoModel.from_config(...)`` builds a model in train mode: compiled and called under
    ``torch.no_grad()`` it ran a training plan (dropout on, every weight cast at every call, FP32 by
    cost) with no word of ``eval()``. The first such call says so, once; a model in eval mode, a plan
    asked for with ``training=True`` and a call with grad mode on are not warned about."""
    import warnings

    x = torch.randn(4, 16)
    amp = amp_compiler.compile(_dropout_mlp(), x)
    assert amp.training
    with torch.no_grad(), warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        amp(x)
        amp(x)
    mine = [w for w in said if "train-mode plan" in str(w.message)]
    assert len(mine) == 1 and "model.eval()" in str(mine[0].message), [str(w.message) for w in said]
    assert mine[0].filename == __file__  # the user's line
    quiet = [(amp_compiler.compile(_dropout_mlp(), x, training=True), torch.no_grad),
             (amp_compiler.compile(_dropout_mlp().eval(), x), torch.no_grad),
             (amp_compiler.compile(_dropout_mlp(), x), torch.enable_grad)]
    for module, mode in quiet:
        with mode(), warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            module(x)
        assert not [w for w in said if "train-mode plan" in str(w.message)], [str(w.message) for w in said]


def test_a_submodule_switched_to_eval_after_compiling_is_followed():
    """``model.bn.eval()`` inside a model in train mode (freezing batch-norm statistics, a common
    fine-tuning step) had kept the plan captured with batch statistics: a plan is keyed by every
    submodule's flag now, as ``compile_training``'s captures are."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    x = torch.randn(32, 16)
    amp = amp_compiler.compile(m, (x,))
    amp(x)
    m[1].eval()
    with torch.no_grad():
        ref = m(x)
        got = amp(x)
    assert torch.allclose(got, ref, atol=1e-2, rtol=1e-2), (got - ref).abs().max()
    assert amp.plans == 2


def test_report_before_any_plan_says_why_it_is_none_and_is_there_at_once_given_an_example():
    """``print(amp_model.report)`` right after ``compile(model)`` printed a bare "None": compiled without
    an example, nothing is planned until the first call. It is still ``None`` (as documented), with a
    warning at the user's line saying why and what gives a report; with an example the report exists at
    compile time, and after a dtype change that dropped the plans it is not the dropped plan's."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).eval()
    x = torch.randn(16, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a report there: nothing to say
        planned = amp_compiler.compile(model, (x,))
        assert planned.report is not None and planned.report.summary["graphs"] >= 1

    lazy = amp_compiler.compile(model)
    with pytest.warns(UserWarning, match=r"AmpModule\(Sequential\)\.report is None: nothing is planned yet: "
                                         r"compiled without example inputs.*plans on its first call.*"
                                         r"compile\(model, \(x,\)\)") as said:
        assert lazy.report is None
    assert said[0].filename == __file__  # the user's line
    with torch.no_grad():
        lazy(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert lazy.report is not None

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "float64, not float32": known
        planned.double()  # the plans, made for float32 weights, are dropped
    try:
        with pytest.warns(UserWarning, match=r"report is None: its plans were dropped"):
            assert planned.report is None
    finally:
        planned.float()
