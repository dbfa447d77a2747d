"""Tensor data of an ONNX model: sizes, where it lies, external-data checks and chunked reads.

Every external-data reference is checked before anything is read: the location must
stay inside the model's folder (after resolving symlinks), the file must hold
``offset + length`` bytes, and the length must match the tensor's shape and dtype.
Large tensors can stay in their files and be read chunk by chunk (``iter_chunks``),
so a model over 2 GB is never held in memory whole (docs/architecture.md, "Input handling").
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import numpy as np
import onnx
from onnx import AttributeProto, GraphProto, ModelProto, TensorProto

from ..errors import ConversionError

#: tensors below this many bytes stay inside the .onnx file (onnx's own default)
INLINE_BYTES = 1024
CHUNK_BYTES = 16 << 20

try:
    import ml_dtypes
except ImportError:  # pragma: no cover - ml_dtypes comes with onnx
    ml_dtypes = None

NUMPY = {
    TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16, TensorProto.DOUBLE: np.float64,
    TensorProto.INT8: np.int8, TensorProto.UINT8: np.uint8, TensorProto.INT16: np.int16,
    TensorProto.UINT16: np.uint16, TensorProto.INT32: np.int32, TensorProto.UINT32: np.uint32,
    TensorProto.INT64: np.int64, TensorProto.UINT64: np.uint64, TensorProto.BOOL: np.bool_,
    TensorProto.COMPLEX64: np.complex64, TensorProto.COMPLEX128: np.complex128,
}
if ml_dtypes is not None:
    NUMPY[TensorProto.BFLOAT16] = ml_dtypes.bfloat16
_ONE_BYTE = ("FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ", "FLOAT8E8M0")
_HALF_BYTE = ("INT4", "UINT4", "FLOAT4E2M1")
_ITEMSIZE = {code: np.dtype(t).itemsize for code, t in NUMPY.items()}
_ITEMSIZE[TensorProto.BFLOAT16] = 2
_ITEMSIZE.update({getattr(TensorProto, n): 1 for n in _ONE_BYTE if hasattr(TensorProto, n)})
_HALF = frozenset(getattr(TensorProto, n) for n in _HALF_BYTE if hasattr(TensorProto, n))
DATA_FIELDS = ("raw_data", "float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data")


def resolve_external_data(model: ModelProto, base_dir: str | os.PathLike, *, source: str = "model",
                          load_all: bool = False) -> set[Path]:
    """Check every external-data reference; read small tensors (all with ``load_all``) into the model.

    A location outside ``base_dir`` is refused before any file is opened. Returns the files
    the references point to.
    """
    base = Path(base_dir).resolve()
    files: set[Path] = set()
    for tensor in iter_tensors(model):
        if not is_external(tensor):
            continue
        where = f"tensor {tensor.name!r}"
        target, offset, length = external_range(tensor, base, source)
        files.add(target)
        if load_all or length < INLINE_BYTES:
            read_inline(tensor, target, offset, length, source, where)
    return files


def external_range(tensor: TensorProto, base: Path, source: str) -> tuple[Path, int, int]:
    """(file, offset, length) of an external tensor, after checking all of it."""
    where = f"tensor {tensor.name!r}"
    info = {e.key: e.value for e in tensor.external_data}
    location = info.get("location", "")
    if not location:
        raise ConversionError(source, where, "external data has no location")
    target = (base / location).resolve()
    if os.path.isabs(location) or (target != base and base not in target.parents):
        raise ConversionError(source, where, f"external data location {location!r} is outside the model's folder; "
                                             "refused")
    numbers = {}
    for key in ("offset", "length"):
        text = info.get(key)
        if text is None:
            continue
        if not text.strip().isdigit():
            raise ConversionError(source, where, f"external data {key} {text!r} is not a non-negative integer")
        numbers[key] = int(text)
    if not target.exists():
        raise ConversionError(source, where, f"external data file {location!r} is missing")
    if not target.is_file():
        raise ConversionError(source, where, f"external data location {location!r} is not a file")
    file_size = target.stat().st_size
    offset = numbers.get("offset", 0)
    length = numbers.get("length", max(file_size - offset, 0))
    if offset + length > file_size:
        raise ConversionError(source, where, f"external data file {location!r} has {file_size} bytes, fewer than "
                                             f"offset {offset} + length {length}")
    expected = tensor_nbytes(tensor)
    if expected is not None:
        if "length" in numbers and length != expected:
            raise ConversionError(source, where, f"external data length {length} does not match its shape "
                                                 f"{list(tensor.dims)} of {type_name(tensor.data_type)} "
                                                 f"({expected} bytes)")
        if "length" not in numbers and length < expected:
            raise ConversionError(source, where, f"external data file {location!r} has {length} bytes after "
                                                 f"offset {offset}, fewer than its shape {list(tensor.dims)} of "
                                                 f"{type_name(tensor.data_type)} needs ({expected} bytes)")
        length = expected
    return target, offset, length


def read_inline(tensor: TensorProto, target: Path, offset: int, length: int, source: str, where: str) -> None:
    buf = bytearray(length)
    try:
        with open(target, "rb") as f:
            f.seek(offset)
            got = f.readinto(buf)
    except OSError as exc:
        raise ConversionError(source, where, f"cannot read external data: {exc.strerror or exc}") from None
    if got != length:
        raise ConversionError(source, where, f"external data file ended after {got} of {length} bytes")
    tensor.raw_data = bytes(buf)
    del buf
    tensor.ClearField("external_data")
    tensor.data_location = TensorProto.DEFAULT


def is_external(tensor: TensorProto) -> bool:
    return tensor.HasField("data_location") and tensor.data_location == TensorProto.EXTERNAL


def tensor_nbytes(tensor: TensorProto) -> int | None:
    """Bytes the tensor's raw data must have (None for strings and unknown dtypes)."""
    numel = 1
    for d in tensor.dims:
        numel *= d
    if tensor.data_type in _HALF:
        return (numel + 1) // 2
    size = _ITEMSIZE.get(tensor.data_type)
    return None if size is None else numel * size


