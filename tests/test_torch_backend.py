"""``torch.compile(model, backend="amp_compiler")``: same plan and outputs as ``amp_compiler.compile``."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import amp_compiler  # noqa: E402
import amp_compiler.backend as amp_backend  # noqa: E402
from benchmarks.torch_amp import TORCH_MODELS, rel_error  # noqa: E402

from .test_torch_compile import CI_TARGET, zoo_case  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256),
                               torch.nn.LayerNorm(256)).eval()


@pytest.mark.parametrize("name", TORCH_MODELS)
def test_backend_returns_the_outputs_of_compile(name):
    case = zoo_case(name)
    reports = []
    compiled = torch.compile(case.model, backend="amp_compiler",
                             options={"target": CI_TARGET, "on_report": reports.append})
    with torch.no_grad():
        out = compiled(*case.args)
    diff = rel_error(case.out, out)
    ours = case.compiled.report.summary
    print(f"\n{name}: torch.compile backend vs amp_compiler.compile: relative difference {diff:.1e}, "
          f"FP16 GEMM share {reports[0].summary['fp16_gemm_flop_fraction']:.2%} vs "
          f"{ours['fp16_gemm_flop_fraction']:.2%}")
    assert len(reports) == 1 and reports[0] is amp_backend.reports[-1]  # one graph, no graph break
    assert reports[0].summary["fp16_gemm_flop_fraction"] == ours["fp16_gemm_flop_fraction"]
    assert out.dtype == case.out.dtype
    assert diff < 1e-3  # the same plan; in practice bit-identical
    ours_allow = {o["name"]: o["precision"] for o in case.compiled.report.ops if o["class"] == "allow"}
    theirs_allow = {o["name"]: o["precision"] for o in reports[0].ops if o["class"] == "allow"}
    assert ours_allow == theirs_allow  # same names (module path + aten op), same decisions


def test_options_reach_the_planner_and_unknown_ones_are_refused():
    model, x = _mlp(), torch.randn(512, 256)
    with torch.no_grad():
        torch.compile(model, backend="amp_compiler", options={"target": CI_TARGET, "deny": ["addmm"]})(x)
    report = amp_backend.reports[-1]
    assert all(o["precision"] == "float32" for o in report.ops if o["op_type"] == "aten.addmm.default")
    assert "named by the user" in next(o for o in report.ops if o["op_type"] == "aten.addmm.default")["reason"]
    torch._dynamo.reset()
    with pytest.raises(Exception, match="unknown amp_compiler backend option 'trget': did you mean 'target'"):
        torch.compile(model, backend="amp_compiler", options={"trget": "a100"})(x)


def test_a_torch_compile_mode_is_said_not_to_apply_to_eager_plans_and_reaches_inductor(monkeypatch):
    """``torch.compile(mode=...)`` reaches a backend only without ``options`` (torch takes one or the
    other), where the plans run eagerly: it had been dropped silently, and with ``backend="inductor"``
    it could not be asked for at all."""
    monkeypatch.setattr(amp_backend, "_mode_said", set())
    model, x = _mlp(), torch.randn(64, 256)
    with pytest.warns(UserWarning, match=r"mode='max-autotune'.*does not apply.*'backend': 'inductor', 'mode'"):
        with torch.no_grad():
            torch.compile(model, backend="amp_compiler", mode="max-autotune")(x)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="Unrecognized mode=fast"):
        torch.compile(model, backend="amp_compiler", options={"mode": "fast"})(x)
    torch._dynamo.reset()
    import torch._inductor.compile_fx as inductor

    patches = []
    monkeypatch.setattr(inductor, "compile_fx",
                        lambda gm, inputs, config_patches=None: patches.append(config_patches) or gm)
    with torch.no_grad():
        torch.compile(model, backend="amp_compiler", options={"backend": "inductor", "mode": "reduce-overhead"})(x)
    assert patches == [{"triton.cudagraphs": True}]


def test_graph_breaks_give_one_planned_graph_each():
    class Branchy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(256, 256), torch.nn.Linear(256, 256)

        def forward(self, x):
            y = self.a(x)
            if y.sum() > 0:  # data-dependent: dynamo splits the graph here
                return self.b(y)
            return -self.b(-y)

    torch.manual_seed(0)
    model, x = Branchy().eval(), torch.randn(512, 256)
    before = {id(r) for r in amp_backend.reports}  # a bounded deque: count the new reports, not its length
    with torch.no_grad():
        ref = model(x)
        out = torch.compile(model, backend="amp_compiler", options={"target": CI_TARGET})(x)
    assert sum(id(r) not in before for r in amp_backend.reports) == 2
    assert rel_error(ref, out) < 1e-2


def test_training_graph_keeps_weight_casts_and_gradients_reach_fp32_parameters():
    model = _mlp().train()
    twin = _mlp().train()
    x, target = torch.randn(512, 256), torch.randn(512, 256)  # gradients of order 1: no loss scaling needed
    compiled = torch.compile(twin, backend="amp_compiler", options={"target": CI_TARGET})
    (compiled(x) * target).sum().backward()
    (model(x) * target).sum().backward()
    report = amp_backend.reports[-1]
    assert report.summary["fp16_gemm_flop_fraction"] == 1.0
    assert any(c["tensor"].endswith("weight") for c in report.casts)  # run-time weight casts
    for p, q in zip(model.parameters(), twin.parameters()):
        assert q.grad is not None and q.grad.dtype == torch.float32
        assert rel_error(p.grad, q.grad) < 2e-2


def test_folded_weights_follow_in_place_updates():
    model, x = _mlp(), torch.randn(512, 256)
    compiled = torch.compile(model, backend="amp_compiler", options={"target": CI_TARGET})
    with torch.no_grad():
        compiled(x)
        model[0].weight.mul_(-1)  # an in-place change of the FP32 master
        assert rel_error(model(x), compiled(x)) < 1e-2


def _have_cxx() -> bool:
    return any(shutil.which(c) for c in ("g++", "c++", "clang++"))


@pytest.mark.skipif(not _have_cxx(), reason="inductor on CPU needs a C++ compiler")
def test_inductor_runs_the_rewritten_graph():
    model, x = _mlp(), torch.randn(512, 256)
    with torch.no_grad():
        eager = amp_compiler.compile(model, x, target=CI_TARGET)
        fused = amp_compiler.compile(model, x, target=CI_TARGET, backend="inductor")
        via_backend = torch.compile(model, backend="amp_compiler",
                                    options={"target": CI_TARGET, "backend": "inductor"})
        ref, a, b, c = model(x), eager(x), fused(x), via_backend(x)
    assert fused.report.summary["fp16_gemm_flop_fraction"] == 1.0
    assert rel_error(ref, b) < 1e-2 and rel_error(a, b) < 5e-3 and rel_error(a, c) < 5e-3
    assert b.dtype == torch.float32


@pytest.mark.skipif(not _have_cxx(), reason="inductor on CPU needs a C++ compiler")
def test_inductor_compiles_a_symbolic_plan_once_for_its_sizes():
    """The export route's symbolic plan (a batch seen at a second size) is handed to inductor
    symbolic: later batch sizes reuse its kernels instead of compiling per size."""
    from torch._dynamo.utils import counters

    model = _mlp()
    with torch.no_grad():
        fused = amp_compiler.compile(model, torch.randn(512, 256), target=CI_TARGET, backend="inductor")
        x = torch.randn(384, 256)
        assert rel_error(model(x), fused(x)) < 1e-2  # the symbolic plan, compiled
        counters.clear()
        for n in (320, 448, 640):
            x = torch.randn(n, 256)
            assert rel_error(model(x), fused(x)) < 1e-2
    assert fused.plans == 2 and fused.report.summary["dim_values"]
    assert counters["stats"]["unique_graphs"] == 0  # no new compilation for the three new sizes


class _CachedAttention(torch.nn.Module):
    """Keys appended to a cache, then a matmul on their transpose, as T5 and GPT-2 attend."""

    def __init__(self, d: int = 256, heads: int = 4) -> None:
        super().__init__()
        self.h, self.q, self.k = heads, torch.nn.Linear(d, d), torch.nn.Linear(d, d)

    def forward(self, x, past):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.h, -1).transpose(1, 2)
        k = torch.cat([past, self.k(x).view(b, s, self.h, -1).transpose(1, 2)], dim=2)
        return torch.matmul(q, k.transpose(3, 2))


@pytest.mark.skipif(not _have_cxx(), reason="inductor on CPU needs a C++ compiler")
def test_inductor_takes_a_view_whose_strides_its_own_trace_lays_out_otherwise():
    """The retrace made matmul's reshape a view, valid for eager's contiguous ``cat``; inductor's
    ``cat`` keeps the transposed layout, where that view fails, on both capture routes."""
    model, x, past = _CachedAttention().eval(), torch.randn(2, 64, 256), torch.zeros(2, 4, 0, 64)
    with torch.no_grad():
        ref = model(x, past)
        fused = amp_compiler.compile(model, (x, past), target=CI_TARGET, backend="inductor")
        via_backend = torch.compile(model, backend="amp_compiler", options={"target": CI_TARGET, "backend": "inductor"})
        a, b = fused(x, past), via_backend(x, past)
    assert fused.report.summary["fp16_gemm_flop_fraction"] == 1.0
    assert rel_error(ref, a) < 1e-2 and rel_error(ref, b) < 1e-2


def test_entry_point_makes_the_name_work_without_importing_amp_compiler(tmp_path):
    """The entry point declared in setup.py, installed as package metadata, is all torch needs."""
    line = next(ln for ln in (ROOT / "setup.py").read_text().splitlines() if "torch_dynamo_backends" in ln
                and "=" in ln.split(":", 1)[-1])
    spec = line.split("[", 1)[1].rsplit("]", 1)[0].strip().strip("\"'")
    dist = tmp_path / "amp_compiler-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: amp-compiler\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text(f"[torch_dynamo_backends]\n{spec}\n")
    script = textwrap.dedent("""
        import sys, torch
        model = torch.nn.Linear(64, 64)
        assert "amp_compiler" not in sys.modules
        out = torch.compile(model, backend="amp_compiler")(torch.randn(8, 64))
        import amp_compiler.backend as b
        print("OK", out.shape[0], len(b.reports))
    """)
    env = {"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"}
    # cwd: a stale amp_compiler.egg-info in the checkout must not shadow the metadata under test
    result = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "OK 8 1" in result.stdout


def test_import_without_torch_needs_no_torch():
    script = ("import sys; sys.modules['torch'] = None  # any 'import torch' now fails\n"
              "import amp_compiler\n"
              "assert 'compile' in amp_compiler.__all__ and amp_compiler.convert_onnx\n"
              "try:\n    amp_compiler.compile\nexcept ImportError:\n    print('OK')\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "OK" in result.stdout, result.stderr[-2000:]


def test_import_registers_the_backend():
    from torch._dynamo.backends.registry import list_backends, lookup_backend

    assert "amp_compiler" in list_backends()
    assert lookup_backend("amp_compiler") is amp_backend.amp_compiler_backend
    amp_backend.register()  # idempotent



class _Dropped(torch.nn.Module):
    def __init__(self, p: float):
        super().__init__()
        self.fc, self.drop = torch.nn.Linear(256, 256), torch.nn.Dropout(p)

    def forward(self, x):
        return self.drop(self.fc(x))


def test_a_recompile_that_makes_a_float_attribute_an_input_still_plans():
    """The same forward with another Dropout p: dynamo recompiles with p as a tensor input read by
    ``.item()`` (the ViT-after-BERT failure); the plan's dtype check must accept that scalar read."""
    x = torch.randn(512, 256)
    for p in (0.1, 0.2, 0.0):
        model = _Dropped(p).eval()
        with torch.no_grad():
            out = torch.compile(model, backend="amp_compiler", options={"planner": "all"})(x)
            assert rel_error(model(x), out) < 1e-2


