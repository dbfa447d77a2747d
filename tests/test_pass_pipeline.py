"""classify / propagate / convert / casts / align on hand-built IR: contracts, honest ``modified``,
the typed plan result, and the no-op and negative cases of each pass."""

from __future__ import annotations

import numpy as np
import pytest

from amp_compiler.plan import make_context, run_passes
from passes import AlignPass, CastPass, ClassifyPass, ConvertPass, NumericsPass, PropagatePass, casts, classify
from passes.base import PassError
from passes.result import AlignmentFinding, PlanResult

from .builders import IRBuilder

BIG = (4096, 4096)


def _mlp(shape=BIG, k: int | None = None) -> IRBuilder:
    """x -> MatMul -> ReduceSum (deny) -> MatMul: big enough that FP16 pays on an A100."""
    b = IRBuilder(shape)
    x = b.input("x")
    w_shape = (shape[1], k or shape[1])
    h = b.op("MatMul", [x, b.const("w1", np.zeros(w_shape))], "mm1", shape=(shape[0], w_shape[1]))
    m = b.op("ReduceSum", [h], "sum")
    b.output(b.op("MatMul", [m, b.const("w2", np.zeros((w_shape[1], w_shape[1])))], "mm2"))
    return b


def test_classify_gives_classes_and_roles_and_a_second_run_changes_nothing():
    b = _mlp((64, 64))
    first, second = b.run(ClassifyPass(), ClassifyPass())
    ops = b.graph.ops
    assert [ops[n].op_class for n in ("mm1", "sum", "mm2")] == ["allow", "deny", "allow"]
    assert ops["mm1"].input_roles == ["unit", "unit"] and ops["mm1"].tensor_core
    assert first.modified and not second.modified
    assert first.details == "2 allow, 1 deny"


def test_classify_ensures_checks_each_kind_of_op_where_its_roles_were_worked_out(monkeypatch):
    roles = classify._roles

    def one_role_short(op, *args):
        ins, outs, forbid_low, source_dtype = roles(op, *args)
        return (ins[:-1] if op.op_type == "ReduceSum" else ins), outs, forbid_low, source_dtype

    monkeypatch.setattr(classify, "_roles", one_role_short)
    with pytest.raises(PassError, match=r"classify: ensures violated: every op has a class and a role per port "
                                        r"\(ReduceSum \(1 inputs, 1 outputs\)\)"):
        _mlp((64, 64)).run(ClassifyPass())


def test_classify_unknown_op_is_class_unknown_with_reason():
    b = IRBuilder((8, 8))
    b.output(b.op("MyCustomOp", [b.input("x")], "custom"))
    b.run(ClassifyPass())
    op = b.graph.ops["custom"]
    assert op.op_class == "unknown" and "not in the registry" in op.reason


def test_propagate_requires_classes():
    b = _mlp((64, 64))
    with pytest.raises(PassError, match="propagate: requires violated: every op has a class"):
        PropagatePass()(b.graph, make_context())


def test_propagate_marks_deny_fp32_and_allow_components_eligible():
    b = _mlp((64, 64))
    _, _, prop = b.run(ClassifyPass(), NumericsPass(), PropagatePass())
    ops = b.graph.ops
    assert ops["mm1"].eligible and ops["mm2"].eligible
    assert not ops["sum"].eligible and ops["sum"].precision == "float32"
    assert prop.modified and prop.details == "2 of 3 ops eligible"


def test_propagate_leaves_an_op_out_of_reach_of_tensor_cores_in_its_source_dtype():
    b = IRBuilder((64, 64))
    b.output(b.op("Relu", [b.input("x")], "relu"))
    b.run(ClassifyPass(), NumericsPass(), PropagatePass())
    op = b.graph.ops["relu"]
    assert not op.eligible and op.precision == "float32" and "not connected to a tensor-core op" in op.reason


def test_convert_puts_big_gemms_low_and_ensures_eligible_ops_have_a_precision():
    b = _mlp()
    *_, conv = b.run(ClassifyPass(), NumericsPass(), PropagatePass(), ConvertPass(), target="a100")
    ops = b.graph.ops
    assert ops["mm1"].precision == ops["mm2"].precision == "float16"
    assert conv.modified
    pred = conv.output.prediction
    # x in, h to FP32 for the sum, m back to FP16, the output back to FP32 (keep_io_types)
    assert pred.mixed_s < pred.fp32_s and pred.casts == 4


def test_convert_keeps_a_launch_bound_graph_fp32_and_says_why():
    b = _mlp((8, 8))
    *_, conv = b.run(ClassifyPass(), NumericsPass(), PropagatePass(), ConvertPass(), target="h100")
    ops = b.graph.ops
    assert ops["mm1"].precision == "float32" and "kept FP32 by the cost model" in ops["mm1"].reason
    assert conv.output.prediction.mixed_s == pytest.approx(conv.output.prediction.fp32_s)


