"""Example: export a BERT encoder to ONNX and convert it with the ``amp-compile`` CLI.

    python examples/onnx_cli.py            # writes examples/out/bert.onnx, bert.fp16.onnx, bert.html

The model is a 4-layer, 512-wide BERT with random weights (no download), exported
with the dynamo exporter at batch 8 x 128 tokens: big enough that FP16 tensor cores pay
off on the default target (H100), small enough to run on a CPU in seconds. The second
step is exactly what you would type in a shell:

    amp-compile examples/out/bert.onnx -o examples/out/bert.fp16.onnx \\
        --report examples/out/bert.html --validate
"""

from __future__ import annotations

import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out"


def export_bert(path: Path) -> None:
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=8192, hidden_size=512, num_hidden_layers=4, num_attention_heads=8,
                        intermediate_size=2048, attn_implementation="eager")
    model = BertModel(config).eval()
    ids = torch.randint(0, config.vocab_size, (8, 128))
    mask = torch.ones_like(ids)
    torch.onnx.export(model, (ids, mask), str(path), dynamo=True, opset_version=18,
                      input_names=["input_ids", "attention_mask"], output_names=["last_hidden_state"],
                      verbose=False)


def main() -> int:
    from amp_compiler.cli import main as amp_compile

    OUT.mkdir(exist_ok=True)
    model = OUT / "bert.onnx"
    if not model.exists():
        print(f"exporting a 4-layer BERT to {model} ...", file=sys.stderr)
        export_bert(model)
    return amp_compile([str(model), "-o", str(OUT / "bert.fp16.onnx"), "--report", str(OUT / "bert.html"),
                        "--report", str(OUT / "bert.json"), "--validate"])


if __name__ == "__main__":
    sys.exit(main())
