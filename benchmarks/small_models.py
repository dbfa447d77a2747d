"""Small and batch-1 models the issue does not name, with default options, on both paths.

Each model is a transformers architecture built from a small config (width 64-128, 2 layers
or stages) with seeded random weights, in eval mode and with the attention implementation
transformers picks (SDPA where the model has it). Inputs are drawn as a user feeds them:
token ids within the vocabulary and masks of ones, images in [0, 1], audio in [-1, 1].

* ``onnx``: exported as ``benchmarks/zoo.py`` exports (dynamo exporter, opset 18), then
  ``amp_compiler.convert_onnx(path)`` with every option at its default (``ort-cuda``).
* ``torch``: ``amp_compiler.compile(model, example_kwargs=inputs)`` with defaults (``eager``),
  the model called as users call it (decoders with their default ``use_cache``); the error is
  against FP32 eager on the same inputs.

Reported per (model, batch, path): the report's FP16 share of GEMM/conv FLOPs, the predicted
mixed and FP32 time, and the first line of ``fp32_tensor_core_why`` (the report's own
explanation of FP32 tensor-core work). A model whose export or capture fails is a row
saying so. Run ``python -m benchmarks.small_models [--models llama,albert] [--batches 1,2]
[--paths onnx,torch] [--json out.json] [--readme]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

SEQ = 64  # tokens per sequence
PX = 64  # image side
SAMPLES = 4000  # audio samples (0.25 s at 16 kHz)
VOCAB = 512
SEED = 0
MARKER = "small-models"
_TEXT = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
             max_position_embeddings=128)


@dataclasses.dataclass(frozen=True)
class Entry:
    """A transformers model class, its config, the kind of input it reads and the output compared."""

    model_class: str
    config_class: str
    config: dict
    inputs: str  # "text", "ids" (no mask), "image" or "audio"
    output: str = "logits"
    export_kwargs: tuple = ()  # fixed forward kwargs for the ONNX export only (caches are no tensors)


_NO_CACHE = (("use_cache", False),)
MODELS: dict[str, Entry] = {
    "mamba": Entry("MambaForCausalLM", "MambaConfig",
                   dict(vocab_size=VOCAB, hidden_size=64, state_size=16, num_hidden_layers=2, expand=2,
                        conv_kernel=4), "ids", export_kwargs=_NO_CACHE),
    "albert": Entry("AlbertForMaskedLM", "AlbertConfig",
                    dict(_TEXT, embedding_size=64, hidden_size=128, intermediate_size=256), "text"),
    "deberta-v2": Entry("DebertaV2ForMaskedLM", "DebertaV2Config", _TEXT, "text"),
    "distilbert": Entry("DistilBertForMaskedLM", "DistilBertConfig",
                        dict(vocab_size=VOCAB, dim=64, n_layers=2, n_heads=2, hidden_dim=128,
                             max_position_embeddings=128), "text"),
    "roberta": Entry("RobertaForMaskedLM", "RobertaConfig", dict(_TEXT, max_position_embeddings=130), "text"),
    "gpt-neo": Entry("GPTNeoForCausalLM", "GPTNeoConfig",
                     dict(vocab_size=VOCAB, hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128,
                          attention_types=[[["global", "local"], 1]], window_size=32, max_position_embeddings=128,
                          bos_token_id=1, eos_token_id=1), "text", export_kwargs=_NO_CACHE),
    "phi": Entry("PhiForCausalLM", "PhiConfig", dict(_TEXT, bos_token_id=1, eos_token_id=1), "text",
                 export_kwargs=_NO_CACHE),
    "qwen2": Entry("Qwen2ForCausalLM", "Qwen2Config", dict(_TEXT, num_key_value_heads=1), "text",
                   export_kwargs=_NO_CACHE),
    "llama": Entry("LlamaForCausalLM", "LlamaConfig", dict(_TEXT, num_key_value_heads=1), "text",
                   export_kwargs=_NO_CACHE),
    "mobilenet-v2": Entry("MobileNetV2ForImageClassification", "MobileNetV2Config",
                          dict(image_size=PX, depth_multiplier=0.35, num_labels=10), "image"),
    "convnext": Entry("ConvNextForImageClassification", "ConvNextConfig",
                      dict(image_size=PX, hidden_sizes=[32, 64], depths=[2, 2], num_stages=2, num_labels=10),
                      "image"),
    "swin": Entry("SwinForImageClassification", "SwinConfig",
                  dict(image_size=PX, patch_size=4, embed_dim=32, depths=[2, 2], num_heads=[2, 4], window_size=4,
                       num_labels=10), "image"),
    "deit": Entry("DeiTForImageClassification", "DeiTConfig",
                  dict(image_size=PX, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                       intermediate_size=128, num_labels=10), "image"),
    "wav2vec2": Entry("Wav2Vec2ForCTC", "Wav2Vec2Config",
                      dict(vocab_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=128, conv_dim=(32,) * 7, num_conv_pos_embeddings=16,
                           num_conv_pos_embedding_groups=4), "audio"),
}


def build(name: str):
    """``(model, config)``: ``name`` with seeded random weights, in eval mode."""
    import torch
    import transformers

    entry = MODELS[name]
    config = getattr(transformers, entry.config_class)(**entry.config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = getattr(transformers, entry.model_class)(config)
        if entry.inputs == "image":  # torch's own init: transformers' MobileNetV2 init gives logits ~1e-25,
            for module in model.modules():  # which no 16-bit dtype holds (an error of 1.0 that says nothing)
                if isinstance(module, (torch.nn.Conv2d, torch.nn.Linear, torch.nn.BatchNorm2d)):
                    module.reset_parameters()
    return model.eval(), config


def inputs(name: str, config: Any, batch: int) -> dict:
    """Keyword inputs drawn as a user feeds them (seeded)."""
    import torch

    gen = torch.Generator().manual_seed(SEED + 1)
    kind = MODELS[name].inputs
    if kind == "image":
        return {"pixel_values": torch.rand((batch, 3, PX, PX), generator=gen)}
    if kind == "audio":
        return {"input_values": torch.rand((batch, SAMPLES), generator=gen) * 2 - 1}
    ids = {"input_ids": torch.randint(0, config.vocab_size, (batch, SEQ), generator=gen)}
    if kind == "text":
        ids["attention_mask"] = torch.ones((batch, SEQ), dtype=torch.int64)
    return ids


def _row(summary: dict, **extra: Any) -> dict:
    return {"fp16_gemm_flop_fraction": summary["fp16_gemm_flop_fraction"],
            "predicted_time_mixed_s": summary["predicted_time_mixed_s"],
            "predicted_time_fp32_s": summary["predicted_time_fp32_s"],
            "why": summary.get("fp32_tensor_core_why") or "", **extra}


def measure_onnx(name: str, batch: int, folder: Path) -> dict:
    """Export ``name`` as the zoo does and convert the file with ``convert_onnx`` defaults."""
    from amp_compiler import convert_onnx
    from benchmarks import zoo

    model, config = build(name)
    kwargs = inputs(name, config, batch)
    entry = MODELS[name]
    wrapper = zoo.wrap_module(model, list(kwargs), dict(entry.export_kwargs), entry.output)
    path = folder / f"{name}-b{batch}.onnx"
    zoo.export_module(wrapper, tuple(kwargs.values()), list(kwargs), [entry.output], path)
    start = time.perf_counter()
    report = convert_onnx(path).report
    return _row(report.summary, convert_s=time.perf_counter() - start)


def measure_torch(name: str, batch: int) -> dict:
    """``amp_compiler.compile`` with defaults; the output's error against FP32 eager."""
    import torch

    import amp_compiler
    from benchmarks.torch_amp import rel_error

    model, config = build(name)
    kwargs = inputs(name, config, batch)
    start = time.perf_counter()
    compiled = amp_compiler.compile(model, example_kwargs=kwargs)
    convert_s = time.perf_counter() - start
    output = MODELS[name].output
    with torch.no_grad():
        ref, out = model(**kwargs)[output], compiled(**kwargs)[output]
    return _row(compiled.report.summary, convert_s=convert_s, capture=compiled.capture,
                rel_error=rel_error(ref, out))


