"""Reading and writing ONNX files with clear errors, atomically, never over the input.

Loading (``load_model``):

1. The file's top-level protobuf fields are scanned before parsing, so that a file
   that is not ONNX, a truncated file and a file too large for protobuf each get
   their own one-line reason instead of a parser exception.
2. Every external-data reference is checked before anything is read: the location
   must stay inside the model's folder (after resolving symlinks; anything else is
   refused and never opened), the file must exist and hold ``offset + length``
   bytes, and the length must match the tensor's shape and dtype.
3. ``external_data="load"`` reads the data into the model (small models, the API);
   ``"lazy"`` leaves large tensors where they are and reads them tensor by tensor
   when needed (``iter_chunks``), so a model over 2 GB is never held in memory.

Saving (``save_model``):

1. The model goes to a temporary file in the output folder and is renamed over the
   output only once complete: an error or an interrupt leaves no partial file.
2. A model whose tensors total more than the external-data threshold (just under
   2 GB; ``AMP_COMPILER_EXTERNAL_DATA_THRESHOLD`` overrides it), or that was loaded
   with external data, is written with external data (``<output>.data``): tensor
   data is streamed into it one tensor at a time, in chunks -- lazily loaded
   tensors are copied file to file, folded constants whose cast was deferred
   (``defer_cast``) are cast chunk by chunk -- and the ``.onnx`` file is written
   from a skeleton copy of the model that holds no tensor data.
3. The output (and its ``.data`` file) may never be one of the files the model
   reads its data from, nor the input model.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import AttributeProto, ModelProto, NodeProto, TensorProto

from ..errors import ConversionError

TWO_GB = 2 ** 31
#: models whose tensors total at least this many bytes are saved with external data
DEFAULT_EXTERNAL_THRESHOLD = TWO_GB - (64 << 20)
EXTERNAL_THRESHOLD_ENV = "AMP_COMPILER_EXTERNAL_DATA_THRESHOLD"
#: tensors below this many bytes stay inside the .onnx file (onnx's own default)
INLINE_BYTES = 1024
#: external-data key marking a folded constant whose cast ``save_model`` performs
CAST_FROM_KEY = "amp_compiler.cast_from"
_CHUNK_BYTES = 16 << 20
_ALIGN_BYTES = 64 << 10  # tensors of 1 MiB and more start on a 64 KiB boundary (mmap-friendly)

try:
    import ml_dtypes
except ImportError:  # pragma: no cover - ml_dtypes comes with onnx
    ml_dtypes = None

_NUMPY = {
    TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16, TensorProto.DOUBLE: np.float64,
    TensorProto.INT8: np.int8, TensorProto.UINT8: np.uint8, TensorProto.INT16: np.int16,
    TensorProto.UINT16: np.uint16, TensorProto.INT32: np.int32, TensorProto.UINT32: np.uint32,
    TensorProto.INT64: np.int64, TensorProto.UINT64: np.uint64, TensorProto.BOOL: np.bool_,
    TensorProto.COMPLEX64: np.complex64, TensorProto.COMPLEX128: np.complex128,
}
if ml_dtypes is not None:
    _NUMPY[TensorProto.BFLOAT16] = ml_dtypes.bfloat16
_ONE_BYTE = ("FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ", "FLOAT8E8M0")
_HALF_BYTE = ("INT4", "UINT4", "FLOAT4E2M1")
_ITEMSIZE = {code: np.dtype(t).itemsize for code, t in _NUMPY.items()}
_ITEMSIZE[TensorProto.BFLOAT16] = 2
_ITEMSIZE.update({getattr(TensorProto, n): 1 for n in _ONE_BYTE if hasattr(TensorProto, n)})
_HALF = frozenset(getattr(TensorProto, n) for n in _HALF_BYTE if hasattr(TensorProto, n))
_DATA_FIELDS = ("raw_data", "float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data")


# -- loading --------------------------------------------------------------------------------------

def load_model(path: str | os.PathLike, *, external_data: str = "load") -> ModelProto:
    """Load an ONNX file; every failure is a ``ConversionError`` naming the file and the reason.

    ``external_data``: ``"load"`` reads external tensors into the model; ``"lazy"``
    checks them and leaves those of ``INLINE_BYTES`` or more in their files (read
    them with ``iter_chunks(tensor, base_dir=<the model's folder>)``).
    """
    if external_data not in ("load", "lazy"):
        raise ValueError(f"external_data must be 'load' or 'lazy', got {external_data!r}")
    path = Path(path)
    name = str(path)
    if not path.exists():
        raise ConversionError(name, "", "file not found")
    if path.is_dir():
        raise ConversionError(name, "", "is a folder, not an ONNX file")
    try:
        size = path.stat().st_size
        if size >= TWO_GB:
            raise ConversionError(name, "", f"the file is {size} bytes: protobuf cannot read a model over 2 GB "
                                            "stored in one file (store its weights as external data)")
        _scan_model_fields(path, size)
        model = onnx.load(name, load_external_data=False)
    except (DecodeError, RuntimeError, ValueError):
        raise ConversionError(name, "", "corrupt ONNX file: the protobuf does not parse") from None
    except OSError as exc:
        raise ConversionError(name, "", f"cannot read the file: {exc.strerror or exc}") from None
    if not model.opset_import:
        raise ConversionError(name, "", "not a valid ONNX model: it has no opset_import")
    resolve_external_data(model, path.resolve().parent, source=name, load_all=external_data == "load")
    return model


def _scan_model_fields(path: Path, size: int) -> None:
    """Walk the top-level fields of the file as a ``ModelProto`` without parsing their contents."""
    name = str(path)
    if size == 0:
        raise ConversionError(name, "", "not an ONNX model: the file is empty")
    fields = ModelProto.DESCRIPTOR.fields_by_number
    seen_graph = False
    with open(path, "rb") as f:
        head = f.read(4)
        if head == b"PK\x03\x04":
            raise ConversionError(name, "", "not an ONNX model: the file is a ZIP archive (a PyTorch checkpoint?)")
        pos = 0
        while pos < size:
            start = pos
            f.seek(pos)
            header = f.read(20)
            tag, n = _varint(header)
            if n == 0 and len(header) < 10:
                raise ConversionError(name, "", f"truncated ONNX file: it ends inside a field header at byte {start}")
            fd = fields.get(tag >> 3) if n else None
            wire = tag & 7 if n else -1
            if fd is None or wire != _wire_type(fd):
                raise ConversionError(name, "", f"not an ONNX model: the bytes at offset {start} are not a "
                                                "ModelProto field")
            if wire == 0:
                value, m = _varint(header[n:])
                if m == 0:
                    if len(header) - n < 10:
                        raise ConversionError(name, "", f"truncated ONNX file: it ends inside the {fd.name} field")
                    raise ConversionError(name, "", f"not an ONNX model: the bytes at offset {start} are not a "
                                                    "ModelProto field")
                pos += n + m
            else:
                length, m = _varint(header[n:])
                if m == 0:
                    if len(header) - n < 10:
                        raise ConversionError(name, "", f"truncated ONNX file: it ends inside a field header at "
                                                        f"byte {start}")
                    raise ConversionError(name, "", f"not an ONNX model: the bytes at offset {start} are not a "
                                                    "ModelProto field")
                pos += n + m + length
                if pos > size:
                    raise ConversionError(name, "", f"truncated ONNX file: its {fd.name} field ends at byte {pos} "
                                                    f"but the file has {size} bytes")
            seen_graph = seen_graph or fd.name == "graph"
    if not seen_graph:
        raise ConversionError(name, "", "not an ONNX model: the file has no graph")


def _varint(buf: bytes) -> tuple[int, int]:
    """(value, bytes used); (0, 0) when ``buf`` holds no complete varint of at most 10 bytes."""
    value = 0
    for i, byte in enumerate(buf[:10]):
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            return value, i + 1
    return 0, 0


def _wire_type(fd) -> int:
    if fd.type in (fd.TYPE_STRING, fd.TYPE_BYTES, fd.TYPE_MESSAGE) or _is_repeated(fd):
        return 2
    return 0  # every scalar field of ModelProto is a varint (int64 / enum)


def _is_repeated(fd) -> bool:
    flag = getattr(fd, "is_repeated", None)
    return bool(flag) if flag is not None else fd.label == fd.LABEL_REPEATED


def resolve_external_data(model: ModelProto, base_dir: str | os.PathLike, *, source: str = "model",
                          load_all: bool = False) -> None:
    """Check every external-data reference; read small tensors (all with ``load_all``) into the model.

    A location outside ``base_dir`` is refused before any file is opened.
    """
    base = Path(base_dir).resolve()
    for tensor in iter_tensors(model):
        if not is_external(tensor):
            continue
        where = f"tensor {tensor.name!r}"
        target, offset, length = _external_range(tensor, base, source)
        if load_all or length < INLINE_BYTES:
            _read_inline(tensor, target, offset, length, source, where)


def _external_range(tensor: TensorProto, base: Path, source: str) -> tuple[Path, int, int]:
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
                                                 f"{list(tensor.dims)} of {_type_name(tensor.data_type)} "
                                                 f"({expected} bytes)")
        if "length" not in numbers and length < expected:
            raise ConversionError(source, where, f"external data file {location!r} has {length} bytes after "
                                                 f"offset {offset}, fewer than its shape {list(tensor.dims)} of "
                                                 f"{_type_name(tensor.data_type)} needs ({expected} bytes)")
        length = expected
    return target, offset, length


def _read_inline(tensor: TensorProto, target: Path, offset: int, length: int, source: str, where: str) -> None:
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


def _type_name(code: int) -> str:
    try:
        return TensorProto.DataType.Name(code).lower()
    except ValueError:
        return f"type {code}"


def iter_tensors(model: ModelProto) -> Iterator[TensorProto]:
    """Every TensorProto that can hold weights: initializers, attribute tensors, sparse values; all scopes."""

    def graph(g) -> Iterator[TensorProto]:
        yield from g.initializer
        for sparse in g.sparse_initializer:
            yield sparse.values
        for node in g.node:
            yield from nodes(node)

    def nodes(node: NodeProto) -> Iterator[TensorProto]:
        for a in node.attribute:
            if a.HasField("t"):
                yield a.t
            yield from a.tensors
            if a.HasField("sparse_tensor"):
                yield a.sparse_tensor.values
            for s in a.sparse_tensors:
                yield s.values
            if a.HasField("g"):
                yield from graph(a.g)
            for sub in a.graphs:
                yield from graph(sub)

    yield from graph(model.graph)
    for fn in model.functions:
        for node in fn.node:
            yield from nodes(node)
    for info in model.training_info:
        yield from graph(info.initialization)
        yield from graph(info.algorithm)


def iter_chunks(tensor: TensorProto, base_dir: str | os.PathLike | None = None,
                chunk_bytes: int = _CHUNK_BYTES) -> Iterator[np.ndarray]:
    """The tensor's values as flat numpy arrays of at most ``chunk_bytes`` each (in memory or external)."""
    dtype = _NUMPY.get(tensor.data_type)
    if dtype is None:
        raise ValueError(f"iter_chunks: unsupported data type {_type_name(tensor.data_type)}")
    itemsize = np.dtype(dtype).itemsize
    step = max(chunk_bytes // itemsize, 1) * itemsize
    if is_external(tensor):
        if base_dir is None:
            raise ConversionError("", f"tensor {tensor.name!r}", "external data is not loaded and no folder to read "
                                                                 "it from was given")
        target, offset, length = _external_range(tensor, Path(base_dir).resolve(), "")
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


# -- deferred casts --------------------------------------------------------------------------------

def defer_cast(proto: TensorProto, name: str, source: TensorProto, data_type: int,
               base_dir: str | os.PathLike) -> None:
    """Make ``proto`` the constant ``source`` (an external-data tensor) cast to ``data_type``, not computed yet.

    ``proto`` records where the source data lies (an absolute location, which onnx's
    own loaders refuse, so the placeholder cannot be mistaken for data) and the dtype
    to cast from; ``save_model`` performs the cast chunk by chunk while writing.
    """
    target, offset, length = _external_range(source, Path(base_dir).resolve(), "")
    proto.name = name
    proto.data_type = data_type
    del proto.dims[:]
    proto.dims.extend(source.dims)
    proto.data_location = TensorProto.EXTERNAL
    del proto.external_data[:]
    for key, value in (("location", str(target)), ("offset", str(offset)), ("length", str(length)),
                       (CAST_FROM_KEY, str(source.data_type))):
        entry = proto.external_data.add()
        entry.key, entry.value = key, value


def _cast_source(tensor: TensorProto) -> int | None:
    for e in tensor.external_data:
        if e.key == CAST_FROM_KEY:
            return int(e.value)
    return None


# -- output paths --------------------------------------------------------------------------------

def external_data_name(out: str | os.PathLike) -> str:
    """The file name of ``out``'s external data (next to it)."""
    return f"{Path(out).name}.data"


def input_files(model: ModelProto, model_path: str | os.PathLike) -> list[Path]:
    """The model file and every external-data file it reads from (resolved)."""
    base = Path(model_path).resolve().parent
    files = [Path(model_path).resolve()]
    for tensor in iter_tensors(model):
        if is_external(tensor):
            location = next((e.value for e in tensor.external_data if e.key == "location"), "")
            files.append((base / location).resolve())
    return files


def check_output_path(out: str | os.PathLike, inputs: list[str | os.PathLike]) -> Path:
    """Refuse writing over an input (or an input's data), into a missing folder or one that cannot be written."""
    out = Path(out)
    name = str(out)
    protected = {Path(p).resolve() for p in inputs if p is not None}
    if out.resolve() in protected:
        raise ConversionError(name, "", "output path is the input file; choose another path")
    data = out.resolve().parent / external_data_name(out)
    if data in protected:
        raise ConversionError(name, "", f"its external data file {data.name} would overwrite an input file; "
                                        "choose another path")
    if out.is_dir():
        raise ConversionError(name, "", "output path is a folder; give a file name")
    folder = out.resolve().parent
    if not folder.exists():
        raise ConversionError(name, "", f"output folder {folder} does not exist")
    if not folder.is_dir():
        raise ConversionError(name, "", f"output folder {folder} is not a folder")
    try:  # os.access says yes to root on a read-only mount: try the real thing
        fd, probe = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".probe", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ConversionError(name, "", f"output folder {folder} is not writable: "
                                        f"{exc.strerror or exc}") from None
    return out


# -- saving ---------------------------------------------------------------------------------------

def external_threshold() -> int:
    """Tensor bytes from which a model is saved with external data (env override for tests)."""
    text = os.environ.get(EXTERNAL_THRESHOLD_ENV, "")
    return int(text) if text.strip().isdigit() else DEFAULT_EXTERNAL_THRESHOLD


def save_model(model: ModelProto, out: str | os.PathLike, *, external: bool | None = None,
               base_dir: str | os.PathLike | None = None, protect: list[str | os.PathLike] = ()) -> Path:
    """Write ``model`` atomically (temporary files, then rename); never over a file it reads from.

    ``external``: None decides (external data when the model references some or its
    tensors total ``external_threshold()`` bytes or more); True/False force it.
    ``base_dir`` is the folder lazily loaded external data is read from. ``model`` is
    not modified.
    """
    out = Path(out)
    name = str(out)
    folder = out.resolve().parent
    data_path = folder / external_data_name(out)
    base = Path(base_dir).resolve() if base_dir is not None else None
    total, sources = _survey(model, base)
    protected = {Path(p).resolve() for p in protect} | sources
    for path, what in ((out.resolve(), "the output"), (data_path, "its external data file")):
        if path in protected:
            raise ConversionError(name, "", f"{what} {path.name} is a file the model reads from; choose another path")
    if external is None:
        external = bool(sources) or total >= external_threshold()
    if sources and not external:
        raise ConversionError(name, "", "the model references external data: it can only be saved with external "
                                        "data")
    tmp = tmp_data = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=folder)
        os.close(fd)
        if external:
            fd, tmp_data = tempfile.mkstemp(prefix=f".{data_path.name}.", suffix=".tmp", dir=folder)
            with os.fdopen(fd, "wb") as data_file:
                skeleton = ModelProto()
                writer = _DataWriter(data_file, data_path.name, base, name)
                _copy_message(model, skeleton, writer)
            with open(tmp, "wb") as f:
                f.write(skeleton.SerializeToString())
            del skeleton
            _set_default_mode(tmp_data)
            os.replace(tmp_data, data_path)
            tmp_data = None
        else:
            with open(tmp, "wb") as f:
                f.write(model.SerializeToString())
        _set_default_mode(tmp)
        os.replace(tmp, out)
        tmp = None
    except OSError as exc:
        raise ConversionError(name, "", f"cannot write the output: {exc.strerror or exc}") from None
    finally:
        for leftover in (tmp, tmp_data):
            if leftover is not None:
                try:
                    os.unlink(leftover)
                except FileNotFoundError:
                    pass
    return out


def _set_default_mode(path: str) -> None:
    """mkstemp creates files 0600: give the output the mode a plain open() would have (0666 - umask)."""
    mask = os.umask(0o022)
    os.umask(mask)
    os.chmod(path, 0o666 & ~mask)


def _survey(model: ModelProto, base: Path | None) -> tuple[int, set[Path]]:
    """(approximate tensor bytes, external files read from); checks lazily loaded references."""
    total = 0
    sources: set[Path] = set()
    for tensor in iter_tensors(model):
        if not is_external(tensor):
            total += tensor.ByteSize()  # no copy of the data, unlike len(tensor.raw_data)
            continue
        info = {e.key: e.value for e in tensor.external_data}
        location = info.get("location", "")
        if _cast_source(tensor) is not None:
            sources.add(Path(location))
            total += int(info.get("length", "0"))
            continue
        if base is None:
            raise ConversionError("", f"tensor {tensor.name!r}", "external data is not loaded and no folder to read "
                                                                 "it from was given")
        target, _, length = _external_range(tensor, base, "")
        sources.add(target)
        total += length
    return total, sources


class _DataWriter:
    """Streams tensor data into the external-data file; returns the entries that point at it."""

    def __init__(self, f, location: str, base: Path | None, source: str) -> None:
        self.f, self.location, self.base, self.source = f, location, base, source

    def __call__(self, tensor: TensorProto) -> list[tuple[str, str]] | None:
        """Write ``tensor``'s data and return its external-data entries, or None to keep it inline."""
        cast_from = _cast_source(tensor) if is_external(tensor) else None
        if not is_external(tensor):
            if tensor.data_type == TensorProto.STRING or tensor.ByteSize() < INLINE_BYTES:
                return None
            if not tensor.HasField("raw_data") and tensor.data_type not in _NUMPY:
                return None  # packed typed fields (4-bit, float8): left inline as they are
        nbytes = tensor_nbytes(tensor)
        if nbytes is None:
            return None
        offset = self._align(nbytes)
        if cast_from is not None:
            self._write_cast(tensor, cast_from)
        elif is_external(tensor):
            self._copy_external(tensor)
        elif tensor.HasField("raw_data"):
            self.f.write(tensor.raw_data)
        else:  # typed fields (float_data, int32_data, ...): raw little-endian bytes, as raw_data holds them
            self.f.write(np.ascontiguousarray(onnx.numpy_helper.to_array(tensor)).tobytes())
        written = self.f.tell() - offset
        if written != nbytes:
            raise ConversionError(self.source, f"tensor {tensor.name!r}",
                                  f"wrote {written} bytes of external data, expected {nbytes}")
        return [("location", self.location), ("offset", str(offset)), ("length", str(nbytes))]

    def _align(self, nbytes: int) -> int:
        pos = self.f.tell()
        if nbytes >= (1 << 20) and pos % _ALIGN_BYTES:
            pos += _ALIGN_BYTES - pos % _ALIGN_BYTES
            self.f.seek(pos)
        return pos

    def _write_cast(self, tensor: TensorProto, cast_from: int) -> None:
        info = {e.key: e.value for e in tensor.external_data}
        src_dtype, dst_dtype = _NUMPY[cast_from], _NUMPY[tensor.data_type]
        itemsize = np.dtype(src_dtype).itemsize
        step = (_CHUNK_BYTES // itemsize) * itemsize
        offset, length = int(info["offset"]), int(info["length"])
        with open(info["location"], "rb") as src:
            src.seek(offset)
            done = 0
            while done < length:
                data = src.read(min(step, length - done))
                if not data:
                    raise ConversionError(info["location"], f"tensor {tensor.name!r}", "external data file ended early")
                done += len(data)
                self.f.write(np.frombuffer(data, dtype=src_dtype).astype(dst_dtype).tobytes())

    def _copy_external(self, tensor: TensorProto) -> None:
        if self.base is None:
            raise ConversionError(self.source, f"tensor {tensor.name!r}", "external data is not loaded and no folder "
                                                                          "to read it from was given")
        target, offset, length = _external_range(tensor, self.base, self.source)
        self.f.flush()
        with open(target, "rb") as src:
            _copy_range(src, self.f, offset, length)


def _copy_range(src, dst, offset: int, length: int) -> None:
    """Copy ``length`` bytes at ``offset`` of ``src`` to the end of ``dst`` (in the kernel where possible)."""
    out_pos = dst.tell()
    done = 0
    copy_file_range = getattr(os, "copy_file_range", None)
    while done < length and copy_file_range is not None:
        try:
            n = copy_file_range(src.fileno(), dst.fileno(), length - done, offset + done, out_pos + done)
        except OSError as exc:
            if exc.errno in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP) and done == 0:
                break  # not supported here: copy through user space
            raise
        if n == 0:
            break
        done += n
    src.seek(offset + done)
    dst.seek(out_pos + done)
    while done < length:
        data = src.read(min(_CHUNK_BYTES, length - done))
        if not data:
            raise OSError(errno.EIO, "external data file ended early")
        dst.write(data)
        done += len(data)
    dst.seek(out_pos + length)


# -- skeleton copies ------------------------------------------------------------------------------

#: message types that may contain tensors; the copy walks into them, copies everything else whole
_CONTAINERS = frozenset({"onnx.ModelProto", "onnx.GraphProto", "onnx.NodeProto", "onnx.AttributeProto",
                         "onnx.FunctionProto", "onnx.TrainingInfoProto", "onnx.SparseTensorProto"})
_PAYLOAD_ATTRS = frozenset({AttributeProto.TENSOR, AttributeProto.TENSORS, AttributeProto.GRAPH,
                            AttributeProto.GRAPHS, AttributeProto.SPARSE_TENSOR, AttributeProto.SPARSE_TENSORS})
TensorHook = Callable[[TensorProto], "list[tuple[str, str]] | None"]


def skeleton_copy(model: ModelProto, hook: TensorHook) -> ModelProto:
    """A copy of ``model`` in which each tensor for which ``hook`` returns entries is external, without data.

    Tensors ``hook`` answers None for are copied as they are. Nothing large is copied.
    """
    out = ModelProto()
    _copy_message(model, out, hook)
    return out


def _copy_message(src, dst, hook: TensorHook) -> None:
    for fd, value in src.ListFields():
        mt = fd.message_type
        repeated = _is_repeated(fd)
        if mt is None:
            if repeated:
                getattr(dst, fd.name).extend(value)
            else:
                setattr(dst, fd.name, value)
        elif mt.full_name == "onnx.TensorProto":
            for t in (value if repeated else [value]):
                _copy_tensor(t, getattr(dst, fd.name).add() if repeated else getattr(dst, fd.name), hook)
        elif mt.full_name in _CONTAINERS:
            for m in (value if repeated else [value]):
                sub = getattr(dst, fd.name).add() if repeated else getattr(dst, fd.name)
                if mt.full_name == "onnx.NodeProto" and not any(a.type in _PAYLOAD_ATTRS for a in m.attribute):
                    sub.CopyFrom(m)
                else:
                    _copy_message(m, sub, hook)
        elif repeated:
            getattr(dst, fd.name).extend(value)
        else:
            getattr(dst, fd.name).CopyFrom(value)


def _copy_tensor(src: TensorProto, dst: TensorProto, hook: TensorHook) -> None:
    entries = hook(src)
    if entries is None:
        dst.CopyFrom(src)
        return
    for fd, value in src.ListFields():
        if fd.name in _DATA_FIELDS or fd.name in ("external_data", "data_location"):
            continue
        if _is_repeated(fd):
            getattr(dst, fd.name).extend(value)
        elif fd.message_type is not None:
            getattr(dst, fd.name).CopyFrom(value)
        else:
            setattr(dst, fd.name, value)
    dst.data_location = TensorProto.EXTERNAL
    for key, value in entries:
        entry = dst.external_data.add()
        entry.key, entry.value = key, value
