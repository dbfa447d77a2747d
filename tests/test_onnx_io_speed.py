"""The shortcuts of the ONNX path's fast load and save give the same answers as the slow ways.

* ``ValueStats.of`` (cache-sized slices) equals the whole-array statistics, with zeros,
  subnormals, inf and NaN falling in different slices;
* weights' bytes are read once: validation hands them to the importer, the emitter folds
  from them, and the FP16 weights are exactly the FP32 ones rounded;
* a skeleton copy keeps every field of a tensor but its data, and copied whole (then emptied) it is
  the field-by-field copy; inferred types read off a model's bytes are those of a walk of its values;
* the port-type check, run once per op kind and port dtypes, still names the first op that fails it;
* ``convert_onnx(copy=False)`` converts the given model in place, the default leaves it alone;
* folded weights cast while the file is written give the model ``.model`` returns;
* the post-emission check forked beside the report says what it says inline;
* the input's inference forked beside its checks gives the types, model and error of inline inference.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from amp_compiler.errors import ConversionError
from amp_compiler.ir import PrecisionGraph
from amp_compiler.numerics import _SLICE, ValueStats
from amp_compiler.onnx_api import convert_onnx
from amp_compiler.onnx_io import forked, importer, inference, skeleton, validation
from amp_compiler.onnx_io.skeleton import skeleton_copy
from amp_compiler.registry import DEFAULT_REGISTRY
from amp_compiler.onnx_io.validation import validate_model

from .builders import fin, model


def _whole_array_stats(values: np.ndarray) -> ValueStats:
    bits = values.astype(np.float32).reshape(-1).view(np.uint32) & 0x7FFFFFFF
    finite = (bits >> 23) != 255
    nonzero = bits[finite & (bits != 0)]
    counts = np.bincount(nonzero >> 23, minlength=256)
    peak = float(bits[finite].max().view(np.float32)) if finite.any() else 0.0
    return ValueStats(bits.size, int(np.count_nonzero(bits == 0)), peak, tuple(int(c) for c in counts))


def test_value_stats_by_slices_equal_the_whole_array() -> None:
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(2 * _SLICE + 77) * 30).astype(np.float32)
    x[5] = 0.0
    x[_SLICE + 3] = -0.0
    x[_SLICE + 9] = np.inf  # only the second slice has non-finite values
    x[_SLICE + 10] = np.nan
    x[2 * _SLICE + 1] = 1e-41  # a float32 subnormal in the last, short slice
    x[7] = -70000.0  # the peak, in the first slice
    got = ValueStats.of(x)
    assert got == _whole_array_stats(x)
    assert got.zeros == 2 and got.max_abs == 70000.0 and got.exponents[0] == 1 and got.exponents[255] == 0
    only_inf = np.full(_SLICE + 1, np.inf, np.float32)
    assert ValueStats.of(only_inf) == _whole_array_stats(only_inf)
    assert ValueStats.of(only_inf).max_abs == 0.0


def _mlp() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((64, 128)).astype(np.float32) / 8, "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((128, 64)).astype(np.float32) / 8, "w2")
    const = helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.full(64, 0.5, np.float32), "cv"))
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["m"]), const, helper.make_node("Add", ["m", "c"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 64])], [w1, w2])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_validation_hands_the_initializers_bytes_to_the_importer() -> None:
    model = _mlp()
    raw: dict[str, bytes] = {}
    validate_model(model, raw=raw)
    assert set(raw) == {"w1", "w2"}  # initializers only: not the Constant's attribute tensor
    assert raw["w1"] == model.graph.initializer[0].raw_data


def test_folded_weights_are_the_fp32_weights_rounded() -> None:
    model = _mlp()
    converted, _ = convert_onnx(model, keep_io_types=True, planner="all")  # a model this small would stay FP32
    weights = {t.name: numpy_helper.to_array(t) for t in converted.graph.initializer}
    originals = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    folded = {name: a for name, a in weights.items() if a.dtype == np.float16}
    assert len(folded) == 2
    for a in folded.values():
        source = next(o for o in originals.values() if o.shape == a.shape)
        np.testing.assert_array_equal(a, source.astype(np.float16))


def test_skeleton_copy_keeps_every_field_but_the_data() -> None:
    t = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(3, 4), "w")
    t.doc_string = "a weight"
    t.metadata_props.add(key="k", value="v")
    model = _mlp()
    model.graph.initializer[0].CopyFrom(t)
    copy = skeleton_copy(model, lambda tensor: [("location", "w.data")] if tensor.name == "w" else None)
    out = copy.graph.initializer[0]
    assert (out.name, list(out.dims), out.data_type, out.doc_string) == ("w", [3, 4], TensorProto.FLOAT, "a weight")
    assert [(p.key, p.value) for p in out.metadata_props] == [("k", "v")]
    assert not out.HasField("raw_data") and out.data_location == TensorProto.EXTERNAL
    assert copy.graph.initializer[1] == model.graph.initializer[1]  # kept inline, whole


def test_whole_skeleton_copy_equals_the_field_by_field_copy(monkeypatch) -> None:
    model = _mlp()
    model.graph.node.remove(model.graph.node[3])  # the Constant: no tensor attribute left
    model.graph.node[-1].input[1] = "w1"  # the Add reads something else
    model.graph.node[-1].op_type = "Mul"
    main_attributes = [n.attribute[:] for n in model.graph.node]
    assert skeleton._copied_whole(model, main_attributes)
    strip = lambda tensor: [("location", "x.data")] if tensor.name == "w2" else None  # noqa: E731
    made: list = []
    whole = skeleton_copy(model, strip, made, main_attributes)
    monkeypatch.setattr(skeleton, "_copied_whole", lambda *_: False)
    made_by_fields: list = []
    by_fields = skeleton_copy(model, strip, made_by_fields, main_attributes)
    assert whole.SerializeToString(deterministic=True) == by_fields.SerializeToString(deterministic=True)
    assert [t.name for t in made] == [t.name for t in made_by_fields] == ["w2"]
    assert not skeleton._copied_whole(_mlp(), [n.attribute[:] for n in _mlp().graph.node])  # a tensor attribute


def test_inferred_types_read_off_the_bytes_equal_the_walk() -> None:
    light = onnx.shape_inference.infer_shapes(_mlp())
    assert len(light.graph.value_info) == 4
    walked: dict = {}
    for vi in (*light.graph.value_info, *light.graph.output):
        walked[vi.name] = inference.tensor_type(vi)
    assert inference.inferred_types(light, nested=False) == walked
    assert list(inference.inferred_types(light, nested=False)) == list(walked)


def test_the_port_type_check_names_the_first_mismatch_once_a_signature_agreed() -> None:
    """The check runs once per op kind and port dtypes; a mismatch is never taken for agreement."""
    info = helper.make_tensor_value_info
    nodes = [helper.make_node("Add", inputs, [out], name=name)
             for name, inputs, out in (("ok1", ["a", "b"], "c"), ("ok2", ["a", "b"], "c2"),
                                       ("bad1", ["c", "h"], "d"), ("bad2", ["c", "h"], "e"))]
    graph = helper.make_graph(nodes, "g", [info("a", 1, [2]), info("b", 1, [2]), info("h", 10, [2])],
                              [info("d", 1, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    types = {**importer._collect_types(model, {}, nested=False),
             **{name: ("float32", (2,)) for name in ("c", "c2", "d", "e")}}  # inference would refuse the model
    imp = importer.OnnxImport(PrecisionGraph("g"), model, strict=True)
    with pytest.raises(ConversionError, match=r"node 'bad1' \(Add\): 'c' \(float32\) and 'h' \(float16\) must have"):
        importer._import_graph(imp, model.graph, "", types, importer._OpKinds(DEFAULT_REGISTRY, {"": 17}), "m")


def test_copy_false_converts_the_given_model_in_place() -> None:
    model = _mlp()
    before = model.SerializeToString()
    kept, _ = convert_onnx(model)
    assert model.SerializeToString() == before and kept is not model
    converted, _ = convert_onnx(model, copy=False, planner="all")
    assert converted is model
    assert any(i.data_type == TensorProto.FLOAT16 for i in model.graph.initializer)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_weights_cast_while_writing_give_the_same_file(tmp_path, monkeypatch, dtype: str) -> None:
    """The folded weights streamed after the model's bytes parse into the model ``.model`` returns,
    ONNX Runtime runs it; a save with external data moves them into the model first."""
    result = convert_onnx(_mlp(), planner="all", dtype=dtype)
    assert [p.name for p in result._pending] == [f"w1_{dtype}", f"w2_{dtype}"]
    result.save(tmp_path / "a.onnx")
    assert result._pending  # a streaming save leaves them pending: a second save writes them again
    streamed = onnx.load(tmp_path / "a.onnx")
    onnx.checker.check_model(streamed, full_check=True)
    assert streamed.SerializeToString() == result.model.SerializeToString()
    assert not result._pending
    if dtype == "fp16":
        ort = pytest.importorskip("onnxruntime")
        ort.InferenceSession(str(tmp_path / "a.onnx")).run(None, {"x": np.ones((4, 64), np.float32)})
    external = convert_onnx(_mlp(), planner="all", dtype=dtype)
    external.save(tmp_path / "e.onnx", external=True)
    assert not external._pending and (tmp_path / "e.onnx.data").is_file()
    loaded = onnx.load(tmp_path / "e.onnx")
    assert [numpy_helper.to_array(t).tobytes() for t in loaded.graph.initializer] == \
        [numpy_helper.to_array(t).tobytes() for t in streamed.graph.initializer]



def _ill_typed() -> onnx.ModelProto:
    """x -> Cast(FP16) -> Relu -> y declared FP32: strict type inference refuses it, as it would a
    converted model whose emitter forgot a cast."""
    nodes = [helper.make_node("Cast", ["x"], ["h"], name="half", to=TensorProto.FLOAT16),
             helper.make_node("Relu", ["h"], ["y"], name="relu")]
    return model(nodes, [fin("x", 4, 8)], [fin("y", 4, 8)])


def _forked_check_error(m: onnx.ModelProto, block_error: Exception | None = None) -> tuple[str, list[str]]:
    """``checking_emitted``'s error message with the check forked, and what the block did."""
    ran: list[str] = []
    with pytest.raises(ConversionError) as raised:
        with validation.checking_emitted(m, "m.onnx"):
            ran.append("block")
            if block_error is not None:
                raise block_error
    return str(raised.value), ran


