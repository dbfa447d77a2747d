"""Ops that exist only on ONNX Runtime's CPU provider, left in a file it saved fully optimised.

``SessionOptions.optimized_model_filepath`` at ONNX Runtime's default level (``ORT_ENABLE_ALL``)
writes its CPU layout transforms into the file: convolutions become ``com.microsoft.nchwc::Conv``
with ``ReorderInput``/``ReorderOutput`` around them. Those ops have CPU kernels only, so on a GPU
they run on the CPU whatever the plan, and the plan can only leave them as exported ("unknown
ops"); a Swin so saved had its patch convolution planned as nothing. The report says so first,
and which file to convert instead.
"""

from __future__ import annotations

from typing import Iterable

__all__ = ["cpu_layout_note"]

#: domains of ONNX Runtime's CPU-only layout ops (``ORT_ENABLE_ALL``'s NCHWc transformer)
CPU_LAYOUT_DOMAINS = frozenset({"com.microsoft.nchwc"})


def cpu_layout_note(ops: Iterable) -> str:
    """The report's line for the ops (IR ``Op``s: ``domain``, ``op_type``, ``name``) of a CPU-only
    layout domain; "" when there are none."""
    found = [op for op in ops if op.domain in CPU_LAYOUT_DOMAINS]
    if not found:
        return ""
    kinds = sorted({f"{op.domain}::{op.op_type}" for op in found})
    return (f"{len(found)} ops of ORT's CPU-only layout (ORT_ENABLE_ALL) stay as exported: convert the export or "
            f"its ORT_ENABLE_EXTENDED save ({', '.join(kinds)})")
