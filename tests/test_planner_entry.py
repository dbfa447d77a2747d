"""Each entry point plans for its default deployment runtime, and ``deploy`` picks another."""

from __future__ import annotations

import pytest

from tests.test_passes import _mlp
from amp_compiler import convert_onnx  # noqa: E402  isort: skip

torch = pytest.importorskip("torch")


def test_onnx_path_defaults_to_ort_cuda_and_deploy_overrides():
    assert convert_onnx(_mlp(64, 128))[1].summary["runtime_profile"] == "ort-cuda"
    assert convert_onnx(_mlp(64, 128), deploy="inductor")[1].summary["runtime_profile"] == "inductor"
    with pytest.raises(ValueError, match="unknown runtime profile"):
        convert_onnx(_mlp(64, 128), deploy="tvm")
    with pytest.raises(ValueError, match="unknown objective"):
        convert_onnx(_mlp(64, 128), objective="energy")


def test_torch_paths_default_to_eager_and_deploy_overrides():
    import amp_compiler

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).eval()
    x = torch.randn(4, 64)
    assert amp_compiler.compile(model, (x,)).report.summary["runtime_profile"] == "eager"
    rep = amp_compiler.compile(model, (x,), deploy="tensorrt", objective="memory").report.summary
    assert rep["runtime_profile"] == "tensorrt" and rep["objective"] == "memory"
    seen = []
    compiled = torch.compile(model, backend="amp_compiler", options={"deploy": "inductor", "on_report": seen.append})
    compiled(x)
    assert seen and seen[-1].summary["runtime_profile"] == "inductor"
