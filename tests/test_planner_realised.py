"""The realised plan is the priced plan: the casts pass inserts exactly the casts the energy charged."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from tests.builders import fin, model, plan_result, weight
from amp_compiler.plan_report import build_report
from passes.convert import TIE_LAUNCHES, tie_tolerance  # noqa: E402  isort: skip
from passes.costs import realised_time  # noqa: E402  isort: skip

_KINDS = ["MatMul", "Add", "Relu", "ReduceSum", "Transpose", "Tanh", "Mul", "Softmax", "Pow", "Reshape"]


def _random_graph(seed: int, n_ops: int = 14) -> onnx.ModelProto:
    """A random DAG over tensor-core, elementwise, deny, data-movement and view ops; some
    values are read several times, some are graph outputs that are also read inside."""
    rng = np.random.default_rng(seed)
    width = int(rng.choice([16, 64, 256]))
    names, nodes, inits = ["x"], [], [onnx.numpy_helper.from_array(np.array([-1, width], np.int64), "shape")]
    inits.append(weight("shared", width, width))
    for i in range(n_ops):
        kind = str(rng.choice(_KINDS))
        a, out, name = names[rng.integers(len(names))], f"t{i}", f"n{i}"
        if kind == "MatMul":
            w = "shared" if rng.random() < 0.3 else f"w{i}"
            if w != "shared":
                inits.append(weight(w, width, width))
            nodes.append(helper.make_node("MatMul", [a, w], [out], name=name))
        elif kind in ("Add", "Mul"):
            nodes.append(helper.make_node(kind, [a, names[rng.integers(len(names))]], [out], name=name))
        elif kind == "ReduceSum":
            nodes.append(helper.make_node("ReduceSum", [a], [out], name=name, keepdims=1))
        elif kind == "Pow":
            inits.append(onnx.numpy_helper.from_array(np.array(2.0, np.float32), f"p{i}"))
            nodes.append(helper.make_node("Pow", [a, f"p{i}"], [out], name=name))
        elif kind == "Reshape":
            nodes.append(helper.make_node("Reshape", [a, "shape"], [out], name=name))
        else:
            nodes.append(helper.make_node(kind, [a], [out], name=name))
        names.append(out)
    picked = sorted({names[-1], names[int(rng.integers(1, len(names)))]})
    outs = [fin(n, None) for n in picked]
    for o in outs:
        o.type.tensor_type.ClearField("shape")
    m = model(nodes, [fin("x", int(rng.choice([8, 256, 4096])), width)], outs, inits)
    return onnx.shape_inference.infer_shapes(m)


@pytest.mark.parametrize("seed", range(16))
def test_realised_casts_are_the_priced_casts(seed):
    rng = np.random.default_rng(1000 + seed)
    runtime = str(rng.choice(["eager", "ort-cuda", "tensorrt", "inductor", "inductor-cudagraphs"]))
    keep_io = bool(rng.random() < 0.7)
    objective = "memory" if rng.random() < 0.2 else "time"
    result = plan_result(_random_graph(seed), runtime=runtime, keep_io_types=keep_io, objective=objective)
    graph, report = result.graph, build_report(result)
    s = report.summary
    realised, casts = realised_time(graph, result.timer, "float16")
    assert realised == pytest.approx(s["predicted_time_mixed_s"], rel=1e-9, abs=1e-15), (runtime, keep_io)
    assert casts == s["inserted_casts"]
    if objective == "time":  # never slower than all-FP32 beyond the tie tolerance (passes.convert)
        tol = tie_tolerance(s["predicted_time_fp32_s"], TIE_LAUNCHES * result.timer.launch)
        assert s["predicted_time_mixed_s"] <= (s["predicted_time_fp32_s"] + tol) * (1 + 1e-12)
