"""Default inputs for validation and calibration, drawn the way the model will see them.

N(0, 1) floats and integers in {0, 1} say little: an image model whose logits reach 1e5
on N(0, 1) "images" fails validation it passes on real ones, and token id 1 exercises one
row of an embedding table. Each graph input is drawn by what reads it and what it is
called (``docs/architecture.md``, "Validation inputs"):

* integers read as Gather indices of a constant table: token ids uniform in [0, rows);
* ``*mask*`` inputs (integer, bool or float): ones; ``token_type_ids``: zeros;
  ``position_ids``: 0, 1, 2, ... along the last axis;
* floats named ``past*``/``*cache*`` (a decoder's KV cache, rank 4): N(0, 1);
* floats of rank 4 or named ``pixel*``/``image*``: images in [0, 1];
* floats named ``audio*``/``input_values``/``wav*``/``input_features``: audio (or its
  normalised log-mel features) in [-1, 1];
* integers a ``Loop`` reads as its trip count: 8 iterations;
* other floats N(0, 1), other integers in {0, 1}.

BF16 inputs are drawn the same way in FP32 and rounded to BF16 (``ml_dtypes.bfloat16`` arrays:
``validate.run_model`` hands them to ONNX Runtime as BF16 tensors, or as FP32 where the model it
runs emulates BF16).

Symbolic dims take their ``--dim`` size (``dims``), else the one size the graph allows them
(``onnx_io.pinned_dims``: an export specialised to batch 1), else ``default_dim``, except the
samples of a raw waveform (a rank-2 audio input): one second at 16 kHz, as a few samples are
shorter than the first convolution of any speech encoder; and the height and width of an image:
224 pixels, as a 2 x 2 image is smaller than a vision model's patchify stem (``natural_dims``).

``model_inputs`` returns the feeds and, per input, how it was drawn (the report carries it).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
from typing import Iterator

from onnx import ModelProto, NodeProto, TensorProto

from .errors import ConversionError
from .onnx_io.annotate import walk_nodes
from .onnx_io.derived_dims import derived_sizes, relations_of_model

__all__ = ["graph_input_specs", "image_dims", "model_inputs", "natural_dims", "waveform_dims"]

_NP = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16, TensorProto.DOUBLE: np.float64,
       TensorProto.BFLOAT16: ml_dtypes.bfloat16, TensorProto.INT64: np.int64, TensorProto.INT32: np.int32,
       TensorProto.INT8: np.int8, TensorProto.UINT8: np.uint8, TensorProto.BOOL: np.bool_,
       TensorProto.INT16: np.int16}
_BF16 = np.dtype(ml_dtypes.bfloat16)
_PASS_THROUGH = {"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity"}
_AUDIO = ("audio", "input_values", "wav", "input_features")
_WAVEFORM = ("audio", "input_values", "wav")
_CACHE = ("past", "cache", "present")  # a decoder's past_key_values.*: rank 4, not images
_WAVEFORM_SAMPLES = 16000  # one second at 16 kHz, the rate speech encoders are trained on
_IMAGE_SIDE = 224  # pixels: the ImageNet resolution most vision backbones are trained at
_TRIP_COUNT = 8  # a Loop's iterations: 0 or 1 (other integers' draw) measured nothing of a state growing per step


def _reads(model: ModelProto) -> Iterator[tuple[str, NodeProto, int]]:
    """(graph input, node, port) for every read of each graph input, directly or through ops that pass
    its values on (``_PASS_THROUGH``, their first port), in any subgraph."""
    readers: dict[str, list] = {}
    for node in walk_nodes(model.graph):  # a merged decoder embeds its tables in If branches
        for port, name in enumerate(node.input):
            readers.setdefault(name, []).append((node, port))
    for inp in model.graph.input:
        frontier, seen = [inp.name], set()
        while frontier:
            name = frontier.pop()
            seen.add(name)
            for node, port in readers.get(name, ()):
                yield inp.name, node, port
                if node.op_type in _PASS_THROUGH and port == 0:
                    frontier.extend(o for o in node.output if o not in seen)


def _table_rows(model: ModelProto, reads: list[tuple[str, NodeProto, int]]) -> dict[str, tuple[int, str]]:
    """Graph input -> (rows, table) when it ends up as the indices of a Gather on a constant table
    (``reads``: ``_reads(model)``)."""
    tables = {i.name: (i.dims[0] if i.dims else 0) for i in model.graph.initializer}
    for node in walk_nodes(model.graph):
        if node.op_type == "Constant" and node.attribute and node.attribute[0].t.dims:
            tables[node.output[0]] = node.attribute[0].t.dims[0]
    found = {}
    for name, node, port in reads:
        if node.op_type == "Gather" and port == 1 and node.input[0] in tables and tables[node.input[0]]:
            rows, table = tables[node.input[0]], node.input[0]
            if name not in found or rows < found[name][0]:
                found[name] = (rows, table)
    return found


def _trip_counts(reads: list[tuple[str, NodeProto, int]]) -> dict[str, str]:
    """Graph input -> the ``Loop`` whose trip count (its first input) it is (``reads``: ``_reads``)."""
    return {name: node.name or "Loop" for name, node, port in reads if node.op_type == "Loop" and port == 0}


def graph_input_specs(model: ModelProto, default_dim: int = 2, dims: dict[str, int] | None = None,
                      relations=None):
    """(name, shape, numpy dtype) of each graph input that is not an initializer; a symbolic
    dim takes its size in ``dims`` (by name), else the size the graph pins it to
    (``pinned_dims``), else a waveform's samples one second of audio and an image's sides 224
    pixels (``natural_dims``), else ``default_dim``; a dim the graph derives from others (a decoder's ``total_sequence =
    past_sequence + sequence``) is sized from theirs. ``relations``: ``relations_of_model``'s
    answer when the caller has it. ``ConversionError`` for a dtype no data can be made for."""
    initializers = {i.name for i in model.graph.initializer}
    dims = _input_dims(model, default_dim, dims, relations)
    for inp in model.graph.input:
        if inp.name in initializers:
            continue
        tt = inp.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else dims.get(d.dim_param, default_dim) for d in tt.shape.dim]
        dtype = _NP.get(tt.elem_type)
        if dtype is None:
            raise ConversionError("", f"graph input {inp.name!r}",
                                  f"cannot generate data of type {TensorProto.DataType.Name(tt.elem_type)}; "
                                  "pass --inputs FILE.npz")
        yield inp.name, shape, dtype


def _input_dims(model: ModelProto, default_dim: int, dims: dict[str, int] | None, relations) -> dict[str, int]:
    pins, derived = relations if relations is not None else relations_of_model(model, sized=dims or ())
    sizes = {**natural_dims(model), **{dim: pin.size for dim, pin in pins.items()}, **(dims or {})}
    return {**sizes, **derived_sizes(model, sizes, default_dim, derived)}


def waveform_dims(model: ModelProto) -> dict[str, int]:
    """The samples dim of each raw waveform input (rank-2 float ``input_values``/``audio*``/``wav*``,
    symbolic): one second at 16 kHz. Sized like a batch or a sequence (2 for validation, 8 for the
    plan) a speech encoder's convolutions leave nothing: HuBERT's frames came out empty."""
    found = {}
    for inp in model.graph.input:
        tt = inp.type.tensor_type
        if (tt.elem_type in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE)
                and len(tt.shape.dim) == 2 and any(key in inp.name.lower() for key in _WAVEFORM)
                and tt.shape.dim[1].dim_param):
            found[tt.shape.dim[1].dim_param] = _WAVEFORM_SAMPLES
    return found


def natural_dims(model: ModelProto) -> dict[str, int]:
    """Symbolic dims sized as the data they hold comes, not as a batch: a waveform's samples
    (``waveform_dims``) and an image's height and width (``image_dims``)."""
    return {**waveform_dims(model), **image_dims(model)}