def test_the_forked_check_raises_what_the_inline_check_raises(tmp_path, monkeypatch) -> None:
    """The post-emission check runs in a forked child beside the report (onnx's C++ holds the GIL):
    same error text as inline, ahead of an error of the block's own; a child that ends without a
    verdict is replaced by the check run in the parent; the child writes no file."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConversionError) as inline:
        validation.check_emitted(_ill_typed(), "m.onnx")
    assert "the converted model fails ONNX's check" in str(inline.value) and "relu" in str(inline.value)
    monkeypatch.setattr(forked, "may_fork", lambda m: True)
    assert _forked_check_error(_ill_typed()) == (str(inline.value), ["block"])
    assert _forked_check_error(_ill_typed(), ValueError("report bug"))[0] == str(inline.value)
    with validation.checking_emitted(_mlp(), "m.onnx"):  # a valid model: nothing raised
        pass
    monkeypatch.setattr(forked, "_child", lambda check, fd: os._exit(9))  # killed before its verdict
    assert _forked_check_error(_ill_typed()) == (str(inline.value), ["block"])
    assert list(tmp_path.iterdir()) == []


def test_the_check_is_forked_only_where_it_is_safe_and_pays(monkeypatch) -> None:
    """Only from the only Python thread, without torch imported, with SIGCHLD at its default, on Linux,
    from FORK_FROM_NODES nodes; where no process can be had, the check runs inline."""
    big = onnx.ModelProto()
    big.graph.node.extend([onnx.NodeProto()] * forked.FORK_FROM_NODES)
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    # other tests of a session may leave a thread running: the count is set, both ways
    monkeypatch.setattr(forked.threading, "active_count", lambda: 2)
    assert not forked.may_fork(big)
    monkeypatch.setattr(forked.threading, "active_count", lambda: 1)
    assert forked.may_fork(big) == sys.platform.startswith("linux")
    assert not forked.may_fork(_mlp())
    previous = signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children reaped by the system: pids reused
    try:
        assert not forked.may_fork(big)
    finally:
        signal.signal(signal.SIGCHLD, previous)
    monkeypatch.setitem(sys.modules, "torch", sys)
    assert not forked.may_fork(big)

    def no_fork():
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(forked, "may_fork", lambda m: True)
    monkeypatch.setattr(os, "fork", no_fork)
    with pytest.raises(ConversionError) as raised:
        with validation.checking_emitted(_ill_typed(), "m.onnx"):
            pytest.fail("the check runs first where it runs inline")
    assert "the converted model fails ONNX's check" in str(raised.value)


def _reversed(m: onnx.ModelProto) -> onnx.ModelProto:
    """``m`` with its nodes in reverse order: the structure check sorts them, in place."""
    nodes = list(m.graph.node)
    del m.graph.node[:]
    m.graph.node.extend(reversed(nodes))
    return m


def _siblings_reusing_a_name() -> onnx.ModelProto:
    """Both If branches call their result ``t``: the structure check renames one, in place."""
    then_b = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [], [fin("t", 4, 8)])
    else_b = helper.make_graph([helper.make_node("Sigmoid", ["x"], ["t"])], "else", [], [fin("t", 4, 8)])
    nodes = [helper.make_node("If", ["c"], ["y"], name="if", then_branch=then_b, else_branch=else_b)]
    return model(nodes, [fin("x", 4, 8), fin("c", dtype=TensorProto.BOOL)], [fin("y", 4, 8)])


def _reshaped_symbols() -> onnx.ModelProto:
    """A Reshape to (-1, 8) of a (batch, seq, 8) input: onnx names the rows anew, ONNX Runtime's
    symbolic inference (``symbolic_dims``) writes them ``batch*seq``."""
    shape = numpy_helper.from_array(np.array([-1, 8], np.int64), "shape")
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"], name="flat"), helper.make_node("Relu", ["r"], ["y"])]
    return model(nodes, [fin("x", "batch", "seq", 8)], [fin("y", "rows", 8)], [shape])


def _with_attribute(m: onnx.ModelProto, node: str, **attrs) -> onnx.ModelProto:
    next(n for n in m.graph.node if n.name == node).attribute.extend(
        helper.make_attribute(k, v) for k, v in attrs.items())
    return m


def _dangling(m: onnx.ModelProto) -> onnx.ModelProto:
    m.graph.node.append(helper.make_node("Relu", ["nope"], ["z"], name="stray"))
    return m


_CHECKED = {  # a model builder; its inference error is found in the child where it is forked
    "valid": _mlp, "out of order": lambda: _reversed(_mlp()), "sibling renames": _siblings_reusing_a_name,
    "related symbols": _reshaped_symbols, "ill-typed": _ill_typed,
    "ill-typed, out of order": lambda: _reversed(_ill_typed()),
    "ill-typed, refused by the checker": lambda: _with_attribute(_ill_typed(), "relu", alpha=0.5),
    "ill-typed, dangling input": lambda: _dangling(_ill_typed()),
}


def _validated(m: onnx.ModelProto) -> tuple:
    """``validate_model``'s types and the model it leaves, or its error message."""
    try:
        types = validate_model(m, source="m.onnx")
    except ConversionError as exc:
        return str(exc)
    return types, m.SerializeToString()


