"""``compile_training`` in mixed precision: parity with FP32 training, the underflow case,
overflow skips, the step graph's precisions, and the inductor backend.

Tiny models are launch-bound on any GPU, so the cost model keeps their GEMMs FP32; the
numerics tests use ``planner="greedy"`` (every allow op FP16) and assert that the FP16
GEMMs are really there. The graph checks use the default cost-model planner on a model
whose GEMMs are big enough to be worth FP16.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from amp_compiler.training import compile_training  # noqa: E402

F = torch.nn.functional
GEMMS = {"mm", "addmm", "bmm", "matmul", "gemm", "conv", "conv_backward"}
HOST_SYNCS = {"aten._local_scalar_dense.default", "aten.item.default", "aten.is_nonzero.default"}


def _teacher_data(shape, classes, n=512, seed=0):
    """Inputs and the labels of a fixed random linear teacher: learnable, never trivially."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, *shape, generator=g)
    teacher = torch.randn(x[0].numel(), classes, generator=g)
    return x, (x.flatten(1) @ teacher).argmax(1)


def _batches(x, y, steps, size=64):
    for i in range(steps):
        j = (i * size) % len(x)
        yield x[j:j + size], y[j:j + size]


def _train_eager(model, opt, loss_fn, x, y, steps):
    for xb, yb in _batches(x, y, steps):
        opt.zero_grad()
        loss_fn(model(xb), yb).backward()
        opt.step()


def _train_compiled(model, opt, loss_fn, x, y, steps, **kw):
    step = compile_training(model, loss_fn, opt, (x[:64], y[:64]), **kw)
    for xb, yb in _batches(x, y, steps):
        step(xb, yb)
    return step


def _full_loss(model, loss_fn, x, y) -> float:
    with torch.no_grad():
        return float(loss_fn(model(x), y))


def _fp16_gemm_fraction(step) -> float:
    return step.report.summary["fp16_gemm_flop_fraction"]


# -- 1. parity --------------------------------------------------------------------------------------

def _cnn():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.Flatten(), torch.nn.Linear(16 * 8 * 8, 4))


def test_small_cnn_trains_to_the_fp32_loss():
    x, y = _teacher_data((3, 8, 8), 4)
    steps = 200
    eager = _cnn()
    _train_eager(eager, torch.optim.Adam(eager.parameters(), lr=1e-3), F.cross_entropy, x, y, steps)
    mixed = _cnn()
    step = _train_compiled(mixed, torch.optim.Adam(mixed.parameters(), lr=1e-3), F.cross_entropy, x, y, steps,
                           planner="greedy")
    assert _fp16_gemm_fraction(step) == 1.0  # forward and backward convolutions/GEMMs ran in FP16
    start = _full_loss(_cnn(), F.cross_entropy, x, y)
    fp32, amp = _full_loss(eager, F.cross_entropy, x, y), _full_loss(mixed, F.cross_entropy, x, y)
    print(f"\nCNN, {steps} Adam steps: loss {start:.4f} -> FP32 eager {fp32:.4f}, amp-compiler {amp:.4f} "
          f"(rel diff {abs(amp - fp32) / fp32:.2%})")
    assert fp32 < 0.5 * start  # the task is learnt
    assert abs(amp - fp32) <= 0.02 * fp32


def _tiny_bert():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=32, num_labels=2,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return transformers.BertForSequenceClassification(config)