def test_a_padded_integer_input_stays_symbolic_after_the_second_size():
    """transformers' causal-LM loss pads the labels (``F.pad(labels, (0, 1), value=-100)``): the emitter's
    fake-tensor check ran ``constant_pad_nd``'s C++ meta kernel, which read the symbolic sizes as ints and
    specialised them, so dynamo recompiled, and the backend planned again, at every batch size."""
    from torch._dynamo.utils import counters

    class Loss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.head = torch.nn.Linear(32, 16)

        def forward(self, x, labels):
            labels = torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:]
            return torch.nn.functional.cross_entropy(self.head(x).flatten(0, 1), labels.reshape(-1))

    torch.manual_seed(0)
    model = Loss()
    compiled = torch.compile(model, backend="amp_compiler", options={"target": CI_TARGET})
    for batch in (4, 3):
        compiled(torch.randn(batch, 8, 32), torch.randint(0, 16, (batch, 8)))
    counters.clear()
    for batch in (5, 2, 6):
        x, labels = torch.randn(batch, 8, 32), torch.randint(0, 16, (batch, 8))
        torch.testing.assert_close(compiled(x, labels), model(x, labels), rtol=1e-2, atol=1e-2)
    assert counters["stats"]["unique_graphs"] == 0  # the symbolic graph takes the three new sizes
