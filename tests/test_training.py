"""compile_training's captured step against eager PyTorch: every torch.optim optimizer, loss
scaling and overflow skips, optimizer-state interop, schedulers, bad input.

The MLP is tiny, so the default cost-model plan keeps the whole step FP32 (and says so):
the parity here is FP32 against FP32, to float rounding.
"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

from amp_compiler.errors import ConversionError  # noqa: E402
from amp_compiler.training import compile_training  # noqa: E402

F = torch.nn.functional


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def _batch(n=64, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 16, generator=g), torch.randint(0, 4, (n,), generator=g)


def _fp32_step(model, optimizer, loss_scale="dynamic", **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "the plan runs the whole step in FP32": known here
        step = compile_training(model, F.cross_entropy, optimizer, _batch(), loss_scale=loss_scale, **kw)
    assert step.report.summary["fp16_nodes"] == 0
    return step


def _eager_step(model, opt, x, y):
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()


def _assert_same_params(a, b, rtol=1e-5, atol=1e-6):
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(q.detach(), p.detach(), rtol=rtol, atol=atol)


OPTIMIZERS = {
    "sgd_momentum_wd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-4),
    "sgd_nesterov_foreach": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, foreach=True),
    "adam_amsgrad": lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=1e-4, amsgrad=True),
    "adamw_fused": lambda p: torch.optim.AdamW(p, lr=1e-2, fused=True),
    "rmsprop": lambda p: torch.optim.RMSprop(p, lr=1e-2, momentum=0.9, centered=True),
    "adagrad": lambda p: torch.optim.Adagrad(p, lr=1e-2, lr_decay=1e-3),
    "adamax": lambda p: torch.optim.Adamax(p, lr=1e-2),
    "nadam": lambda p: torch.optim.NAdam(p, lr=1e-2),
    "radam": lambda p: torch.optim.RAdam(p, lr=1e-2, decoupled_weight_decay=True, weight_decay=1e-2),
    "asgd": lambda p: torch.optim.ASGD(p, lr=1e-2, t0=2),
    "rprop": lambda p: torch.optim.Rprop(p, lr=1e-2),  # its lr fills a tensor (full_like), rewritten too
}


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_captured_step_matches_the_torch_optimizer(name):
    eager, captured = _mlp(), _mlp()
    opt_eager, opt_captured = OPTIMIZERS[name](eager.parameters()), OPTIMIZERS[name](captured.parameters())
    step = _fp32_step(captured, opt_captured)
    x, y = _batch()
    for i in range(5):
        _eager_step(eager, opt_eager, x, y)
        step(x, y)
        if i == 2:  # a learning-rate change between steps takes effect without re-capture
            for opt in (opt_eager, opt_captured):
                for group in opt.param_groups:
                    group["lr"] *= 0.5
    _assert_same_params(eager, captured)
    # the first step (it creates the state, Adagrad's exists already) and the steady step: lr is an input
    assert len(step.captures) == (1 if name == "adagrad" else 2)
    for (_, a), (_, b) in zip(opt_eager.state_dict()["state"].items(), opt_captured.state_dict()["state"].items()):
        assert a.keys() == b.keys()  # optimizer.state_dict() holds the captured step's state
        for k in a:
            torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-5) if isinstance(a[k], torch.Tensor) else None


@pytest.mark.parametrize("loss_scale", ["none", 1024.0])
def test_constant_and_no_loss_scale_match_eager(loss_scale):
    eager, captured = _mlp(), _mlp()
    opt_eager = torch.optim.Adam(eager.parameters(), lr=1e-2)
    step = _fp32_step(captured, torch.optim.Adam(captured.parameters(), lr=1e-2), loss_scale)
    x, y = _batch()
    for _ in range(3):
        _eager_step(eager, opt_eager, x, y)
        step(x, y)
    _assert_same_params(eager, captured)


def test_step_graph_has_no_host_sync_and_marks_every_gradient():
    model = _mlp()
    step = _fp32_step(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    x, y = _batch()
    step(x, y)
    step(x, y)  # the steady-state update graph
    targets = [str(n.target) for n in step.graph_module.graph.nodes if n.op == "call_function"]
    assert "aten.mm.default" in targets  # the graph is what we think it is
    host_syncs = {"aten._local_scalar_dense.default", "aten.item.default", "aten.is_nonzero.default"}
    assert not host_syncs & set(targets)  # SGD's alpha=-lr became tensor arithmetic
    assert sum("unscale_marker" in t for t in targets) == len(list(model.parameters()))


def test_overflow_skips_the_update_and_halves_the_scale_then_grows_back():
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    step = _fp32_step(model, opt, growth_interval=3)
    x, y = _batch()
    for _ in range(2):  # some optimizer state worth protecting
        step(x, y)
    before = [p.detach().clone() for p in model.parameters()]
    state_before = {i: {k: v.clone() for k, v in s.items()} for i, s in opt.state_dict()["state"].items()}
    bad = x.clone()
    bad[0, 0] = 3e38  # activations overflow: the gradients hold inf/NaN
    step(bad, y)
    assert step.skipped_steps == 1 and step.scale == 2.0 ** 15
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # bit-identical
    for i, s in opt.state_dict()["state"].items():
        assert all(torch.equal(state_before[i][k], v) for k, v in s.items())  # moments, step counts too
    for _ in range(3):
        step(x, y)
    assert step.skipped_steps == 1 and step.scale == 2.0 ** 16  # grown back after growth_interval steps
    assert not any(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_optimizer_and_scaler_state_round_trip_resumes_identically():
    x, y = _batch()
    a, b = _mlp(), _mlp()
    opt_a, opt_b = torch.optim.AdamW(a.parameters(), lr=1e-2), torch.optim.AdamW(b.parameters(), lr=1e-2)
    step_a = _fp32_step(a, opt_a)
    for _ in range(3):
        step_a(x, y)
    assert opt_a.state_dict()["state"][0]["step"] == 3
    b.load_state_dict(a.state_dict())
    opt_b.load_state_dict(opt_a.state_dict())  # loaded before compiling ...
    step_b = _fp32_step(b, opt_b)
    step_b.load_state_dict(step_a.state_dict())
    for _ in range(2):
        la, lb = step_a(x, y), step_b(x, y)
    assert torch.equal(la, lb) and step_b.scale == step_a.scale
    c = _mlp()
    opt_c = torch.optim.AdamW(c.parameters(), lr=1e-2)
    step_c = _fp32_step(c, opt_c)
    c.load_state_dict(a.state_dict())
    opt_c.load_state_dict(opt_a.state_dict())  # ... and after compiling
    assert torch.equal(step_a(x, y), step_c(x, y))
    _assert_same_params(a, c, rtol=0, atol=0)



def test_an_eager_grad_scalers_state_resumes_the_loss_scale():
    """A run moved from eager autocast + GradScaler to compile_training keeps its scale and growth count
    (GradScaler's state_dict has a float scale and '_growth_tracker': it had been a KeyError)."""
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step = compile_training(model, F.cross_entropy, opt, _batch(), growth_interval=3)
    scaler = torch.amp.GradScaler("cpu", init_scale=512.0, growth_interval=3)
    scaler._lazy_init_scale_growth_tracker(torch.device("cpu"))  # noqa: SLF001 - as after eager steps
    scaler._growth_tracker.fill_(2)  # noqa: SLF001
    step.load_state_dict(scaler.state_dict())
    assert step.scale == 512.0 and step.skipped_steps == 0
    step(*_batch())
    assert step.scale == 1024.0  # the third clean step grows it
    step.load_state_dict({"scale": 8.0, "growth_tracker": 0, "skipped_steps": 1})  # plain numbers too
    assert step.scale == 8.0 and step.skipped_steps == 1


def test_scheduler_steps_without_warning_and_param_groups_keep_their_hyper_parameters():
    eager, captured = _mlp(), _mlp()

    def make(m):
        opt = torch.optim.AdamW([{"params": m[0].parameters(), "weight_decay": 0.1},
                                 {"params": m[2].parameters(), "lr": 3e-3, "weight_decay": 0.0}], lr=1e-2)
        return opt, torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=6)

    (opt_e, sched_e), (opt_c, sched_c) = make(eager), make(captured)
    step = _fp32_step(captured, opt_c)
    x, y = _batch()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "lr_scheduler.step() before optimizer.step()" would fail here
        for _ in range(6):
            _eager_step(eager, opt_e, x, y)
            sched_e.step()
            step(x, y)
            sched_c.step()
    _assert_same_params(eager, captured)
    assert len(step.captures) == 2  # six learning rates, no re-capture


