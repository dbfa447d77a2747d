"""Example: ``amp_compiler.compile`` on a PyTorch model, with the per-op report.

    python examples/compile_model.py           # prints the report, writes examples/out/compile_bert.html

The model is a 4-layer, 256-wide BERT with random weights (no download) at batch 8 x 128
tokens: big enough that FP16 tensor cores pay off on the default target (H100), small
enough to run on a CPU in seconds (CPUs without FP16 units run FP16 GEMMs slowly, so the
compiled model is slower *here*; the plan is for the target GPU).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out"


def build_bert():
    import torch
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    config = BertConfig(vocab_size=8192, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                        intermediate_size=1024)  # default attention: SDPA
    model = BertForMaskedLM(config).eval()
    ids = torch.randint(0, config.vocab_size, (8, 128))
    return model, ids, torch.ones_like(ids)


def main() -> int:
    import torch

    import amp_compiler

    model, ids, mask = build_bert()
    start = time.perf_counter()
    # keyword arguments work too: the compiled module takes the same ones
    amp = amp_compiler.compile(model, (), example_kwargs={"input_ids": ids, "attention_mask": mask})
    print(f"compiled in {time.perf_counter() - start:.1f} s\n")
    print(amp.report.to_text(max_rows=12))

    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask).logits
        out = amp(input_ids=ids, attention_mask=mask).logits
    err = ((out - ref).abs().max() / ref.abs().max()).item()
    summary = amp.report.summary
    print(f"\noutput dtype {out.dtype} (as the model's), relative error vs FP32 {err:.1e}")
    print(f"{summary['fp16_gemm_flop_fraction']:.0%} of GEMM FLOPs in FP16, {summary['casts']} casts, "
          f"predicted {summary['predicted_speedup_vs_fp32']:.2f}x over FP32 on {summary['target']}")
    OUT.mkdir(exist_ok=True)
    print(f"report: {amp.report.save(OUT / 'compile_bert.html')}")
    return 0 if err < 1e-2 else 1


if __name__ == "__main__":
    sys.exit(main())
