"""The casts pass's clean-up (rules 4-7) on hand-built graphs: what it merges and keeps."""

from __future__ import annotations

from amp_compiler.ir import ANY, FIXED, GRAPH_INPUT, UNIT, Op, PrecisionGraph, Tensor
from passes.casts import _eliminate_casts


def _cast(name: str, src: str, out: str, to: str) -> Op:
    return Op(name, "Cast", [src], [out], attrs={"to": to}, canonical="cast", op_class="clear",
              input_roles=[ANY], output_roles=[FIXED], precision=to)


def _relu(name: str, src: str, out: str, dtype: str) -> Op:
    return Op(name, "Relu", [src], [out], canonical="relu", op_class="clear",
              input_roles=[UNIT], output_roles=[UNIT], precision=dtype)


def _graph(tensors: list[tuple[str, str]], ops: list[Op]) -> PrecisionGraph:
    graph = PrecisionGraph()
    for name, dtype in tensors:
        graph.add_tensor(Tensor(name, dtype, (4,), GRAPH_INPUT if name == "x" else "activation"))
    graph.inputs = ["x"]
    for op in ops:
        graph.add_op(op)
    return graph


def test_merged_siblings_hand_their_readers_casts_that_then_merge_too():
    """x is cast to FP16 three times; two of the copies are cast back to FP32. Merging the three
    copies makes the two FP32 casts siblings on the kept copy, where they merge in turn."""
    tensors = [("x", "float32"), ("a1", "float16"), ("a2", "float16"), ("a3", "float16"),
               ("b2", "float32"), ("b3", "float32"), ("y1", "float16"), ("y2", "float32"), ("y3", "float32")]
    ops = [_cast("c1", "x", "a1", "float16"), _cast("c2", "x", "a2", "float16"), _cast("c3", "x", "a3", "float16"),
           _cast("d2", "a2", "b2", "float32"), _cast("d3", "a3", "b3", "float32"),
           _relu("r1", "a1", "y1", "float16"), _relu("r2", "b2", "y2", "float32"), _relu("r3", "b3", "y3", "float32")]
    graph = _graph(tensors, ops)
    for name in ("y1", "y2", "y3"):
        graph.tensors[name].is_graph_output = True

    removed = _eliminate_casts(graph)

    assert removed == 3
    assert [n for n, op in graph.ops.items() if op.canonical == "cast"] == ["c1", "d2"]
    assert graph.ops["d2"].inputs == ["a1"]
    assert graph.ops["r2"].inputs == ["b2"] and graph.ops["r3"].inputs == ["b2"]
