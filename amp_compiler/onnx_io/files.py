"""Reading ONNX files with one-line errors; the entry point of the ONNX file helpers.

``load_model`` pre-scans the file's wire format (``wire``), parses it, and checks
every external-data reference (``tensors``): ``external_data="load"`` reads the data
into the model (small models, the API); ``"lazy"`` leaves large tensors where they
are, to be read tensor by tensor, and maps a large one-file model instead of reading it
(``mapped``: its weights stay in the file). Writing lives in ``save`` (streamed, staged through
``atomic.Staging``), the output-path policy in ``paths``, deferred casts in
``deferred``; their public names are re-exported here. docs/architecture.md,
"Input handling".
"""

from __future__ import annotations

import os
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError
from onnx import ModelProto

from ..errors import ConversionError
from .deferred import CAST_FROM_KEY, defer_cast, has_deferred, has_external, materialize
from .mapped import load_hollow
from .paths import check_output_path, external_data_name, input_files
from .save import DEFAULT_EXTERNAL_THRESHOLD, EXTERNAL_THRESHOLD_ENV, TWO_GB, external_threshold, save_model
from .skeleton import skeleton_copy
from .tensors import INLINE_BYTES, is_external, iter_chunks, iter_tensors, resolve_external_data, tensor_nbytes
from .wire import scan_model_fields

__all__ = ["CAST_FROM_KEY", "DEFAULT_EXTERNAL_THRESHOLD", "EXTERNAL_THRESHOLD_ENV", "INLINE_BYTES", "TWO_GB",
           "check_output_path", "defer_cast", "external_data_name", "external_threshold", "has_deferred", "has_external",
           "input_files", "is_external", "iter_chunks", "iter_tensors", "load_model", "load_model_files", "materialize",
           "resolve_external_data", "save_model", "skeleton_copy", "tensor_nbytes"]


def load_model(path: str | os.PathLike, *, external_data: str = "load") -> ModelProto:
    """Load an ONNX file; every failure is a ``ConversionError`` naming the file and the reason.
    See ``load_model_files``."""
    return load_model_files(path, external_data=external_data)[0]


def load_model_files(path: str | os.PathLike, *, external_data: str = "load") -> tuple[ModelProto, list[Path]]:
    """Load an ONNX file, and name the files it was read from: the file, then its external data.

    ``external_data``: ``"load"`` reads external tensors into the model; ``"lazy"``
    checks them and leaves those of ``INLINE_BYTES`` or more in their files (read
    them with ``iter_chunks(tensor, base_dir=<the model's folder>)``), and maps a one-file
    model instead of reading it: its large float32 initializers become references to their
    bytes in the file (``mapped.load_hollow``), written back inline by ``save_model``.
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
        scan_model_fields(path, size)
        model = load_hollow(path) if external_data == "lazy" else None
        if model is None:
            model = onnx.load(name, load_external_data=False)
    except (DecodeError, RuntimeError, ValueError):
        raise ConversionError(name, "", "corrupt ONNX file: the protobuf does not parse") from None
    except OSError as exc:
        raise ConversionError(name, "", f"cannot read the file: {exc.strerror or exc}") from None
    if not model.opset_import:
        raise ConversionError(name, "", "not a valid ONNX model: it has no opset_import")
    data = resolve_external_data(model, path.resolve().parent, source=name, load_all=external_data == "load")
    return model, [path.resolve(), *sorted(data)]