def run(names: list[str], batches: list[int], paths: list[str], log: Callable[[str], None] = print) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="amp-small-") as tmp:
        for name in names:
            for batch in batches:
                for path in paths:
                    row = {"model": name, "batch": batch, "path": path}
                    try:
                        row.update(measure_onnx(name, batch, Path(tmp)) if path == "onnx" else
                                   measure_torch(name, batch))
                    except Exception as exc:  # noqa: BLE001 - a failing model is a row, not the end of the run
                        row["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"
                    rows.append(row)
                    log(_line(row))
    return rows


def _line(r: dict) -> str:
    if "error" in r:
        return f"{r['model']:12} b{r['batch']} {r['path']:5}  FAILED {r['error']}"
    why = r["why"].splitlines()[0] if r["why"] else ""
    return (f"{r['model']:12} b{r['batch']} {r['path']:5} {r['fp16_gemm_flop_fraction']:7.1%} "
            f"{r['predicted_time_mixed_s'] * 1e6:8.1f} {r['predicted_time_fp32_s'] * 1e6:8.1f}  {why}")


def table(rows: list[dict]) -> str:
    from benchmarks.common import md_table

    body = []
    for r in rows:
        if "error" in r:
            body.append([r["model"], r["batch"], r["path"], "—", "—", "—", "—", f"failed: {r['error']}"])
            continue
        err = f"{r['rel_error']:.1e}" if "rel_error" in r else "—"
        why = "; ".join(r["why"].splitlines()[:1] + [ln for ln in r["why"].splitlines() if "by a rule" in ln][:1])
        body.append([r["model"], r["batch"], r["path"], f"{r['fp16_gemm_flop_fraction']:.1%}",
                     f"{r['predicted_time_mixed_s'] * 1e6:.1f}", f"{r['predicted_time_fp32_s'] * 1e6:.1f}", err,
                     why or "—"])
    return md_table(["model", "batch", "path", "FP16 GEMM FLOPs", "mixed µs", "FP32 µs", "rel err",
                     "fp32_tensor_core_why (first line; rule line)"], body, "lrlrrrrl")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     epilog="e.g. python -m benchmarks.small_models --models llama,mamba --batches 1")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from: {', '.join(MODELS)}")
    parser.add_argument("--batches", default="1,2", help="comma-separated batch sizes (default 1,2)")
    parser.add_argument("--paths", default="onnx,torch", help="onnx, torch or both (default both)")
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("--readme", action="store_true", help="write the table into benchmarks/README.md")
    opts = parser.parse_args(argv)
    names = [n for n in opts.models.split(",") if n]
    unknown = [n for n in names if n not in MODELS]
    paths = [p for p in opts.paths.split(",") if p]
    if unknown or not set(paths) <= {"onnx", "torch"}:
        parser.error(f"unknown models {unknown} or paths {paths}")
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    from benchmarks.common import run_header, update_readme_section, write_json

    header = run_header("small_models", argv if argv is not None else sys.argv[1:])
    print(f"{'model':12} {'b':2} {'path':5} {'FP16':>7} {'mixed':>8} {'FP32 µs':>8}  why")
    rows = run(names, [int(b) for b in opts.batches.split(",")], paths)
    md = table(rows)
    print(md)
    if opts.json:
        write_json(opts.json, {**header, "rows": rows}, Path("."))
    if opts.readme:
        dirty = " plus uncommitted changes" if header["dirty"] else " (clean tree)" if header["dirty"] is False else ""
        caption = f"`{header['command']}`, {header['date']}, commit {header['commit']}{dirty}; H100 cost model.\n\n"
        update_readme_section(MARKER, caption + md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
