"""Functional versions of torch's SGD, Adam and AdamW, traceable into one step graph.

Each optimizer reads its hyper-parameters from the user's ``torch.optim`` object at
every step (so a changed learning rate takes effect) and passes them into the graph as
tensors, so the captured graph never changes after step 0. State (momentum buffers,
moments, step counts) is created up front with fixed shapes; the first-step special
cases of torch's implementations are expressed with ``torch.where`` on the step count.
The update formulas follow torch's single-tensor implementations with default flags.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import ConversionError


@dataclass(frozen=True)
class FunctionalOptimizer:
    kind: str  # "sgd" | "adam" | "adamw"
    hyper_names: tuple[str, ...]
    state_names: tuple[str, ...]


_SGD = FunctionalOptimizer("sgd", ("lr", "momentum", "dampening", "weight_decay"), ("momentum_buffer",))
_ADAM = FunctionalOptimizer("adam", ("lr", "beta1", "beta2", "eps", "weight_decay"), ("exp_avg", "exp_avg_sq"))
_ADAMW = FunctionalOptimizer("adamw", ("lr", "beta1", "beta2", "eps", "weight_decay"), ("exp_avg", "exp_avg_sq"))


def describe(optimizer: torch.optim.Optimizer) -> FunctionalOptimizer:
    """The functional form of ``optimizer``; unsupported optimizers or flags raise ConversionError."""
    name = type(optimizer).__name__
    kinds = {"SGD": _SGD, "Adam": _ADAM, "AdamW": _ADAMW}
    if name not in kinds:
        raise ConversionError("compile_training", f"optimizer {name}",
                              "not supported; use torch.optim.SGD, Adam or AdamW")
    for group in optimizer.param_groups:
        for flag in ("nesterov", "amsgrad", "maximize", "capturable", "differentiable"):
            if group.get(flag):
                raise ConversionError("compile_training", f"optimizer {name}", f"{flag}=True is not supported")
        if callable(group.get("lr")) or isinstance(group.get("lr"), torch.Tensor) and group["lr"].requires_grad:
            raise ConversionError("compile_training", f"optimizer {name}", "lr must be a number")
    return kinds[name]


def hyper_tensors(opt: FunctionalOptimizer, optimizer: torch.optim.Optimizer,
                  group_of: list[int]) -> dict[str, torch.Tensor]:
    """Per-parameter hyper-parameters (one value per parameter, from its group) as float32 tensors."""
    out = {}
    for name in opt.hyper_names:
        values = []
        for g in group_of:
            group = optimizer.param_groups[g]
            if name in ("beta1", "beta2"):
                values.append(float(group["betas"][0 if name == "beta1" else 1]))
            else:
                values.append(float(group.get(name, 0.0)))
        out[name] = torch.tensor(values, dtype=torch.float32)
    return out


def init_state(opt: FunctionalOptimizer, params: list[torch.Tensor]) -> dict[str, list[torch.Tensor]]:
    state = {name: [torch.zeros_like(p, memory_format=torch.preserve_format) for p in params]
             for name in opt.state_names}
    state["step"] = [torch.zeros((), dtype=torch.float32) for _ in params]
    return state


def update(opt: FunctionalOptimizer, params: list[torch.Tensor], grads: list[torch.Tensor],
           state: dict[str, list[torch.Tensor]], hyper: dict[str, torch.Tensor]):
    """New parameters and new state (pure: nothing is modified in place)."""
    new_params, new_state = [], {k: [] for k in state}
    for i, (p, g) in enumerate(zip(params, grads)):
        h = {k: v[i] for k, v in hyper.items()}
        step = state["step"][i] + 1
        if opt.kind == "sgd":
            d_p = g + h["weight_decay"] * p
            buf = state["momentum_buffer"][i]
            buf = torch.where(step == 1, d_p, h["momentum"] * buf + (1 - h["dampening"]) * d_p)
            d_p = torch.where(h["momentum"] != 0, buf, d_p)
            new_p = p - h["lr"] * d_p
            new_state["momentum_buffer"].append(buf)
        else:
            if opt.kind == "adamw":
                p = p * (1 - h["lr"] * h["weight_decay"])
            else:
                g = g + h["weight_decay"] * p
            m = state["exp_avg"][i] * h["beta1"] + g * (1 - h["beta1"])
            v = state["exp_avg_sq"][i] * h["beta2"] + g * g * (1 - h["beta2"])
            bias1 = 1 - h["beta1"] ** step
            bias2 = 1 - h["beta2"] ** step
            denom = v.sqrt() / bias2.sqrt() + h["eps"]
            new_p = p - (h["lr"] / bias1) * m / denom
            new_state["exp_avg"].append(m)
            new_state["exp_avg_sq"].append(v)
        new_params.append(new_p)
        new_state["step"].append(step)
    return new_params, new_state
