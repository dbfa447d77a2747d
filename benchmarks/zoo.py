"""The real-model zoo shared by the tests and the benchmarks.

Seven transformers architectures, built from config objects with seeded random
weights (nothing is downloaded), in two sizes:

* ``"small"`` -- tiny configs of the same architecture (2 layers or 1 block per
  stage, width 64-256, vocab 512, 32-64 px images, 8-16 token sequences). Each builds and
  exports in a few seconds; this is what CI uses.
* ``"base"`` -- the real sizes (BERT-base, GPT-2 124M, ResNet-50, ViT-B/16 at
  224 px, T5-small, Whisper-tiny, ConvNeXt-tiny) for benchmarks.

API::

    model, args = build_torch_model("bert", "small")   # wrapper module + example inputs
    path = export_onnx("bert", "small")                 # cached ONNX file (opset 18, dynamo)
    feeds = random_feeds(path)                          # {input name: np.ndarray}

Every model is wrapped so that ``forward`` takes positional tensors (in the
order of ``input_names(name)``) and returns the logits tensor; the same object
serves ``torch.export``/FX and ONNX export. Batch size is 2 and all shapes are
static.

torch and transformers are imported lazily: importing this module and calling
``random_feeds`` need only numpy + onnx.

No model needed an export workaround with torch 2.13 / transformers 5.23 / onnxscript
0.7; the only per-entry fixes are config values that must fit a small vocabulary.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import uuid
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import onnx
    import torch

__all__ = [
    "MODEL_NAMES",
    "SIZES",
    "ZOO",
    "OPSET",
    "CACHE_ENV_VAR",
    "ZooInput",
    "ZooVariant",
    "ZooSpec",
    "variant",
    "input_names",
    "example_inputs",
    "build_torch_model",
    "export_onnx",
    "export_module",
    "wrap_module",
    "cache_path",
    "default_cache_dir",
    "random_feeds",
    "at_batch",
]

MODEL_NAMES = ("bert", "gpt2", "resnet", "vit", "t5", "whisper", "convnext")
SIZES = ("small", "base")
OPSET = 18
BATCH = 2
SEED = 0
CACHE_ENV_VAR = "AMP_COMPILER_ZOO_CACHE"
# Bump when the wrappers, inputs or export settings change in a way the config
# hash cannot see; it is part of every cache key.
ZOO_FORMAT = 1
# Keys under which export_onnx records the zoo entry in the ONNX metadata_props.
_META_NAME = "amp_compiler.zoo.name"
_META_SIZE = "amp_compiler.zoo.size"
_META_INT_HIGH = "amp_compiler.zoo.int_high"  # JSON {input name: exclusive upper bound}


# --------------------------------------------------------------------------- table


@dataclasses.dataclass(frozen=True)
class ZooInput:
    """One positional model input. ``high`` set: int64 ids in [0, high); else float32 N(0, 1)."""

    name: str
    shape: tuple[int, ...]
    high: int | None = None


@dataclasses.dataclass(frozen=True)
class ZooVariant:
    """A model at one size: its transformers config and its example inputs."""

    config: Any  # transformers.PretrainedConfig
    inputs: tuple[ZooInput, ...]


@dataclasses.dataclass(frozen=True)
class ZooSpec:
    model_class: str  # a transformers class name, built as ``cls(config)``
    variant: Callable[[str], ZooVariant]  # size -> config + inputs
    call_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # fixed forward kwargs
    output: str = "logits"  # the ModelOutput field the wrapper returns


def _ids(name: str, seq: int, vocab: int) -> ZooInput:
    return ZooInput(name, (BATCH, seq), high=vocab)


def _mask(name: str, seq: int) -> ZooInput:
    return ZooInput(name, (BATCH, seq), high=2)


def _image(px: int, channels: int = 3) -> ZooInput:
    return ZooInput("pixel_values", (BATCH, channels, px, px))


@contextlib.contextmanager
def at_batch(batch: int):
    """Build, export and feed zoo entries at another batch size inside the block (the cache key
    holds the input shapes, so each batch gets its own file)."""
    global BATCH
    saved, BATCH = BATCH, int(batch)
    try:
        yield
    finally:
        BATCH = saved


def _pick(size: str, small: dict, base: dict) -> dict:
    if size == "small":
        return small
    if size == "base":
        return base
    raise ValueError(f"unknown zoo size {size!r}; expected one of {SIZES}")


# Every builder below makes its config through ``_cfg``, which pins eager attention.
# SDPA exports too (opset 18 decomposes it), but torch.export keeps it as one
# aten op; eager gives the FX and ONNX paths the same explicit MatMul/Softmax graph.


def _cfg(cls_name: str, **kwargs: Any) -> Any:
    import transformers

    cls = getattr(transformers, cls_name)
    return cls(attn_implementation="eager", **kwargs)


def _bert(size: str) -> ZooVariant:
    kw = _pick(
        size,
        small=dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                   intermediate_size=128, max_position_embeddings=64),
        base=dict(),  # bert-base-uncased: 12 layers x 768, vocab 30522
    )
    seq = 16 if size == "small" else 128
    cfg = _cfg("BertConfig", **kw)
    return ZooVariant(cfg, (_ids("input_ids", seq, cfg.vocab_size), _mask("attention_mask", seq)))


def _gpt2(size: str) -> ZooVariant:
    kw = _pick(
        size,
        small=dict(vocab_size=512, n_embd=64, n_layer=2, n_head=2, n_positions=64,
                   bos_token_id=1, eos_token_id=1),  # defaults (50256) lie outside the small vocab
        base=dict(),  # gpt2 (124M): 12 layers x 768, vocab 50257
    )
    seq = 16 if size == "small" else 128
    cfg = _cfg("GPT2Config", use_cache=False, **kw)
    return ZooVariant(cfg, (_ids("input_ids", seq, cfg.vocab_size),))


def _resnet(size: str) -> ZooVariant:
    kw = _pick(
        size,
        small=dict(embedding_size=16, hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 1, 1], num_labels=10),
        base=dict(num_labels=1000),  # microsoft/resnet-50: bottleneck [3, 4, 6, 3]
    )
    px = 64 if size == "small" else 224
    return ZooVariant(_cfg("ResNetConfig", **kw), (_image(px),))


def _vit(size: str) -> ZooVariant:
    kw = _pick(
        size,
        small=dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                   image_size=32, patch_size=8, num_labels=10),
        base=dict(num_labels=1000),  # google/vit-base-patch16-224
    )
    cfg = _cfg("ViTConfig", **kw)
    return ZooVariant(cfg, (_image(cfg.image_size),))


def _t5(size: str) -> ZooVariant:
    kw = _pick(
        size,
        small=dict(vocab_size=512, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                   relative_attention_num_buckets=8, relative_attention_max_distance=32),
        base=dict(),  # t5-small: 6+6 layers x 512, vocab 32128
    )
    src, tgt = (16, 8) if size == "small" else (128, 32)
    cfg = _cfg("T5Config", use_cache=False, **kw)
    return ZooVariant(cfg, (
        _ids("input_ids", src, cfg.vocab_size),
        _mask("attention_mask", src),
        _ids("decoder_input_ids", tgt, cfg.vocab_size),
    ))


def _whisper(size: str) -> ZooVariant:
    kw = _pick(
        size,
        # The encoder insists on exactly 2 * max_source_positions input frames.
        small=dict(vocab_size=512, num_mel_bins=16, d_model=64, encoder_layers=2, decoder_layers=2,
                   encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=128,
                   decoder_ffn_dim=128, max_source_positions=32, max_target_positions=32,
                   pad_token_id=1, bos_token_id=1, eos_token_id=2, decoder_start_token_id=3,
                   begin_suppress_tokens=None),
        base=dict(),  # openai/whisper-tiny: 4+4 layers x 384, 80 mel bins, 3000 frames
    )
    tgt = 8 if size == "small" else 32
    cfg = _cfg("WhisperConfig", use_cache=False, **kw)
    features = ZooInput("input_features", (BATCH, cfg.num_mel_bins, 2 * cfg.max_source_positions))
    return ZooVariant(cfg, (features, _ids("decoder_input_ids", tgt, cfg.vocab_size)))


def _convnext(size: str) -> ZooVariant:
    kw = _pick(
        size,
        small=dict(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], num_labels=10),
        base=dict(num_labels=1000),  # facebook/convnext-tiny-224: [3, 3, 9, 3] x [96 .. 768]
    )
    px = 64 if size == "small" else 224
    return ZooVariant(_cfg("ConvNextConfig", image_size=px, **kw), (_image(px),))


ZOO: dict[str, ZooSpec] = {
    "bert": ZooSpec("BertForMaskedLM", _bert),
    "gpt2": ZooSpec("GPT2LMHeadModel", _gpt2, {"use_cache": False}),
    "resnet": ZooSpec("ResNetForImageClassification", _resnet),
    "vit": ZooSpec("ViTForImageClassification", _vit),
    "t5": ZooSpec("T5ForConditionalGeneration", _t5, {"use_cache": False}),
    "whisper": ZooSpec("WhisperForConditionalGeneration", _whisper, {"use_cache": False}),
    "convnext": ZooSpec("ConvNextForImageClassification", _convnext),
}
assert tuple(ZOO) == MODEL_NAMES


def _spec(name: str) -> ZooSpec:
    try:
        return ZOO[name]
    except KeyError:
        raise ValueError(f"unknown zoo model {name!r}; expected one of {MODEL_NAMES}") from None


def variant(name: str, size: str = "small") -> ZooVariant:
    """The config and input specs of one zoo entry (cheap: builds no model)."""
    return _spec(name).variant(size)


def input_names(name: str, size: str = "small") -> tuple[str, ...]:
    """Positional input order of ``build_torch_model(name)`` and the ONNX graph inputs."""
    return tuple(i.name for i in variant(name, size).inputs)


# --------------------------------------------------------------------------- torch


def _wrapper_class() -> type:
    import torch

    class ZooModel(torch.nn.Module):
        """Positional tensors in, the ``output`` field of the transformers ModelOutput out."""

        def __init__(self, model: torch.nn.Module, names: Sequence[str], call_kwargs: Mapping[str, Any],
                     output: str) -> None:
            super().__init__()
            self.model = model
            self.input_names = tuple(names)
            self.call_kwargs = dict(call_kwargs)
            self.output = output

        def forward(self, *args: torch.Tensor) -> torch.Tensor:
            kwargs = dict(zip(self.input_names, args, strict=True))
            out = self.model(**kwargs, **self.call_kwargs, return_dict=True)
            return out[self.output]

    return ZooModel


def example_inputs(name: str, size: str = "small", seed: int = SEED) -> tuple["torch.Tensor", ...]:
    """Seeded example inputs: int64 ids within the vocab, float32 N(0, 1) features/pixels."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    out = []
    for spec in variant(name, size).inputs:
        if spec.high is None:
            out.append(torch.randn(spec.shape, generator=gen, dtype=torch.float32))
        elif spec.high == 2 and "mask" in spec.name:
            out.append(torch.ones(spec.shape, dtype=torch.int64))  # attend to every token
        else:
            out.append(torch.randint(0, spec.high, spec.shape, generator=gen, dtype=torch.int64))
    return tuple(out)


