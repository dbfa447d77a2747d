"""compile_training's runtime profile and what its FP32 plan says (docs/architecture.md, "Training"):
``backend="inductor"`` prices the casts inductor fuses, ``deploy``/``objective`` are taken as by
``compile``, and the advice given for an all-FP32 step names options that change the plan."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

from amp_compiler.training import compile_training  # noqa: E402

F = torch.nn.functional


def _step(**kw):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.GELU(), torch.nn.Linear(256, 10))
    batch = (torch.randn(32, 128), torch.randint(0, 10, (32,)))
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        step = compile_training(model, F.cross_entropy, torch.optim.AdamW(model.parameters()), batch, **kw)
    return step, [str(w.message) for w in said if "compile_training" in str(w.message)]


def test_an_all_fp32_step_names_options_that_do_change_it():
    """Before: the advice named backend="inductor", which still priced eager casts (the step stayed FP32),
    and objective="memory", which compile_training did not take; the loss-scale ops read as user-denied."""
    step, said = _step()
    summary = step.report.summary
    assert summary["fp16_gemm_flop_fraction"] == 0.0 and summary["runtime_profile"] == "eager"
    assert any('backend="inductor"' in m and 'objective="memory"' in m for m in said), said
    why = summary["fp32_tensor_core_why"]
    assert "--deny-node" not in why and "loss scaling and the optimizer's step arithmetic" in why
    for options, runtime in (({"backend": "inductor"}, "inductor"), ({"deploy": "inductor"}, "inductor"),
                             ({"objective": "memory"}, "eager")):
        changed, said = _step(**options)  # inductor compiles lazily: the step is never run here
        assert changed.report.summary["fp16_gemm_flop_fraction"] == 1.0, options
        assert changed.report.summary["runtime_profile"] == runtime and not said, said


def test_a_bad_runtime_is_refused_before_tracing():
    with pytest.raises(ValueError, match="unknown runtime profile 'bogus'"):
        _step(deploy="bogus")
