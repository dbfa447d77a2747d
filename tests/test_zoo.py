"""Tests for the real-model zoo (benchmarks/zoo.py): small sizes only.

Each model is exported with the dynamo exporter, must pass the full ONNX checker,
run under ONNX Runtime and match the torch model; the export cache must hand back
the same file without rewriting it. Base sizes are for benchmarks, not tested here.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch", reason="the model zoo builds its models with torch")
pytest.importorskip("transformers", reason="the model zoo builds its models with transformers")
pytest.importorskip("onnxscript", reason="torch.onnx.export(dynamo=True) needs onnxscript")
onnx = pytest.importorskip("onnx", reason="the model zoo exports ONNX")
ort = pytest.importorskip("onnxruntime", reason="exported models are checked under ONNX Runtime")

import torch  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:  # benchmarks/ is not an installed package
    sys.path.insert(0, str(_ROOT))

from benchmarks import zoo  # noqa: E402

RTOL = 1e-4


def _run_torch(name: str, feeds: dict[str, np.ndarray]) -> np.ndarray:
    model, _ = zoo.build_torch_model(name, "small")
    args = [torch.from_numpy(feeds[n]) for n in zoo.input_names(name, "small")]
    with torch.no_grad():
        out = model(*args)
    return (out[0] if isinstance(out, tuple) else out).numpy()


@pytest.mark.parametrize("name", zoo.MODEL_NAMES)
def test_small_model_exports_checks_and_matches_torch(name: str) -> None:
    path = zoo.export_onnx(name, "small")
    assert path.is_file() and path.suffix == ".onnx"
    onnx.checker.check_model(str(path), full_check=True)

    model = onnx.load(str(path))
    assert [i.name for i in model.graph.input] == list(zoo.input_names(name, "small"))
    assert any(o.domain in ("", "ai.onnx") and o.version == zoo.OPSET for o in model.opset_import)

    feeds = zoo.random_feeds(path, seed=1)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = sess.run(None, feeds)[0]
    ref = _run_torch(name, feeds)

    assert got.shape == ref.shape
    assert np.isfinite(ref).all()
    # 1e-4 relative, measured against the output's scale so near-zero logits don't dominate
    np.testing.assert_allclose(got, ref, rtol=RTOL, atol=RTOL * float(np.abs(ref).max()))


@pytest.mark.parametrize("name", zoo.MODEL_NAMES)
def test_small_model_torch_exports(name: str) -> None:
    """The same wrapper serves torch.export (the FX path): positional tensors in, logits out."""
    model, args = zoo.build_torch_model(name, "small")
    assert not model.training
    with torch.no_grad():
        ref = model(*args)
        program = torch.export.export(model, args)
        got = program.module()(*args)
    assert isinstance(ref, torch.Tensor) and ref.dtype == torch.float32
    torch.testing.assert_close(got, ref, rtol=RTOL, atol=RTOL * float(ref.abs().max()))


@pytest.mark.parametrize("name", zoo.MODEL_NAMES)
def test_export_cache_returns_same_file_without_rewriting(name: str) -> None:
    first = zoo.export_onnx(name, "small")
    mtime = first.stat().st_mtime_ns
    second = zoo.export_onnx(name, "small")
    assert second == first
    assert second.stat().st_mtime_ns == mtime
    assert first.parent == zoo.default_cache_dir()
    assert first.name.startswith(f"{name}-small-")


def test_random_feeds_respects_zoo_vocab_and_input_types() -> None:
    path = zoo.export_onnx("t5", "small")
    var = zoo.variant("t5", "small")
    feeds = zoo.random_feeds(path)
    assert list(feeds) == [i.name for i in var.inputs]
    for spec in var.inputs:
        arr = feeds[spec.name]
        assert arr.shape == spec.shape
        assert arr.dtype == np.int64
        assert 0 <= arr.min() and arr.max() < spec.high
    # a large vocab is actually used, not just {0, 1}
    assert feeds["input_ids"].max() > 1
    # seeded: same seed, same feeds; another seed, other feeds
    again = zoo.random_feeds(str(path))
    assert all(np.array_equal(feeds[k], again[k]) for k in feeds)
    other = zoo.random_feeds(path, seed=5)
    assert not np.array_equal(feeds["input_ids"], other["input_ids"])

    image = zoo.random_feeds(onnx.load(str(zoo.export_onnx("vit", "small"))))
    assert image["pixel_values"].dtype == np.float32
    assert image["pixel_values"].shape == zoo.variant("vit", "small").inputs[0].shape


def test_random_feeds_on_foreign_model_with_symbolic_dims() -> None:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"]), helper.make_node("Identity", ["ids"], ["z"])],
        "foreign",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["batch", 3, "height", "width"]),
            helper.make_tensor_value_info("ids", TensorProto.INT32, ["batch", None]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT16, None),
            helper.make_tensor_value_info("z", TensorProto.INT32, None),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    feeds = zoo.random_feeds(model, dims={"height": 8, "width": 9})
    assert feeds["x"].dtype == np.float16 and feeds["x"].shape == (2, 3, 8, 9)
    assert feeds["ids"].dtype == np.int32 and feeds["ids"].shape == (2, 16)
    assert set(np.unique(feeds["ids"])) <= {0, 1}  # no zoo metadata: ids in [0, 2)
    wide = zoo.random_feeds(model, int_high={"ids": 1000})
    assert wide["ids"].max() < 1000 and wide["ids"].max() > 1


def test_build_is_seeded_and_leaves_global_rng_alone() -> None:
    state = torch.random.get_rng_state()
    a, args_a = zoo.build_torch_model("gpt2", "small")
    b, args_b = zoo.build_torch_model("gpt2", "small")
    assert torch.equal(torch.random.get_rng_state(), state)
    assert not a.training and not a.model.training
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert ka == kb and torch.equal(va, vb), ka
    assert all(torch.equal(x, y) for x, y in zip(args_a, args_b))
    ids = args_a[0]
    assert ids.dtype == torch.int64 and ids.shape[0] == 2
    assert int(ids.max()) < zoo.variant("gpt2", "small").config.vocab_size


def test_cache_dir_env_var_and_keys(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(zoo.CACHE_ENV_VAR, str(tmp_path))
    assert zoo.default_cache_dir() == tmp_path
    assert zoo.cache_path("bert").parent == tmp_path
    keys = {zoo.cache_path(n, s).name for n in zoo.MODEL_NAMES for s in zoo.SIZES}
    assert len(keys) == 2 * len(zoo.MODEL_NAMES)
    assert zoo.cache_path("bert") == zoo.cache_path("bert")  # deterministic
    with pytest.raises(ValueError, match="unknown zoo model"):
        zoo.export_onnx("alexnet")
    with pytest.raises(ValueError, match="unknown zoo size"):
        zoo.cache_path("bert", "huge")


def test_interrupted_export_leaves_no_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def boom(src: str, dst: str) -> None:
        raise KeyboardInterrupt  # as if the process died between writing and renaming

    monkeypatch.setattr(zoo, "_rename_into_place", boom)
    with pytest.raises(KeyboardInterrupt):
        zoo.export_onnx("vit", "small", cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    path = zoo.export_onnx("vit", "small", cache_dir=tmp_path)
    assert path.parent == tmp_path and [p.name for p in tmp_path.iterdir()] == [path.name]
    onnx.checker.check_model(str(path), full_check=True)
