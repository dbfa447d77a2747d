"""Loading a one-file model without copying its weights: the file is mapped, the large weights stay in it.

``load_hollow`` walks the file's protobuf wire format (the main graph's initializers only),
hands protobuf the model's bytes without the ``raw_data`` of its large float32 initializers,
and marks each of those as external data that lies in the ``.onnx`` file itself (``location``
the file's name, ``offset`` and ``length`` of its ``raw_data``, and ``INLINE_KEY``): a valid
reference that any reader of external data resolves. ``inline_view`` gives its bytes as a
view of the mapped file (no copy); ``save.save_model`` writes such tensors back inline when
the output is one file. Anything but the plain layout (a second graph field, typed data
fields, a tensor whose size does not match its shape, malformed bytes) leaves the file to
the ordinary parser, which gives its errors. docs/architecture.md, "Performance".
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

from google.protobuf.message import DecodeError
from onnx import ModelProto, TensorProto

from .stream import encode_varint

#: float32 main-graph initializers of at least this many bytes stay in the mapped file ...
HOLLOW_MIN_BYTES = 64 << 10
#: ... of a file of at least this many bytes (the walk costs about a microsecond per node)
HOLLOW_MIN_FILE_BYTES = 32 << 20
#: external-data key marking a tensor whose data is ``raw_data`` inside the model file itself
INLINE_KEY = "amp_compiler.inline"
_GRAPH, _INITIALIZER = 7, 5  # ModelProto.graph, GraphProto.initializer
_DIMS, _DATA_TYPE, _RAW = 1, 2, 9  # TensorProto fields read; any other data field leaves a tensor whole
_PLAIN_TENSOR_FIELDS = frozenset({_DIMS, _DATA_TYPE, 8, _RAW, 12, 16})  # + name, doc_string, metadata_props
_MAPS: dict[tuple[str, int, int], mmap.mmap] = {}
_MAX_MAPS = 8


class _Malformed(Exception):
    """The bytes are not the plain layout: the ordinary parser takes the file."""


def mapped(path: str | os.PathLike) -> mmap.mmap:
    """The file mapped read-only (one mapping per file version, kept for the process)."""
    path = os.path.realpath(path)
    st = os.stat(path)
    key = (path, st.st_size, st.st_mtime_ns)
    if key not in _MAPS:
        if len(_MAPS) >= _MAX_MAPS:  # dropped from the cache only: views still in use keep theirs alive
            del _MAPS[next(iter(_MAPS))]
        with open(path, "rb") as f:
            _MAPS[key] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    return _MAPS[key]


def is_inline(tensor: TensorProto) -> bool:
    return any(e.key == INLINE_KEY for e in tensor.external_data)


def inline_view(target: Path, offset: int, length: int) -> memoryview:
    """``length`` bytes at ``offset`` of the mapped ``target``, without a copy."""
    return memoryview(mapped(target))[offset:offset + length]


def load_hollow(path: Path) -> ModelProto | None:
    """The model at ``path`` with its float32 main-graph initializers of ``HOLLOW_MIN_BYTES`` or more
    left in the file; None when the file is smaller than ``HOLLOW_MIN_FILE_BYTES``, not the plain
    layout, or holds no such initializer."""
    path = Path(os.path.realpath(path))
    size = path.stat().st_size
    if size < HOLLOW_MIN_FILE_BYTES or size == 0:
        return None  # copies of a small file's weights cost less than the walk over its nodes
    try:
        mm = mapped(path)
    except (OSError, ValueError):  # a file system that cannot map: the ordinary parser reads it
        return None
    try:
        data, hollow = _hollow_bytes(mm, HOLLOW_MIN_BYTES)
    except (_Malformed, IndexError):
        return None
    if not hollow:
        return None
    model = ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError):
        return None
    inits = model.graph.initializer
    for index, offset, length in hollow:
        t = inits[index]
        t.data_location = TensorProto.EXTERNAL
        for key, value in (("location", path.name), ("offset", str(offset)), ("length", str(length)),
                           (INLINE_KEY, "1")):
            entry = t.external_data.add()
            entry.key, entry.value = key, value
    return model


def _hollow_bytes(mm: mmap.mmap, min_bytes: int) -> tuple[bytes, list[tuple[int, int, int]]]:
    """The model's bytes without the large initializers' ``raw_data``; (initializer index, offset,
    length) of each left out."""
    graph = None
    pos, end = 0, len(mm)
    while pos < end:
        field_start = pos
        number, wire, start, pos = _field(mm, pos, end)
        if number == _GRAPH:
            if graph is not None or wire != 2:
                raise _Malformed  # merged graph occurrences: protobuf's merge rules, not ours
            graph = (field_start, start, pos)
    if graph is None:
        raise _Malformed
    header, gstart, gend = graph
    pieces: list[bytes] = []
    hollow: list[tuple[int, int, int]] = []
    kept = gstart  # graph bytes up to here are copied as they are
    index = 0
    pos = gstart
    while pos < gend:
        field_start = pos
        number, wire, start, pos = _field(mm, pos, gend)
        if number != _INITIALIZER:
            continue
        if wire != 2:
            raise _Malformed
        raw = _raw_range(mm, start, pos, min_bytes)
        if raw is not None:
            rstart, dstart, dend = raw  # raw_data field header start, data start, data end
            tensor = mm[start:rstart] + mm[dend:pos]
            pieces += [mm[kept:field_start], _key(_INITIALIZER, 2), encode_varint(len(tensor)), tensor]
            kept = pos
            hollow.append((index, dstart, dend - dstart))
        index += 1
    pieces.append(mm[kept:gend])
    body = b"".join(pieces)
    return b"".join([mm[:header], _key(_GRAPH, 2), encode_varint(len(body)), body, mm[gend:]]), hollow


def _raw_range(mm: mmap.mmap, start: int, end: int, min_bytes: int) -> tuple[int, int, int] | None:
    """(raw_data header start, data start, data end) of a plain float32 tensor of at least
    ``min_bytes`` whose raw_data matches its dims; None for any other tensor."""
    dims: list[int] = []
    dtype = 0
    raw = None
    pos = start
    while pos < end:
        field_start = pos
        number, wire, fstart, pos = _field(mm, pos, end)
        if number not in _PLAIN_TENSOR_FIELDS:
            return None
        if number == _DIMS:
            if wire == 0:
                dims.append(_varint_at(mm, fstart, end)[0])
            else:
                p = fstart
                while p < pos:
                    value, p = _varint_at(mm, p, pos)
                    dims.append(value)
        elif number == _DATA_TYPE:
            dtype = _varint_at(mm, fstart, end)[0]
        elif number == _RAW:
            if raw is not None or wire != 2:
                return None
            raw = (field_start, fstart, pos)
    if raw is None or dtype != TensorProto.FLOAT or raw[2] - raw[1] < min_bytes:
        return None
    numel = 1
    for d in dims:
        numel *= d
    return raw if numel * 4 == raw[2] - raw[1] else None


def _field(mm: mmap.mmap, pos: int, end: int) -> tuple[int, int, int, int]:
    """(field number, wire type, payload start, next field start) of the field at ``pos``."""
    key, pos = _varint_at(mm, pos, end)
    wire = key & 7
    if wire == 0:
        _, nxt = _varint_at(mm, pos, end)
    elif wire == 2:
        length, pos = _varint_at(mm, pos, end)
        nxt = pos + length
    elif wire == 1:
        nxt = pos + 8
    elif wire == 5:
        nxt = pos + 4
    else:
        raise _Malformed  # groups: not in ONNX
    if nxt > end or key >> 3 == 0:
        raise _Malformed
    return key >> 3, wire, pos, nxt


def _varint_at(mm: mmap.mmap, pos: int, end: int) -> tuple[int, int]:
    byte = mm[pos]
    if byte < 0x80:
        return byte, pos + 1
    value, shift = 0, 0
    while True:
        if pos >= end or shift > 63:
            raise _Malformed
        byte = mm[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        if byte < 0x80:
            return value, pos
        shift += 7


def _key(number: int, wire: int) -> bytes:
    return encode_varint(number << 3 | wire)
