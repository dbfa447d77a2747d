"""The FX importer and emitter on small captured graphs: ports, names, casts, folded weights."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import amp_compiler  # noqa: E402
from amp_compiler.fx_io.capture import capture_error, export_graph  # noqa: E402
from amp_compiler.fx_io.importer import aten_op_types, dotted_path, import_graph_module, module_path  # noqa: E402
from amp_compiler.fx_io.weights import FoldedWeights  # noqa: E402
from amp_compiler.ir import ANY, CONSTANT, FIXED, OTHER, PARAMETER, UNIT  # noqa: E402
from amp_compiler.plan import make_context  # noqa: E402
from benchmarks.torch_amp import rel_error  # noqa: E402
from passes import ClassifyPass  # noqa: E402

nn = torch.nn


class Casts(nn.Module):
    """A Linear, an int mask cast to float, an explicit FP16 round trip, a second Linear."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(256, 256), nn.Linear(256, 256)

    def forward(self, x, mask):
        h = self.a(x) + mask.to(torch.float32)
        return self.b(h) + h.to(torch.float16).to(torch.float32)


def _inputs():
    return torch.randn(512, 256), torch.ones(512, 256, dtype=torch.int64)


def _imported(model, args, training=False):
    gm = export_graph(model, args, None, source=type(model).__name__)
    imp = import_graph_module(gm, source=type(model).__name__, training=training)
    ClassifyPass()(imp.graph, make_context())
    return imp


def _op(imp, prefix):
    return next(op for op in imp.graph.ops.values() if op.name.startswith(prefix))


def test_ops_get_canonical_names_onnx_port_order_and_readable_names():
    imp = _imported(Casts().eval(), _inputs())
    addmm = _op(imp, "a/aten.addmm")
    assert addmm.canonical == "gemm" and addmm.op_type == "aten.addmm.default"
    # addmm(bias, mat1, mat2) is Gemm(A, B, C): mat1, mat2, bias
    assert [imp.graph.tensors[t].shape for t in addmm.inputs] == [(512, 256), (256, 256), (256,)]
    assert addmm.input_roles == [UNIT, UNIT, UNIT] and addmm.output_roles == [UNIT]
    assert imp.graph.tensors["a.weight"].kind == CONSTANT  # inference: folded by the casts pass
    assert imp.graph.inputs == ["x", "mask"]


def test_casts_and_runtime_checks_accept_any_float_dtype():
    imp = _imported(Casts().eval(), _inputs())
    mask_cast = next(op for op in imp.graph.ops.values()
                     if op.canonical == "cast" and imp.graph.tensors[op.inputs[0]].dtype == "int64")
    assert mask_cast.input_roles == [OTHER] and mask_cast.output_roles == [UNIT]  # int -> float: output planned
    round_trip = [op for op in imp.graph.ops.values()
                  if op.canonical == "cast" and imp.graph.tensors[op.inputs[0]].dtype.startswith("float")]
    assert [op.input_roles for op in round_trip] == [[ANY], [ANY]]
    checks = [op for op in imp.graph.ops.values() if op.canonical == "runtime_check"]
    assert checks and all(op.outputs == [] for op in checks)
    assert all(op.input_roles in ([ANY], [OTHER]) for op in checks)


def test_emitter_retargets_dtype_arguments_and_the_graph_runs():
    model, args = Casts().eval(), _inputs()
    compiled = amp_compiler.compile(model, args, target="t4")
    code = compiled.code
    assert "_to_copy.default(mask, dtype = torch.float16)" in code  # the int mask cast now makes FP16
    assert "torch.float32, device" not in code  # every _assert_tensor_metadata checks the planned dtype
    with torch.no_grad():
        assert rel_error(model(*args), compiled(*args)) < 1e-2


def test_batch_norm_statistics_and_buffer_writes_keep_fp32():
    model = nn.Sequential(nn.Conv2d(16, 32, 3), nn.BatchNorm2d(32)).train()
    imp = _imported(model, (torch.randn(4, 16, 16, 16),), training=True)
    bn = _op(imp, "1/aten._native_batch_norm_legit_functional")
    assert bn.input_roles == [UNIT, FIXED, FIXED, FIXED, FIXED]  # x | weight, bias, running mean/var
    assert bn.output_roles == [UNIT, FIXED, FIXED, FIXED, FIXED]
    copies = [op for op in imp.graph.ops.values() if op.canonical == "copy"]
    assert len(copies) == 3  # running_mean, running_var, num_batches_tracked
    float_copy = next(op for op in copies if imp.graph.tensors[op.inputs[0]].dtype == "float32")
    assert float_copy.input_roles == [FIXED, ANY]  # the buffer keeps its dtype; copy_ converts the source
    assert imp.graph.tensors["1.running_mean"].kind == PARAMETER  # written in place: never folded
    assert imp.graph.tensors["0.weight"].kind == PARAMETER  # training: the cast stays a run-time op


