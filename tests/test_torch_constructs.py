"""Python constructs through ``amp_compiler.compile``: they work, or fail naming the construct.

Control flow, in-place ops, buffers (BatchNorm running statistics in train mode), several
outputs, keyword arguments; plus the module contract: FP32 parameters shared with the
model, folded FP16 copies that follow the master, the captured train/eval mode. Models are
small MLP/CNN blocks planned for a T4, whose FP32 rate is 8x below its FP16 tensor-core rate,
so their GEMMs go FP16 at these sizes.
"""

from __future__ import annotations

import copy
import warnings

import pytest

torch = pytest.importorskip("torch")

import amp_compiler  # noqa: E402
from amp_compiler import ConversionError  # noqa: E402
from benchmarks.torch_amp import count_casts, rel_error  # noqa: E402

nn = torch.nn
TARGET = "t4"


def _seeded(module_fn):
    torch.manual_seed(0)
    return module_fn()


class Block(nn.Module):
    """Linear -> GELU -> Linear with a residual and a LayerNorm; GEMMs big enough for FP16."""

    def __init__(self, d: int = 256):
        super().__init__()
        self.up, self.down, self.norm = nn.Linear(d, 4 * d), nn.Linear(4 * d, d), nn.LayerNorm(d)

    def forward(self, x):
        return self.norm(x + self.down(nn.functional.gelu(self.up(x))))


def _fp16_gemms(report) -> list[str]:
    return [o["name"] for o in report.ops if o["class"] == "allow" and o["precision"] == "float16"]


