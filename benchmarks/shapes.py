"""Changing shapes, as users bring them: captures, time and error over loops of new sizes.

* ``serve``: a BERT encoder (transformers config, default SDPA attention, width 128, 2 layers)
  called with 12 (batch, length) pairs, as a server batching requests of different lengths;
* ``train``: a GPT-2 LM (width 64, 2 layers) fine-tuned for 12 steps, each batch padded to its
  own longest sequence (transformers' padding collators), AdamW, gradient clipping.

Beside the peers in one run: eager FP32 (the reference), ``torch.autocast`` in eager mode (no
capture), and ``torch.compile`` with autocast (dynamo's automatic dynamic shapes; inductor needs a
C++ compiler, else the cell says so). For each: captures made (plans, dynamo graphs or training
captures), wall time of the whole loop including every capture, the slowest call, and the
largest relative error of an output (serve) or of the final loss (train) against eager FP32.
On a CPU the FP16 arithmetic itself is emulated: compare captures and capture time, not
steady-state speed.

``python -m benchmarks.shapes [--loops serve,train] [--no-readme]``
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import shutil
import sys
import time
import warnings
from typing import Any, Callable

from .common import fmt_err, md_table, provenance, publish, run_header

SERVE_CALLS = [(2, 16), (2, 20), (4, 24), (1, 9), (8, 33), (2, 16), (3, 47), (2, 64), (1, 128), (6, 12), (4, 90),
               (2, 31)]
TRAIN_LENGTHS = [16, 20, 24, 31, 17, 40, 22, 33, 27, 19, 45, 12]
TOOLS = ("amp-compiler", "torch.autocast (eager)", "torch.compile + autocast")


def _rel(ref, out) -> float:
    ref, out = ref.float(), out.float()
    return float((ref - out).abs().max() / ref.abs().max().clamp_min(1e-12))


def _have_cxx() -> bool:
    return any(shutil.which(c) for c in ("g++", "c++", "clang++"))


def _dynamo_graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _timed(calls: list, run: Callable[[Any], Any]) -> tuple[list, float, float]:
    outs, slowest, start = [], 0.0, time.perf_counter()
    for call in calls:
        t = time.perf_counter()
        outs.append(run(call))
        slowest = max(slowest, time.perf_counter() - t)
    return outs, time.perf_counter() - start, slowest


def serve(tool: str) -> dict[str, Any]:
    import torch
    from transformers import BertConfig, BertModel

    import amp_compiler

    torch.manual_seed(0)
    model = BertModel(BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                                 intermediate_size=512)).eval()
    g = torch.Generator().manual_seed(1)
    calls = []
    for b, n in SERVE_CALLS:
        ids = torch.randint(0, 1000, (b, n), generator=g)
        calls.append({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    with torch.no_grad():
        refs = [model(**c).last_hidden_state for c in calls]
        captures: Callable[[], int]
        if tool == "amp-compiler":
            start = time.perf_counter()
            amp = amp_compiler.compile(model, example_kwargs=calls[0])
            first = time.perf_counter() - start
            outs, total, slowest = _timed(calls, lambda c: amp(**c).last_hidden_state)
            total, slowest, captures = total + first, max(slowest, first), lambda: amp.plans
        elif tool == "torch.autocast (eager)":
            with torch.autocast("cpu", dtype=torch.float16):
                outs, total, slowest = _timed(calls, lambda c: model(**c).last_hidden_state)
            captures = lambda: 0  # noqa: E731
        else:
            if not _have_cxx():
                return {"skipped": "inductor needs a C++ compiler"}
            torch._dynamo.reset()
            before = _dynamo_graphs()
            compiled = torch.compile(model)
            with torch.autocast("cpu", dtype=torch.float16):
                outs, total, slowest = _timed(calls, lambda c: compiled(**c).last_hidden_state)
            captures = lambda: _dynamo_graphs() - before  # noqa: E731
    return {"captures": captures(), "total_s": total, "slowest_s": slowest,
            "max_rel_err": max(_rel(r, o) for r, o in zip(refs, outs))}


def _gpt2():
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=500, n_positions=128)).train()


def _lm_loss(out, labels):
    import torch

    logits = out.logits[:, :-1]
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))


def train(tool: str) -> dict[str, Any]:
    import torch

    import amp_compiler

    g = torch.Generator().manual_seed(2)
    batches = [torch.randint(0, 500, (4, n), generator=g) for n in TRAIN_LENGTHS]

    def eager_loop(model, autocast: bool, compiled=None):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        scaler = torch.amp.GradScaler("cpu", enabled=autocast)
        forward = compiled if compiled is not None else model

        def one(ids):
            opt.zero_grad()
            ctx = torch.autocast("cpu", dtype=torch.float16) if autocast else contextlib.nullcontext()
            with ctx:
                loss = _lm_loss(forward(ids), ids)
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
            return float(loss)
        return _timed(batches, one)

    ref, _, _ = eager_loop(_gpt2(), autocast=False)
    model = _gpt2()
    if tool == "amp-compiler":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            start = time.perf_counter()
            step = amp_compiler.compile_training(model, _lm_loss, opt, (batches[0], batches[0]), max_grad_norm=1.0)
            first = time.perf_counter() - start
            losses, total, slowest = _timed(batches, lambda ids: float(step(ids, ids)))
        total, slowest, captures = total + first, max(slowest, first), len(step.captures)
    elif tool == "torch.autocast (eager)":
        losses, total, slowest = eager_loop(model, autocast=True)
        captures = 0
    else:
        if not _have_cxx():
            return {"skipped": "inductor needs a C++ compiler"}
        torch._dynamo.reset()
        before = _dynamo_graphs()
        losses, total, slowest = eager_loop(model, autocast=True, compiled=torch.compile(model))
        captures = _dynamo_graphs() - before
    return {"captures": captures, "total_s": total, "slowest_s": slowest,
            "max_rel_err": max(abs(a - b) / abs(b) for a, b in zip(losses, ref))}


LOOPS = {"serve": serve, "train": train}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.shapes", description=__doc__.splitlines()[0])
    parser.add_argument("--loops", default="serve,train", help="comma-separated: serve, train")
    parser.add_argument("--tools", default=",".join(TOOLS), help=f"comma-separated, of: {', '.join(TOOLS)}")
    parser.add_argument("--no-readme", action="store_true", help="print the table, leave benchmarks/README.md as is")
    args = parser.parse_args(argv)
    data = run_header("shapes", argv if argv is not None else sys.argv[1:])
    loops = [name for name in args.loops.split(",") if name]
    tools = [t for t in args.tools.split(",") if t]
    unknown = [n for n in loops if n not in LOOPS] + [t for t in tools if t not in TOOLS]
    if unknown:
        parser.error(f"unknown loop or tool: {', '.join(unknown)}")
    rows, results = [], {}
    for loop in loops:
        for tool in tools:
            print(f"{loop}: {tool} ...", file=sys.stderr, flush=True)
            try:
                r = LOOPS[loop](tool)
            except Exception as exc:  # noqa: BLE001 - a failure is a cell
                r = {"failed": f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"}
            results[f"{loop}/{tool}"] = r
            if "captures" in r:
                rows.append([loop, tool, r["captures"], f"{r['total_s']:.1f}", f"{r['slowest_s']:.2f}",
                             fmt_err(r["max_rel_err"])])
            else:
                rows.append([loop, tool, r.get("skipped") or r.get("failed"), "", "", ""])
    data["results"] = results
    calls = len(SERVE_CALLS) if "serve" in loops else len(TRAIN_LENGTHS)
    md = (f"Generated by `{data['command']}` on {data['date']} ({provenance(data)}); "
          f"{data['machine'].get('cpu', 'CPU')}, shared. {calls} calls per loop, every capture included.\n\n"
          + md_table(["loop", "tool", "captures", "loop s", "slowest call s", "max rel err vs FP32"], rows,
                     "llrrrr"))
    publish("shapes.json", "shapes-table", data, md, readme=not args.no_readme)
    return 0


if __name__ == "__main__":
    sys.exit(main())