def test_kernel_output_dtype_differing_from_the_registry_gets_a_cast():
    class Stats(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.fc, self.fc2 = nn.Linear(256, 256), nn.Linear(256, 256)

        def forward(self, x):
            out, mean, rstd = torch.ops.aten.native_layer_norm.default(self.fc(x), [256], None, None, 1e-5)
            return self.fc2(out), mean

    model, x = Stats().eval(), torch.randn(512, 256)
    compiled = amp_compiler.compile(model, x, target="t4")
    norm = next(o for o in compiled.report.ops if o["op_type"] == "aten.native_layer_norm.default")
    assert norm["precision"] == "float16"
    # the registry says the statistics are FP32; the CPU kernel returns them in FP16: a cast fixes it
    with torch.no_grad():
        out, mean = compiled(x)
        ref_out, ref_mean = model(x)
    assert out.dtype == mean.dtype == torch.float32
    assert rel_error(ref_mean, mean) < 1e-2 and rel_error(ref_out, out) < 1e-2


def test_folded_weights_recast_only_when_the_master_changes():
    master = nn.Parameter(torch.randn(8, 8))
    folded = FoldedWeights()
    attr = folded.add(master, torch.float16, "", 0)
    copy = getattr(folded, attr)
    assert copy.dtype == torch.float16 and not copy.requires_grad
    assert folded.refresh(args=[master]) == 0
    with torch.no_grad():
        master.mul_(2)
    assert folded.refresh(args=[master]) == 1 and folded.refresh(args=[master]) == 0
    assert torch.equal(getattr(folded, attr), master.detach().half())


def test_module_paths_and_dynamo_sources_read_as_dotted_paths():
    class Node:
        def __init__(self, path):
            self.meta = {"nn_module_stack": {"k": (path, object)}}

    assert module_path(Node("model.bert.encoder.layer.0")) == "model.bert.encoder.layer.0"
    assert module_path(Node("L['self'].model.layers[0].attn")) == "model.layers.0.attn"
    assert module_path(Node("L['self']._modules['fc']")) == "fc"
    assert module_path(Node("L['self']")) == ""
    assert dotted_path("L['self']._modules['l']._parameters['weight']") == "l.weight"
    assert dotted_path("L['fn']._modules['0']._buffers['running_mean']") == "0.running_mean"


def test_short_aten_names_expand_to_the_graph_overloads():
    imp = _imported(Casts().eval(), _inputs())
    for name in ("addmm", "aten.addmm", "gemm", "Gemm"):  # short aten, canonical, ONNX spelling
        named, unmatched = aten_op_types(imp.graph, [name])
        assert "aten.addmm.default" in named and name in named and unmatched == set(), name
    assert aten_op_types(imp.graph, ["gemm", "conv"])[1] == {"conv"}  # names naming nothing are returned


def test_capture_errors_name_the_user_line():
    try:
        raise RuntimeError('Could not guard on data-dependent expression u0\n'
                           '  File "/home/me/model.py", line 12, in forward\n    if x.max() > 1:\n')
    except RuntimeError as exc:
        err = capture_error(exc, "Net")
    assert str(err).startswith("Net: /home/me/model.py:12 in forward: `if x.max() > 1:`: data-dependent")


class _RMSNormLinear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(256, 256)

    def forward(self, x):
        return self.proj(x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


def test_rms_norm_on_the_fx_path_stays_finite_by_default_and_with_deny_propagation():
    """CPU torch runs FP16 kernels for real: mean(x^2) ~ 1e6 is inf in FP16 unless kept FP32. The
    numerics pass keeps the add-eps -> sqrt chain FP32 (eps 1e-6, a scalar argument on this path)."""
    model, x = _RMSNormLinear().eval(), torch.randn(512, 256) * 1000
    with torch.no_grad():
        ref = model(x)
        plain = amp_compiler.compile(model, (x,), target="a100", planner="all", deny_propagation=False)
        strict = amp_compiler.compile(model, (x,), target="a100", planner="all")  # deny propagation: on by default
        assert rel_error(ref, plain(x)) < 1e-2
        assert rel_error(ref, strict(x)) < 1e-2
    plain_ops, ops = ({o["name"].rsplit("/", 1)[-1]: o for o in r.ops} for r in (plain.report, strict.report))
    assert plain_ops["aten.sqrt"]["precision"] == "float32" and "plus eps 1e-06" in plain_ops["aten.sqrt"]["reason"]
    assert plain_ops["aten.div"]["precision"] == "float16"
    # deny propagation keeps pow/mean/add/sqrt FP32 and stops at x / rms, bounded like a norm's output
    assert ops["aten.sqrt"]["precision"] == "float32" and ops["aten.div"]["precision"] == "float16"
    assert ops["aten.addmm"]["precision"] == "float16"


class _ScaledScores(nn.Module):
    """SwinV2's cosine-attention scale: scores times ``clamp(logit_scale, max=log(100)).exp()``."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.qk = nn.Linear(64, 128)
        self.logit_scale = nn.Parameter(torch.full((1,), 2.3))

    def forward(self, x):
        q, k = self.qk(x).chunk(2, dim=-1)
        scale = torch.clamp(self.logit_scale, max=4.605).exp()
        return torch.softmax(q @ k.transpose(-1, -2) * scale + 1.0, dim=-1)


def test_clamp_bounds_its_exp_so_the_scores_after_it_are_planned_low():
    """aten's clamp maximum is a scalar argument: the importer keeps it as Clip's ``max`` so that
    ``exp(clamp(s, max=log(100)))`` (at most 100) seeds no deny propagation, as on the ONNX path."""
    model, x = _ScaledScores().eval(), torch.randn(2, 16, 64)
    assert _op(_imported(model, (x,)), "aten.clamp").attrs == {"max": 4.605}
    with torch.no_grad():
        amp = amp_compiler.compile(model, (x,), planner="all")
        assert rel_error(model(x), amp(x)) < 1e-2
    ops = {o["name"].rsplit("/", 1)[-1]: o for o in amp.report.ops}
    assert ops["aten.exp"]["precision"] == "float32"
    assert ops["aten.mul"]["precision"] == "float16", ops["aten.mul"]["reason"]
    with torch.no_grad():  # default options: the Mul is no longer held by deny propagation either
        default = amp_compiler.compile(model, (x,))
        assert rel_error(model(x), default(x)) < 1e-2
    mul = next(o for o in default.report.ops if o["name"].endswith("aten.mul"))
    assert "downstream of deny" not in mul["reason"], mul["reason"]
