"""Registry parity with torch autocast / Apex O1 / TF AMP (issue 10), on both paths.

One rule for the ONNX and the aten form of an op; ops the FX path used to lose
(unknown, or decomposed into a deny sum) are tensor-core work; reductions hidden in
scatter/index_put attributes and interpolating resizes are deny on both paths.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import onnx  # noqa: E402
from onnx import helper  # noqa: E402

import amp_compiler  # noqa: E402
from amp_compiler.fx_io.capture import export_graph  # noqa: E402
from amp_compiler.fx_io.importer import import_graph_module  # noqa: E402
from amp_compiler.plan import make_context, run_passes  # noqa: E402
from amp_compiler.plan_report import build_report  # noqa: E402
from amp_compiler.registry import ALLOW, DEFAULT_REGISTRY, DENY  # noqa: E402
from tests.builders import fin, model, plan  # noqa: E402

nn = torch.nn


def _aten_class(name: str) -> str:
    return DEFAULT_REGISTRY.lookup_aten(name).op_class


@pytest.mark.parametrize("aten, onnx_op", [("tan", "Tan"), ("rsqrt", "Rsqrt"), ("reciprocal", "Reciprocal"),
                                           ("sinh", "Sinh"), ("cosh", "Cosh"), ("asin", "Asin"), ("acos", "Acos"),
                                           ("exp", "Exp"), ("log", "Log")])
def test_onnx_and_aten_forms_share_one_deny_rule(aten, onnx_op):
    """Autocast and Apex O1 force these FP32; both columns of the registry say deny."""
    row = DEFAULT_REGISTRY.lookup_onnx("", onnx_op)
    assert row is DEFAULT_REGISTRY.lookup_aten(aten) and row.op_class == DENY


@pytest.mark.parametrize("aten", ["expm1", "log1p", "log2", "log10", "erfinv"])
def test_aten_only_range_ops_are_deny_so_deny_propagation_starts_there(aten):
    assert _aten_class(aten) == DENY


@pytest.mark.parametrize("aten", ["addmv", "addbmm", "conv_tbc", "_native_multi_head_attention", "mv", "dot",
                                  "scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
                                  "_scaled_dot_product_flash_attention_for_cpu",
                                  "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
                                  "_efficient_attention_forward", "_cudnn_attention_forward",
                                  "grouped_mm_fallback", "grouped_mm_fallback_backward",
                                  "_scaled_dot_product_flash_attention_for_cpu_backward",
                                  "_scaled_dot_product_efficient_attention_backward"])
def test_tensor_core_aten_ops_are_known_allow(aten):
    row = DEFAULT_REGISTRY.lookup_aten(aten)
    assert row is not None and row.op_class == ALLOW and row.tensor_core


def _report(module: nn.Module, *args, **options):
    gm = export_graph(module.eval(), args, None, source=type(module).__name__)
    imp = import_graph_module(gm, source="m")
    return build_report(run_passes(imp.graph, make_context(**options), "m", imp.dim_values))


def _op(report, aten: str) -> dict:
    return next(o for o in report.ops if o["op_type"].startswith(f"aten.{aten}."))


class MatVec(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(512, 256))

    def forward(self, x):
        return torch.dot(torch.mv(self.w, x)[:256], x)


def test_mv_and_dot_stay_tensor_core_ops_with_their_flops():
    report = _report(MatVec(), torch.randn(256))
    mv, dot = _op(report, "mv"), _op(report, "dot")
    assert mv["class"] == dot["class"] == ALLOW  # not mul + a deny sum
    assert mv["flops"] == 2 * 512 * 256 and dot["flops"] == 2 * 256
    assert not any(o["op_type"].startswith("aten.sum") for o in report.ops)


class Scatters(nn.Module):
    def forward(self, x, index, rows):
        added = torch.zeros(4, 64).scatter_add(0, index, x)
        put = torch.zeros(8, 64).index_put((rows,), x, accumulate=True)
        plain = torch.zeros(8, 64).index_put((rows,), x)
        return added, put, plain


def test_accumulating_scatter_and_index_put_are_deny_on_the_fx_path():
    x, index, rows = torch.randn(16, 64), torch.randint(0, 4, (16, 64)), torch.randint(0, 8, (16,))
    report = _report(Scatters(), x, index, rows)
    scatters = [o for o in report.ops if o["canonical"] in ("scatter_elements", "scatter_nd")]
    by_reason = sorted((o["class"], o["reason"].startswith("deny: scatter with a reduction")) for o in scatters)
    assert by_reason == [("clear", False), ("deny", True), ("deny", True)]


class Upsample(nn.Module):
    """conv -> interpolate -> conv (a segmentation decoder's upsampling between convolutions)."""

    def __init__(self, mode):
        super().__init__()
        self.mode = mode
        self.a, self.b = nn.Conv2d(64, 64, 3, padding=1), nn.Conv2d(64, 64, 3, padding=1)

    def forward(self, x):
        return self.b(nn.functional.interpolate(self.a(x), scale_factor=2, mode=self.mode))


@pytest.mark.parametrize("mode, op_class", [("bilinear", "infer"), ("bicubic", "infer"), ("nearest", "clear")])
def test_interpolating_resize_is_not_clear_on_either_path(mode, op_class):
    """Interpolation computes (infer: it follows its input's dtype, and deny propagation holds it
    where a deny op feeds it) but is bounded, so it is not deny: deny held a Segformer's decoder and
    a DINOv2 at a new resolution (its bicubic position embeddings) entirely FP32. Between two
    convolutions it runs FP16 on both paths."""
    torch.manual_seed(0)
    up = next(o for o in _report(Upsample(mode), torch.randn(4, 64, 32, 32)).ops if o["canonical"] == "resize")
    onnx_mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    weights = [helper.make_tensor(w, onnx.TensorProto.FLOAT, [64, 64, 3, 3], [0.01] * (64 * 64 * 9)) for w in "ab"]
    m = model([helper.make_node("Conv", ["x", "a"], ["h"], pads=[1, 1, 1, 1]),
               helper.make_node("Resize", ["h", "", "scales"], ["u"], mode=onnx_mode),
               helper.make_node("Conv", ["u", "b"], ["y"], pads=[1, 1, 1, 1])],
              [fin("x", 4, 64, 32, 32)], [fin("y", 4, 64, 64, 64)],
              [*weights, helper.make_tensor("scales", onnx.TensorProto.FLOAT, [4], [1, 1, 2, 2])])
    _, report = plan(m)
    resize = next(o for o in report.ops if o["op_type"] == "Resize")
    for row in (up, resize):
        assert row["class"] == op_class and row["precision"] == "float16", row


class Special(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(256, 256)

    def forward(self, x):
        return torch.i0(self.fc(x))


def test_allowing_an_op_the_registry_does_not_know_plans_its_float_ports():
    compiled = amp_compiler.compile(Special().eval(), torch.randn(64, 256), allow=["i0"], planner="all")
    i0 = _op(compiled.report, "i0")
    assert i0["class"] == "allow" and i0["precision"] == "float16" and "no float data" not in i0["reason"]
