"""Folded weights cast while the file is written: one pass from the FP32 bytes to the output file.

``convert_onnx`` has the emitter leave the FP16/BF16 copies of in-memory FP32 weights as
``PendingCast`` entries instead of initializers. ``write_pending`` appends each to the
serialized model as one more occurrence of ``ModelProto.graph`` holding one initializer
(protobuf parsers merge repeated occurrences of a message field, so the initializer is
appended to the graph's list, where the emitter would have put it): the weight is cast
and written straight from its array, never copied into the proto nor serialized with it.
``append_pending`` puts them into the model instead, for callers that want a plain
``ModelProto``. docs/architecture.md, "Performance".
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import BinaryIO, Iterator

import numpy as np
from onnx import GraphProto, ModelProto, TensorProto

from .dtypes import dtype_to_onnx

try:
    import ml_dtypes
except ImportError:  # pragma: no cover - ml_dtypes comes with onnx
    ml_dtypes = None


def _tag(message, field: str) -> bytes:
    """The wire tag of a length-delimited field."""
    return encode_varint(message.DESCRIPTOR.fields_by_name[field].number << 3 | 2)


def encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


_GRAPH, _INITIALIZER, _RAW = _tag(ModelProto, "graph"), _tag(GraphProto, "initializer"), _tag(TensorProto, "raw_data")


_SLICE = 1 << 18  # elements cast per write: source and buffer slices stay in cache
_WINDOW = 4  # slices in flight (and buffers per dtype) when threaded
_THREADED_BYTES = 16 << 20


@dataclass
class PendingCast:
    """The constant ``name``: the float32 bytes ``raw`` (shape ``dims``; a view of a mapped file,
    ``mapped``) cast to ``dtype`` (``"float32"``: copied as they are)."""

    name: str
    dims: tuple[int, ...]
    raw: bytes | memoryview
    dtype: str

    @property
    def target(self) -> np.dtype:
        return np.dtype(ml_dtypes.bfloat16 if self.dtype == "bfloat16" else self.dtype)

    def values(self) -> np.ndarray:
        return np.frombuffer(self.raw, dtype=np.float32).astype(self.target)

    def meta(self) -> TensorProto:
        proto = TensorProto(name=self.name, data_type=dtype_to_onnx(self.dtype))
        proto.dims.extend(self.dims)
        return proto

    @property
    def nbytes(self) -> int:
        return len(self.raw) // 4 * (2 if self.dtype == "bfloat16" else np.dtype(self.dtype).itemsize)


def write_pending(f: BinaryIO, pending: list[PendingCast]) -> None:
    """Append each pending weight to a serialized ``ModelProto`` in ``f``, cast slice by slice into a
    few reused buffers (fresh pages for a whole cast array cost as much as the rounding) or, for
    ``float32``, written from the source bytes as they are. Past ``_THREADED_BYTES``, two threads
    cast the next slices while this one writes (numpy and the write release the GIL)."""
    pieces = _pieces(pending)
    if pending_nbytes(pending) < _THREADED_BYTES:
        for piece in pieces:
            f.write(_cast(piece))
        return
    window: deque = deque()
    with ThreadPoolExecutor(_WINDOW // 2) as pool:
        for piece in pieces:
            window.append(pool.submit(_cast, piece) if isinstance(piece, tuple) else piece)
            if len(window) == _WINDOW:  # piece k reuses buffer k % _WINDOW: written first
                _write_next(f, window)
        while window:
            _write_next(f, window)


def _pieces(pending: list[PendingCast]) -> Iterator[bytes | memoryview | tuple[np.ndarray, np.ndarray]]:
    """What to write, in order: bytes as they are, or (float32 slice, buffer to cast it into)."""
    buffers: dict[np.dtype, list[np.ndarray]] = {}
    k = 0
    for p in pending:
        nbytes = p.nbytes
        meta = p.meta().SerializeToString()
        tensor_len = len(meta) + len(_RAW) + len(encode_varint(nbytes)) + nbytes
        graph_len = len(_INITIALIZER) + len(encode_varint(tensor_len)) + tensor_len
        yield (_GRAPH + encode_varint(graph_len) + _INITIALIZER + encode_varint(tensor_len) + meta + _RAW
               + encode_varint(nbytes))
        if p.target == np.float32:
            yield p.raw
            continue
        ring = buffers.setdefault(p.target, [np.empty(_SLICE, dtype=p.target) for _ in range(_WINDOW)])
        src = np.frombuffer(p.raw, dtype=np.float32)
        for start in range(0, src.size, _SLICE):
            part = src[start:start + _SLICE]
            yield part, ring[k % _WINDOW][:part.size]
            k += 1


def _cast(piece) -> bytes | memoryview:
    if not isinstance(piece, tuple):
        return piece
    src, out = piece
    out[...] = src
    return out.view(np.uint8).data


def _write_next(f: BinaryIO, window: deque) -> None:
    piece = window.popleft()
    f.write(piece.result() if isinstance(piece, Future) else piece)


def append_pending(model: ModelProto, pending: list[PendingCast]) -> None:
    """Compute the pending weights into ``model``'s main graph (in order) and empty ``pending``."""
    for p in pending:
        proto = model.graph.initializer.add()
        proto.CopyFrom(p.meta())
        proto.raw_data = p.values().tobytes()
    pending.clear()


def pending_nbytes(pending: list[PendingCast]) -> int:
    return sum(p.nbytes for p in pending)


__all__ = ["PendingCast", "append_pending", "pending_nbytes", "write_pending"]
