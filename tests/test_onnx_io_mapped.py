"""A one-file model mapped instead of read (``onnx_io.mapped``) converts to the same file as one read whole.

* ``load_hollow`` leaves the large float32 initializers in the file as references to their
  ``raw_data``, whose bytes are the ones ``onnx.load`` reads; the rest of the model is equal;
* files that are not the plain layout (typed data, a size that does not match the shape, two
  graph fields) are left to the ordinary parser, and the CLI's errors are unchanged;
* the CLI's output from a mapped model equals the one from the model read whole, mask fills
  saturated, kept FP32 weights written back inline, one file; with external data, copied;
* ``ConvertedModel.model`` after a streamed save holds every weight.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from amp_compiler import cli, convert_onnx
from amp_compiler.onnx_io import mapped
from amp_compiler.onnx_io.files import load_model
from amp_compiler.onnx_io.tensors import is_external

from .test_pass_numerics_mask import D, FILL, S, _masked_attention


@pytest.fixture(autouse=True)
def small_files(monkeypatch):
    monkeypatch.setattr(mapped, "HOLLOW_MIN_FILE_BYTES", 0)


@pytest.fixture
def low_threshold(monkeypatch):
    monkeypatch.setattr(mapped, "HOLLOW_MIN_BYTES", 256)


def _attention() -> onnx.ModelProto:
    """Masked attention with a 1 KiB mask fill to saturate, then a LayerNorm; an unused int64 table."""
    m = _masked_attention()
    fill = next(t for t in m.graph.initializer if t.name == "fill")
    fill.CopyFrom(numpy_helper.from_array(np.full((S, S), FILL, dtype=np.float32), "fill"))
    m.graph.node[-1].output[0] = "o"
    m.graph.node.append(helper.make_node("LayerNormalization", ["o", "gamma", "beta"], ["y"], name="norm"))
    m.graph.initializer.extend([numpy_helper.from_array(np.linspace(0.5, 1.5, D, dtype=np.float32), "gamma"),
                                numpy_helper.from_array(np.zeros(D, np.float32), "beta"),
                                numpy_helper.from_array(np.arange(D * 8, dtype=np.int64), "unused_ints")])
    return m


def _save(m: onnx.ModelProto, path: Path) -> Path:
    onnx.save(m, str(path))
    return path


def _by_name(m: onnx.ModelProto) -> tuple[dict[str, tuple], bytes]:
    """Each initializer's dtype, shape and bytes, and the model without its initializers."""
    inits = {t.name: (t.data_type, tuple(t.dims), numpy_helper.to_array(t).tobytes()) for t in m.graph.initializer}
    rest = onnx.ModelProto()
    rest.CopyFrom(m)
    rest.graph.ClearField("initializer")
    return inits, rest.SerializeToString()


def test_load_hollow_maps_the_large_float_initializers(tmp_path, low_threshold) -> None:
    path = _save(_attention(), tmp_path / "m.onnx")
    hollow = mapped.load_hollow(path)
    whole = onnx.load(str(path))
    left = {t.name for t in hollow.graph.initializer if is_external(t)}
    assert left == {"Wq", "Wo", "fill"}  # float32, >= 256 bytes; gamma/beta smaller, the int64 table kept
    for h, w in zip(hollow.graph.initializer, whole.graph.initializer):
        if h.name in left:
            info = {e.key: e.value for e in h.external_data}
            assert info["location"] == "m.onnx" and mapped.INLINE_KEY in info
            assert bytes(mapped.inline_view(path, int(info["offset"]), int(info["length"]))) == w.raw_data
            h.ClearField("external_data")
            h.ClearField("data_location")
            h.raw_data = w.raw_data
    assert hollow.SerializeToString() == whole.SerializeToString()


def test_small_files_are_parsed_whole(tmp_path, low_threshold, monkeypatch) -> None:
    path = _save(_attention(), tmp_path / "m.onnx")
    monkeypatch.setattr(mapped, "HOLLOW_MIN_FILE_BYTES", path.stat().st_size + 1)
    assert mapped.load_hollow(path) is None
    assert not any(is_external(t) for t in load_model(path, external_data="lazy").graph.initializer)


def test_a_file_that_cannot_be_mapped_is_parsed_whole(tmp_path, low_threshold, monkeypatch) -> None:
    path = _save(_attention(), tmp_path / "m.onnx")

    def refuse(*_, **__):
        raise OSError(19, "No such device")

    monkeypatch.setattr(mapped.mmap, "mmap", refuse)
    model = load_model(path, external_data="lazy")
    assert not any(is_external(t) for t in model.graph.initializer)
    assert model.SerializeToString() == onnx.load(str(path)).SerializeToString()