def test_convert_ensures_fail_on_an_eligible_op_without_precision():
    class Broken(ConvertPass):
        def call(self, graph, ctx):
            result = super().call(graph, ctx)
            graph.ops["mm1"].precision = None
            return result

    b = _mlp()
    b.run(ClassifyPass(), NumericsPass(), PropagatePass())
    with pytest.raises(PassError, match="convert: ensures violated: every eligible op has a precision \\(mm1\\)"):
        Broken()(b.graph, make_context(target="a100"))


def test_casts_make_unit_ports_carry_the_op_precision():
    b = _mlp()
    *_, casts = b.run(ClassifyPass(), NumericsPass(), PropagatePass(), ConvertPass(), CastPass(), target="a100")
    g = b.graph
    assert casts.modified and casts.output.inserted == 4 and casts.output.folded == 2
    assert casts.output.original_dtypes["mm1_out"] == "float32" and g.tensors["mm1_out"].dtype == "float16"
    total = g.ops["sum"]
    assert g.tensors[total.inputs[0]].dtype == "float32"  # it reads a cast of mm1's output


def test_casts_on_an_all_fp32_plan_change_nothing():
    b = _mlp((8, 8))
    *_, casts = b.run(ClassifyPass(), NumericsPass(), PropagatePass(), ConvertPass(), CastPass())
    assert not casts.modified and casts.details == "0 casts inserted, 0 constants folded, 0 casts removed"


def test_casts_ensures_catches_a_port_left_in_the_wrong_dtype():
    """On a graph it did not just plan, the check walks every port of every op."""
    b = _mlp()
    b.run(ClassifyPass(), NumericsPass(), PropagatePass(), ConvertPass(), CastPass())
    b.graph.tensors["mm1_out"].dtype = "float32"
    with pytest.raises(PassError, match=r"casts: ensures violated: every op's unit ports carry its precision "
                                        r"\(mm1 out\[0\]"):
        CastPass().ensures(b.graph, make_context())


def test_casts_ensures_catches_a_cast_its_own_rewrite_got_wrong(monkeypatch):
    """After ``call``, the ports it rewired are checked again: a cast that converts nothing leaves
    mm1 reading FP32 x in FP16."""
    make_cast = casts.make_cast

    def converting_nothing(graph, t, dtype, out_name=None):
        out, cast = make_cast(graph, t, dtype, out_name)
        out.dtype = t.dtype
        return out, cast

    monkeypatch.setattr(casts, "make_cast", converting_nothing)
    b = _mlp()
    b.run(ClassifyPass(), NumericsPass(), PropagatePass(), ConvertPass())
    with pytest.raises(PassError, match=r"casts: ensures violated: every op's unit ports carry its precision "
                                        r"\(mm1 in\[0\]"):
        CastPass()(b.graph, make_context())


def test_align_reports_dims_off_the_tensor_core_granularity_and_never_modifies():
    b = _mlp((4096, 4096), k=4092)
    *_, align = b.run(ClassifyPass(), NumericsPass(), PropagatePass(), ConvertPass(), CastPass(), AlignPass(),
                      target="a100")
    assert not align.modified
    findings = {f.op: f for f in align.output.findings}
    assert set(findings) == {"mm1", "mm2"}
    assert findings["mm1"].dims == {"N": 4092}
    assert "N=4092 (pad to 4096)" in findings["mm1"].message
    assert findings["mm2"].dims == {"N": 4092, "K": 4092}


def test_align_finds_nothing_in_fp32_or_aligned_graphs():
    b = _mlp((8, 12))  # misaligned, but kept FP32
    *_, align = b.run(ClassifyPass(), NumericsPass(), PropagatePass(), ConvertPass(), CastPass(), AlignPass())
    assert align.output.findings == () and align.details == "0 misaligned tensor-core ops"


def test_run_passes_returns_a_typed_plan_result_with_records_by_name():
    b = _mlp((4096, 4092))
    result = run_passes(b.graph, make_context(target="a100"), "mlp")
    assert isinstance(result, PlanResult)
    assert [r.name for r in result.records] == ["classify", "numerics", "propagate", "convert", "casts", "align"]
    assert result.record("casts").details.startswith("4 casts inserted")
    assert result.prediction.mixed_s < result.prediction.fp32_s
    assert result.original_dtypes["mm2_out"] == "float32"
    assert all(isinstance(f, AlignmentFinding) for f in result.alignment) and result.alignment
    assert result.timer.flops(b.graph.ops["mm1"]) == 2.0 * 4096 * 4092 * 4092
    assert not hasattr(b.graph, "meta")
    assert not hasattr(make_context(), "alignment")


@pytest.mark.parametrize("allowed", [True, False])
def test_an_unknown_op_the_user_allows_is_planned_like_a_known_one(allowed):
    b = IRBuilder((64, 64))
    b.output(b.op("MyOp", [b.op("MatMul", [b.input("x"), b.input("w")], "mm")], "custom"))
    b.run(ClassifyPass(), NumericsPass(), PropagatePass(), ConvertPass(), allow={"MyOp"} if allowed else (),
          planner="all")
    op = b.graph.ops["custom"]
    if allowed:
        assert op.op_class == "allow" and op.input_roles == ["unit"] and op.precision == "float16"
    else:
        assert op.op_class == "unknown" and op.input_roles == ["fixed"] and "not in the registry" in op.reason
