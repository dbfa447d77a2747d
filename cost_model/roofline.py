"""Roofline time model: ``time = max(flops / peak, bytes / bandwidth) + launch``.

Peaks depend on dtype, on whether the op can use tensor cores (GEMM/conv-like) and on
whether its dimensions are aligned for them. A :class:`MeasuredProfile` entry for
``(key, dtype)`` overrides the analytic estimate. Everything is precomputed in
``__init__`` so ``op_time`` costs a couple of dict lookups.
"""

from __future__ import annotations

from .devices import DeviceSpec, get_device
from .dtypes import DTYPE_ALIASES, canonical_dtype, itemsize
from .measured import MeasuredProfile

__all__ = ["Roofline", "alignment_multiple", "itemsize", "tensor_core_aligned"]

_TERA = 1e12
_GIGA = 1e9

# Tensor cores want every GEMM dimension to span a multiple of 16 bytes
# (NVIDIA "Matrix Multiplication Background" / "Tensor Core Requirements").
_TC_ALIGN_ELEMS = {"float16": 8, "bfloat16": 8, "float32": 4, "int8": 16, "uint8": 16}


def alignment_multiple(dtype: str) -> int | None:
    """Tensor-core granularity in elements for ``dtype`` (8 for FP16/BF16, 4 for TF32, 16 for INT8), or None."""
    return _TC_ALIGN_ELEMS.get(canonical_dtype(dtype))


def tensor_core_aligned(dtype: str, *dims: int) -> bool:
    """True if every dim is a multiple of the tensor-core granularity for ``dtype``; False for dtypes
    without tensor cores."""
    mult = alignment_multiple(dtype)
    return mult is not None and all(int(d) % mult == 0 for d in dims)


class Roofline:
    """Analytic (optionally measured) op-time model for one device; all times in seconds."""

    def __init__(
        self,
        device: str | DeviceSpec | None = None,
        profile: MeasuredProfile | None = None,
        *,
        allow_tf32: bool = False,
    ) -> None:
        from .devices import DEFAULT_DEVICE

        self.device: DeviceSpec = get_device(DEFAULT_DEVICE if device is None else device)
        if profile is not None and profile.device != self.device.name.lower():
            raise ValueError(
                f"measured profile is for device {profile.device!r}, "
                f"but the roofline is for {self.device.name!r}"
            )
        self.profile = profile
        self.allow_tf32 = allow_tf32
        d = self.device
        self.bandwidth = d.mem_bandwidth_gbs * _GIGA  # bytes/s
        self.launch_overhead = d.launch_overhead_us * 1e-6  # s
        self._inv_bw = 1.0 / self.bandwidth

        fp32 = d.fp32_tflops * _TERA
        simt16 = d.fp16_simt_tflops * _TERA
        tc = {
            "float32": d.tf32_tflops * _TERA if allow_tf32 else fp32,
            "float16": d.fp16_tflops * _TERA,
            "bfloat16": d.bf16_tflops * _TERA,
        }
        # _peak[alias][tensor_core][aligned] -> FLOP/s. Dtypes other than the three float
        # types (float64, integers, bool) are charged at the FP32 CUDA-core rate.
        self._peak: dict[str, tuple[tuple[float, float], tuple[float, float]]] = {}
        self._inv_peak: dict[str, tuple[tuple[float, float], tuple[float, float]]] = {}
        for alias, canon in DTYPE_ALIASES.items():
            if canon in ("float16", "bfloat16"):
                simt, tc_aligned = simt16, tc[canon]
            elif canon == "float32":
                simt, tc_aligned = fp32, tc[canon]
            else:
                simt = tc_aligned = fp32
            # misaligned tensor-core candidates fall back to the CUDA-core rate
            table = ((simt, simt), (simt, tc_aligned))
            self._peak[alias] = table
            self._inv_peak[alias] = tuple(tuple(1.0 / p for p in row) for row in table)
        self._itemsize = {alias: itemsize(alias) for alias in DTYPE_ALIASES}

    def __repr__(self) -> str:
        return (
            f"Roofline(device={self.device.name!r}, allow_tf32={self.allow_tf32}, "
            f"measured={self.profile is not None})"
        )

    def _row(self, table: dict, dtype: str):
        try:
            return table[dtype]
        except KeyError:
            canonical_dtype(dtype)  # raises ValueError with the known names
            raise

    def compute_peak(self, dtype: str, tensor_core: bool, aligned: bool = True) -> float:
        """Peak FLOP/s for work of ``dtype``; ``tensor_core`` marks GEMM/conv-like work."""
        return self._row(self._peak, dtype)[bool(tensor_core)][bool(aligned)]

    def op_time(
        self,
        *,
        flops: float,
        bytes_moved: float,
        dtype: str,
        tensor_core: bool = False,
        aligned: bool = True,
        key: str | None = None,
    ) -> float:
        """Seconds for one kernel; a measured ``(key, dtype)`` entry wins over the roofline."""
        if key is not None and self.profile is not None:
            per_dtype = self.profile.entries.get(key)
            if per_dtype is not None:
                measured = per_dtype.get(DTYPE_ALIASES.get(dtype, dtype))
                if measured is not None:
                    return measured
        try:
            inv_peak = self._inv_peak[dtype][tensor_core][aligned]
        except (KeyError, TypeError, IndexError):
            inv_peak = 1.0 / self.compute_peak(dtype, tensor_core, aligned)
        t_compute = flops * inv_peak
        t_memory = bytes_moved * self._inv_bw
        return (t_compute if t_compute > t_memory else t_memory) + self.launch_overhead

    def cast_time(self, numel: int, src_dtype: str, dst_dtype: str) -> float:
        """Seconds for a Cast kernel: read ``numel`` src elements, write ``numel`` dst ones."""
        sizes = self._itemsize
        try:
            nbytes = numel * (sizes[src_dtype] + sizes[dst_dtype])
        except KeyError:
            nbytes = numel * (itemsize(src_dtype) + itemsize(dst_dtype))
        return nbytes * self._inv_bw + self.launch_overhead

    def bytes_time(self, nbytes: float) -> float:
        """Pure memory-traffic time (no launch overhead), e.g. for fused-away casts."""
        return nbytes * self._inv_bw
