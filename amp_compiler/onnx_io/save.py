"""Saving a model: one staged write, with external data streamed tensor by tensor.

A model whose tensors total more than the external-data threshold (just under 2 GB;
``AMP_COMPILER_EXTERNAL_DATA_THRESHOLD`` overrides it), or that was loaded with
external data, is written with external data (``<output>.data``): tensor data is
streamed into it one tensor at a time, in chunks -- lazily loaded tensors are copied
file to file, deferred casts are cast chunk by chunk -- and the ``.onnx`` file is
written from a skeleton copy that holds no tensor data. Files go through
``atomic.Staging``: nothing is in place until everything is written (and, in the
CLI, checked). A model written in one file over an output that read ``<output>.data`` removes that
file once the new model is in place (it would be left stale beside it); a data file of another name
is left alone. docs/architecture.md, "Input handling".
"""

from __future__ import annotations

import errno
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import onnx
from onnx import ModelProto, TensorProto

from ..atomic import Staging
from ..errors import ConversionError
from .deferred import cast_source
from .mapped import INLINE_KEY, inline_view, is_inline
from .paths import external_data_name
from .skeleton import skeleton_copy
from .stream import PendingCast, append_pending, pending_nbytes, write_pending
from .tensors import (CHUNK_BYTES, INLINE_BYTES, NUMPY, approx_nbytes, external_range, is_external, iter_tensors,
                      read_inline, tensor_nbytes)

TWO_GB = 2 ** 31
#: models whose tensors total at least this many bytes are saved with external data
DEFAULT_EXTERNAL_THRESHOLD = TWO_GB - (64 << 20)
EXTERNAL_THRESHOLD_ENV = "AMP_COMPILER_EXTERNAL_DATA_THRESHOLD"
_ALIGN_BYTES = 64 << 10  # tensors of 1 MiB and more start on a 64 KiB boundary (mmap-friendly)


def external_threshold() -> int:
    """Tensor bytes from which a model is saved with external data (env override for tests)."""
    text = os.environ.get(EXTERNAL_THRESHOLD_ENV, "")
    return int(text) if text.strip().isdigit() else DEFAULT_EXTERNAL_THRESHOLD


def save_model(model: ModelProto, out: str | os.PathLike, *, external: bool | None = None,
               base_dir: str | os.PathLike | None = None, protect: list[str | os.PathLike] = (),
               staging: Staging | None = None, pending: list[PendingCast] | None = None) -> Path:
    """Write ``model`` to ``out`` (and ``out.data``); never over a file it reads from.

    ``external``: None decides (external data when the model references some or its
    tensors total ``external_threshold()`` bytes or more); True/False force it.
    ``base_dir`` is the folder lazily loaded external data is read from. With
    ``staging`` the files are only staged (the caller checks them, then publishes);
    without, they are published at once. ``model`` is not modified, except that ``pending``
    weights (``stream``: cast while written, after the model's bytes) are moved into it
    when it must be written with external data.
    """
    out = Path(out)
    name = str(out)
    data_path = out.resolve().parent / external_data_name(out)
    base = Path(base_dir).resolve() if base_dir is not None else None
    total, sources, mapped_from = _survey(model, base)
    pending = pending if pending is not None else []
    total += pending_nbytes(pending)
    protected = {Path(p).resolve() for p in protect} | sources | mapped_from
    for path, what in ((out.resolve(), "the output"), (data_path, "its external data file")):
        if path in protected:
            raise ConversionError(name, "", f"{what} {path.name} is a file the model reads from; choose another path")
    if external is None:
        external = bool(sources) or total >= external_threshold()
    if external and pending:
        append_pending(model, pending)
    if sources and not external:
        raise ConversionError(name, "", "the model references external data: it can only be saved with external "
                                        "data")
    own = staging is None
    staging = Staging() if own else staging
    former = None if external else _former_data(out, data_path)
    try:
        if former is not None:  # the file replaced read it, the new one will not: gone once the new one is in place
            staging.retire(out, former)
        if external:
            # beside the staged .onnx (relative location), staged first: published before the .onnx reads it
            staged_data = staging.path(Path(os.path.abspath(out)).parent / data_path.name)
            with open(staged_data, "wb") as data_file:
                skeleton = skeleton_copy(model, _DataWriter(data_file, data_path.name, base, name))
            payload = skeleton.SerializeToString()
            del skeleton
            mapped = []
        else:
            with _mapped_out(model, base, mapped_from) as mapped:  # weights left in the mapped input: written after the rest
                payload = model.SerializeToString()
        with open(staging.path(out), "wb") as f:
            f.write(payload)
            del payload
            write_pending(f, [*pending, *mapped])
        if own:
            staging.publish()
    except OSError as exc:
        raise ConversionError(name, "", f"cannot write the output: {exc.strerror or exc}") from None
    finally:
        if own:
            staging.discard()
    return out