def build_torch_model(name: str, size: str = "small") -> tuple["torch.nn.Module", tuple["torch.Tensor", ...]]:
    """Build a zoo model with seeded random weights, in eval mode, plus example inputs.

    Returns ``(module, args)``: ``module(*args)`` returns the logits tensor.
    """
    import torch
    import transformers

    spec = _spec(name)
    var = spec.variant(size)
    cls = getattr(transformers, spec.model_class)
    with torch.random.fork_rng(devices=[]):  # reproducible weights, caller's RNG untouched
        torch.manual_seed(SEED)
        model = cls(var.config)
    model.eval()
    return wrap_module(model, [i.name for i in var.inputs], spec.call_kwargs, spec.output), example_inputs(name, size)


def wrap_module(model: "torch.nn.Module", names: Sequence[str], call_kwargs: Mapping[str, Any] | None = None,
                output: str = "logits") -> "torch.nn.Module":
    """``model`` behind a ``forward(*tensors)`` that passes them as ``names`` and returns ``output``."""
    return _wrapper_class()(model, names, call_kwargs or {}, output).eval()


# --------------------------------------------------------------------------- ONNX export


def default_cache_dir() -> Path:
    """``$AMP_COMPILER_ZOO_CACHE`` if set, else ``benchmarks/.cache/onnx`` in the repository."""
    env = os.environ.get(CACHE_ENV_VAR)
    if env:
        return Path(env).expanduser()
    return Path(__file__).resolve().parent / ".cache" / "onnx"


