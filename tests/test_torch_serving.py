"""Serving habits on an ``AmpModule`` (docs/architecture.md, "Capture routes and shapes"): calls from
several threads at once, keyword arguments in another order than the example's."""

from __future__ import annotations

import threading
import time
import warnings

import pytest

torch = pytest.importorskip("torch")

import amp_compiler  # noqa: E402

from .test_training_shared import _Switch  # noqa: E402


class _TwoInputs(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(32, 32), torch.nn.Linear(32, 32)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.a(x) + self.b(y)


@pytest.mark.parametrize("options", [{}, {"planner": "all"}], ids=["default", "all"])
def test_kwargs_in_another_order_share_the_plan(options):
    model = _TwoInputs().eval()
    x, y = torch.randn(4, 32), torch.randn(4, 32)
    amp = amp_compiler.compile(model, example_kwargs={"x": x, "y": y}, **options)
    with torch.no_grad():
        out, expected = amp(y=y, x=x), model(x=x, y=y)
    assert amp.plans == 1
    assert torch.allclose(out, expected, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("options", [{}, {"planner": "all"}], ids=["default", "all"])
def test_threads_capturing_at_once_each_get_their_own_right_outputs(options):
    """Two threads calling one module with new shapes at once: torch.export's tracing state is the
    process's, so captures are serialised (before: 'Trying to pop empty mode stack' in one thread)."""
    model = _TwoInputs().eval()
    amp = amp_compiler.compile(model, **options)
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


def test_a_call_during_another_threads_capture_sees_no_replaced_weight():
    """torch.export's non-strict trace puts fakes in the module's parameter slots while it captures. A
    call on another thread had read them as replaced: 'a.weight was replaced since its plans were
    made', its plans dropped, and the watch reset to the fakes. The call now waits for the capture."""
    from amp_compiler.fx_io.serving import CAPTURE_LOCK

    model = _TwoInputs().eval()
    x, y = torch.randn(4, 32), torch.randn(4, 32)
    amp = amp_compiler.compile(model, (x, y))
    real = model.a._parameters["weight"]
    swapped, done = threading.Event(), threading.Event()

    def capture_elsewhere() -> None:  # what export's reparametrisation does to the module, under the lock
        with CAPTURE_LOCK.capturing():
            model.a._parameters["weight"] = torch.nn.Parameter(real.detach().clone())
            swapped.set()
            time.sleep(0.3)
            model.a._parameters["weight"] = real
        done.set()

    thread = threading.Thread(target=capture_elsewhere)
    thread.start()
    swapped.wait()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.no_grad():
            out = amp(x, y)
    thread.join()
    assert done.is_set() and amp.plans == 1
    with torch.no_grad():
        assert torch.allclose(out, model(x, y), atol=1e-2, rtol=1e-2)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            amp(x, y)  # the watch still holds the real weight: no replacement seen after the capture
    assert amp.plans == 1


@pytest.mark.parametrize("options", [{}, {"planner": "all"}], ids=["default", "all"])
def test_a_flag_set_after_compiling_is_planned_again_not_ignored(options):
    """Before: the plan captured with a flag off kept running after it was set on (two Linears: error 1.8)."""
    model = _Switch().eval()
    x = torch.randn(4, 16)
    amp = amp_compiler.compile(model, (x,), **options)
    expected = {}
    with torch.no_grad():
        for flag in (False, True):
            model.residual = flag
            expected[flag] = model(x)
    model.residual, model.calls = False, 0  # as compiled: the eager calls moved the counter
    with pytest.warns(UserWarning, match=r"residual False -> True since its plans were made"), torch.no_grad():
        assert torch.allclose(amp(x), expected[False], atol=1e-2, rtol=1e-2)
        model.residual = True
        out = amp(x)
    torch.testing.assert_close(out, expected[True], atol=1e-2, rtol=1e-2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # back to a value planned before: its route, no warning
        model.residual = False
        with torch.no_grad():
            torch.testing.assert_close(amp(x), expected[False], atol=1e-2, rtol=1e-2)
    assert amp.plans == 2


@pytest.mark.parametrize("options", [{}, {"planner": "all"}], ids=["default", "all"])
def test_a_counter_changed_between_calls_stops_being_watched(options):
    """An attribute eager calls keep changing (a call counter) is state: after ``RESTLESS`` recaptures
    for it, its changes plan nothing more, and a warning says so once."""
    from amp_compiler.fx_io.flags import RESTLESS
    model = _Switch().eval()
    x = torch.randn(4, 16)
    amp = amp_compiler.compile(model, (x,), **options)
    with warnings.catch_warnings(record=True) as said, torch.no_grad():
        warnings.simplefilter("always")
        for _ in range(RESTLESS + 3):
            model(x)  # the counter moves
            torch.testing.assert_close(amp(x), _Switch.forward(model, x), atol=1e-2, rtol=1e-2)
    messages = [str(w.message) for w in said]
    assert sum("calls changed between calls" in m for m in messages) == 1, messages
    assert sum("since its plans were made" in m for m in messages) == RESTLESS - 1  # recaptures, then none
    assert amp.plans <= 2  # the routes that differed by the counter alone merged when it was dropped


@pytest.mark.parametrize("options", [{}, {"planner": "all"}], ids=["default", "all"])
def test_torch_compile_of_an_amp_module_runs_its_plans_without_tracing_into_them(options):
    """Before: dynamo traced into the plans' weight refresh and hit its recompile limit, with warnings."""
    model = _TwoInputs().eval()
    amp = amp_compiler.compile(model, **options)
    compiled = torch.compile(amp)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.no_grad():
            for n in (1, 2, 3):
                x, y = torch.randn(n, 32), torch.randn(n, 32)
                torch.testing.assert_close(compiled(x, y), model(x, y), atol=1e-2, rtol=1e-2)
    if options:  # planner "all": every GEMM FP16 (the default may keep this small model FP32 by cost)
        assert amp.report.summary["fp16_gemm_flop_fraction"] == 1.0


@pytest.mark.parametrize("options", [{}, {"planner": "all"}], ids=["default", "all"])
def test_a_dtype_change_after_compiling_plans_again(options):
    """``amp.double()`` then ``amp.float()`` (or ``.half()`` then ``.float()``) had converted the plans'
    folded FP16 weights too, and the next call failed: 'mat1 and mat2 must have the same dtype'."""
    model = _TwoInputs().eval()
    x, y = torch.randn(4, 32), torch.randn(4, 32)
    amp = amp_compiler.compile(model, (x, y), **options)
    with torch.no_grad():
        amp.to(torch.float64)
        out = amp(x.double(), y.double())
        assert out.dtype == torch.float64
        torch.testing.assert_close(out, model(x.double(), y.double()))  # a float64 model is not planned
        with pytest.warns(UserWarning, match="keep the module float32"):
            amp.half()
        amp.float()
        torch.testing.assert_close(amp(x, y), model(x, y), atol=1e-2, rtol=1e-2)
    if options:  # planner "all": every GEMM FP16 (the default may keep this small model FP32 by cost)
        assert amp.report.summary["fp16_gemm_flop_fraction"] == 1.0


def test_runs_that_capture_on_two_threads_take_turns_instead_of_deadlocking():
    """An AmpModule inside another's plan captures during the outer run: two such runs on two
    threads each waited for the other's run to end, forever. Captures must still never overlap."""
    from amp_compiler.fx_io.serving import CaptureLock

    lock, both_running, inside, overlaps, done = CaptureLock(), threading.Barrier(2), [0], [], []

    def serve():
        with lock.running():
            both_running.wait(timeout=5)
            with lock.capturing():
                inside[0] += 1
                overlaps.append(inside[0])
                time.sleep(0.05)
                inside[0] -= 1
            done.append(True)

    threads = [threading.Thread(target=serve, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert done == [True, True]  # neither thread is stuck
    assert overlaps == [1, 1]  # one capture at a time


class _Branchy(torch.nn.Module):
    """A branch on a tensor's value: torch.export refuses it, so the dynamo route captures it."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = torch.nn.Linear(32, 32), torch.nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        return self.b(h) if h.sum() > 0 else self.b(-h)


@pytest.mark.parametrize("options", [{}, {"planner": "all"}], ids=["default", "all"])
def test_inference_mode_after_no_grad_reuses_the_dynamo_routes_plan(options):
    """Dynamo guards on the inputs' dispatch keys, which ``torch.inference_mode()`` changes (no autograd
    keys; an inference tensor has fewer still): the same graph compiled again had been planned again, a
    second plan (and a third for an input made under inference_mode) of the same graph."""
    model, x = _Branchy().eval(), torch.randn(4, 32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        amp = amp_compiler.compile(model, (x,), **options)
    assert amp.capture.startswith("torch.compile (dynamo")
    with torch.no_grad():
        expected = amp(x)
    assert amp.plans == 1
    with torch.inference_mode():
        outs = [amp(x), amp(x.clone())]  # a normal tensor, then an inference tensor
    assert amp.plans == 1
    for out in outs:
        torch.testing.assert_close(out, expected, rtol=0, atol=0)  # the same plan ran
    with torch.no_grad():
        torch.testing.assert_close(expected, model(x), rtol=1e-2, atol=1e-2)
