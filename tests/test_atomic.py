"""The one atomic writer: staged beside the destination, published together, nothing left on failure."""

from __future__ import annotations

import os

import pytest

from amp_compiler.atomic import Staging, atomic_write


def test_nothing_is_in_place_until_published_and_data_goes_before_its_model(tmp_path, monkeypatch):
    model, data = tmp_path / "m.onnx", tmp_path / "m.onnx.data"
    model.write_bytes(b"old model")
    order = []
    real = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: (order.append(os.path.basename(dst)), real(src, dst)))
    with Staging() as staging:
        staged_data = staging.write_bytes(data, b"new data")
        staged_model = staging.write_bytes(model, b"new model")
        assert staged_model.parent == staged_data.parent != tmp_path  # side by side: relative locations hold
        assert model.read_bytes() == b"old model" and not data.exists()
        assert staging.path(model) == staged_model
        staging.publish()
    assert order == ["m.onnx.data", "m.onnx"]
    assert (model.read_bytes(), data.read_bytes()) == (b"new model", b"new data")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.onnx.data"]


def test_an_error_before_publishing_leaves_nothing_and_only_publishes_a_subset(tmp_path):
    with pytest.raises(RuntimeError), Staging() as staging:
        staging.write_bytes(tmp_path / "a.json", b"{}")
        raise RuntimeError("a check failed")
    assert list(tmp_path.iterdir()) == []
    with Staging() as staging:
        staging.write_bytes(tmp_path / "model.onnx", b"m")
        staging.write_bytes(tmp_path / "r.json", b"{}")
        assert staging.publish(only=[str(tmp_path / "r.json")]) == [tmp_path / "r.json"]
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]
    assert atomic_write(tmp_path / "r.json", b"[]").read_bytes() == b"[]"
