"""The planner's shortcuts give what the plain code gives: signatures price like op by op,
the cast table prices like ``term_cost``, on random graphs and random plans."""

from __future__ import annotations

import random

import pytest

from tests.test_planner_realised import _random_graph
from amp_compiler.onnx_io.importer import import_model  # noqa: E402  isort: skip
from amp_compiler.plan import make_context  # noqa: E402  isort: skip
from passes import ClassifyPass, PropagatePass  # noqa: E402  isort: skip
from passes.costs import OpTimer, TensorTerm, build_energy  # noqa: E402  isort: skip


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


@pytest.mark.parametrize("seed", range(8))
def test_cast_table_prices_like_term_cost(seed):
    rng = random.Random(seed)
    graph, ctx = _planned(seed, "ort-cuda", seed % 3 != 0)
    energy = build_energy(graph, ctx, OpTimer(graph, ctx))
    units = list(energy.unit_ops)
    ends = [("var", u) for u in units] + [("fixed", 0), ("fixed", 1)]
    for k in range(20):  # every producer kind, consumers of every kind, twice over
        producer = [("free", None), ("choose", None), *ends][k % (len(ends) + 2)] if units else ("fixed", k % 2)
        energy.terms.append(TensorTerm(f"extra{k}", rng.random() * 1e-6, producer,
                                       rng.sample(ends, min(len(ends), rng.randint(1, 3))) + [("free", None)]))
    for _ in range(10):
        plan = {u: rng.randint(0, 1) for u in units}
        costs = [energy.term_cost(t, plan) for t in energy.terms]
        assert energy.total(plan) == (
            energy.fixed_time + sum(energy.time_low[u] if plan[u] else energy.time_fp32[u] for u in units)
            + sum(costs), sum(1 for c in costs if c), sum(costs))
