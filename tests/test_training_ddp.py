"""compile_training on a DistributedDataParallel model: 2 CPU processes, gloo, localhost.

Each rank trains 10 mixed-precision steps (FP16 GEMMs, ``planner="greedy"``) on its own data
and, beside it, an eager FP32 DDP copy; the gradients are all-reduced inside the captured
step. Both ranks must end with identical parameters, within 1e-2 (relative norm) of eager. A
batch-norm model's buffers must follow eager's on both ranks (DDP broadcasts rank 0's before each
forward).
"""

from __future__ import annotations

import os
import socket
import warnings

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

STEPS = 10


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))


def _bn_buffers(x: torch.Tensor, y: torch.Tensor) -> list[tuple[list, list]]:
    """(captured, eager) running statistics of a batch-norm model after 3 DDP steps: each rank's had
    drifted on its own data, DDP's forward broadcasts rank 0's (``broadcast_buffers=True``)."""
    from amp_compiler.training import compile_training

    def bn():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.Linear(32, 4))

    F = torch.nn.functional
    eager, mixed = torch.nn.parallel.DistributedDataParallel(bn()), torch.nn.parallel.DistributedDataParallel(bn())
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step = compile_training(mixed, F.cross_entropy, torch.optim.SGD(mixed.parameters(), lr=0.1), (x, y))
    for _ in range(3):
        opt_e.zero_grad()
        F.cross_entropy(eager(x), y).backward()
        opt_e.step()
        step(x, y)
    return [(m.float().tolist(), e.float().tolist()) for m, e in zip(mixed.buffers(), eager.buffers())]


def _rank(rank: int, world: int, port: int, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from amp_compiler.training import compile_training

        F = torch.nn.functional
        g = torch.Generator().manual_seed(rank)  # every rank its own data
        x, y = torch.randn(32, 16, generator=g), torch.randint(0, 4, (32,), generator=g)
        eager = torch.nn.parallel.DistributedDataParallel(_mlp())
        opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-2)
        mixed = torch.nn.parallel.DistributedDataParallel(_mlp())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            step = compile_training(mixed, F.cross_entropy, torch.optim.AdamW(mixed.parameters(), lr=1e-2), (x, y),
                                    planner="greedy")
        for _ in range(STEPS):
            opt_e.zero_grad()
            F.cross_entropy(eager(x), y).backward()
            opt_e.step()
            step(x, y)
        before = [p.detach().clone() for p in mixed.parameters()]
        try:  # eager's accumulate-under-no_sync habit: this updating call had silently all-reduced and updated
            with mixed.no_sync():
                step(x, y)
            no_sync = "ran"
        except ValueError as exc:
            no_sync = str(exc) if all(torch.equal(a, b) for a, b in zip(before, mixed.parameters())) else "changed"
        queue.put((rank, [p.detach().tolist() for p in mixed.parameters()],
                   [p.detach().tolist() for p in eager.parameters()], step.skipped_steps,
                   step.report.summary["fp16_gemm_flop_fraction"],
                   sum("all_reduce" in str(n.target) for n in step.graph_module.graph.nodes), no_sync,
                   _bn_buffers(x + rank, y)))
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed gloo")
def test_ddp_two_ranks_identical_parameters_close_to_eager_data_parallel_fp32():
    ctx = torch.multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, 2, port, queue)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        results = sorted(queue.get(timeout=240) for _ in procs)
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    (_, mixed0, eager0, skipped0, fp16_0, reduces, no_sync, _), (_, mixed1, _, skipped1, *_) = results
    assert "inside DistributedDataParallel.no_sync() on call 1 of accumulation_steps=1" in no_sync
    assert fp16_0 == 1.0 and skipped0 == skipped1 == 0
    assert reduces == len(mixed0)  # one all-reduce per gradient, inside the captured step
    assert mixed0 == mixed1  # every rank applied the same update, bit for bit
    start = [p.detach() for p in _mlp().parameters()]
    for m, e, s in zip(mixed0, eager0, start):
        m, e = torch.tensor(m), torch.tensor(e)
        assert not torch.equal(e, s)  # training moved the parameters
        assert float((m - e).norm() / e.norm()) <= 1e-2
    for *_, buffers in results:
        for m, e in buffers:
            torch.testing.assert_close(torch.tensor(m), torch.tensor(e), rtol=1e-4, atol=1e-5)
