"""Example: ``torch.compile(model, backend="amp_compiler")``, graph breaks included.

    python examples/torch_compile_backend.py   # prints one report summary per compiled graph

The model is a 4-layer, 256-wide ViT with random weights (no download) on 8 images of
224x224 pixels, plus a data-dependent rescaling step (``if logits.abs().max() > ...``) that
dynamo cannot put in the graph: it splits there and the backend plans each graph on its own.
Options go through ``options={...}``; ``on_report`` receives each graph's report (they are
also kept in ``amp_compiler.backend.reports``). Add ``"backend": "inductor"`` to fuse the
remaining casts into inductor's kernels (needs a C++ compiler on CPU).
"""

from __future__ import annotations

import sys
import time


def build_model():
    import torch
    from transformers import ViTConfig, ViTForImageClassification

    class Classifier(torch.nn.Module):
        def __init__(self):
            super().__init__()
            config = ViTConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
                               num_labels=100)  # default attention: SDPA
            self.vit = ViTForImageClassification(config)

        def forward(self, pixels):
            logits = self.vit(pixel_values=pixels).logits
            if logits.abs().max() > 1e3:  # data-dependent Python control flow: a graph break
                logits = logits / logits.abs().max()
            return logits.softmax(-1)

    torch.manual_seed(0)
    return Classifier().eval(), torch.randn(8, 3, 224, 224)


def main() -> int:
    import torch

    import amp_compiler  # noqa: F401  (registers the backend; an installed package needs no import)

    model, pixels = build_model()
    reports = []
    compiled = torch.compile(model, backend="amp_compiler",
                             options={"target": "h100", "dtype": torch.float16, "on_report": reports.append})
    start = time.perf_counter()
    with torch.no_grad():
        out = compiled(pixels)
        ref = model(pixels)
    print(f"compiled and ran in {time.perf_counter() - start:.1f} s: {len(reports)} graphs\n")
    for report in reports:
        s = report.summary
        gemms = f"{s['fp16_gemm_flop_fraction']:.0%} of GEMM/conv FLOPs in FP16" if s["gemm_flops"] else "no GEMM/conv"
        print(f"{report.source}: {s['nodes']} ops, {s['fp16_nodes']} in FP16, {gemms}, {s['casts']} casts, "
              f"predicted {s['predicted_speedup_vs_fp32']:.2f}x over FP32")
    gemms = [o for o in reports[0].ops if o["class"] == "allow"][:3]
    print("\nfirst GEMMs of graph 0:")
    for op in gemms:
        print(f"  {op['name']:<55} {op['precision']:<8} {op['reason'][:60]}")
    err = ((out - ref).abs().max() / ref.abs().max()).item()
    print(f"\noutput dtype {out.dtype}, relative error vs FP32 {err:.1e}")
    return 0 if err < 1e-2 else 1


if __name__ == "__main__":
    sys.exit(main())
