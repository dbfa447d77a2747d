"""Operands of mixed dtypes that torch's kernels refuse, found in a captured graph (docs/architecture.md,
"Capture routes and shapes").

Captures trace with fake tensors, whose meta kernels do not check that a GEMM's, convolution's,
attention's or norm's operands share a dtype: an example of the wrong dtype (float64 or int64 inputs
to a float32 model) was captured and planned, and failed only at the first call, with
"mat1 and mat2 must have the same dtype" from inside the plan. ``check_operand_dtypes`` refuses such
a graph at capture, with ``OperandDtypeError``, naming the op, the module, the user's line and the fix.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable

import torch
from torch import fx

from ..errors import ConversionError
from ..user_frame import user_line
from .importer import module_path

#: ops whose tensor operands must share one dtype (their first ``n`` arguments; None: all)
_SAME = {name: None for name in ("mm", "addmm", "bmm", "baddbmm", "addbmm", "addmv", "mv", "dot", "vdot",
                                 "convolution", "_convolution", "_prelu_kernel")}
_SAME.update({name: 3 for name in ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
                                   "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
                                   "scaled_dot_product_attention")})  # query, key, value (a mask may be bool)
#: norms: the input may also be FP16/BF16 with FP32 parameters (a mixed kernel), not more
_NORMS = ("native_layer_norm", "native_group_norm", "native_batch_norm", "_native_batch_norm_legit",
          "_native_batch_norm_legit_no_training", "_native_batch_norm_legit_functional", "_fused_rms_norm")
_LOW = (torch.float16, torch.bfloat16)


class OperandDtypeError(ConversionError):
    """The model cannot run the example: an op reads operands of dtypes its kernel refuses (the other
    capture route would capture the same graph, so it is not tried)."""


def _dtype(value) -> torch.dtype | None:
    val = value.meta.get("val") if isinstance(value, fx.Node) else None
    return val.dtype if isinstance(val, torch.Tensor) else None


def _refused(node: fx.Node) -> list[torch.dtype]:
    """The dtypes ``node`` reads if its kernel refuses them together, else []."""
    name = getattr(getattr(node.target, "_overloadpacket", None), "__name__", "")
    if name in _NORMS:
        x, params = _dtype(node.args[0]), {_dtype(a) for a in node.args[1:]} - {None}
        if x is None or not params or params == {x} or (x in _LOW and params == {torch.float32}):
            return []
        return [x, *sorted(params - {x}, key=str)]
    if name not in _SAME:
        return []
    dtypes = list(dict.fromkeys(d for d in map(_dtype, node.args[:_SAME[name]]) if d is not None))
    return dtypes if len(dtypes) > 1 else []


def _where(node: fx.Node) -> str:
    """``module path (Class)`` and the user's line of ``node``, as the capture recorded them."""
    stack = node.meta.get("nn_module_stack")
    parts = []
    if stack:
        cls = list(stack.values())[-1][1]
        parts.append(f"module {module_path(node) or '<root>'} "
                     f"({getattr(cls, '__name__', str(cls).rsplit('.', 1)[-1])})")
    line = user_line(node.meta.get("stack_trace") or "")
    if line:
        parts.append(line)
    return ", ".join(parts)


def check_operand_dtypes(gm: fx.GraphModule, source: str, params: Iterable[torch.Tensor],
                         inputs: str = "example inputs") -> None:
    """Raise ``OperandDtypeError`` at the first op of ``gm`` whose operands' dtypes its kernel refuses
    (eager raises the same at that op); ``params`` are the model's, whose dtype the fix names."""
    for node in gm.graph.nodes:
        dtypes = _refused(node) if node.op == "call_function" else []
        if not dtypes:
            continue
        counts = Counter(p.dtype for p in params if p.is_floating_point())
        model = counts.most_common(1)[0][0] if counts else dtypes[-1]
        named = " and ".join(str(d).removeprefix("torch.") for d in sorted(dtypes, key=lambda d: d == model))
        where = ", ".join(p for p in (f"aten.{node.target._overloadpacket.__name__}", _where(node)) if p)
        raise OperandDtypeError(source, where, f"reads {named} tensors together, which torch's kernel refuses: "
                                f"the model's own forward fails there too; its parameters are "
                                f"{str(model).removeprefix('torch.')}: pass {inputs} of that dtype (x.to({model}))")


__all__ = ["OperandDtypeError", "check_operand_dtypes"]
