"""``--dtype bf16 --validate`` on ONNX Runtime's CPU provider, which has no BF16 kernels.

The converted model runs with BF16 storage emulated (``amp_compiler/onnx_io/bf16_emulation.py``):
every op in FP32, every BF16 value rounded to BF16. Before, validation failed at session creation
("Could not find an implementation for Add(14)") on every BF16 plan.
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from amp_compiler import convert_onnx
from amp_compiler.cli import main
from amp_compiler.onnx_io.bf16_emulation import declares_bf16
from amp_compiler.validate import run_model

from .builders import fin, model, weight
from .test_ort_fusions import _norm

BF16 = TensorProto.BFLOAT16


def _bf16(a: np.ndarray) -> np.ndarray:
    """``a`` rounded to BF16 (nearest even), back in FP32."""
    return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def _bf16_tensor(name: str, a: np.ndarray) -> TensorProto:
    return helper.make_tensor(name, BF16, a.shape, np.asarray(a, np.float32).ravel().tolist())  # rounded by onnx


def test_a_bf16_graph_runs_on_the_cpu_provider_rounding_every_stored_value():
    """Input, weight, product and sum stored BF16: the emulated run equals numpy's BF16 rounding of
    each FP32 result, exactly."""
    mk = helper.make_node
    w = np.random.default_rng(1).standard_normal((16, 16)).astype(np.float32)
    b = np.random.default_rng(2).standard_normal(16).astype(np.float32)
    m = model([mk("MatMul", ["x", "w"], ["p"]), mk("Add", ["p", "b"], ["y"])],
              [fin("x", 4, 16, dtype=BF16)], [fin("y", 4, 16, dtype=BF16)],
              [_bf16_tensor("w", w), _bf16_tensor("b", b)], value_info=[fin("p", 4, 16, dtype=BF16)])
    x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32) * 10
    (got,) = run_model(m, {"x": x})
    want = _bf16(_bf16(_bf16(x) @ _bf16(w)) + _bf16(b))
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)
    assert not np.array_equal(got, _bf16(x) @ _bf16(w) + _bf16(b))  # the product's rounding shows


def test_bf16_inside_if_branches_runs():
    """A value of the main graph read inside an ``If`` branch, and BF16 computed in the branches."""
    mk = helper.make_node

    def branch(name: str, op: str) -> onnx.GraphProto:
        return helper.make_graph([mk(op, ["h", "h"], [f"{name}_out"])], name, [],
                                 [fin(f"{name}_out", 2, 3, dtype=BF16)])

    m = model([mk("Cast", ["x"], ["h"], to=BF16),
               mk("If", ["c"], ["z"], then_branch=branch("then", "Add"), else_branch=branch("else", "Mul")),
               mk("Cast", ["z"], ["y"], to=TensorProto.FLOAT)],
              [fin("x", 2, 3), fin("c", dtype=TensorProto.BOOL)], [fin("y", 2, 3)],
              value_info=[fin("h", 2, 3, dtype=BF16), fin("z", 2, 3, dtype=BF16)])
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    (added,) = run_model(m, {"x": x, "c": np.array(True)})
    (multiplied,) = run_model(m, {"x": x, "c": np.array(False)})
    np.testing.assert_array_equal(added, _bf16(_bf16(x) * 2))
    np.testing.assert_array_equal(multiplied, _bf16(_bf16(x) * _bf16(x)))


@pytest.mark.parametrize("opset", [14, 18], ids=["opset14", "opset18"])
def test_cli_validates_a_bf16_plan_of_a_written_out_layer_norm(opset, tmp_path, capsys):
    """Default options but ``--dtype bf16``: the plan converts, ONNX Runtime loads the emulated model
    (its LayerNorm fusion would absorb a view's Cast into a BF16-reading node the CPU provider has
    no kernel for), validation passes and says how it ran."""
    m = _norm("layer_norm")
    m.opset_import[0].version = opset
    if opset < 18:  # ReduceMean takes its axes as an attribute before opset 18
        for node in m.graph.node:
            if node.op_type == "ReduceMean":
                del node.input[1:]
                node.attribute.append(helper.make_attribute("axes", [-1]))
    src, out, rep = tmp_path / "m.onnx", tmp_path / "o.onnx", tmp_path / "r.json"
    onnx.save(m, src)
    assert main([str(src), "-o", str(out), "--dtype", "bf16", "--validate", "--report", str(rep)]) == 0
    assert declares_bf16(str(out))  # something did run in BF16
    validation = json.loads(rep.read_text())["validation"]
    assert validation["passed"] and 0 < validation["max_rel_error"] < 1e-2  # BF16's rounding, not FP32's
    assert "emulated" in validation["emulation"]
    assert "bfloat16 emulated" in capsys.readouterr().err


def test_an_fp16_plan_is_not_said_to_be_emulated(tmp_path):
    mk = helper.make_node
    m = model([mk("MatMul", ["x", "w"], ["y"])], [fin("x", 64, 256)], [fin("y", 64, 256)],
              [weight("w", 256, 256)])
    src, out, rep = tmp_path / "m.onnx", tmp_path / "o.onnx", tmp_path / "r.json"
    onnx.save(m, src)
    assert main([str(src), "-o", str(out), "--validate", "--report", str(rep), "-q"]) == 0
    assert "emulation" not in json.loads(rep.read_text())["validation"]
    assert not declares_bf16(convert_onnx(m).model)


def test_the_emulation_leaves_the_callers_model_as_it_was():
    mk = helper.make_node
    m = model([mk("Add", ["x", "b"], ["y"])], [fin("x", 3, dtype=BF16)], [fin("y", 3, dtype=BF16)],
              [_bf16_tensor("b", np.ones(3, np.float32))])
    before = m.SerializeToString()
    run_model(m, {"x": np.zeros(3, np.float32)})
    assert m.SerializeToString() == before
    assert numpy_helper.to_array(m.graph.initializer[0]).dtype != np.float32  # still stored BF16


def test_fallback_on_a_bf16_plan_runs_and_speaks_of_bf16(tmp_path):
    """``--fallback`` runs the converted model each round: on BF16 it ran into the same missing
    kernels; its reasons named FP16 whatever the dtype."""
    mk = helper.make_node
    m = model([mk("MatMul", ["x", "w0"], ["h"], name="mm0"), mk("MatMul", ["h", "w1"], ["y"], name="mm1")],
              [fin("x", 64, 256)], [fin("y", 64, 256)], [weight("w0", 256, 256), weight("w1", 256, 256)])
    src, out, rep = tmp_path / "m.onnx", tmp_path / "o.onnx", tmp_path / "r.json"
    onnx.save(m, src)
    assert main([str(src), "-o", str(out), "--dtype", "bf16", "--fallback", "--tolerance", "1e-6",
                 "--report", str(rep), "-q"]) == 0
    data = json.loads(rep.read_text())
    moved = [o for o in data["ops"] if o["reason"].startswith(("deny: fallback", "fallback"))
             or "fallback:" in o["reason"]]
    assert moved and all("BF16" in o["reason"] and "FP16" not in o["reason"] for o in moved)
    assert data["fallback"]["max_rel_error"] <= 1e-6


def test_bf16_loop_carried_values_run_rounded_each_iteration():
    """A ``Loop`` hands its BF16 carried value to its body as it is; the body's product is rounded
    to BF16 every iteration, as stored."""
    mk = helper.make_node
    body = helper.make_graph(
        [mk("Identity", ["cond_in"], ["cond_out"]), mk("Mul", ["v_in", "k"], ["v_out"])], "body",
        [fin("i", dtype=TensorProto.INT64), fin("cond_in", dtype=TensorProto.BOOL), fin("v_in", 3, dtype=BF16)],
        [fin("cond_out", dtype=TensorProto.BOOL), fin("v_out", 3, dtype=BF16)])
    m = model([mk("Cast", ["x"], ["xb"], to=BF16), mk("Loop", ["n", "c", "xb"], ["vb"], body=body),
               mk("Cast", ["vb"], ["y"], to=TensorProto.FLOAT)],
              [fin("x", 3)], [fin("y", 3)],
              [helper.make_tensor("n", TensorProto.INT64, [], [5]), helper.make_tensor("c", TensorProto.BOOL, [], [True]),
               _bf16_tensor("k", np.full(3, 1.1, np.float32))],
              value_info=[fin("xb", 3, dtype=BF16), fin("vb", 3, dtype=BF16)])
    x = np.array([1.0, 2.0, 3.0], np.float32)
    want, k = _bf16(x), _bf16(np.full(3, 1.1, np.float32))
    for _ in range(5):
        want = _bf16(want * k)
    np.testing.assert_array_equal(run_model(m, {"x": x})[0], want)


def test_a_node_named_like_a_value_validates_in_bf16(tmp_path):
    """Exporters name nodes like their outputs (MatMul ``h`` writing ``h``): the emulation's Casts
    were named after the values they write, and ONNX Runtime refused the copy ("two nodes with same
    node name (h)"), failing every ``--dtype bf16 --validate`` of such a model."""
    mk = helper.make_node
    m = model([mk("MatMul", ["x", "w0"], ["h"], name="h"), mk("MatMul", ["h", "w1"], ["y"], name="y")],
              [fin("x", 64, 256)], [fin("y", 64, 256)], [weight("w0", 256, 256), weight("w1", 256, 256)])
    src, out, rep = tmp_path / "m.onnx", tmp_path / "o.onnx", tmp_path / "r.json"
    onnx.save(m, src)
    assert main([str(src), "-o", str(out), "--dtype", "bf16", "--validate", "--report", str(rep), "-q"]) == 0
    assert declares_bf16(str(out))
    validation = json.loads(rep.read_text())["validation"]
    assert validation["passed"] and "emulated" in validation["emulation"]
    onnx.checker.check_model(str(out), full_check=True)
    x = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
    ref = run_model(m, {"x": x})[0]
    got = run_model(str(out), {"x": x}, bf16_file=True)[0]  # ONNX Runtime loads and runs the written file
    assert 0 < np.abs(got - ref).max() < 1e-2 * np.abs(ref).max()


def test_the_emulation_names_nothing_the_model_already_names():
    """Node and value names equal to the ones the rewrite would make, in the main graph and in an
    ``If`` branch: each name it adds is new (a clash had defined a value twice or named two nodes alike)."""
    mk = helper.make_node
    tag = "__amp_bf16emu"

    def branch(name: str) -> onnx.GraphProto:
        return helper.make_graph([mk("Add", ["h", "h"], [f"{name}_out"], name=f"{name}_out_cast")], name, [],
                                 [fin(f"{name}_out", 2, 3, dtype=BF16)])

    m = model([mk("Cast", ["x"], ["h"], to=BF16, name=f"h{tag}_f32_cast"),
               mk("Identity", ["x"], [f"h{tag}_f32"], name="h"),
               mk("If", ["c"], ["z"], then_branch=branch("then"), else_branch=branch("else"), name=f"z{tag}_f32"),
               mk("Cast", ["z"], ["y"], to=TensorProto.FLOAT, name="y_cast")],
              [fin("x", 2, 3), fin("c", dtype=TensorProto.BOOL)], [fin("y", 2, 3), fin(f"h{tag}_f32", 2, 3)],
              value_info=[fin("h", 2, 3, dtype=BF16), fin("z", 2, 3, dtype=BF16)])
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    y, passed_through = run_model(m, {"x": x, "c": np.array(True)})
    np.testing.assert_array_equal(y, _bf16(_bf16(x) * 2))
    np.testing.assert_array_equal(passed_through, x)


def test_bf16_graph_inputs_are_drawn_and_validated(tmp_path, capsys):
    """A model whose inputs are BF16 (a ``--dtype bf16 --no-keep-io-types`` output fed back in, or an
    export in BF16) failed ``--validate``, ``--calibrate`` and ``--fallback`` at once: "cannot generate
    data of type BFLOAT16", and ``--inputs`` could not help (numpy has no BF16 ONNX Runtime takes, and
    the source file was run without emulation). BF16 inputs are drawn as FP32 ones are, rounded to BF16;
    ONNX Runtime gets them as BF16 tensors, or widened where the model it runs emulates BF16."""
    from amp_compiler.input_gen import model_inputs
    from amp_compiler.validate import validate

    mk = helper.make_node
    fp32 = model([mk("MatMul", ["x", "w"], ["h"], name="mm"), mk("Relu", ["h"], ["y"], name="relu")],
                 [fin("x", 64, 256)], [fin("y", 64, 256)], [weight("w", 256, 256)])
    src, bf, out, rep = tmp_path / "m.onnx", tmp_path / "bf.onnx", tmp_path / "o.onnx", tmp_path / "r.json"
    onnx.save(fp32, src)
    assert main([str(src), "-o", str(bf), "--dtype", "bf16", "--no-keep-io-types", "--planner", "all", "-q"]) == 0
    assert [i.type.tensor_type.elem_type for i in onnx.load(bf).graph.input] == [BF16]
    feeds, how = model_inputs(onnx.load(bf))
    assert feeds["x"].dtype == ml_dtypes.bfloat16 and how["x"] == "N(0, 1), rounded to BF16"
    assert 0.5 < float(np.std(feeds["x"].astype(np.float32))) < 1.5  # drawn as floats, not integers in {0, 1}
    # the converted file fed back in, each way validation runs a model
    for extra in ([], ["--dtype", "bf16"], ["--calibrate"], ["--fallback"]):
        assert main([str(bf), "-o", str(out), "--validate", "--report", str(rep), "-q", *extra]) == 0, extra
        data = json.loads(rep.read_text())
        assert data["validation"]["passed"] and "emulated" in data["validation"]["emulation"], extra
        assert data["summary"]["inputs_drawn"]["x"].endswith("rounded to BF16"), extra
    # a BF16 input computed in FP32 behind a Cast: an FP16 plan of it, with the error it really has
    widened = model([mk("Cast", ["x"], ["xf"], name="up", to=TensorProto.FLOAT), mk("MatMul", ["xf", "w"], ["y"], name="mm")],
                    [fin("x", 64, 256, dtype=BF16)], [fin("y", 64, 256)], [weight("w", 256, 256)])
    onnx.save(widened, src)
    assert main([str(src), "-o", str(out), "--validate", "--report", str(rep), "-q"]) == 0
    validation = json.loads(rep.read_text())["validation"]
    assert validation["passed"] and 0 < validation["max_rel_error"] < 1e-2  # FP16's rounding: it did compare
    # a file of BF16 inputs (numpy.savez writes them as raw 2-byte records) and an FP32 one alike
    x = feeds["x"]
    for name, array in (("b.npz", x), ("f.npz", x.astype(np.float32))):
        np.savez(tmp_path / name, x=array)
        assert main([str(src), "-o", str(out), "--validate", "--inputs", str(tmp_path / name), "-q"]) == 0, name
    same = validate(str(src), str(out), {"x": x}, low="float16")
    assert same["max_rel_error"] == validation["max_rel_error"]  # the drawn feeds, given again
    assert capsys.readouterr().err == ""
