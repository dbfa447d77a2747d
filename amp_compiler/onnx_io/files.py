"""Reading and writing ONNX files with clear errors, atomically, never over the input."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError
from onnx import ModelProto, TensorProto

from ..errors import ConversionError

TWO_GB = 2 ** 31


def load_model(path: str | os.PathLike) -> ModelProto:
    """Load an ONNX file with its external data; every failure is a ``ConversionError``."""
    path = Path(path)
    if not path.exists():
        raise ConversionError(str(path), "", "file not found")
    if path.is_dir():
        raise ConversionError(str(path), "", "is a folder, not an ONNX file")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise ConversionError(str(path), "", f"not a valid ONNX model (protobuf parse failed: {exc})") from None
    except OSError as exc:
        raise ConversionError(str(path), "", f"cannot read the file: {exc.strerror or exc}") from None
    if not model.HasField("graph") or not model.opset_import:
        raise ConversionError(str(path), "", "not a valid ONNX model (no graph or no opset_import)")
    _load_external(model, path)
    return model


def _load_external(model: ModelProto, path: Path) -> None:
    """Read external-data tensors, refusing locations outside the model's folder."""
    base = path.resolve().parent
    for tensor in _external_tensors(model):
        info = {e.key: e.value for e in tensor.external_data}
        location = info.get("location", "")
        target = (base / location).resolve()
        if not location or os.path.isabs(location) or base not in target.parents:
            raise ConversionError(str(path), f"tensor {tensor.name!r}",
                                  f"external data location {location!r} is outside the model's folder; refused")
        if not target.exists():
            raise ConversionError(str(path), f"tensor {tensor.name!r}", f"external data file {location!r} is missing")
    try:
        onnx.external_data_helper.load_external_data_for_model(model, str(base))
    except (OSError, ValueError) as exc:
        raise ConversionError(str(path), "", f"cannot read external data: {exc}") from None


def _external_tensors(model: ModelProto):
    return [t for t in onnx.external_data_helper._get_all_tensors(model)
            if t.HasField("data_location") and t.data_location == TensorProto.EXTERNAL]


def check_output_path(out: str | os.PathLike, inputs: list[str | os.PathLike]) -> Path:
    """Refuse writing over an input, or into a folder that does not exist or is not writable."""
    out = Path(out)
    for inp in inputs:
        if inp is not None and Path(inp).exists() and out.exists() and out.resolve() == Path(inp).resolve():
            raise ConversionError(str(out), "", "output path is the input file; choose another path")
        if inp is not None and out.resolve() == Path(inp).resolve():
            raise ConversionError(str(out), "", "output path is the input file; choose another path")
    folder = out.resolve().parent
    if not folder.is_dir():
        raise ConversionError(str(out), "", f"output folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise ConversionError(str(out), "", f"output folder {folder} is not writable")
    return out


def save_model(model: ModelProto, out: str | os.PathLike, *, external: bool | None = None) -> Path:
    """Write ``model`` atomically (temp file + rename); external data when over 2 GB."""
    out = Path(out)
    if external is None:
        external = model.ByteSize() >= TWO_GB - (64 << 20) if _fits_bytesize(model) else True
    folder = out.resolve().parent
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=folder)
    os.close(fd)
    data_name = f"{out.name}.data"
    tmp_data = folder / f".{data_name}.tmp"
    try:
        if external:
            onnx.save_model(model, tmp, save_as_external_data=True, all_tensors_to_one_file=True,
                            location=tmp_data.name, size_threshold=1024)
            _rename_location(tmp, tmp_data.name, data_name)
            os.replace(tmp_data, folder / data_name)
        else:
            onnx.save_model(model, tmp)
        os.replace(tmp, out)
    except BaseException:
        for leftover in (tmp, tmp_data):
            try:
                os.unlink(leftover)
            except FileNotFoundError:
                pass
        raise
    return out


def _fits_bytesize(model: ModelProto) -> bool:
    try:
        model.ByteSize()
        return True
    except ValueError:
        return False


def _rename_location(model_path: str, old: str, new: str) -> None:
    """Point the saved model's external-data entries from the temp data file to the final one."""
    model = onnx.load(model_path, load_external_data=False)
    for tensor in _external_tensors(model):
        for entry in tensor.external_data:
            if entry.key == "location" and entry.value == old:
                entry.value = new
    onnx.save_model(model, model_path)
