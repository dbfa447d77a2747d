"""Attention as users run it: SDPA fused or decomposed is tensor-core work with the right FLOPs,
masks stay correct with FP16 scores, GQA captures and plans (issue 10)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import amp_compiler  # noqa: E402
from amp_compiler.fx_io.capture import export_graph  # noqa: E402
from amp_compiler.fx_io.importer import import_graph_module  # noqa: E402
from amp_compiler.plan import make_context, run_passes  # noqa: E402
from amp_compiler.plan_report import build_report  # noqa: E402
from benchmarks.torch_amp import rel_error  # noqa: E402

nn, F = torch.nn, torch.nn.functional
B, H, KV, S, D = 2, 4, 2, 64, 32


class Attention(nn.Module):
    """Projections around ``F.scaled_dot_product_attention``; ``kv_heads < heads`` is GQA."""

    def __init__(self, heads: int = H, kv_heads: int = H):
        super().__init__()
        self.heads, self.kv_heads = heads, kv_heads
        self.q, self.o = nn.Linear(heads * D, heads * D), nn.Linear(heads * D, heads * D)
        self.kv = nn.Linear(heads * D, 2 * kv_heads * D)

    def forward(self, x, mask=None):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, D).transpose(1, 2)
        k, v = self.kv(x).view(b, s, 2, self.kv_heads, D).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.kv_heads != self.heads)
        return self.o(out.transpose(1, 2).reshape(b, s, -1))


def _plan(gm):
    imp = import_graph_module(gm, source="attention")
    return build_report(run_passes(imp.graph, make_context(), "attention", imp.dim_values))


@pytest.mark.parametrize("kv_heads", [H, KV])
def test_fused_and_decomposed_sdpa_are_tensor_core_work_with_the_same_flops(kv_heads):
    model, x = Attention(kv_heads=kv_heads).eval(), torch.randn(B, S, H * D)
    fused = _plan(torch.export.export(model, (x,)).module())  # aten SDPA (the CPU flash form), not decomposed
    sdpa = [o for o in fused.ops if o["canonical"] == "attention"]
    assert len(sdpa) == 1 and sdpa[0]["class"] == "allow"
    assert sdpa[0]["flops"] == 4 * B * H * S * S * D  # Q K^T and P V, over the query heads
    decomposed = _plan(export_graph(model, (x,), None, source="attention"))  # what amp_compiler.compile plans
    attention_flops = sum(o["flops"] for o in decomposed.ops  # SDPA's bmm pair (the projections have a module)
                          if o["class"] == "allow" and o["name"].startswith("aten.bmm"))
    assert attention_flops == sdpa[0]["flops"]


def _masks():
    keep = torch.ones(B, 1, S, S, dtype=torch.bool).tril()
    keep[1, :, 5] = False  # a fully masked query row
    additive = torch.zeros(B, 1, S, S).masked_fill(~keep, torch.finfo(torch.float32).min)
    return {"boolean": keep, "additive finfo.min": additive}


@pytest.mark.parametrize("kind", ["boolean", "additive finfo.min"])
def test_masks_stay_correct_with_fp16_scores(kind):
    torch.manual_seed(0)
    model, x, mask = Attention().eval(), torch.randn(B, S, H * D), _masks()[kind]
    compiled = amp_compiler.compile(model, (x, mask), planner="all")
    assert compiled.report.summary["fp16_gemm_flop_fraction"] == 1.0  # the scores really are FP16
    with torch.no_grad():
        ref, out = model(x, mask), compiled(x, mask)
    assert torch.equal(ref.isnan(), out.isnan())  # no new NaN rows (-inf - -inf)
    finite = ~ref.isnan()
    assert rel_error(ref[finite], out[finite]) < 1e-2