@pytest.mark.parametrize("case", list(_CHECKED))
def test_inference_forked_beside_the_checks_gives_what_inline_gives(monkeypatch, case) -> None:
    """Step 5 forked beside steps 2-4: the same types, the same model (sorted, renamed), the same error
    ahead of which the parent's own come (structure, checker), as inline."""
    inline = _validated(_CHECKED[case]())
    assert isinstance(inline, str) == case.startswith("ill-typed")
    started = []
    start = forked.ForkedWork.start.__func__
    monkeypatch.setattr(forked, "may_fork", lambda m: True)
    monkeypatch.setattr(forked.ForkedWork, "start",
                        classmethod(lambda cls, work: started.append(1) or start(cls, work)))
    assert _validated(_CHECKED[case]()) == inline
    assert started == [1]
    if case == "related symbols":
        assert inline[0]["r"][1] == ("batch*seq", 8)
    if case in ("ill-typed, refused by the checker", "ill-typed, dangling input"):  # the parent's error first
        assert "type inference failed" in _validated(_ill_typed()) and "type inference failed" not in inline


@pytest.mark.parametrize("case", ["valid", "related symbols", "ill-typed"])
@pytest.mark.parametrize("end", [b"", b"R\xfb"])  # killed before its answer, or while writing it
def test_a_child_that_gives_no_answer_is_replaced_by_inference_here(monkeypatch, case, end) -> None:
    inline = _validated(_CHECKED[case]())
    monkeypatch.setattr(forked, "may_fork", lambda m: True)

    def child(work, fd):
        os.write(fd, end)
        os._exit(9)

    monkeypatch.setattr(forked, "_child", child)
    assert _validated(_CHECKED[case]()) == inline


def test_an_error_of_the_parents_ends_the_child_unheard(monkeypatch) -> None:
    """A structure error is raised at once, the child (here one that would take a minute) ended and
    reaped, not waited for; where no process can be forked, inference runs inline."""
    inline = _validated(_ill_typed())
    monkeypatch.setattr(forked, "may_fork", lambda m: True)
    monkeypatch.setattr(forked, "_child", lambda work, fd: (time.sleep(60), os._exit(0)))
    children = []
    start = forked.ForkedWork.start.__func__
    monkeypatch.setattr(forked.ForkedWork, "start",
                        classmethod(lambda cls, work: children.append(start(cls, work)) or children[-1]))
    began = time.monotonic()
    assert "input 'nope' is not produced" in _validated(_dangling(_mlp()))
    assert time.monotonic() - began < 30 and len(children) == 1
    with pytest.raises(ChildProcessError):
        os.waitpid(children[0]._pid, os.WNOHANG)

    def no_fork():
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(os, "fork", no_fork)
    assert _validated(_ill_typed()) == inline and children[1:] == [None]