def _one_cycle(make_opt, max_lr: float, hyper, **step_options):
    """Ten steps of an eager model and a captured one, each under ``OneCycleLR``; the captured step,
    the optimizer and the values ``hyper(group)`` took."""
    eager, captured = _mlp(), _mlp()
    opt_eager, opt_captured = (make_opt(m.parameters()) for m in (eager, captured))
    sched_eager, sched_captured = (torch.optim.lr_scheduler.OneCycleLR(o, max_lr=max_lr, total_steps=12)
                                   for o in (opt_eager, opt_captured))
    step = _fp32_step(captured, opt_captured, **step_options)
    seen = []
    for i in range(10):
        x, y = _batch(seed=i)
        _eager_step(eager, opt_eager, x, y)
        step(x, y)
        sched_eager.step()
        sched_captured.step()
        seen.append(hyper(opt_captured.param_groups[0]))
    return eager, captured, step, seen


def test_one_cycle_lr_cycling_adamw_betas_keeps_one_capture_and_matches_eager():
    """OneCycleLR cycles betas[0] with the lr at every step: baked as constants they made a capture per
    step, and the 9th step failed at max_captures naming the (unchanged) batch shapes."""
    eager, captured, step, betas = _one_cycle(lambda p: torch.optim.AdamW(p, lr=1e-3), 1e-2, lambda g: g["betas"][0])
    assert betas[-1] != 0.95  # the scheduler did cycle it
    assert len(step.captures) <= 2  # the first step creates the optimizer state: a second layout
    _assert_same_params(captured, eager, rtol=1e-4, atol=1e-6)