def test_files_other_than_the_plain_layout_are_parsed_whole(tmp_path, low_threshold) -> None:
    typed = _attention()
    wq = typed.graph.initializer[0]
    wq.float_data.extend(np.frombuffer(wq.raw_data, np.float32).tolist())
    wq.ClearField("raw_data")
    short = _attention()
    short.graph.initializer[0].raw_data = short.graph.initializer[0].raw_data[:-4]
    assert {t.name for t in mapped.load_hollow(_save(typed, tmp_path / "t.onnx")).graph.initializer
            if is_external(t)} == {"Wo", "fill"}
    assert {t.name for t in mapped.load_hollow(_save(short, tmp_path / "s.onnx")).graph.initializer
            if is_external(t)} == {"Wo", "fill"}
    twice = tmp_path / "g.onnx"
    graph_field = onnx.ModelProto(graph=_attention().graph).SerializeToString()
    twice.write_bytes(_attention().SerializeToString() + graph_field)
    assert mapped.load_hollow(twice) is None
    for name in ("s.onnx", "t.onnx"):  # the CLI's errors are the whole parser's
        status = cli.main([str(tmp_path / name), "-o", str(tmp_path / f"out_{name}"), "-q"])
        assert status == (2 if name == "s.onnx" else 0)


def test_a_mapped_model_converts_to_the_file_a_read_one_does(tmp_path, monkeypatch) -> None:
    src = _save(_attention(), tmp_path / "m.onnx")
    monkeypatch.setattr(mapped, "HOLLOW_MIN_BYTES", 1 << 40)
    options = ["-q", "--planner", "all", "--deny-node", "out_proj"]  # Wo stays FP32: written back as it was
    assert cli.main([str(src), "-o", str(tmp_path / "read.onnx"), *options]) == 0
    monkeypatch.setattr(mapped, "HOLLOW_MIN_BYTES", 256)
    assert any(is_external(t) for t in load_model(src, external_data="lazy").graph.initializer)
    assert cli.main([str(src), "-o", str(tmp_path / "mapped.onnx"), *options]) == 0
    read, out = onnx.load(str(tmp_path / "read.onnx")), onnx.load(str(tmp_path / "mapped.onnx"))
    assert not any(is_external(t) for t in out.graph.initializer)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "mapped.onnx", "read.onnx"]  # one file each
    assert _by_name(out) == _by_name(read)
    weights = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    fill = weights["fill_fp16"].min()
    assert np.isfinite(fill) and fill < -1e4  # saturated (numerics rule 10) from the mapped bytes
    assert np.array_equal(weights["Wo"], numpy_helper.to_array(onnx.load(str(src)).graph.initializer[1]))
    onnx.checker.check_model(out, full_check=True)


@pytest.mark.parametrize("options", [{}, {"planner": "all"}], ids=["defaults", "all"])
def test_mapped_weights_are_copied_into_external_data_and_into_model(tmp_path, low_threshold, options) -> None:
    src = _save(_attention(), tmp_path / "m.onnx")
    whole = convert_onnx(str(src), **options)
    lazy = load_model(src, external_data="lazy")
    result = convert_onnx(lazy, base_dir=tmp_path, copy=False, **options)
    result.save(tmp_path / "e.onnx", external=True)
    assert (tmp_path / "e.onnx.data").is_file()
    external = onnx.load(str(tmp_path / "e.onnx"))
    result.save(tmp_path / "one.onnx")
    assert not (tmp_path / "one.onnx.data").exists()
    assert _by_name(external) == _by_name(onnx.load(str(tmp_path / "one.onnx"))) == _by_name(whole.model)
    assert _by_name(result.model) == _by_name(whole.model)  # the data read in from the mapped file


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_weights_cast_by_threads_give_the_same_bytes(tmp_path, monkeypatch, dtype) -> None:
    from amp_compiler.onnx_io import stream

    result = convert_onnx(_attention(), planner="all", dtype=dtype, deny_nodes=["out_proj"])
    result.save(tmp_path / "serial.onnx")
    monkeypatch.setattr(stream, "_THREADED_BYTES", 0)
    monkeypatch.setattr(stream, "_SLICE", 100)  # many slices, buffers reused round the ring
    result.save(tmp_path / "threaded.onnx")
    assert (tmp_path / "threaded.onnx").read_bytes() == (tmp_path / "serial.onnx").read_bytes()
    assert _by_name(onnx.load(str(tmp_path / "threaded.onnx"))) == _by_name(result.model)