def _cache_key(name: str, size: str) -> str:
    import torch
    import transformers

    spec = _spec(name)
    var = spec.variant(size)
    try:
        import onnxscript

        onnxscript_version = onnxscript.__version__
    except ImportError:  # pragma: no cover - the exporter needs it anyway
        onnxscript_version = None
    blob = json.dumps(
        {
            "format": ZOO_FORMAT,
            "name": name,
            "size": size,
            "model_class": spec.model_class,
            "call_kwargs": dict(spec.call_kwargs),
            "output": spec.output,
            "config": var.config.to_dict(),
            "inputs": [dataclasses.astuple(i) for i in var.inputs],
            "opset": OPSET,
            "seed": SEED,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "onnxscript": onnxscript_version,
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cache_path(name: str, size: str = "small", cache_dir: str | os.PathLike | None = None) -> Path:
    """Where ``export_onnx`` puts (or finds) this entry; the file may not exist yet."""
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return folder / f"{name}-{size}-{_cache_key(name, size)}.onnx"


@contextlib.contextmanager
def _quiet_exporter():
    """Mute the exporter's known-benign chatter; other warnings still get through."""
    noisy = {
        # "torchvision is not installed. Skipping torchvision::nms" (x4, every export)
        "torch.onnx._internal.exporter._registration": logging.ERROR,
        # "Evaluation failed: ..." when a constant-folding attempt does not apply
        "onnxscript.optimizer._constant_folding": logging.ERROR,
    }
    saved = {}
    for logger_name, level in noisy.items():
        lg = logging.getLogger(logger_name)
        saved[logger_name] = lg.level
        lg.setLevel(level)
    try:
        with warnings.catch_warnings():
            # pytree deprecation inside torch.export itself, not actionable here
            warnings.filterwarnings("ignore", message=r".*LeafSpec.*", category=FutureWarning)
            # numpy warnings from constant folding with the ONNX reference evaluator, e.g.
            # log(0) in T5's relative-position buckets, whose -inf is masked out by a Where
            warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"onnx\.reference\.")
            yield
    finally:
        for logger_name, level in saved.items():
            logging.getLogger(logger_name).setLevel(level)


def _rename_into_place(tmp: Path, path: Path) -> None:
    os.replace(tmp, path)  # atomic within one filesystem: readers see no file or a whole one


def export_onnx(name: str, size: str = "small", cache_dir: str | os.PathLike | None = None) -> Path:
    """Export a zoo model to ONNX (dynamo exporter, opset 18) and return the cached path.

    The file name carries a hash of the config, inputs and torch/transformers/onnxscript
    versions, so a second call returns the existing file without building anything.
    The export goes to a temporary file in the cache folder that is renamed into
    place, so an interrupted export never leaves a partial file under the final name.
    Weights are stored inside the .onnx file (every zoo model is < 2 GB).
    """
    import torch

    path = cache_path(name, size, cache_dir)
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)

    model, args = build_torch_model(name, size)
    var = variant(name, size)
    int_high = {i.name: i.high for i in var.inputs if i.high is not None}
    metadata = {_META_NAME: name, _META_SIZE: size, _META_INT_HIGH: json.dumps(int_high, sort_keys=True)}
    return export_module(model, args, [i.name for i in var.inputs], [_spec(name).output], path, metadata)