def _former_data(out: Path, data_path: Path) -> Path | None:
    """``data_path`` (``<output>.data``, the name this writer gives external data) where the model being
    replaced at ``out`` reads from it: a new output written in one file would leave it beside it, stale
    (and as large as the old weights). None where there is no such file, or the old output does not read it
    (then it is not ours to remove), or is not a model that parses."""
    target = out.resolve()
    if not data_path.is_file() or not target.is_file():
        return None
    try:
        old = onnx.load(str(target), load_external_data=False)
    except Exception:  # noqa: BLE001  not a model we can read: nothing beside it is ours to remove
        return None
    for tensor in iter_tensors(old):
        if is_external(tensor):
            location = next((e.value for e in tensor.external_data if e.key == "location"), "")
            if location and (target.parent / location).resolve() == data_path:
                return data_path
    return None


def _survey(model: ModelProto, base: Path | None) -> tuple[int, set[Path], set[Path]]:
    """(approximate tensor bytes, external files read from, one-file models whose mapped weights it
    holds: ``mapped.load_hollow``); checks lazily loaded references."""
    total = 0
    sources: set[Path] = set()
    mapped_from: set[Path] = set()
    for tensor in iter_tensors(model):
        if not is_external(tensor):
            total += approx_nbytes(tensor)
            continue
        info = {e.key: e.value for e in tensor.external_data}
        location = info.get("location", "")
        if cast_source(tensor) is not None:
            sources.add(Path(location))
            total += int(info.get("length", "0"))
            continue
        if base is None:
            raise ConversionError("", f"tensor {tensor.name!r}", "external data is not loaded and no folder to read "
                                                                 "it from was given")
        target, _, length = external_range(tensor, base, "")
        (mapped_from if INLINE_KEY in info else sources).add(target)
        total += length
    return total, sources, mapped_from


@contextmanager
def _mapped_out(model: ModelProto, base: Path | None, mapped_from: set[Path]) -> Iterator[list[PendingCast]]:
    """Take the main graph's mapped initializers out of ``model`` for the block, as ``PendingCast``s
    that copy them from the mapped file; those anywhere else are read into the model for good.
    ``mapped_from``: the mapped files ``_survey`` found the model's tensors in (none: no walk)."""
    if not mapped_from:
        yield []
        return
    inits = model.graph.initializer
    taken = [(i, TensorProto()) for i, t in enumerate(inits) if is_external(t) and is_inline(t)]
    out = []
    for i, copy in taken:
        copy.CopyFrom(inits[i])
        out.append(PendingCast(copy.name, tuple(copy.dims), inline_view(*external_range(copy, base, "")), "float32"))
    for i, _ in reversed(taken):
        del inits[i]
    for tensor in iter_tensors(model):  # elsewhere (load_hollow maps main-graph initializers; a copy may move one)
        if is_external(tensor) and is_inline(tensor):
            read_inline(tensor, *external_range(tensor, base, ""), "", f"tensor {tensor.name!r}")
    try:
        yield out
    finally:  # back in the model, after the others (the order of initializers has no meaning)
        for _, copy in taken:
            inits.add().CopyFrom(copy)


class _DataWriter:
    """Streams tensor data into the external-data file; returns the entries that point at it."""

    def __init__(self, f, location: str, base: Path | None, source: str) -> None:
        self.f, self.location, self.base, self.source = f, location, base, source

    def __call__(self, tensor: TensorProto) -> list[tuple[str, str]] | None:
        """Write ``tensor``'s data and return its external-data entries, or None to keep it inline."""
        cast_from = cast_source(tensor) if is_external(tensor) else None
        if not is_external(tensor):
            if tensor.data_type == TensorProto.STRING or approx_nbytes(tensor) < INLINE_BYTES:
                return None
            if not tensor.HasField("raw_data") and tensor.data_type not in NUMPY:
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
        src_dtype, dst_dtype = NUMPY[cast_from], NUMPY[tensor.data_type]
        itemsize = np.dtype(src_dtype).itemsize
        step = (CHUNK_BYTES // itemsize) * itemsize
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
        target, offset, length = external_range(tensor, self.base, self.source)
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
        data = src.read(min(CHUNK_BYTES, length - done))
        if not data:
            raise OSError(errno.EIO, "external data file ended early")
        dst.write(data)
        done += len(data)
    dst.seek(out_pos + length)

