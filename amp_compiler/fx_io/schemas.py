"""Port facts of aten ops, derived from the torch op schemas (the ONNX path's ``onnx_io.schemas``).

aten schemas type every tensor argument as plain ``Tensor`` (no type parameters), so the
groups follow from the schema's shape and a few rules:

1. A pure cast (``_to_copy`` / ``convert_element_type`` with a dtype and nothing else that
   changes) has two groups: its input accepts any float dtype, its output takes the op's
   precision (the emitter rewrites the ``dtype`` argument to match).
2. An op without tensor outputs (``_assert_tensor_metadata``, ...) accepts any float dtype
   on each input; the emitter keeps its ``dtype`` argument equal to the input's dtype.
3. ``copy_(dst, src)``: ``dst`` keeps its dtype (the buffer being written), ``src`` is any
   float dtype (copy_ converts).
4. Batch norm: input 0 and output 0 take the op's precision; weight, bias, running
   statistics and saved statistics stay FP32 (the CPU and CUDA kernels accept a half input
   with float parameters and statistics).
5. Any other op that writes one of its arguments (an in-place op the capture did not
   functionalize) keeps every float port's source dtype: a cast in front of it would
   write the copy instead of the original.
6. An op whose float ports already disagree in the source (a partly mixed model) keeps
   them as they are.
7. Otherwise all float tensor arguments and results form one group (one precision unit).

``ir_order`` puts tensor arguments in the order the ONNX op of the same canonical name
has them (``addmm(bias, a, b)`` is ``Gemm(A, B, C)``), so the shared FLOP formulas apply.
"""

from __future__ import annotations

import torch

from ..dtypes import BFLOAT16, FLOAT16, FLOAT32, is_float
from ..ir import PortGroup

ALL_FLOATS = frozenset({FLOAT32, FLOAT16, BFLOAT16})
CAST_PACKETS = frozenset({"_to_copy", "convert_element_type"})
_BATCH_NORM = frozenset({"_native_batch_norm_legit_functional", "_native_batch_norm_legit_no_training",
                         "_native_batch_norm_legit", "native_batch_norm"})
#: IR port -> tensor argument, where the ONNX op of the same canonical op orders them differently
_ONNX_ORDER = {"addmm": (1, 2, 0), "baddbmm": (1, 2, 0), "addbmm": (1, 2, 0), "addmv": (1, 2, 0)}
_CAST_KWARGS = frozenset({"dtype", "layout", "device", "pin_memory", "non_blocking", "memory_format"})


def packet_name(target) -> str:
    """``aten.addmm.default`` -> ``addmm``; other callables by their ``__name__``."""
    packet = getattr(target, "_overloadpacket", None)
    if packet is not None:
        return packet.__name__
    return getattr(target, "__name__", str(target))


def ir_order(packet: str, n_tensors: int) -> list[int]:
    order = _ONNX_ORDER.get(packet)
    if order is not None and n_tensors == len(order):
        return list(order)
    return list(range(n_tensors))


def is_pure_cast(packet: str, node: torch.fx.Node) -> bool:
    """A dtype conversion and nothing else (no device, layout or memory-format change)."""
    if packet == "convert_element_type":
        return True
    if packet != "_to_copy" or node.kwargs.get("dtype") is None or set(node.kwargs) - _CAST_KWARGS:
        return False
    src = node.args[0].meta.get("val") if node.args and isinstance(node.args[0], torch.fx.Node) else None
    device = node.kwargs.get("device")
    return (node.kwargs.get("layout") in (None, torch.strided)
            and not node.kwargs.get("pin_memory")
            and node.kwargs.get("memory_format") in (None, torch.preserve_format)
            and (device is None or (isinstance(src, torch.Tensor) and torch.device(device) == src.device)))


def writes_arguments(target) -> bool:
    schema = getattr(target, "_schema", None)
    return bool(schema) and any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)


def port_groups(packet: str, target, node: torch.fx.Node, in_dtypes: list[str | None],
                out_dtypes: list[str | None], fp32_in: tuple[int, ...] = (),
                fp32_out: tuple[int, ...] = ()) -> list[PortGroup]:
    """Groups of IR ports (cases 1-7 of the module docstring); ``*_dtypes`` are the source dtypes."""
    fin = [i for i, d in enumerate(in_dtypes) if is_float(d)]
    fout = [o for o, d in enumerate(out_dtypes) if is_float(d)]
    if not fin and not fout:
        return []
    if packet in CAST_PACKETS and is_pure_cast(packet, node) and len(in_dtypes) == 1:  # 1
        return [PortGroup("self", tuple(fin), (), ALL_FLOATS), PortGroup("out", (), tuple(fout), ALL_FLOATS)]
    if packet == "copy_" and len(in_dtypes) == 2:  # 3
        groups = [PortGroup("dst", tuple(i for i in fin if i == 0), tuple(fout), ALL_FLOATS, fixed_type=True)]
        return groups + ([PortGroup("src", (1,), (), ALL_FLOATS)] if 1 in fin else [])
    if not out_dtypes:  # 2
        return [PortGroup(f"in{i}", (i,), (), ALL_FLOATS) for i in fin]
    if packet in _BATCH_NORM:  # 4
        return [PortGroup("x", tuple(i for i in fin if i == 0), tuple(o for o in fout if o == 0), ALL_FLOATS),
                PortGroup("stats", tuple(i for i in fin if i), tuple(o for o in fout if o), ALL_FLOATS,
                          fixed_type=True)]
    if writes_arguments(target):  # 5
        return [PortGroup("mutated", tuple(fin), tuple(fout), ALL_FLOATS, fixed_type=True)]
    source = {in_dtypes[i] for i in fin if i not in fp32_in} | {out_dtypes[o] for o in fout if o not in fp32_out}
    return [PortGroup("T", tuple(fin), tuple(fout), ALL_FLOATS, fixed_type=len(source) > 1)]  # 6, 7


__all__ = ["ALL_FLOATS", "CAST_PACKETS", "ir_order", "is_pure_cast", "packet_name", "port_groups",
           "writes_arguments"]
