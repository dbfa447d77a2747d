"""The PyTorch entry points on zoo models: accuracy, FP16 share of GEMM FLOPs, cast counts.

For each model it runs ``amp_compiler.compile`` and reports

* the relative error of the output against the FP32 model (max |diff| / max |ref|);
* the share of GEMM/conv FLOPs in FP16 (from the report) and which allow-class aten
  ops run in FP16;
* the number of dtype-converting nodes in our graph and in the aten graph torch.compile
  produces for ``torch.autocast(dtype=float16)`` on the same model (weights folded by
  us count zero: they are cast once at compile time).

Sizes:

* ``"ci"`` -- the zoo's small configs widened so that FP16 pays on the H100 roofline
  (width 128, 1024 tokens or 16 images per batch); the tests use these. Smaller configs are
  launch-overhead bound: the optimal planner rightly keeps their tiny GEMMs FP32.
* ``"base"`` -- the zoo's real sizes (BERT-base, GPT-2 124M, ResNet-50, ViT-B/16).

Run ``python -m benchmarks.torch_amp [--size base] [--target h100] [--models bert,vit] [--json out.json]``.
CPU FP16 GEMMs are slow without AVX512-FP16/AMX; base sizes take minutes on such a CPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from typing import Any

TORCH_MODELS = ("bert", "gpt2", "resnet", "vit")
CI_BATCH = 16
#: allow-class aten ops whose FLOPs the issue asks to run in FP16
GEMM_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "convolution", "linear", "matmul"})

_CI_CONFIG = {
    "bert": dict(hidden_size=128, intermediate_size=512, num_attention_heads=2),
    "gpt2": dict(n_embd=128, n_head=2),
    "vit": dict(hidden_size=128, intermediate_size=512, num_attention_heads=2, image_size=64, patch_size=8),
    "resnet": dict(embedding_size=32, hidden_sizes=[64, 128, 256, 512]),
}
CI_SEQ = 64


def build(name: str, size: str = "ci"):
    """``(module, args)``: a zoo model with seeded random weights, in eval mode, and its inputs."""
    import torch
    import transformers

    from benchmarks import zoo

    if size != "ci":
        return zoo.build_torch_model(name, size)
    spec = zoo.ZOO[name]
    var = zoo.variant(name, "small")
    config = var.config
    for key, value in _CI_CONFIG[name].items():
        setattr(config, key, value)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(zoo.SEED)
        model = getattr(transformers, spec.model_class)(config).eval()
    wrapper = zoo.wrap_module(model, [i.name for i in var.inputs], spec.call_kwargs, spec.output)
    gen = torch.Generator().manual_seed(zoo.SEED)
    args = []
    for inp in var.inputs:
        if inp.high is None:
            px = getattr(config, "image_size", inp.shape[-1])
            args.append(torch.randn((CI_BATCH, inp.shape[1], px, px), generator=gen))
        elif "mask" in inp.name:
            args.append(torch.ones((CI_BATCH, CI_SEQ), dtype=torch.int64))
        else:
            args.append(torch.randint(0, inp.high, (CI_BATCH, CI_SEQ), generator=gen))
    return wrapper, tuple(args)


def rel_error(ref, out) -> float:
    """``amp_compiler.metrics.rel_error`` of two torch tensors."""
    from amp_compiler.metrics import rel_error as measure

    return measure(ref.detach().float().cpu().numpy(), out.detach().float().cpu().numpy())


def count_casts(gm) -> int:
    """Nodes of an aten graph that change a tensor's dtype (``_to_copy`` / ``convert_element_type``)."""
    import torch

    n = 0
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is torch.ops.prims.convert_element_type.default:
            n += 1
        elif node.target is torch.ops.aten._to_copy.default and node.kwargs.get("dtype") is not None:
            src = node.args[0].meta.get("val") if hasattr(node.args[0], "meta") else None
            if src is None or src.dtype != node.kwargs["dtype"]:
                n += 1
    return n


def low_gemm_ops(gm, low="float16") -> tuple[Counter, Counter]:
    """(allow-class aten ops by name, those whose output is ``low``) in an aten graph."""
    total, in_low = Counter(), Counter()
    for node in gm.graph.nodes:
        packet = getattr(getattr(node.target, "_overloadpacket", None), "__name__", None)
        if node.op == "call_function" and packet in GEMM_OPS:
            total[packet] += 1
            val = node.meta.get("val")
            if val is not None and str(val.dtype) == f"torch.{low}":
                in_low[packet] += 1
    return total, in_low


def autocast_graph(model, args, dtype=None):
    """The forward aten graph torch.compile traces for ``model`` under CPU autocast (no inductor)."""
    import torch
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    dtype = dtype or torch.float16
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=aot_autograd(fw_compiler=capture), fullgraph=True)
    with torch.no_grad(), torch.autocast("cpu", dtype=dtype):
        out = compiled(*args)
    torch._dynamo.reset()
    return graphs[0], out


def run_one(name: str, size: str = "ci", target: str = "h100") -> dict[str, Any]:
    import torch

    import amp_compiler

    model, args = build(name, size)
    with torch.no_grad():
        ref = model(*args)
    start = time.perf_counter()
    compiled = amp_compiler.compile(model, args, target=target)
    compile_s = time.perf_counter() - start
    with torch.no_grad():
        start = time.perf_counter()
        out = compiled(*args)
        run_s = time.perf_counter() - start
    total, low = low_gemm_ops(compiled)
    auto_gm, auto_out = autocast_graph(model, args)
    auto_total, auto_low = low_gemm_ops(auto_gm)
    summary = compiled.report.summary
    return {
        "model": name, "size": size, "target": target, "rel_error": rel_error(ref, out),
        "rel_error_autocast": rel_error(ref, auto_out), "rel_error_vs_autocast": rel_error(auto_out, out),
        "fp16_gemm_flop_fraction": summary["fp16_gemm_flop_fraction"],
        "gemm_ops": dict(total), "gemm_ops_fp16": dict(low), "autocast_gemm_ops_fp16": dict(auto_low),
        "casts": count_casts(compiled), "autocast_casts": count_casts(auto_gm),
        "folded_weights": len(compiled.get_submodule("_amp_folded").entries),
        "compile_s": compile_s, "run_s": run_s,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="ci", choices=("ci", "small", "base"))
    parser.add_argument("--models", default=",".join(TORCH_MODELS))
    parser.add_argument("--target", default="h100", help="device the plan is for (the tests use a100 at ci size)")
    parser.add_argument("--json", help="write the results here")
    opts = parser.parse_args(argv)
    rows = []
    print(f"{'model':8} {'rel err':>9} {'vs autocast':>11} {'fp16 GEMM':>9} {'casts':>5} {'autocast':>8} "
          f"{'compile':>8}")
    for name in opts.models.split(","):
        r = run_one(name, opts.size, opts.target)
        rows.append(r)
        print(f"{name:8} {r['rel_error']:9.2e} {r['rel_error_vs_autocast']:11.2e} "
              f"{r['fp16_gemm_flop_fraction']:9.1%} {r['casts']:5d} {r['autocast_casts']:8d} "
              f"{r['compile_s']:7.1f}s", flush=True)
    if opts.json:
        with open(opts.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
