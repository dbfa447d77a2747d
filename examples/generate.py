"""Example: transformers' ``generate`` on a model ``amp_compiler.compile`` planned.

    python examples/generate.py

A 2-layer, 256-wide Llama-style decoder with random weights (no download) and its default
configuration (SDPA attention, ``use_cache=True``). Its cache output sends it to the dynamo
route, where the first decode step is planned for its shapes and the next, whose cache is
longer, symbolically: every later step reuses that plan, so generation does not re-plan per
token. The last step's report says what ran in which precision and why.
"""

from __future__ import annotations

import sys
import time

NEW_TOKENS = 24


def main() -> int:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import amp_compiler

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=8192)
    model = LlamaForCausalLM(config).eval()
    prompt = torch.randint(0, config.vocab_size, (1, 16))

    amp = amp_compiler.compile(model, example_kwargs={"input_ids": prompt})
    print(f"captured by {amp.capture}")
    greedy = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    start = time.perf_counter()
    out = amp.generate(prompt, **greedy)
    first = time.perf_counter() - start
    start = time.perf_counter()
    again = amp.generate(prompt, **greedy)  # every shape planned already
    second = time.perf_counter() - start
    ref = model.generate(prompt, **greedy)

    same = int((out[0, 16:] == ref[0, 16:]).sum())
    print(f"{NEW_TOKENS} tokens: first generate {first:.1f} s (planning included), second {second:.2f} s; "
          f"{amp.plans} plans in all")
    print(f"{same}/{NEW_TOKENS} tokens as the FP32 model's")
    print(amp.report.to_text(max_rows=8))
    ok = torch.equal(out, again) and amp.plans <= 4 and same >= NEW_TOKENS // 2
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