def approx_nbytes(tensor: TensorProto) -> int:
    """Size of a tensor's data from its dims and dtype, without touching the data (``ByteSize()``
    and ``len(raw_data)`` copy it in upb); the serialized size for strings and unknown dtypes."""
    nbytes = tensor_nbytes(tensor)
    return tensor.ByteSize() if nbytes is None else nbytes


def type_name(code: int) -> str:
    try:
        return TensorProto.DataType.Name(code).lower()
    except ValueError:
        return f"type {code}"


#: attribute types that hold no tensor nor graph (onnx's checker refuses such an attribute with
#: one set); any other type, unset included, has each of its tensor and graph fields looked at
_PLAIN_ATTRS = frozenset({AttributeProto.FLOAT, AttributeProto.INT, AttributeProto.STRING, AttributeProto.FLOATS,
                          AttributeProto.INTS, AttributeProto.STRINGS, AttributeProto.TYPE_PROTO,
                          AttributeProto.TYPE_PROTOS})


def iter_tensors(model: ModelProto) -> Iterator[TensorProto]:
    """Every TensorProto that can hold weights: initializers, attribute tensors, sparse values; all scopes.
    Each attribute's type is read first: a scalar's six tensor and graph fields are not (0.3 s per
    walk at 100k nodes)."""
    yield from _graph_tensors(model.graph)
    for fn in model.functions:
        for node in fn.node:
            if node.attribute:
                yield from _attribute_tensors(node.attribute)
    for info in model.training_info:
        yield from _graph_tensors(info.initialization)
        yield from _graph_tensors(info.algorithm)


def _graph_tensors(g: GraphProto) -> Iterator[TensorProto]:
    yield from g.initializer
    for sparse in g.sparse_initializer:
        yield sparse.values
    for node in g.node:
        attributes = node.attribute
        if attributes:  # most nodes have none
            yield from _attribute_tensors(attributes)


def _attribute_tensors(attributes) -> Iterator[TensorProto]:
    for a in attributes:
        if a.type in _PLAIN_ATTRS:
            continue
        if a.HasField("t"):
            yield a.t
        yield from a.tensors
        if a.HasField("sparse_tensor"):
            yield a.sparse_tensor.values
        for s in a.sparse_tensors:
            yield s.values
        if a.HasField("g"):
            yield from _graph_tensors(a.g)
        for sub in a.graphs:
            yield from _graph_tensors(sub)


def iter_chunks(tensor: TensorProto, base_dir: str | os.PathLike | None = None,
                chunk_bytes: int = CHUNK_BYTES) -> Iterator[np.ndarray]:
    """The tensor's values as flat numpy arrays of at most ``chunk_bytes`` each (in memory or external)."""
    dtype = NUMPY.get(tensor.data_type)
    if dtype is None:
        raise ValueError(f"iter_chunks: unsupported data type {type_name(tensor.data_type)}")
    itemsize = np.dtype(dtype).itemsize
    step = max(chunk_bytes // itemsize, 1) * itemsize
    if is_external(tensor):
        if base_dir is None:
            raise ConversionError("", f"tensor {tensor.name!r}", "external data is not loaded and no folder to read "
                                                                 "it from was given")
        target, offset, length = external_range(tensor, Path(base_dir).resolve(), "")
        with open(target, "rb") as f:
            f.seek(offset)
            done = 0
            while done < length:
                data = f.read(min(step, length - done))
                if not data:
                    raise ConversionError(str(target), f"tensor {tensor.name!r}", "external data file ended early")
                done += len(data)
                yield np.frombuffer(data, dtype=dtype)
        return
    if tensor.HasField("raw_data"):
        raw = tensor.raw_data
        for start in range(0, len(raw), step):
            yield np.frombuffer(raw, dtype=dtype, count=min(step, len(raw) - start) // itemsize, offset=start)
        return
    yield onnx.numpy_helper.to_array(tensor).reshape(-1)