def test_one_cycle_lr_cycling_sgd_momentum_keeps_one_capture_and_matches_eager():
    """OneCycleLR cycles SGD's momentum at every step (``cycle_momentum``): a constant of the graph, it
    was a capture per step until max_captures. It is a graph input now, its ``momentum != 0`` branch
    answered by the sign the capture key holds."""
    eager, captured, step, momenta = _one_cycle(lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), 0.1,
                                                lambda g: g["momentum"], max_captures=2)
    assert len(set(momenta)) == 10  # the scheduler did cycle it
    assert len(step.captures) == 2  # the first step creates the momentum buffers: a second layout
    _assert_same_params(captured, eager)


class _OwnStepSGD(torch.optim.SGD):
    """An optimizer whose ``step()`` is not torch's: it might read momentum otherwise than torch's do, so
    its hyper-parameters stay constants of the graph."""

    def step(self, closure=None):
        return super().step(closure)


def test_a_hyper_parameter_changing_every_step_names_itself_at_max_captures():
    """A graph constant (here the momentum of an optimizer with its own ``step()``) cycled by OneCycleLR is a
    capture per step; the error at max_captures had said "pad or bucket the shapes" of a batch whose shapes
    never changed."""
    model = _mlp()
    opt = _OwnStepSGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=10)
    step = _fp32_step(model, opt, max_captures=3)
    for _ in range(2):  # the first step creates the momentum buffers: the second is a capture of its own
        step(*_batch())
        sched.step()
    with pytest.warns(UserWarning, match=r"capturing step variant 3: optimizer _OwnStepSGD's hyper-parameters "
                                         r"\['momentum'\]"):
        step(*_batch())
    sched.step()
    with pytest.raises(ConversionError, match=r"max_captures=3: optimizer _OwnStepSGD's hyper-parameters "
                                              r"\['momentum'\] changed.*cycle_momentum=False"):
        step(*_batch())


def test_eval_mode_is_respected():
    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Dropout(0.5), torch.nn.Linear(32, 4))

    eager, captured = model().eval(), model().eval()
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    step = _fp32_step(captured, torch.optim.SGD(captured.parameters(), lr=0.1))
    x, y = _batch()
    for _ in range(3):  # dropout off in eval mode: deterministic, so eager and captured agree exactly
        _eager_step(eager, opt_e, x, y)
        step(x, y)
    _assert_same_params(eager, captured)
    n = len(step.captures)
    captured.train()
    step(x, y)
    assert len(step.captures) == n + 1  # the train-mode variant is its own capture


def test_unsupported_optimizer_is_a_clear_error_up_front():
    model = _mlp()
    lbfgs = torch.optim.LBFGS(model.parameters())
    with pytest.raises(ConversionError, match="optimizer LBFGS: not supported: it needs a closure"):
        _fp32_step(model, lbfgs)
    assert not lbfgs.state
    with pytest.raises(ConversionError, match="optimizer SparseAdam: not supported: it needs sparse gradients"):
        _fp32_step(model, torch.optim.SparseAdam(model.parameters()))
    with pytest.raises(ConversionError, match=r"optimizer Adafactor: not supported: it reads its step count"):
        _fp32_step(model, torch.optim.Adafactor(model.parameters()))


def test_a_model_moved_to_half_precision_before_compiling_is_warned_about():
    """``model.half()`` first: the step kept FP16 master weights and optimizer and said nothing."""
    model = _mlp().half()
    x, y = _batch()
    with pytest.warns(UserWarning, match=r"compile_training\(Sequential\): 4 of 4 floating parameters are "
                                         r"torch.float16.*call model.float\(\)"):
        compile_training(model, F.cross_entropy, torch.optim.SGD(model.parameters(), lr=0.1), (x.half(), y))



