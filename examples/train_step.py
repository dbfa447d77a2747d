"""Example: ``amp_compiler.compile_training``: one captured mixed-precision training step.

    python examples/train_step.py        # trains 100 steps, prints losses, writes examples/out/train_step.html

The model is a small CNN on a synthetic but learnable task (labels of a fixed random linear
teacher). The step graph holds forward, backward and the AdamW update; its convolutions and
GEMMs (forward and backward) run in FP16, the optimizer and the FP32 master weights stay FP32
because FP16 stops at the gradient-unscale markers, and dynamic loss scaling is injected.
The CNN is tiny, so the cost model would keep it FP32 on a GPU (launch-bound); the example
uses ``planner="greedy"`` to show the FP16 step. Runs on a CPU in about ten seconds.
"""

from __future__ import annotations

import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out"


def main() -> int:
    import torch

    import amp_compiler

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 3, 8, 8, generator=g)
    y = (x.flatten(1) @ torch.randn(3 * 8 * 8, 4, generator=g)).argmax(1)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Linear(16 * 8 * 8, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    step = amp_compiler.compile_training(model, torch.nn.functional.cross_entropy, optimizer, (x[:64], y[:64]),
                                         planner="greedy")
    for i in range(100):
        j = (i * 64) % 512
        loss = step(x[j:j + 64], y[j:j + 64])  # forward + backward + update; model's parameters updated
        if i % 20 == 0 or i == 99:
            print(f"step {i:3d}  loss {loss.item():.4f}  loss scale {step.scale:g}")
    optimizer.param_groups[0]["lr"] = 1e-4  # hyper-parameters are read at every step
    step(x[:64], y[:64])

    summary = step.report.summary
    marked = sum("unscale marker" in o["reason"] for o in step.report.ops)
    print(f"\n{summary['fp16_gemm_flop_fraction']:.0%} of GEMM/conv FLOPs (forward and backward) in FP16, "
          f"{summary['fp16_nodes']} of {summary['nodes']} ops in FP16, {marked} optimizer ops kept FP32 "
          f"after the gradient-unscale markers, {step.skipped_steps} steps skipped on overflow")
    OUT.mkdir(exist_ok=True)
    print(f"report: {step.report.save(OUT / 'train_step.html')}")
    return 0 if loss.item() < 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
