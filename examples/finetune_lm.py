"""Example: fine-tuning a GPT-2-style LM with ``amp_compiler.compile_training``.

    python examples/finetune_lm.py     # 200 micro-batch steps three ways, prints the final losses

The recipe people fine-tune with: a tiny ``transformers`` GPT-2 (default config, shrunk),
frozen token and position embeddings, AdamW with two parameter groups (no weight decay on
biases and LayerNorms), a cosine schedule, clipping at 1.0, accumulation over 4
micro-batches and a smaller last micro-batch (36 sequences do not split into 4 x 10). The
same recipe runs in eager FP32, in eager ``torch.autocast`` (bfloat16 on a CPU) with
``GradScaler``, and through ``compile_training`` (FP16 GEMMs, ``planner="greedy"``: the
cost model would keep a model this small FP32, and says so). Exits 1 unless the compiled
run's final loss is within 2 % of both. Runs on a CPU in well under a minute.
"""

from __future__ import annotations

import sys
import warnings

import torch

STEPS, ACCUM, MICRO = 200, 4, 10  # 200 micro-batches = 50 updates


class Logits(torch.nn.Module):
    """``ids -> logits`` (the step's loss function takes the model's output)."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, ids):
        return self.lm(input_ids=ids).logits


def _model() -> Logits:
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=128, n_positions=32, n_embd=64, n_layer=2, n_head=2,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    lm = transformers.GPT2LMHeadModel(config)
    lm.transformer.wte.requires_grad_(False)  # frozen embeddings (tied to the LM head)
    lm.transformer.wpe.requires_grad_(False)
    return Logits(lm)


def _recipe(model):
    decay = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-3)
    return opt, torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS // ACCUM)


def lm_loss(logits, ids):
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def _data():
    """36 sequences of 16 tokens, each counting up from a random start: learnable next tokens."""
    g = torch.Generator().manual_seed(0)
    start = torch.randint(0, 112, (36, 1), generator=g)
    ids = start + torch.arange(16)
    return [ids[i:i + MICRO] for i in range(0, 36, MICRO)]  # 10, 10, 10 and a last batch of 6


def _eager(autocast: bool) -> float:
    model = _model()
    opt, sched = _recipe(model)
    scaler = torch.amp.GradScaler("cpu", enabled=autocast)
    batches = _data()
    for i in range(STEPS):
        ids = batches[i % ACCUM]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = lm_loss(model(ids), ids) / ACCUM
        scaler.scale(loss).backward()
        if (i + 1) % ACCUM == 0:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            sched.step()
    return _final_loss(model)


def _compiled() -> tuple[float, object]:
    import amp_compiler
    model = _model()
    opt, sched = _recipe(model)
    batches = _data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one capture per batch shape: 10 and 6 sequences
        step = amp_compiler.compile_training(model, lm_loss, opt, (batches[0], batches[0]), planner="greedy",
                                             accumulation_steps=ACCUM, max_grad_norm=1.0)
        for i in range(STEPS):
            ids = batches[i % ACCUM]
            step(ids, ids)
            if (i + 1) % ACCUM == 0:
                sched.step()
    return _final_loss(model), step


def _final_loss(model) -> float:
    ids = torch.cat(_data())
    with torch.no_grad():
        return float(lm_loss(model(ids), ids))


def main() -> int:
    torch.set_num_threads(1)  # a model this small runs fastest on one thread (and beside other jobs)
    start = _final_loss(_model())
    fp32, amp = _eager(False), _eager(True)
    compiled, step = _compiled()
    summary = step.report.summary
    print(f"GPT-2 (2 layers, width 64), frozen embeddings, AdamW x2 groups, cosine, clip 1.0, "
          f"{STEPS} micro-batches / {ACCUM} per update")
    print(f"loss {start:.4f} -> eager FP32 {fp32:.4f} | eager autocast(bf16)+GradScaler {amp:.4f} | "
          f"compile_training {compiled:.4f} ({summary['fp16_gemm_flop_fraction']:.0%} of GEMM FLOPs FP16, "
          f"{len(step.captures)} captures, {step.skipped_steps} skipped)")
    worst = max(abs(compiled - fp32) / fp32, abs(compiled - amp) / amp)
    print(f"compiled vs eager: {abs(compiled - fp32) / fp32:.2%} of FP32, {abs(compiled - amp) / amp:.2%} of autocast")
    return 0 if worst <= 0.02 and fp32 < 0.8 * start else 1


if __name__ == "__main__":
    sys.exit(main())