def test_a_model_moved_to_half_precision_after_compiling_is_a_clear_error():
    """``model.half()`` after compile_training had failed inside the graph ('mat1 and mat2 must have the
    same dtype') or in the optimizer's trace; now one line names the parameter and ``model.float()``."""
    model = _mlp()
    step = _fp32_step(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    step(*_batch())
    model.half()
    with pytest.raises(ValueError, match=r"parameter 0.weight is torch.float16 now, torch.float32 when compiled.*"
                                         r"model.float\(\)"):
        step(*_batch())
    model.float()
    step(*_batch())  # back to FP32: the captures run again


def test_non_scalar_loss_is_a_clear_error_before_any_state_changes():
    model = _mlp()
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.Adam(model.parameters())
    with pytest.raises(ConversionError, match=r"loss_fn: must return a scalar tensor, got shape \(64,\) \(reduce it"):
        compile_training(model, lambda out, y: F.cross_entropy(out, y, reduction="none"), opt, _batch())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters())) and not opt.state


def test_batch_unlike_the_example_is_a_clear_error_before_any_state_changes():
    model = _mlp()
    step = _fp32_step(model, torch.optim.Adam(model.parameters(), lr=1e-2))
    x, y = _batch()
    before = [p.detach().clone() for p in model.parameters()]
    for bad, message in [((x,), "takes 2 batch tensors"), ((x, y.float()), "batch item 1 is torch.float32"),
                         ((x[None], y), "batch item 0 is torch.float32 with 3 dims"),
                         ((x, [1, 2]), "batch item 1 is a list")]:
        with pytest.raises(ValueError, match=message):
            step(*bad)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert not step.optimizer.state and step.scale == 2.0 ** 16