def image_dims(model: ModelProto) -> dict[str, int]:
    """The symbolic height and width of each image input (rank-4 float, 1 or 3 channels fixed,
    NCHW or NHWC, or any channels if named ``pixel*``/``image*``/``img*``): ``_IMAGE_SIDE``
    pixels. A Swin, Segformer or ConvNeXt exported with dynamic height and width was drawn as
    2 x 2 images, which its 4 x 4 patchify convolution refused, and planned on 8 x 8 ones."""
    found = {}
    for inp in model.graph.input:
        tt = inp.type.tensor_type
        name = inp.name.lower()
        if (tt.elem_type not in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE)
                or len(tt.shape.dim) != 4 or any(key in name for key in (*_CACHE, *_AUDIO, "mask"))):
            continue
        dims = list(tt.shape.dim)
        channels = [axis for axis in (1, 3) if dims[axis].dim_value in (1, 3)]
        if not channels and name.startswith(("pixel", "image", "img")):
            channels = [1]
        if channels:
            spatial = (2, 3) if channels[0] == 1 else (1, 2)
            found.update({dims[axis].dim_param: _IMAGE_SIDE for axis in spatial if dims[axis].dim_param})
    return found


def model_inputs(model: ModelProto, *, seed: int = 0, default_dim: int = 2,
                 dims: dict[str, int] | None = None) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Feeds for the model's graph inputs and how each was drawn (see module docstring);
    ``dims`` sizes symbolic dims by name (``--dim``)."""
    rng = np.random.default_rng(seed)
    reads = list(_reads(model))
    rows, loops = _table_rows(model, reads), _trip_counts(reads)
    relations = pins, derived = relations_of_model(model, sized=dims or ())
    feeds, how = {}, {}
    for name, shape, dtype in graph_input_specs(model, default_dim, dims, relations):
        if name in loops and np.issubdtype(dtype, np.integer):
            feeds[name] = np.full(shape, _TRIP_COUNT, dtype)
            how[name] = f"{_TRIP_COUNT} iterations of Loop {loops[name]} (pass --inputs for the counts you run)"
            continue
        if dtype == _BF16:  # numpy does not count it a floating type: drawn in FP32, then rounded
            value, how[name] = _draw(rng, name.lower(), shape, np.float32, rows.get(name))
            feeds[name], how[name] = value.astype(_BF16), how[name] + ", rounded to BF16"
        else:
            feeds[name], how[name] = _draw(rng, name.lower(), shape, dtype, rows.get(name))
        symbolic = dict(_symbolic_dims(model, name))
        pinned = [pins[d].describe() if d in pins else derived[d].describe(shape[i])
                  for d, i in symbolic.items() if d in pins or d in derived]
        if pinned:
            how[name] += "; " + "; ".join(pinned)
    return feeds, how


def _symbolic_dims(model: ModelProto, name: str) -> list[tuple[str, int]]:
    """(symbolic dim, axis) of input ``name``."""
    return [(d.dim_param, axis) for vi in model.graph.input if vi.name == name
            for axis, d in enumerate(vi.type.tensor_type.shape.dim) if d.dim_param]


def _draw(rng, name: str, shape: list[int], dtype, table) -> tuple[np.ndarray, str]:
    if "mask" in name:
        return np.ones(shape, dtype), "mask of ones"
    if np.issubdtype(dtype, np.floating):
        if any(key in name for key in _AUDIO):
            return rng.uniform(-1, 1, shape).astype(dtype), "audio in [-1, 1]"
        if any(key in name for key in _CACHE):
            return rng.standard_normal(shape).astype(dtype), "KV cache, N(0, 1)"
        if len(shape) == 4 or name.startswith(("pixel", "image", "img")):
            return rng.uniform(0, 1, shape).astype(dtype), "images in [0, 1]"
        return rng.standard_normal(shape).astype(dtype), "N(0, 1)"
    if dtype is np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_), "random booleans"
    if "token_type" in name:
        return np.zeros(shape, dtype), "zeros (one segment)"
    if "position" in name and shape:
        return np.broadcast_to(np.arange(shape[-1]), shape).astype(dtype), "positions 0, 1, 2, ..."
    if table is not None:
        return rng.integers(0, table[0], shape).astype(dtype), f"token ids in [0, {table[0]}) (rows of {table[1]})"
    return rng.integers(0, 2, shape).astype(dtype), "integers in {0, 1}"