def test_shape_dependent_python_control_flow_is_specialised():
    class Loop(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Block()

        def forward(self, x):
            for _ in range(x.shape[0] // 256):  # depends on a shape: unrolled at capture
                x = self.block(x)
            if x.dim() == 2:  # depends on a constant
                x = x * 2
            return x

    model, x = _seeded(Loop).eval(), torch.randn(512, 256)
    compiled = amp_compiler.compile(model, x, target=TARGET)
    assert len(_fp16_gemms(compiled.report)) == 4  # two unrolled iterations
    with torch.no_grad():
        assert rel_error(model(x), compiled(x)) < 1e-2
        longer = torch.randn(768, 256)  # another size: captured with the batch Dim.AUTO (three iterations)
        assert rel_error(model(longer), compiled(longer)) < 1e-2
        assert compiled.plans == 2 and len(_fp16_gemms(compiled.report)) == 6
        assert list(compiled.report.summary["dim_values"].values()) == [768]  # symbolic, sized by the call
        odd = torch.randn(1000, 256)  # 1000 // 256 == 3 too: the symbolic plan's guards take it
        assert rel_error(model(odd), compiled(odd)) < 1e-2 and compiled.plans == 2
        four = torch.randn(1024, 256)  # four iterations: outside its guards, so another capture
        assert rel_error(model(four), compiled(four)) < 1e-2
    assert compiled.plans == 3 and len(_fp16_gemms(compiled.report)) == 8
    assert compiled.capture == "torch.export"


def test_a_symbolic_plan_is_sized_by_the_largest_call_seen():
    """A small call arriving second makes the symbolic plan, but later calls are as large as the
    example: the cost model prices the plan at the largest size each dim took."""
    model = _seeded(Block).eval()
    compiled = amp_compiler.compile(model, torch.randn(512, 256), target=TARGET)
    with torch.no_grad():
        x = torch.randn(64, 256)
        assert rel_error(model(x), compiled(x)) < 1e-2
    assert list(compiled.report.summary["dim_values"].values()) == [512]
    assert compiled.report.summary["fp16_gemm_flop_fraction"] == 1.0


class _Pinned(nn.Module):
    """A block whose output depends on a Python float of its batch size: export specialises that
    dim whatever ``dynamic_shapes`` says, so every batch size is a plan of its own."""

    def __init__(self):
        super().__init__()
        self.block = Block()

    def forward(self, x):
        return self.block(x) * (1.0 / float(x.shape[0]))


def test_shapes_the_model_pins_get_static_plans_and_a_full_cache_warns():
    model = _seeded(_Pinned).eval()
    compiled = amp_compiler.compile(model, torch.randn(256, 256), target=TARGET, max_plans=2)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")  # within max_plans: no warning
        x = torch.randn(384, 256)
        assert rel_error(model(x), compiled(x)) < 1e-2
    assert compiled.plans == 2 and compiled.report.summary["dim_values"] == {}  # Dim.AUTO pinned: static
    with torch.no_grad(), pytest.warns(UserWarning, match=r"max_plans=2 plans; the plan for \(512, 256\) replaced "
                                                            r"the least recently used one \(\(256, 256\)\)"):
        x = torch.randn(512, 256)
        assert rel_error(model(x), compiled(x)) < 1e-2
    assert compiled.plans == 2


def test_a_symbolic_capture_that_fails_falls_back_to_static_plans(monkeypatch):
    """When the automatic ``Dim.AUTO`` capture fails, the call gets a static plan, and later sizes of
    the same ranks are not tried symbolically again."""
    import amp_compiler.export_route as api

    model, calls = _seeded(Block).eval(), []
    real = api.export_graph

    def export(*args, dynamic_shapes=None, **kwargs):
        calls.append(dynamic_shapes)
        if dynamic_shapes is not None:
            raise ConversionError("Block", "forward", "symbolic capture refused (test)")
        return real(*args, dynamic_shapes=dynamic_shapes, **kwargs)

    monkeypatch.setattr(api, "export_graph", export)
    compiled = amp_compiler.compile(model, torch.randn(256, 256), target=TARGET)
    with torch.no_grad():
        for n in (384, 512):
            x = torch.randn(n, 256)
            assert rel_error(model(x), compiled(x)) < 1e-2
    assert compiled.plans == 3 and compiled.capture == "torch.export"
    assert [c is not None for c in calls] == [False, True, False, False]  # one symbolic try, then static


def test_data_dependent_control_flow_falls_back_to_dynamo_with_graph_breaks():
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.block, self.head = Block(), Block()

        def forward(self, x):
            y = self.block(x)
            if x[0, 0] > 0:  # torch.export cannot capture this; dynamo breaks the graph here
                return self.head(y)
            return -y

    model, x = _seeded(Branchy).eval(), torch.randn(512, 256)
    x[0, 0] = 1.0
    compiled = amp_compiler.compile(model, x, target=TARGET)
    summary = compiled.report.summary
    assert compiled.capture.startswith("torch.compile") and summary["capture"] == compiled.capture
    assert summary["graphs"] >= 2 and {o["graph"] for o in compiled.report.ops} == set(range(summary["graphs"]))
    assert len(_fp16_gemms(compiled.report)) == 4  # both blocks, in two graphs, planned
    with torch.no_grad():
        assert rel_error(model(x), compiled(x)) < 1e-2
        assert rel_error(model(-x), compiled(-x)) < 1e-2  # the other branch: compiled when first taken


def test_a_model_no_route_captures_fails_naming_module_and_construct():
    @torch._dynamo.disable  # dynamo leaves it to eager: no graph; torch.export meets the branch on a value
    def gate(block, x):
        return block(x) if x.sum() > 0 else x

    class Gated(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Block()

        def forward(self, x):
            return gate(self.block, x)

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.gated = Gated()

        def forward(self, x):
            return self.gated(x)

    with pytest.raises(ConversionError) as err:
        amp_compiler.compile(_seeded(Outer).eval(), torch.randn(512, 256), target=TARGET)
    message = str(err.value)
    assert "\n" not in message and message.startswith("Outer: module gated (Gated)")
    assert "test_torch_constructs.py" in message and "`return block(x) if x.sum() > 0 else x`" in message
    assert "data-dependent Python control flow" in message and "dynamo captured no graph" in message
    assert "next: " in message


def test_a_scripted_submodule_is_named_with_the_fix():
    class Scripted(nn.Module):
        def __init__(self):
            super().__init__()
            self.act = torch.jit.script(nn.Sequential(nn.Linear(32, 32), nn.ReLU()))
            self.out = nn.Linear(32, 32)

        def forward(self, x):
            return self.out(self.act(x))

    with pytest.raises(ConversionError) as err:  # export's TypeError had come with advice about branches
        amp_compiler.compile(Scripted().eval(), (torch.randn(2, 32),))
    message = str(err.value)
    assert "\n" not in message and "next: submodule act (Sequential) is torch.jit.script-ed" in message
    assert "torch.where" not in message


def test_in_place_ops_are_functionalised():
    class InPlace(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Block()

        def forward(self, x):
            h = self.block(x)
            h.mul_(0.5)
            h += x
            torch.relu_(h)
            return h

    model, x = _seeded(InPlace).eval(), torch.randn(512, 256)
    compiled = amp_compiler.compile(model, x, target=TARGET)
    assert len(_fp16_gemms(compiled.report)) == 2
    with torch.no_grad():
        assert rel_error(model(x), compiled(x)) < 1e-2


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(32, 64, 3, padding=1, bias=False)  # BN cancels a conv bias (zero gradient)
        self.bn, self.fc = nn.BatchNorm2d(64), nn.Linear(64, 10)

    def forward(self, x):
        h = torch.relu(self.bn(self.conv(x)))
        return self.fc(h.mean((2, 3)))


def test_batchnorm_buffers_update_in_train_mode_and_gradients_reach_fp32_weights():
    model = _seeded(ConvBN).train()
    twin = copy.deepcopy(model)
    x = torch.randn(16, 32, 32, 32)
    compiled = amp_compiler.compile(twin, x, target=TARGET)
    conv = next(o for o in compiled.report.ops if o["op_type"] == "aten.convolution.default")
    assert conv["precision"] == "float16"
    bn = next(o for o in compiled.report.ops if "batch_norm" in o["op_type"])
    assert bn["precision"] == "float16"  # statistics stay FP32 (fx_io.schemas case 4)
    for step in range(2):
        target = torch.randn(16, 10)
        (model(x) * target).sum().backward()
        (compiled(x) * target).sum().backward()
    assert twin.bn.num_batches_tracked.item() == model.bn.num_batches_tracked.item() == 2
    assert twin.bn.running_mean.dtype == torch.float32
    assert rel_error(model.bn.running_mean, twin.bn.running_mean) < 1e-2
    assert rel_error(model.bn.running_var, twin.bn.running_var) < 1e-2
    for p, q in zip(model.parameters(), twin.parameters()):
        assert q.dtype == q.grad.dtype == torch.float32
        assert rel_error(p.grad, q.grad) < 5e-2  # FP16 backward through the conv: ~2e-2 here
    # training graph: the weight casts stay run-time ops, so gradients flow through them
    assert any(c["tensor"] == "conv.weight" for c in compiled.report.casts)


class _DropBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.bn, self.drop, self.down = nn.Linear(64, 128), nn.BatchNorm1d(128), nn.Dropout(0.5), nn.Linear(128, 8)

    def forward(self, x):
        return self.down(self.drop(torch.relu(self.bn(self.up(x)))))


@pytest.mark.parametrize("planner", ["greedy", "optimal"])  # FP16 GEMMs at this size, and the default
def test_the_compiled_module_follows_train_and_eval_mode(planner):
    """Evaluation after training on one AmpModule: ``am.eval()`` (it had raised) and the model's own
    ``model.train()``/``eval()`` (the captured mode had run silently: dropout and statistic updates at
    evaluation) each run that mode's plan, the other mode's captured on its first call."""
    model, x = _seeded(_DropBN).train(), torch.randn(32, 64)
    compiled = amp_compiler.compile(model, x, target=TARGET, planner=planner)
    compiled(x).sum().backward()  # train mode: statistics move, gradients reach the FP32 weights
    assert model.bn.num_batches_tracked.item() == 1 and model.up.weight.grad is not None
    compiled.eval()
    assert not model.training and not model.bn.training
    stats = model.bn.running_mean.clone()
    with torch.inference_mode():
        out, again = compiled(x), compiled(x)
        expected = model(x)
    assert torch.equal(out, again)  # no dropout
    assert torch.equal(model.bn.running_mean, stats) and model.bn.num_batches_tracked.item() == 1
    assert rel_error(expected, out) < 1e-2
    assert compiled.plans == 2
    model.train()  # the model's own switch is followed too
    first, second = compiled(x), compiled(x)
    assert not torch.equal(first, second) and model.bn.num_batches_tracked.item() == 3 and compiled.training
    model.eval()
    with torch.no_grad():
        assert torch.equal(compiled(x), compiled(x)) and compiled.plans == 2  # the eval plan, reused



@pytest.mark.parametrize("planner", ["greedy", "optimal"])
def test_a_parameter_unfrozen_after_compiling_gets_its_gradient(planner):
    """A train-mode plan folds a frozen layer's weights into an FP16 constant; unfreezing the layer
    (``requires_grad_(True)`` at epoch 2) plans again, so its gradient reaches it (it had stayed None)."""
    model, x = _seeded(_DropBN).eval(), torch.randn(32, 64)
    model.up.requires_grad_(False)
    compiled = amp_compiler.compile(model, x, target=TARGET, planner=planner, training=True)
    compiled(x).sum().backward()
    assert model.up.weight.grad is None and model.down.weight.grad is not None
    model.up.requires_grad_(True)
    compiled(x).sum().backward()
    model.zero_grad()
    model(x).sum().backward()
    expected = model.up.weight.grad.clone()
    model.zero_grad()
    compiled(x).sum().backward()
    assert rel_error(expected, model.up.weight.grad) < 5e-2 and compiled.plans == 2



def test_forward_hooks_of_the_model_are_warned_about_and_the_compiled_modules_fire():
    """A hook on the model runs at capture only (its return value is in the graph): the user is told,
    naming the module (its side effects had stopped silently); one on the compiled module fires."""
    model, x = _seeded(_DropBN).eval(), torch.randn(32, 64)
    seen = []
    model.bn.register_forward_hook(lambda module, args, out: seen.append("bn"))
    model.down.register_forward_pre_hook(lambda module, args: (args[0] * 0,))
    with pytest.warns(UserWarning, match=r"forward hooks of bn and 1 more modules run only while the model is "
                                         r"captured"):
        compiled = amp_compiler.compile(model, x, target=TARGET)
    compiled.register_forward_hook(lambda module, args, out: seen.append("compiled"))
    seen.clear()
    out = compiled(x)
    assert seen == ["compiled"]
    assert torch.allclose(out, model.down.bias.expand_as(out), atol=1e-3)  # the pre-hook's zeros are in the graph



@pytest.mark.parametrize("planner", ["greedy", "optimal"])
def test_planned_under_inference_mode_then_loaded_outside_it(planner):
    """A serving process's first call under ``torch.inference_mode()`` made the folded FP16 copies
    inference tensors: a later ``load_state_dict`` made the next call fail recasting them."""
    model, x = _seeded(lambda: Block(64)).eval(), torch.randn(8, 64)
    compiled = amp_compiler.compile(model, target=TARGET, planner=planner)
    with torch.inference_mode():
        compiled(x)
    assert _fp16_gemms(compiled.report)
    model.load_state_dict({k: v * 0.5 for k, v in model.state_dict().items()})
    with torch.no_grad():
        assert rel_error(model(x), compiled(x)) < 1e-2


def test_several_outputs_and_keyword_arguments():
    class Heads(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Block()
            self.a, self.b = nn.Linear(256, 256), nn.Linear(256, 64)

        def forward(self, x, *, bias=None, scale: float = 1.0):
            h = self.block(x) * scale
            if bias is not None:
                h = h + bias
            return {"a": self.a(h), "pooled": self.b(h).softmax(-1)}, h.argmax(-1)

    model, x, bias = _seeded(Heads).eval(), torch.randn(512, 256), torch.randn(256)
    compiled = amp_compiler.compile(model, x, example_kwargs={"bias": bias, "scale": 0.5}, target=TARGET)
    with torch.no_grad():
        (ref, ref_idx), (out, idx) = model(x, bias=bias, scale=0.5), compiled(x, bias=bias, scale=0.5)
    assert out.keys() == ref.keys()
    for key in ref:
        assert out[key].dtype == ref[key].dtype == torch.float32
        assert rel_error(ref[key], out[key]) < 1e-2
    assert idx.dtype == torch.int64 and (idx == ref_idx).float().mean() > 0.95
    assert len(_fp16_gemms(compiled.report)) == 4
    with torch.no_grad():  # a Python scalar is specialised: another value, another plan
        (ref, _), (out, _) = model(x, bias=bias, scale=2.0), compiled(x, bias=bias, scale=2.0)
    assert compiled.plans == 2 and rel_error(ref["a"], out["a"]) < 1e-2


def test_dynamic_batch_plans_for_the_example_and_runs_other_sizes():
    from torch.export import Dim

    model, x = _seeded(Block).eval(), torch.randn(512, 256)
    compiled = amp_compiler.compile(model, x, target=TARGET, dynamic_shapes=({0: Dim("batch", min=2)},))
    assert 512 in compiled.report.summary["dim_values"].values()  # the cost model sized the batch by the example
    assert len(_fp16_gemms(compiled.report)) == 2
    small = torch.randn(24, 256)
    with torch.no_grad():
        assert rel_error(model(small), compiled(small)) < 1e-2


class _Positions(torch.nn.Module):
    """Learned positions for at most 16 tokens: a symbolic length above 16 breaks a guard."""

    def __init__(self) -> None:
        super().__init__()
        self.pos = torch.nn.Parameter(torch.randn(16, 8))

    def forward(self, x):
        return x + self.pos[: x.shape[1]]


def test_a_dynamic_range_the_model_refuses_is_answered_with_torch_s_fix():
    from torch.export import Dim

    with pytest.raises(ConversionError) as err:
        amp_compiler.compile(_Positions().eval(), torch.randn(2, 8, 8), dynamic_shapes=({1: Dim("tokens")},))
    message = str(err.value)
    assert "_Positions" in message and "<= 16" in message
    assert "use tokens = Dim('tokens', max=16) in dynamic_shapes" in message


def test_folded_copies_follow_load_state_dict():
    model, x = _seeded(Block).eval(), torch.randn(512, 256)
    compiled = amp_compiler.compile(model, x, target=TARGET)
    assert count_casts(compiled) == 2  # the input down, the output up: weights are folded
    other = _seeded(Block)
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(1.5)
        compiled.load_state_dict(other.state_dict())  # writes the shared FP32 masters in place
        assert rel_error(other.eval()(x), compiled(x)) < 1e-2
        assert torch.equal(model.up.weight, other.up.weight)


def test_bfloat16_and_user_overrides():
    model, x = _seeded(Block).eval(), torch.randn(512, 256)
    bf16 = amp_compiler.compile(model, x, target=TARGET, dtype=torch.bfloat16)
    assert {o["precision"] for o in bf16.report.ops if o["class"] == "allow"} == {"bfloat16"}
    with torch.no_grad():
        assert rel_error(model(x), bf16(x)) < 3e-2
    denied = amp_compiler.compile(model, x, target=TARGET, deny=["addmm"], deny_nodes=["norm/aten.native_layer_norm"])
    for op in denied.report.ops:
        if op["op_type"] == "aten.addmm.default" or op["name"] == "norm/aten.native_layer_norm":
            assert op["precision"] == "float32" and "by the user" in op["reason"], op


@pytest.mark.parametrize("scale, phrase", [(1e7, "beyond the FP16 range"), (1e-7, "would flush to zero")])
def test_weights_fp16_cannot_hold_keep_their_op_fp32(scale, phrase):
    model, x = _seeded(Block).eval(), torch.randn(512, 256)
    with torch.no_grad():
        model.up.weight.mul_(scale)  # read through a permute: the flag follows the weight through views
    compiled = amp_compiler.compile(model, x, target=TARGET)
    up = next(o for o in compiled.report.ops if o["name"] == "up/aten.addmm")
    assert up["precision"] == "float32" and phrase in up["reason"] and "parameter up.weight" in up["reason"]
    assert not any(c["tensor"] == "up.weight" for c in compiled.report.casts)  # never cast, never clamped
    if scale < 1:  # (large weights make large activations, which the FP16 GEMM after them cannot hold)
        with torch.no_grad():
            assert rel_error(model(x), compiled(x)) < 1e-2


def test_a_plan_with_nothing_to_convert_leaves_the_graph_as_captured():
    from amp_compiler.fx_io.capture import export_graph

    class Islands(nn.Module):  # tiny GEMMs between exp/log (FP32 by rule): six cast kernels, beyond a near-tie
        def __init__(self):
            super().__init__()
            self.fcs = nn.ModuleList(nn.Linear(64, 64) for _ in range(3))

        def forward(self, x):
            for fc in self.fcs:
                x = torch.log1p(fc(torch.exp(x)).abs())
            return x

    model, x = _seeded(Islands).eval(), torch.randn(8, 64)  # 8 rows: launch-bound, all FP32 on an H100
    compiled = amp_compiler.compile(model, x)
    assert not _fp16_gemms(compiled.report)
    assert compiled.code == export_graph(model, (x,), None, source="Block").code


def test_not_a_module_and_unknown_backend_are_refused():
    with pytest.raises(TypeError, match="nn.Module"):
        amp_compiler.compile(lambda x: x, torch.ones(1))
    with pytest.raises(ValueError, match="unknown backend"):
        amp_compiler.compile(Block(), torch.ones(2, 256), backend="tensorrt")
    with pytest.raises(ValueError, match="fp16 or bf16"):
        amp_compiler.compile(Block(), torch.ones(2, 256), dtype=torch.float64)


def test_merged_report_sums_every_graph_and_keeps_each_graphs_reasons():
    from amp_compiler.fx_io.plans import merge_reports
    from amp_compiler.report import Report

    def graph(i: int, why: str) -> Report:
        return Report({"source": f"g{i}", "ops": [{"name": f"mm{i}"}], "casts": [], "passes": [], "summary": {
            "nodes": 1, "gemm_flops": 10.0, "fp16_gemm_flop_fraction": 0.5 * i, "predicted_time_fp32_s": 2.0,
            "predicted_time_mixed_s": 1.0, "predicted_time_all_fp16_s": 1.0, "predicted_memory_mixed_bytes": 100 * i,
            "predicted_memory_weights_fp32_bytes": 40, "fp32_tensor_core_why": why}})

    s = merge_reports([graph(1, "FP32 by cost"), graph(2, "")], "Model", "dynamo").summary
    assert s["graphs"] == 2 and s["nodes"] == 2 and s["predicted_time_mixed_s"] == 2.0
    assert s["predicted_memory_mixed_bytes"] == 300 and s["predicted_memory_weights_fp32_bytes"] == 80
    assert s["fp16_gemm_flop_fraction"] == pytest.approx(0.75)
    assert s["fp32_tensor_core_why"] == "graph 0: FP32 by cost"


def test_compiled_without_an_example_it_plans_on_the_first_call():
    """``torch.compile(model)``'s habit: no example inputs. The capture ran on an empty call and
    failed with advice about traceability ("missing a required argument: 'src'")."""
    layer = nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024, batch_first=True)
    encoder = _seeded(lambda: nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).eval())
    x = torch.randn(8, 64, 256)
    amp = amp_compiler.compile(encoder, target=TARGET)
    with pytest.warns(UserWarning, match=r"report is None: nothing is planned yet"):
        assert amp.plans == 0 and amp.report is None and "first call" in amp.capture
    with torch.no_grad():
        ref, out = encoder(x), amp(x)
        assert amp.capture == "torch.export" and amp.plans == 1
        assert amp.report.summary["fp16_gemm_flop_fraction"] == 1.0
        assert rel_error(out, ref) < 1e-2
        amp(torch.randn(4, 64, 256))  # later calls take the chosen route's plans
    assert amp.plans == 2
    with pytest.raises(TypeError, match="bogus"):  # a call the forward refuses is the model's own error
        amp_compiler.compile(encoder, target=TARGET)(bogus=x)


def test_an_example_that_does_not_fit_the_forward_is_refused_naming_its_signature():
    encoder = _seeded(lambda: Block())
    with pytest.raises(TypeError, match=r"the example does not fit Block.forward\(x\) .*'mask'"):
        amp_compiler.compile(encoder, (torch.randn(2, 256),), example_kwargs={"mask": None})


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_model_moved_to_half_precision_before_compiling_is_warned_about(dtype):
    """``model.half()`` before compile was planned silently: nothing it keeps FP32 has FP32 weights (a
    bfloat16 model's attention math even became float16)."""
    model = _seeded(lambda: Block(64).eval()).to(dtype)
    with pytest.warns(UserWarning, match=rf"compile\(Block\): 6 of 6 floating parameters are {dtype}, not float32"):
        amp_compiler.compile(model, (torch.randn(2, 64, dtype=dtype),), target=TARGET)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an FP32 model: no such warning
        amp_compiler.compile(model.float(), (torch.randn(2, 64),), target=TARGET)



def test_a_compiled_module_moved_to_half_precision_is_warned_about():
    """``amp_model.half()`` after compiling ran silently: the ops the plan keeps FP32 then read FP16
    weights. Moving it (``.to(device)``, ``.float()``) says nothing."""
    model = _seeded(lambda: Block(64).eval())
    compiled = amp_compiler.compile(model, (torch.randn(2, 64),), target=TARGET)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled.to("cpu")
    with pytest.warns(UserWarning, match=r"AmpModule\(Block\): 6 of 6 floating parameters are torch.float16.*"
                                         r"keep the module float32"):
        compiled.half()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled.float()


def test_a_recurrent_module_is_said_to_be_unrolled_per_time_step():
    class Tagger(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn, self.out = nn.LSTM(32, 32, batch_first=True), nn.Linear(32, 4)

        def forward(self, x):
            return self.out(self.rnn(x)[0])

    model, x = Tagger().eval(), torch.randn(2, 4, 32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        amp = amp_compiler.compile(model, (x,), target=TARGET)
    messages = [str(w.message) for w in caught]
    assert any("LSTM rnn is unrolled" in m and "each sequence length is captured" in m for m in messages)
    assert not any("_flat_weights" in m for m in messages)  # torch's register_buffer advice, not the user's to act on
    torch.testing.assert_close(amp(x), model(x), atol=1e-2, rtol=1e-2)