class _Logits(torch.nn.Module):
    """The model's logits as a tensor (the step's loss function takes the model's output)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids).logits


def test_small_transformer_trains_to_the_fp32_loss():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 64, (512, 16), generator=g)
    labels = (ids[:, 1] < 32).long()  # learnable from one position through attention
    steps = 200
    eager = _Logits(_tiny_bert())
    _train_eager(eager, torch.optim.AdamW(eager.parameters(), lr=2e-3), F.cross_entropy, ids, labels, steps)
    mixed = _Logits(_tiny_bert())
    step = _train_compiled(mixed, torch.optim.AdamW(mixed.parameters(), lr=2e-3), F.cross_entropy, ids, labels,
                           steps, planner="greedy")
    assert _fp16_gemm_fraction(step) == 1.0
    start = _full_loss(_Logits(_tiny_bert()), F.cross_entropy, ids, labels)
    fp32, amp = _full_loss(eager, F.cross_entropy, ids, labels), _full_loss(mixed, F.cross_entropy, ids, labels)
    print(f"\nBERT (2 layers, hidden 32), {steps} AdamW steps: loss {start:.4f} -> FP32 eager {fp32:.4f}, "
          f"amp-compiler {amp:.4f} (rel diff {abs(amp - fp32) / fp32:.2%})")
    assert fp32 < 0.5 * start
    assert abs(amp - fp32) <= 0.02 * fp32


# -- 2. the underflow case --------------------------------------------------------------------------

TINY = 1e-7  # gradients of the scaled-down loss are ~1e-9: below FP16's smallest subnormal (6e-8)


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))


def _tiny_loss(out, y):
    return F.cross_entropy(out, y) * TINY


def _adam(model):  # eps far below the gradients, so Adam's step does not depend on their scale
    return torch.optim.Adam(model.parameters(), lr=1e-2, eps=1e-30)


@pytest.mark.parametrize("planner", ["greedy", "all"])
def test_gradients_below_fp16_subnormals_need_loss_scaling(planner):  # "all": the scale stays FP32
    x, y = _teacher_data((32,), 4)
    steps = 60
    eager = _mlp()
    _train_eager(eager, _adam(eager), _tiny_loss, x, y, steps)

    unscaled = _mlp()
    before = [p.detach().clone() for p in unscaled.parameters()]
    step = _train_compiled(unscaled, _adam(unscaled), _tiny_loss, x, y, steps, planner=planner, loss_scale="none")
    assert _fp16_gemm_fraction(step) == 1.0
    weights = [i for i, p in enumerate(unscaled.parameters()) if p.dim() == 2]
    for i in weights:  # the FP16 weight-gradient GEMMs saw only zeros: the weights never moved
        assert torch.equal(before[i], list(unscaled.parameters())[i])

    scaled = _mlp()
    # "all" also runs the loss and its backward in FP16: their seed, d(loss) * scale, must be an FP16
    # number, so 2**15 (2**16 > 65504 would overflow, and be skipped, on step 1); the scale itself is FP32
    step = _train_compiled(scaled, _adam(scaled), _tiny_loss, x, y, steps, planner=planner,
                           init_scale=2.0 ** 15 if planner == "all" else 2.0 ** 16)
    assert step.skipped_steps == 0

    start = _full_loss(_mlp(), F.cross_entropy, x, y)
    fp32 = _full_loss(eager, F.cross_entropy, x, y)
    none = _full_loss(unscaled, F.cross_entropy, x, y)
    dynamic = _full_loss(scaled, F.cross_entropy, x, y)
    print(f"\nloss x {TINY:g}, {steps} Adam steps: start {start:.4f}, FP32 eager {fp32:.4f}, "
          f"FP16 without scaling {none:.4f}, FP16 with dynamic scaling {dynamic:.4f}")
    assert fp32 < 0.6 * start
    assert none > 0.9 * start
    assert abs(dynamic - fp32) <= 0.02 * fp32


# -- 3. overflow ------------------------------------------------------------------------------------

@pytest.mark.parametrize("planner", ["greedy", "all"])
def test_fp16_overflow_skips_the_step_bit_exactly_then_the_scale_recovers(planner):
    x, y = _teacher_data((32,), 4)
    model = _mlp()
    # 2**40 times the loss overflows the FP16 backward GEMMs (FP32 alone would not)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    step = compile_training(model, F.cross_entropy, opt, (x[:64], y[:64]), planner=planner,
                            init_scale=2.0 ** 40, growth_interval=3)
    before = [p.detach().clone() for p in model.parameters()]
    step(x[:64], y[:64])
    assert step.skipped_steps == 1 and step.scale == 2.0 ** 39
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert not opt.state  # a skipped first step creates no optimizer state, as GradScaler's skip
    scales = [step.scale]
    for xb, yb in _batches(x, y, 40):
        step(xb, yb)
        scales.append(step.scale)
    skipped = step.skipped_steps
    print(f"\nscale 2**40 -> {step.scale:g} after {skipped} skipped steps: {scales}")
    assert 1 < skipped < 40  # it halved until the gradients fit in FP16
    low = min(scales)
    assert max(scales[scales.index(low):]) > low  # ... then grew after clean steps
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.filterwarnings("ignore:.*the plan runs the whole step in FP32")
@pytest.mark.parametrize("planner", ["optimal", "greedy", "all"])
def test_loss_scale_state_and_arithmetic_are_fp32_under_every_planner(planner):
    x, y = _teacher_data((32,), 4)
    model = _mlp()
    step = compile_training(model, F.cross_entropy, torch.optim.Adam(model.parameters(), lr=1e-3),
                            (x[:64], y[:64]), planner=planner, init_scale=2.0 ** 15, growth_interval=1)
    step(x[:64], y[:64])
    assert step.skipped_steps == 0 and step.scale == 2.0 ** 16  # in FP16 2**16 is inf
    cap = list(step._captures.values())[-1]
    rows = [o for o in cap.report.ops if cap.report_nodes.get(o["name"]) in cap.variant.fp32_nodes]
    assert len(rows) > 10  # the seed, the scale update, the optimizer's step counts and bias corrections
    assert all(o["precision"] in ("float32", "n/a") for o in rows), [o["name"] for o in rows
                                                                     if o["precision"] not in ("float32", "n/a")]


# -- 4. graph checks --------------------------------------------------------------------------------

class _EmbeddingMLP(torch.nn.Module):
    def __init__(self, vocab=8000, d=512):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.up = torch.nn.Linear(d, 4 * d)
        self.down = torch.nn.Linear(4 * d, d)

    def forward(self, ids):
        return self.down(F.relu(self.up(self.emb(ids))))


@pytest.fixture(scope="module")
def embedding_step():
    torch.manual_seed(0)
    model = _EmbeddingMLP()
    ids, target = torch.randint(0, 8000, (64, 32)), torch.randn(64, 32, 512)  # 2048 tokens
    step = compile_training(model, F.mse_loss, torch.optim.AdamW(model.parameters()), (ids, target))
    return step, ids, target


def _after(nodes):
    """Every node that depends on one of ``nodes``."""
    seen, todo = set(), list(nodes)
    while todo:
        for user in todo.pop().users:
            if user not in seen:
                seen.add(user)
                todo.append(user)
    return seen


def test_step_graph_has_no_host_sync(embedding_step):
    step, _, _ = embedding_step
    targets = {str(n.target) for n in step.graph_module.graph.nodes if n.op == "call_function"}
    assert "aten.mm.default" in targets and not targets & HOST_SYNCS


def test_every_op_after_an_unscale_marker_is_fp32(embedding_step):
    step, ids, target = embedding_step
    gm = step.graph_module
    markers = [n for n in gm.graph.nodes if "unscale_marker" in str(n.target)]
    assert len(markers) == len(list(step.model.parameters()))
    after = {n.name for n in _after(markers)}
    rows = {step.report_nodes[o["name"]]: o for o in step.report.ops if o["name"] in step.report_nodes}
    checked = [rows[name] for name in after if name in rows]
    assert len(checked) > 5 * len(markers)  # the whole optimizer: moments, bias corrections, update, skip
    assert all(o["precision"] in ("float32", "n/a") for o in checked), \
        [o["name"] for o in checked if o["precision"] not in ("float32", "n/a")]
    # and so it runs: every float value computed after a marker is FP32
    dtypes = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            dtypes[n.name] = out.dtype if isinstance(out, torch.Tensor) else None
            return out

    Recorder(gm).run(*step._flat_inputs((ids, target), list(step._captures.values())[-1].variant))
    low = [name for name in after if dtypes.get(name) in (torch.float16, torch.bfloat16)]
    assert not low


def test_forward_and_backward_gemms_are_fp16(embedding_step):
    step, _, _ = embedding_step
    order = {n.name: i for i, n in enumerate(step.graph_module.graph.nodes)}
    loss_at = min(i for name, i in order.items() if name.startswith("mse_loss"))
    gemms = [o for o in step.report.ops if o["canonical"] in GEMMS]
    forward = [o for o in gemms if order[step.report_nodes[o["name"]]] < loss_at]
    backward = [o for o in gemms if order[step.report_nodes[o["name"]]] > loss_at]
    assert len(forward) == 2 and len(backward) == 4  # up/down; their input and weight gradients
    assert all(o["precision"] == "float16" for o in forward + backward)


def test_embedding_over_a_big_table_stays_fp32_in_training(embedding_step):
    step, _, _ = embedding_step
    ops = {o["canonical"]: o for o in step.report.ops}
    lookup = ops["embedding"]
    assert lookup["precision"] == "float32"
    assert "casts" in lookup["reason"]  # casting the whole FP32 master table every step costs more
    assert "emb.weight" not in {c["tensor"] for c in step.report.casts}
    assert {c["tensor"] for c in step.report.casts} >= {"up.weight", "down.weight"}


# -- 5. inductor ------------------------------------------------------------------------------------

def test_inductor_step_matches_the_plain_step():
    x, y = _teacher_data((32,), 4)
    plain_model, inductor_model = _mlp(), _mlp()
    plain = compile_training(plain_model, F.cross_entropy, torch.optim.AdamW(plain_model.parameters(), lr=1e-2),
                             (x[:64], y[:64]), planner="greedy")
    fused = compile_training(inductor_model, F.cross_entropy,
                             torch.optim.AdamW(inductor_model.parameters(), lr=1e-2), (x[:64], y[:64]),
                             planner="greedy", backend="inductor")
    for xb, yb in _batches(x, y, 5):
        torch.testing.assert_close(fused(xb, yb), plain(xb, yb), rtol=1e-2, atol=1e-3)
    for a, b in zip(plain_model.parameters(), inductor_model.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-2, atol=1e-3)
    assert fused.scale == plain.scale and fused.skipped_steps == plain.skipped_steps == 0


@pytest.mark.parametrize("options", [{}, {"planner": "all"}, {"dtype": "bfloat16"}],
                         ids=["default", "all", "bf16"])
def test_log_probabilities_a_loss_reads_stay_fp32(options):
    """Numerics rule 14: cross-entropy is log_softmax then nll_loss; the log-probabilities the loss
    reads stay FP32 (torch autocast keeps log_softmax FP32 for this), while the head GEMM that
    makes the logits runs low. Without the rule ``planner="all"`` had rounded them to FP16/BF16."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 4096))
    x, y = torch.randn(64, 256), torch.randint(0, 4096, (64,))
    step = compile_training(model, torch.nn.functional.cross_entropy, torch.optim.SGD(model.parameters(), lr=0.1),
                            (x, y), **options)
    step(x, y)
    ops = {o["op_type"].split(".")[1]: o for o in step.report.ops}
    assert ops["_log_softmax"]["precision"] == "float32"
    assert "log-probabilities a loss reads" in ops["_log_softmax"]["reason"]
    if options.get("planner") == "all":  # elsewhere the cost model may keep this small head FP32
        assert ops["addmm"]["precision"] == "float16"
