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

from dataclasses import dataclass
from typing import BinaryIO

import numpy as np
from onnx import GraphProto, ModelProto, TensorProto

from .dtypes import dtype_to_onnx

try:
    import ml_dtypes
except ImportError:  # pragma: no cover - ml_dtypes comes with onnx
    ml_dtypes = None


def _tag(message, field: str) -> bytes:
    """The wire tag of a length-delimited field."""
    return _varint(message.DESCRIPTOR.fields_by_name[field].number << 3 | 2)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


_GRAPH, _INITIALIZER, _RAW = _tag(ModelProto, "graph"), _tag(GraphProto, "initializer"), _tag(TensorProto, "raw_data")


@dataclass
class PendingCast:
    """The constant ``name``: the float32 bytes ``raw`` (shape ``dims``) cast to ``dtype``."""

    name: str
    dims: tuple[int, ...]
    raw: bytes
    dtype: str

    def values(self) -> np.ndarray:
        src = np.frombuffer(self.raw, dtype=np.float32)
        return src.astype(ml_dtypes.bfloat16 if self.dtype == "bfloat16" else np.dtype(self.dtype))

    def meta(self) -> TensorProto:
        proto = TensorProto(name=self.name, data_type=dtype_to_onnx(self.dtype))
        proto.dims.extend(self.dims)
        return proto

    @property
    def nbytes(self) -> int:
        return len(self.raw) // 4 * (2 if self.dtype == "bfloat16" else np.dtype(self.dtype).itemsize)


def write_pending(f: BinaryIO, pending: list[PendingCast]) -> None:
    """Append each pending weight to a serialized ``ModelProto`` in ``f``, cast one at a time."""
    for p in pending:
        values = p.values()
        meta = p.meta().SerializeToString()
        tensor_len = len(meta) + len(_RAW) + len(_varint(values.nbytes)) + values.nbytes
        graph_len = len(_INITIALIZER) + len(_varint(tensor_len)) + tensor_len
        f.write(_GRAPH + _varint(graph_len) + _INITIALIZER + _varint(tensor_len) + meta + _RAW
                + _varint(values.nbytes))
        f.write(np.ascontiguousarray(values).view(np.uint8).data)  # the array's own buffer: no bytes copy
        del values


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
