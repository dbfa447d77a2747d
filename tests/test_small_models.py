"""Issue 12, done-when 2, on models the issue does not name: tiny transformers configs from
``benchmarks/small_models.py`` (SDPA where the model has it, inputs as users draw them) through
``amp_compiler.compile`` with every option at its default. At batch 1 these are launch-bound;
at least 95 % of their GEMM/conv FLOPs must still run FP16, the output within 1e-2 of FP32 eager.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import amp_compiler  # noqa: E402
from benchmarks.small_models import MODELS, build, inputs  # noqa: E402
from benchmarks.torch_amp import rel_error  # noqa: E402


@pytest.mark.parametrize("name", ["distilbert", "deit", "wav2vec2"])
def test_unnamed_small_models_convert_by_default(name):
    model, config = build(name)
    kwargs = inputs(name, config, batch=1)
    compiled = amp_compiler.compile(model, example_kwargs=kwargs)
    summary = compiled.report.summary
    assert summary["fp16_gemm_flop_fraction"] >= 0.95, summary["fp32_tensor_core_why"]
    output = MODELS[name].output
    with torch.no_grad():
        ref, out = model(**kwargs)[output], compiled(**kwargs)[output]
    assert out.dtype == ref.dtype and torch.isfinite(out).all()
    assert rel_error(ref, out) < 1e-2
