"""Numeric facts both importers record, and the ranges of the low dtypes.

The importers only translate: for each float32 constant they record its raw statistics
(``ValueStats``: largest finite magnitude, zeros, a histogram of binary exponents), with
no policy. ``passes/numerics.py`` decides, for the target dtype (``RANGES``), what a low
dtype cannot hold (docs/architecture.md, "Numerics").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np

FP16_MAX = 65504.0
FP16_TINY = 2.0 ** -24  # smallest FP16 subnormal: nonzero magnitudes below it flush to zero
FP16_MIN_NORMAL = 2.0 ** -14  # below it FP16 values are subnormal: fewer than 11 significant bits


@dataclass(frozen=True)
class DtypeRange:
    """What a low dtype holds: largest finite value, smallest subnormal, smallest normal, and
    its explicit significand bits (the spacing near ``x`` is ``2 ** (floor(log2 x) - bits)``)."""

    max: float
    tiny: float
    min_normal: float
    bits: int

    def spacing(self, x: float) -> float:
        """Distance between neighbouring values of the dtype near ``x`` (normal range)."""
        return 2.0 ** (int(np.floor(np.log2(abs(x)))) - self.bits)


RANGES = {
    "float16": DtypeRange(FP16_MAX, FP16_TINY, FP16_MIN_NORMAL, 10),
    "bfloat16": DtypeRange(3.3895313892515355e38, 2.0 ** -133, 2.0 ** -126, 7),  # FP32's exponent range
}

_EXPONENT_BINS = 256  # float32 biased exponents; bin 0 holds the (nonzero) subnormals
_SLICE = 1 << 17  # elements per slice of ValueStats.of: its temporaries stay in cache (10x faster than whole)


@dataclass(frozen=True)
class ValueStats:
    """Raw statistics of a float32 tensor's values (NaN and inf are left out of ``max_abs``)."""

    size: int
    zeros: int
    max_abs: float
    exponents: tuple[int, ...]  # nonzero finite values per float32 biased exponent
    value: float | None = None  # the value of a one-element tensor (signed), else None

    @classmethod
    def of(cls, values: np.ndarray) -> "ValueStats":
        """Statistics in one pass over cache-sized slices. The exponents (as bytes) are counted in pairs:
        one histogram of 65536 bins over the bytes read two at a time halves ``bincount``'s work, the
        cost that dominates (folded into 256 bins at the end); zeros (bin 0, with the subnormals) and
        inf/NaN (bin 255) are taken out afterwards."""
        bits_all = np.ascontiguousarray(values, dtype=np.float32).reshape(-1).view(np.uint32)
        pairs = np.zeros(1 << 16, dtype=np.int64)
        counts = np.zeros(_EXPONENT_BINS, dtype=np.int64)
        zeros = peak = 0
        for start in range(0, bits_all.size, _SLICE):
            bits = bits_all[start:start + _SLICE] & 0x7FFFFFFF
            exponent = (bits >> 23).astype(np.uint8)
            if exponent.min() == 0:
                zeros += int(np.count_nonzero(bits == 0))
            finite = bits[exponent != 255] if exponent.max() == 255 else bits
            if finite.size:
                peak = max(peak, int(finite.max()))
            if exponent.size % 2:
                counts[exponent[-1]] += 1
                exponent = exponent[:-1]
            pairs += np.bincount(exponent.view(np.uint16), minlength=1 << 16)
        grid = pairs.reshape(256, 256)  # [second byte, first byte]
        counts += grid.sum(axis=0) + grid.sum(axis=1)
        counts[0] -= zeros
        counts[255] = 0
        value = float(bits_all.view(np.float32)[0]) if bits_all.size == 1 else None
        return cls(int(bits_all.size), zeros, float(np.uint32(peak).view(np.float32)), tuple(int(c) for c in counts),
                   value)

    @classmethod
    def of_chunks(cls, chunks: Iterable[np.ndarray]) -> "ValueStats | None":
        """Statistics of a tensor read chunk by chunk (external data is never loaded whole)."""
        total = None
        for chunk in chunks:
            if chunk.size:
                part = cls.of(chunk)
                total = part if total is None else total.merge(part)
        return total

    def merge(self, other: "ValueStats") -> "ValueStats":
        return ValueStats(self.size + other.size, self.zeros + other.zeros, max(self.max_abs, other.max_abs),
                          tuple(a + b for a, b in zip(self.exponents, other.exponents)))

    @property
    def nonzero(self) -> int:
        return sum(self.exponents)

    def below(self, limit: float) -> int:
        """Nonzero finite values whose magnitude is below ``limit`` (a power of two). FP32 subnormals
        all count when ``limit`` lies among them (the histogram does not resolve them)."""
        k = int(np.floor(np.log2(limit)))
        return self.exponents[0] + sum(self.exponents[1:max(k + 127, 1)])


def stats_of(values: np.ndarray) -> ValueStats | None:
    """``ValueStats`` of a float array, or None when it is empty."""
    return ValueStats.of(values) if values.size else None


__all__ = ["FP16_MAX", "FP16_MIN_NORMAL", "FP16_TINY", "RANGES", "DtypeRange", "ValueStats", "stats_of"]
