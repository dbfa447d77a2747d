"""Output-path policy: never over the input or a file it reads from, into a writable folder.

docs/architecture.md, "Input handling".
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from onnx import ModelProto

from ..errors import ConversionError
from .tensors import is_external, iter_tensors


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
    """Refuse writing over an input (or an input's data), over a device or pipe, into a missing folder or one
    that cannot be written."""
    out = Path(out)
    name = str(out)
    if out.is_symlink():  # written where a plain open() writes: the target, its .data file beside it
        out = out.resolve()
    protected = {Path(p).resolve() for p in inputs if p is not None}
    if out.resolve() in protected:
        raise ConversionError(name, "", "output path is the input file; choose another path")
    data = out.resolve().parent / external_data_name(out)
    if data in protected:
        raise ConversionError(name, "", f"its external data file {data.name} would overwrite an input file; "
                                        "choose another path")
    if out.is_dir():
        raise ConversionError(name, "", "output path is a folder; give a file name")
    if out.exists() and not out.is_file():  # the staged file's rename would replace the device itself (its link
        # is followed: atomic.Staging writes where a plain open() would)
        raise ConversionError(name, "", "output path is not a regular file (a device or a pipe: /dev/null as root "
                                        "would be replaced by the model); give a file name, or --dry-run to "
                                        "write no model")
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