def export_module(model: "torch.nn.Module", args: Sequence["torch.Tensor"], input_names: Sequence[str],
                  output_names: Sequence[str], path: str | os.PathLike,
                  metadata: Mapping[str, str] | None = None) -> Path:
    """Export ``model(*args)`` as the zoo does (dynamo exporter, opset 18, optimised) to ``path``.

    The file is written under a temporary name in the same folder and renamed into place.
    """
    import torch

    path = Path(path)
    with _quiet_exporter(), torch.no_grad():
        program = torch.onnx.export(
            model,
            tuple(args),
            dynamo=True,
            opset_version=OPSET,
            input_names=list(input_names),
            output_names=list(output_names),
            external_data=False,
            optimize=True,
            verbose=False,
        )
    program.model.metadata_props.update(dict(metadata or {}))
    # Same folder as the target so os.replace is an atomic rename; unique per writer so
    # concurrent exports of one entry cannot clobber each other's partial files.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        program.save(tmp, external_data=False)
        _rename_into_place(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


# --------------------------------------------------------------------------- random feeds

# Values for symbolic (dim_param) dimensions that random_feeds has no other hint for.
_DEFAULT_DIMS = {"batch": BATCH, "batch_size": BATCH, "sequence": 16, "sequence_length": 16,
                 "seq_len": 16, "seq": 16, "height": 224, "width": 224}


def random_feeds(
    model: "str | os.PathLike | onnx.ModelProto",
    seed: int = 0,
    *,
    dims: Mapping[str, int] | None = None,
    int_high: Mapping[str, int] | None = None,
) -> dict[str, np.ndarray]:
    """Random inputs for every graph input of an ONNX model, by its declared types and shapes.

    * Integer inputs: values in ``[0, high)``. ``high`` comes from ``int_high``, else from
      the zoo metadata that ``export_onnx`` writes (the vocab size for ids, 2 for masks),
      else 2.
    * Float inputs (any precision): N(0, 1) cast to the input dtype. Bool inputs: random.
    * Symbolic dims: ``dims[dim_param]``, else a default by name (batch -> 2, sequence -> 16),
      else 2 for axis 0 and 16 elsewhere. Unknown (unnamed) dims count as symbolic.
    """
    import onnx
    from onnx import helper

    if isinstance(model, onnx.ModelProto):
        proto = model
    else:
        proto = onnx.load(os.fspath(model), load_external_data=False)

    meta = {p.key: p.value for p in proto.metadata_props}
    highs: dict[str, int] = json.loads(meta.get(_META_INT_HIGH, "{}"))
    highs.update(int_high or {})
    dim_values = {**_DEFAULT_DIMS, **(dims or {})}

    initializers = {t.name for t in proto.graph.initializer}
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for value in proto.graph.input:
        if value.name in initializers:  # IR < 4 models list weights as inputs
            continue
        ttype = value.type.tensor_type
        if not value.type.HasField("tensor_type"):
            raise ValueError(f"random_feeds: input {value.name!r} is not a tensor")
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(ttype.elem_type))
        shape = []
        for axis, dim in enumerate(ttype.shape.dim):
            if dim.HasField("dim_value"):
                shape.append(dim.dim_value)
            else:
                shape.append(dim_values.get(dim.dim_param, BATCH if axis == 0 else 16))
        if dtype == np.bool_:
            feeds[value.name] = rng.integers(0, 2, size=shape).astype(np.bool_)
        elif np.issubdtype(dtype, np.integer):
            high = int(highs.get(value.name, 2))
            feeds[value.name] = rng.integers(0, high, size=shape).astype(dtype)
        else:  # float32/float16/bfloat16/float64 (ml_dtypes types are not np.floating)
            feeds[value.name] = rng.standard_normal(size=shape).astype(np.float32).astype(dtype)
    return feeds