class _TraceablePath(torch.nn.Module):
    """Takes a different path outside a compiler, as libraries do (transformers' MoE experts): a
    host read of a value, which a trace on fake tensors cannot make."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 4)

    def forward(self, x):
        if not torch.compiler.is_compiling():
            x = x * float(x.abs().max() > 0)
        return self.lin(x)


def test_the_step_is_traced_under_the_compiling_flag_as_torch_compile_traces():
    model = _TraceablePath()
    step = _fp32_step(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert torch.isfinite(step(*_batch()))
    assert not torch.compiler.is_compiling()


class _Attention(torch.nn.Module):
    """SDPA on sliced projections: the fused kernel's backward (no dropout) or the math decomposition with
    ``_safe_softmax`` (dropout), and ``slice_backward``, in the traced step."""

    def __init__(self, dropout: float):
        super().__init__()
        self.qkv, self.out, self.dropout = torch.nn.Linear(16, 48), torch.nn.Linear(16, 4), dropout

    def forward(self, x):
        q, k, v = self.qkv(x).view(8, 1, 8, 48)[..., :16], self.qkv(x).view(8, 1, 8, 48)[..., 16:32], \
            self.qkv(x).view(8, 1, 8, 48)[..., 32:]
        a = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0)
        return self.out(a.reshape(64, 16))


@pytest.mark.parametrize("planner", ["optimal", "greedy"], ids=["defaults", "greedy"])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_attention_and_its_backward_are_known_tensor_core_ops_in_the_step(dropout, planner):
    """Defaults: nothing unknown, and this tiny step stays FP32 by cost with the warning that says so;
    ``planner="greedy"`` runs the attention kernels FP16, the logsumexp FP32."""
    model = _Attention(dropout).train()
    options = {} if planner == "optimal" else {"planner": planner}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step = compile_training(model, F.cross_entropy, torch.optim.SGD(model.parameters(), lr=0.1), _batch(),
                                **options)
    assert not step.report.summary.get("unknown_ops")
    if planner == "optimal" and not step.report.summary["fp16_nodes"]:
        assert any("the plan runs the whole step in FP32" in str(w.message) for w in caught)
    if not dropout and planner == "greedy":
        ops = step.report.to_dict()["ops"]
        backward = [op for op in ops if op["op_type"].endswith("attention_for_cpu_backward.default")]
        assert backward and all(op["class"] == "allow" and op["precision"] == "float16" for op in backward)
        # the fused forward runs FP16 but its logsumexp stays FP32, as the kernel writes it: no cast
        # rounds it to FP16 between the forward and the backward that reads it
        forward = next(n for n in step.graph_module.graph.nodes
                       if str(n.target).endswith("flash_attention_for_cpu.default"))
        lse = next(u for u in forward.users if u.args[1] == 1)
        assert forward.args[0].meta["val"].dtype == torch.float16
        assert lse.meta["val"].dtype == torch.float32
        assert not any("_to_copy" in str(u.target) or "convert_element_type" in str(u.target) for u in lse.users)
    assert torch.isfinite(step(*_batch()))


@pytest.mark.parametrize("name", ["adamw_fused", "sgd_momentum_wd"])
def test_a_bias_with_entries_below_fp16s_subnormal_keeps_its_gemm_low(name):
    """Adam steps leave some bias entries near zero. Rule 6 lets an addend flush to zero, but the
    step's own optimizer update reads the parameter too (weight decay, the skip-step select: FP32
    whatever the plan), and those reads kept the GEMM adding the bias FP32 (GPT-2's c_attn)."""
    model = _mlp()
    with torch.no_grad():
        model[0].bias[:8] = 1e-9  # below FP16's smallest subnormal, 6e-8
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step = compile_training(model, F.cross_entropy, OPTIMIZERS[name](model.parameters()), _batch(),
                                planner="all")
    reasons = [o["reason"] for o in step.report.data["ops"] if o["canonical"] == "gemm"]
    assert reasons and not any("subnormal" in r for r in reasons), reasons
    forward = [o for o in step.report.data["ops"] if o["canonical"] == "gemm" and "aten.addmm" == o["name"]]
    assert forward and forward[0]["precision"] == "float16"
    with warnings.catch_warnings():  # the default planner: the tiny MLP may stay FP32, but by cost, not by the bias
        warnings.simplefilter("ignore")
        default = compile_training(model, F.cross_entropy, OPTIMIZERS[name](model.parameters()), _batch())
    reasons = [o["reason"] for o in default.report.data["ops"] if o["canonical"] == "gemm"]
    assert reasons and not any("subnormal" in r for r in reasons), reasons


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_the_returned_loss_is_not_rounded_to_the_low_dtype_under_any_planner(dtype):
    """The loss leaves the step through a detach, a clear op between the FP32 loss and the output:
    even ``planner="all"`` must not run it low (it returned BF16-rounded losses, 2.328125 for
    2.3234). The FP32 eager loss on the same parameters is the reference."""
    x, y = _batch()
    for planner in ("optimal", "all"):
        model = _mlp()
        reference = F.cross_entropy(model(x), y).item()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            step = compile_training(model, F.cross_entropy, torch.optim.SGD(model.parameters(), lr=0.1), (x, y),
                                    dtype=dtype, planner=planner)
        loss = step(x, y).item()
        assert loss != torch.tensor(loss).to(dtype).item() or loss == reference, (planner, loss)
        assert abs(loss - reference) < 2e-2 * abs(reference), (planner, loss, reference)
        if planner == "all":
            assert step.report.summary["fp16_nodes"] > 0  # the GEMMs did run low


def test_a_batch_of_a_dtype_the_model_refuses_is_refused_at_compile():
    """A float64 batch for a float32 model was traced (meta kernels do not check dtypes) and planned; the
    first step failed inside the graph. Now compile_training names the op and the dtype to pass."""
    model = _mlp()
    x, y = _batch()
    with pytest.raises(ConversionError, match=r"compile_training: aten.addmm: reads float64 and float32 tensors.*"
                                              r"pass batch inputs of that dtype"):
        compile_training(model, F.cross_entropy, torch.optim.SGD(model.parameters(), lr=0.1), (x.double(), y))


def test_a_meta_model_is_refused_with_what_to_do():
    with torch.device("meta"):
        model = _mlp()
    with pytest.raises(ValueError, match=r"compile_training\(Sequential\): the model's weights .* 'meta' device.*"
                                         r"to_empty"):
        compile_training(model, F.cross_entropy, torch.optim.SGD(model.parameters(), lr=0.1), _batch())


class _DataDependent(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 4)

    def forward(self, x):
        h = self.lin(x)
        if h.sum() > 0:  # a branch on a value
            return h * 2
        return h


def test_a_data_dependent_branch_names_the_line_and_the_fix():
    """It had read "could not be captured as one graph: Could not guard on data-dependent expression
    Eq(u0, 1)", naming neither; compile's message for the same model names both."""
    model = _DataDependent()
    with pytest.raises(ConversionError, match=r"_DataDependent, .*test_training.py:\d+ in forward: `if h.sum\(\) > 0:"
                                              r".*data-dependent Python control flow.*torch.where/torch.cond"):
        compile_training(model, F.cross_entropy, torch.optim.SGD(model.parameters(), lr=0.1), _batch())
