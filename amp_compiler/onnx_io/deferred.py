"""Deferred casts: folded constants of external-data weights, cast while the model is written.

The emitter turns a cast of a lazily loaded weight into a placeholder (``defer_cast``)
that records where the FP32 data lies and the dtype to cast from; ``save.save_model``
casts it chunk by chunk while streaming, and ``materialize`` computes it in memory for
callers that want a plain ``ModelProto`` (docs/architecture.md, "Input handling").
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from onnx import ModelProto, TensorProto

from .tensors import NUMPY, external_range, is_external, iter_tensors, resolve_external_data

#: external-data key marking a folded constant whose cast ``save_model`` performs
CAST_FROM_KEY = "amp_compiler.cast_from"


def defer_cast(proto: TensorProto, name: str, source: TensorProto, data_type: int,
               base_dir: str | os.PathLike) -> None:
    """Make ``proto`` the constant ``source`` (an external-data tensor) cast to ``data_type``, not computed yet.

    ``proto`` records where the source data lies (an absolute location, which onnx's
    own loaders refuse, so the placeholder cannot be mistaken for data) and the dtype
    to cast from; ``save_model`` performs the cast chunk by chunk while writing.
    """
    target, offset, length = external_range(source, Path(base_dir).resolve(), "")
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


def cast_source(tensor: TensorProto) -> int | None:
    for e in tensor.external_data:
        if e.key == CAST_FROM_KEY:
            return int(e.value)
    return None



def has_deferred(model: ModelProto) -> bool:
    """Whether ``model`` holds a placeholder only ``save_model`` or ``materialize`` can resolve."""
    return any(is_external(t) and cast_source(t) is not None for t in iter_tensors(model))


def has_external(model: ModelProto) -> bool:
    """Whether any tensor of ``model`` (a deferred cast or a lazily loaded weight) lies in a file."""
    return any(is_external(t) for t in iter_tensors(model))


def materialize(model: ModelProto, base_dir: str | os.PathLike | None = None) -> None:
    """Compute every deferred cast of ``model`` in place, and with ``base_dir`` read the tensors
    still in external files in too: the model then stands alone (small models: weights read whole)."""
    for tensor in iter_tensors(model):
        src_code = cast_source(tensor) if is_external(tensor) else None
        if src_code is None:
            continue
        info = {e.key: e.value for e in tensor.external_data}
        with open(info["location"], "rb") as f:
            f.seek(int(info["offset"]))
            data = f.read(int(info["length"]))
        values = np.frombuffer(data, dtype=NUMPY[src_code]).astype(NUMPY[tensor.data_type])
        del tensor.external_data[:]
        tensor.data_location = TensorProto.DEFAULT
        tensor.raw_data = values.tobytes()
    if base_dir is not None:
        resolve_external_data(model, base_dir, load_all=True)
