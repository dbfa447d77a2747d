"""A small transformers EfficientNet at batch 1 converts by default on the torch path (issue 12,
done-when 2): its squeeze-excitation means are infer, so no FP32 islands cost more than FP16 saves."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
T = pytest.importorskip("transformers")

import amp_compiler  # noqa: E402
from benchmarks.torch_amp import rel_error  # noqa: E402


def _efficientnet():
    """Width and depth scaled to 0.25 at 64 px; parameters re-initialised by each layer's own
    ``reset_parameters`` (the config's init draws conv weights of std 0.02, so logits near 0)."""
    torch.manual_seed(0)
    cfg = T.EfficientNetConfig(image_size=64, width_coefficient=0.25, depth_coefficient=0.25, num_labels=10,
                               hidden_dim=320)
    m = T.EfficientNetForImageClassification(cfg).eval()
    for mod in m.modules():
        if isinstance(mod, (torch.nn.Conv2d, torch.nn.Linear, torch.nn.BatchNorm2d)):
            mod.reset_parameters()
    return m


def test_small_efficientnet_batch_1_converts_by_default_and_matches_fp32():
    m = _efficientnet()
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        ref = m(pixel_values=x).logits
    amp = amp_compiler.compile(m, example_kwargs={"pixel_values": x})
    s = amp.report.summary
    assert s["fp16_gemm_flop_fraction"] >= 0.95, str(amp.report)
    means = [o for o in amp.report.ops if o["canonical"] == "reduce_mean"]
    assert means and all(o["precision"] == "float16" for o in means)  # the squeeze-excitation pooling
    with torch.no_grad():
        out = amp(pixel_values=x).logits
    assert out.dtype == torch.float32 and rel_error(ref, out) < 1e-2
