"""The planner's shortcuts give what the plain code gives: signatures price like op by op,
the cast table prices like ``term_cost``, the all-low ceiling like its rebuilt energy, on random
graphs and random plans."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tests.builders import rms_norm_stack
from tests.test_planner_realised import _random_graph
from amp_compiler.onnx_io.importer import import_model  # noqa: E402  isort: skip
from amp_compiler.plan import make_context  # noqa: E402  isort: skip
from passes import CastPass, ClassifyPass, ConvertPass, NumericsPass, PropagatePass  # noqa: E402  isort: skip
from passes.costs import OpTimer, TensorTerm, all_low_time, build_energy  # noqa: E402  isort: skip


def _planned(seed: int, runtime: str, keep_io_types: bool):
    graph = import_model(_random_graph(seed, n_ops=11), default_dim=8).graph
    graph.set_dim_sizes(8, None)
    ctx = make_context(runtime=runtime, keep_io_types=keep_io_types)
    for p in (ClassifyPass(), PropagatePass()):
        p(graph, ctx)
    return graph, ctx


@pytest.mark.parametrize("seed", range(8))
def test_op_signatures_price_like_each_op_alone(seed):
    runtime = ["eager", "ort-cuda", "tensorrt", "inductor"][seed % 4]
    graph, ctx = _planned(seed, runtime, seed % 2 == 0)
    shared, alone = OpTimer(graph, ctx), OpTimer(graph, ctx)
    for op in list(graph.ops.values()) * 2:  # the second round reads the signatures' numbers
        if not op.has_unit_ports:
            continue
        dtypes = ("float32", ctx.low_dtype)
        assert shared.costs(op, dtypes) == (alone.times(op, dtypes), [alone.output_bytes(op, d) for d in dtypes])
        assert shared.flops(op) == alone.flops(op)
        assert [shared.bytes(op, d) for d in dtypes] == [alone.bytes(op, d) for d in dtypes]


def _random_energy(seed: int, n_plans: int):
    """A random graph's energy with terms of every producer kind and consumers of every kind added,
    twice over (indexed under their units in ``by_unit``), and ``n_plans`` random plans of it."""
    rng = random.Random(seed)
    graph, ctx = _planned(seed, "ort-cuda", seed % 3 != 0)
    energy = build_energy(graph, ctx, OpTimer(graph, ctx))
    units = list(energy.unit_ops)
    ends = [("var", u) for u in units] + [("fixed", 0), ("fixed", 1)]
    for k in range(20):
        producer = [("free", None), ("choose", None), *ends][k % (len(ends) + 2)] if units else ("fixed", k % 2)
        consumers = rng.sample(ends, min(len(ends), rng.randint(1, 3))) + [("free", None)]
        energy.terms.append(TensorTerm(f"extra{k}", rng.random() * 1e-6, producer, consumers))
        for unit in sorted({e[1] for e in (producer, *consumers) if e[0] == "var"}):
            energy.by_unit.setdefault(unit, []).append(len(energy.terms) - 1)
    return energy, [{u: rng.randint(0, 1) for u in units} for _ in range(n_plans)]


@pytest.mark.parametrize("seed", range(8))
def test_cast_table_prices_like_term_cost(seed):
    energy, plans = _random_energy(seed, 10)
    units = list(energy.unit_ops)
    for plan in plans:
        costs = [energy.term_cost(t, plan) for t in energy.terms]
        assert energy.total(plan) == (
            energy.fixed_time + sum(energy.time_low[u] if plan[u] else energy.time_fp32[u] for u in units)
            + sum(costs), sum(1 for c in costs if c), sum(costs))


def _all_low_rebuilt(graph, ctx, timer) -> float:
    """The all-FP16 ceiling as it was first computed: every op that may go low made eligible, the
    whole energy built again and priced all low (``passes.costs.all_low_time`` skips the build)."""
    saved = {name: (op.eligible, op.unit) for name, op in graph.ops.items()}
    for op in graph.ops.values():
        op.eligible = op.has_unit_ports and not op.inserted and not op.forbid_low
    energy = build_energy(graph, ctx, timer)
    total = energy.total({u: 1 for u in energy.unit_ops})[0]
    for name, (eligible, unit) in saved.items():
        graph.ops[name].eligible, graph.ops[name].unit = eligible, unit
    return total


def _converted(m, runtime: str, keep_io_types: bool, dtype: str):
    graph = import_model(m, default_dim=8).graph
    graph.set_dim_sizes(8, None)
    ctx = make_context(runtime=runtime, keep_io_types=keep_io_types, dtype=dtype)
    for p in (ClassifyPass(), NumericsPass(), PropagatePass(), ConvertPass()):
        p(graph, ctx)
    return graph, ctx


@pytest.mark.parametrize("seed", range(16))
def test_all_low_ceiling_equals_the_rebuilt_energy(seed):
    rng = random.Random(seed)
    runtime = ["eager", "ort-cuda", "tensorrt", "inductor"][seed % 4]
    gamma = lambda block, d: np.linspace(0.5, 1.5, d, dtype=np.float32)  # noqa: E731
    # ort-cuda fuses the scaled RMSNorms: their reads are absorbed
    m = rms_norm_stack(blocks=3, gamma=gamma) if seed % 4 == 1 else _random_graph(seed, n_ops=14)
    graph, ctx = _converted(m, runtime, seed % 2 == 0, "bf16" if seed % 5 == 4 else "fp16")
    timer = OpTimer(graph, ctx)
    build_energy(graph, ctx, timer)  # as in the convert pass: the plan's energy first
    before = [(op.eligible, op.unit) for op in graph.ops.values()]
    assert all_low_time(graph, ctx, timer) == _all_low_rebuilt(graph, ctx, OpTimer(graph, ctx))
    assert [(op.eligible, op.unit) for op in graph.ops.values()] == before
    for share in (0.2, 0.5, 0.8, 1.0):  # other precisions and forbidden ops than the plan left
        for op in graph.ops.values():
            if op.has_unit_ports and rng.random() < share:
                op.precision = rng.choice(["float32", ctx.low_dtype])
                op.forbid_low = rng.choice([None, "test"])
        assert all_low_time(graph, ctx, OpTimer(graph, ctx)) == _all_low_rebuilt(graph, ctx, OpTimer(graph, ctx))
    CastPass()(graph, ctx)  # inserted casts are no units
    assert all_low_time(graph, ctx, OpTimer(graph, ctx)) == _all_low_rebuilt(graph, ctx, OpTimer(graph, ctx))


@pytest.mark.parametrize("seed", range(8))
def test_flip_deltas_price_like_one_unit_at_a_time(seed):
    energy, plans = _random_energy(seed, 5)
    units = list(energy.unit_ops)
    for plan in plans:
        expected = []
        for u in units:
            touched = energy.by_unit.get(u, ())
            before = sum(energy.term_cost(energy.terms[i], plan) for i in touched)
            flipped = {**plan, u: 1 - plan[u]}
            after = sum(energy.term_cost(energy.terms[i], flipped) for i in touched)
            expected.append(((energy.time_low[u] - energy.time_fp32[u]) * (-1 if plan[u] else 1), after - before))
        assert energy.flip_deltas(plan) == expected
