"""The why-lines count the casts a plan pays at weights apart from the graph's inputs and outputs:
a training-mode model keeps its parameters FP32 and casts them every call, which read as "6 at
graph inputs/outputs" on a two-Linear MLP with one input and one output (``passes/explain.py``)."""

from __future__ import annotations

import torch

import amp_compiler


def test_parameters_cast_every_call_are_named_as_such():
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    x = torch.randn(4, 64)
    why = amp_compiler.compile(mlp.train(), x).report.summary["fp32_tensor_core_why"]
    assert "its casts: 4 at parameters cast every call (training mode keeps their FP32 master copy), " \
           "2 at graph inputs/outputs" in why, why
    # eval mode folds the weights' casts: FP16 (a near tie of launches), nothing to explain
    assert not amp_compiler.compile(mlp.eval(), x).report.summary["fp32_tensor_core_why"]
