"""What a first ``amp-compile`` run on an exported ONNX file meets outside the zoo's models: every
error names the file, whichever stage raised it."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from amp_compiler.cli import main

from .builders import fin, model, weight


def _bf16_model(input_dtype: int) -> onnx.ModelProto:
    """x -> Cast(bf16) -> MatMul(bf16 W) -> Cast(float) -> y: a model already in BF16, as
    ``model.to(torch.bfloat16)`` exports it (ONNX Runtime's CPU provider has no BF16 MatMul)."""
    w = numpy_helper.from_array(np.ones((16, 16), np.float32), "W32")
    nodes = [helper.make_node("Cast", ["x"], ["xb"], name="to_bf16", to=TensorProto.BFLOAT16),
             helper.make_node("Cast", ["W32"], ["W"], name="w_bf16", to=TensorProto.BFLOAT16),
             helper.make_node("MatMul", ["xb", "W"], ["yb"], name="mm"),
             helper.make_node("Cast", ["yb"], ["y"], name="to_f32", to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "bf16", [helper.make_tensor_value_info("x", input_dtype, [2, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_model_errors_raised_without_a_file_name_it(tmp_path, capsys):
    """Inputs that cannot be drawn for a graph input (a UINT32 one; BF16 had been the case until BF16
    inputs were drawn), and ONNX Runtime refusing "the converted model", had printed no file at all;
    the line now starts with the input's path."""
    for case, dtype, extra in (("drawn", TensorProto.UINT32, []), ("ort", TensorProto.FLOAT, ["--inputs", "x.npz"])):
        path = tmp_path / f"{case}.onnx"
        onnx.save(_bf16_model(dtype), path)
        np.savez(tmp_path / "x.npz", x=np.ones((2, 16), np.float32))
        extra = [str(tmp_path / e) if e.endswith(".npz") else e for e in extra]
        status = main([str(path), "-o", str(tmp_path / "out.onnx"), "--validate", *extra])
        err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("amp-compile")]  # not progress
        assert status == 2 and len(err) == 1, err
        assert err[0].startswith(f"amp-compile: error: {path}: "), err[0]
        assert ("graph input 'x'" if case == "drawn" else "ONNX Runtime") in err[0]
        assert not (tmp_path / "out.onnx").exists()


def test_option_errors_are_not_given_the_models_name(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(_bf16_model(TensorProto.FLOAT), path)
    assert main([str(path), "--dry-run", "--dim", "seq"]) == 2
    assert capsys.readouterr().err.strip() == "amp-compile: error: --dim seq: expected NAME=SIZE with a positive integer size"


def _dropout_in_training_mode() -> onnx.ModelProto:
    """x -> MatMul -> Dropout(ratio 0.5, training_mode=True) -> MatMul -> y, as
    ``torch.onnx.export(..., training=TrainingMode.TRAINING)`` writes an MLP."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32) * 0.1, name)
               for name in ("W1", "W2")]
    consts = [numpy_helper.from_array(np.array(0.5, np.float32), "ratio"),
              numpy_helper.from_array(np.array(True), "training")]
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"], name="fc1"),
             helper.make_node("Dropout", ["h", "ratio", "training"], ["d", "mask"], name="drop"),
             helper.make_node("MatMul", ["d", "W2"], ["y"], name="fc2")]
    graph = helper.make_graph(nodes, "train", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [32, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [32, 64])], [*weights, *consts])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_validation_of_a_model_in_training_mode_compares_the_same_dropout_mask(tmp_path, capsys):
    """Validation's runs expose every value, and an unseeded Dropout then drew different masks for
    the two models: a 0.5 relative error blamed on FP16. Each random op runs seeded, both models alike."""
    path = tmp_path / "train.onnx"
    onnx.save(_dropout_in_training_mode(), path)
    status = main([str(path), "-o", str(tmp_path / "out.onnx"), "--planner", "all", "--validate",
                   "--report", str(tmp_path / "r.json")])
    import json

    validation = json.loads((tmp_path / "r.json").read_text())["validation"]
    assert status == 0 and validation["passed"], validation
    assert validation["max_rel_error"] > 0  # the plan did convert: the error measured is FP16's
    assert not any(a.name == "seed" for n in onnx.load(tmp_path / "out.onnx").graph.node for a in n.attribute)


def test_seeding_leaves_the_model_as_it_was():
    from amp_compiler.onnx_io.seeded import seeded_random_ops

    model = _dropout_in_training_mode()
    model.graph.node.append(helper.make_node("RandomNormalLike", ["y"], ["noise"], name="noise", seed=7.0))
    before = model.SerializeToString()
    with seeded_random_ops(model) as seeded:
        drop = model.graph.node[1]
        assert seeded == 1 and [a.i for a in drop.attribute if a.name == "seed"] == [0]
    assert model.SerializeToString() == before  # the user's own seed kept, ours taken off


def test_a_terminated_run_leaves_nothing_behind(tmp_path):
    """SIGTERM (``kill``, ``timeout``, a cancelled CI job) ended the process at once and left the
    hidden staging folder, with a partly written model in it, beside the output."""
    import subprocess
    import sys
    from pathlib import Path

    path = tmp_path / "train.onnx"
    onnx.save(_dropout_in_training_mode(), path)
    probe = ("import os, signal, sys\nfrom amp_compiler import atomic\nstage = atomic.Staging.path\n"
             "def path(self, dest):\n    staged = stage(self, dest)\n    staged.write_bytes(b'half')\n"
             "    os.kill(os.getpid(), signal.SIGTERM)\n    return staged\n"
             "atomic.Staging.path = path\nfrom amp_compiler.cli import main\n"
             "sys.exit(main([sys.argv[1], '-o', sys.argv[2], '-q']))")
    done = subprocess.run([sys.executable, "-c", probe, str(path), str(tmp_path / "out.onnx")], capture_output=True,
                          text=True, timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 143 and done.stderr.strip() == "amp-compile: terminated", (done.returncode, done.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.onnx"]


def test_a_destination_that_cannot_be_replaced_is_named_not_its_staged_copy(tmp_path, capsys):
    """A folder in the place of the output's ``.data`` file: the error named the hidden staged file
    (``.out.onnx.data.<hex>.tmp/out.onnx.data``), which no user knows, instead of the destination."""
    src = tmp_path / "m.onnx"
    onnx.save(_dropout_in_training_mode(), src, save_as_external_data=True, location="m.onnx.data",
              size_threshold=0)
    (tmp_path / "out.onnx.data").mkdir()
    status = main([str(src), "-o", str(tmp_path / "out.onnx"), "-q"])
    err = capsys.readouterr().err.strip()
    assert status == 2 and err.startswith(f"amp-compile: error: {tmp_path / 'out.onnx.data'}: "), err
    assert ".tmp" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.onnx.data", "out.onnx.data"]


def test_a_graph_without_ops_converts_to_itself(tmp_path, capsys):
    """An export of an identity (its output its input) had no op position for the output to live
    at: the memory estimate indexed past its table, an internal error (exit 3)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    graph = helper.make_graph([], "identity", [x], [x])
    path = tmp_path / "identity.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    out = tmp_path / "out.onnx"
    assert main([str(path), "-o", str(out), "--validate", "-q"]) == 0, capsys.readouterr().err
    assert [o.name for o in onnx.load(out).graph.output] == ["x"]


def test_an_output_that_is_a_pipe_is_refused_and_left_as_it_is(tmp_path, capsys):
    """The model is staged and renamed into place, and a rename replaces whatever is there: ``-o
    /dev/null`` as root replaced the system's null device with the model. A device or pipe (a FIFO
    here: never a system path in a test) is refused, and stays."""
    import os
    import stat

    path = tmp_path / "m.onnx"
    onnx.save(_bf16_model(TensorProto.FLOAT), path)
    fifo = tmp_path / "out.onnx"
    os.mkfifo(fifo)
    assert main([str(path), "-o", str(fifo), "-q"]) == 2
    assert "not a regular file" in capsys.readouterr().err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_an_output_that_is_a_link_is_written_through_it(tmp_path):
    """A rename over a symbolic link replaced the link (``-o /dev/stdout`` as root replaced the
    system's link); the model goes where a plain open() writes, the link's target."""
    path = tmp_path / "m.onnx"
    onnx.save(_bf16_model(TensorProto.FLOAT), path)
    (tmp_path / "models").mkdir()
    target = tmp_path / "models" / "target.onnx"
    target.write_bytes(b"old")
    link = tmp_path / "out.onnx"
    link.symlink_to(target)
    assert main([str(path), "-o", str(link), "--report", str(tmp_path / "r.json"), "-q"]) == 0
    assert link.is_symlink() and link.resolve() == target.resolve()
    assert [n.name for n in onnx.load(target).graph.node] == [n.name for n in onnx.load(path).graph.node]


def test_the_api_refuses_to_save_over_a_pipe(tmp_path):
    import os
    import stat

    import pytest

    from amp_compiler import convert_onnx
    from amp_compiler.errors import ConversionError

    result = convert_onnx(_bf16_model(TensorProto.FLOAT))
    for name, save in (("out.onnx", result.save), ("r.json", result.report.save)):
        fifo = tmp_path / name
        os.mkfifo(fifo)
        with pytest.raises((OSError, ConversionError), match="not a regular file"):
            save(fifo)
        assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.onnx", "r.json"]  # no staging folder left


def test_a_dim_sized_twice_or_without_a_name_is_refused(tmp_path, capsys):
    """``--dim seq=512 --dim seq=256`` planned at 256 with no word said (the last won)."""
    path = tmp_path / "m.onnx"
    onnx.save(_bf16_model(TensorProto.FLOAT), path)
    assert main([str(path), "--dry-run", "--dim", "seq=512", "--dim", "seq=256"]) == 2
    assert capsys.readouterr().err.strip() == ("amp-compile: error: --dim seq=256: seq is sized twice (seq=512 "
                                               "before); give each dim one size")
    assert main([str(path), "--dry-run", "--dim", "=8"]) == 2
    assert "expected NAME=SIZE" in capsys.readouterr().err


def test_a_converted_model_onnx_would_refuse_is_an_error_and_nothing_is_written(tmp_path, monkeypatch, capsys):
    """The converted model passes onnx's checker and strict type inference before anything is written:
    a conversion bug (here a Cast made to write FP16 where its reader takes FP32) is said as one line
    naming the node, not shipped as a file ONNX Runtime refuses at load with exit 0."""
    from amp_compiler import onnx_api

    real_emit = onnx_api.emit

    def broken_emit(imp, result):
        m = real_emit(imp, result)
        cast = next(n for n in m.graph.node if n.op_type == "Cast" and n.attribute[0].i == TensorProto.FLOAT)
        cast.attribute[0].i = TensorProto.FLOAT16  # its FP32 reader now reads FP16
        return m

    monkeypatch.setattr(onnx_api, "emit", broken_emit)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
             helper.make_node("Softmax", ["h"], ["p"], name="sm"),
             helper.make_node("ReduceSum", ["p"], ["y"], name="sum", keepdims=1)]
    m = model(nodes, [fin("x", 64, 256)], [fin("y", 64, 1)], [weight("W", 256, 256)])
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    src.write_bytes(m.SerializeToString())
    status = main([str(src), "-o", str(out), "-q"])
    err = capsys.readouterr().err
    assert status == 2 and not out.exists() and list(tmp_path.iterdir()) == [src]
    assert "the converted model fails ONNX's check" in err and "a bug in amp-compiler" in err and "m.onnx" in err


def test_a_model_already_in_bf16_is_counted_as_bf16_in_the_summary(tmp_path):
    """Planned for FP16, a model exported in BF16 keeps its BF16 ops; the summary's node count had
    labelled them by the plan's dtype ("3 FP16"), while the class table said BF16."""
    from amp_compiler import convert_onnx

    _, report = convert_onnx(_bf16_model(TensorProto.FLOAT))
    lows = [o for o in report.ops if o["precision"] == "bfloat16"]
    assert lows and report.summary["dtype"] == "float16"
    nodes_line = next(line for line in str(report).splitlines() if line.strip().startswith("nodes"))
    assert f"{len(lows)} BF16" in nodes_line and "FP16" not in nodes_line


def _mlp() -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "W")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"), helper.make_node("Relu", ["h"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 64])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_an_output_rewritten_in_one_file_takes_its_former_data_file_with_it(tmp_path):
    """``-o out.onnx`` over an earlier output with external data, now written in one file, had left
    ``out.onnx.data`` beside it: stale, as large as the old weights, and read by nothing. It goes once
    the new model is in place; not before (a failed validation leaves the old pair), and not a
    ``.data`` file the old output did not read (not ours)."""
    import onnxruntime as ort

    external, inline = tmp_path / "ext" / "m.onnx", tmp_path / "m.onnx"
    external.parent.mkdir()
    onnx.save(_mlp(), external, save_as_external_data=True, location="m.onnx.data", size_threshold=0)
    onnx.save(_mlp(), inline)
    out, data = tmp_path / "out.onnx", tmp_path / "out.onnx.data"
    assert main([str(external), "-o", str(out), "--planner", "all", "-q"]) == 0
    assert data.is_file() and data.stat().st_size == 64 * 64 * 2  # external data in, external data out
    before = (out.read_bytes(), data.read_bytes())
    assert main([str(inline), "-o", str(out), "--planner", "all", "--validate", "--tolerance", "1e-12", "-q"]) == 1
    assert (out.read_bytes(), data.read_bytes()) == before  # nothing published: the old pair still holds
    assert main([str(inline), "-o", str(out), "--planner", "all", "-q"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ext", "m.onnx", "out.onnx"]
    assert [t.data_location for t in onnx.load(out, load_external_data=False).graph.initializer] == [0]
    ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    data.write_bytes(b"the user's own")  # beside a one-file output that does not read it
    assert main([str(inline), "-o", str(out), "--planner", "all", "-q"]) == 0
    assert data.read_bytes() == b"the user's own"
    assert sorted(p.name for p in external.parent.iterdir()) == ["m.onnx", "m.onnx.data"]


def test_a_data_file_the_input_reads_is_protected_when_the_input_is_loaded_into_memory(tmp_path, capsys):
    """``--calibrate`` (and ``--fallback``) load the input's external data into memory, which clears
    the model's references to its files; the output's ``.data`` file was then checked against the
    input file alone, and an input reading ``out.onnx.data`` had that file replaced by the output's
    weights (then removed, were the output written in one file over an earlier one reading it)."""
    src = tmp_path / "m.onnx"
    onnx.save(_mlp(), src, save_as_external_data=True, location="out.onnx.data", size_threshold=0)
    data = tmp_path / "out.onnx.data"
    before = data.read_bytes()
    status = main([str(src), "-o", str(tmp_path / "out.onnx"), "--calibrate", "-q"])
    err = capsys.readouterr().err.strip()
    assert status == 2 and "out.onnx.data would overwrite an input file" in err, err
    assert data.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "out.onnx.data"]
