"""Wire-level pre-scan of an ONNX file: its top-level protobuf fields, checked before parsing.

A file that is not ONNX, a truncated file and a ZIP archive each get their own
one-line ``ConversionError`` instead of a parser exception (docs/architecture.md,
"Input handling").
"""

from __future__ import annotations

from pathlib import Path

from onnx import ModelProto

from ..errors import ConversionError


def scan_model_fields(path: Path, size: int) -> None:
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
    if fd.type in (fd.TYPE_STRING, fd.TYPE_BYTES, fd.TYPE_MESSAGE) or is_repeated(fd):
        return 2
    return 0  # every scalar field of ModelProto is a varint (int64 / enum)


def is_repeated(fd) -> bool:
    flag = getattr(fd, "is_repeated", None)
    return bool(flag) if flag is not None else fd.label == fd.LABEL_REPEATED

