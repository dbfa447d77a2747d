"""Differential test against ``torch.autocast(device_type="cpu", dtype=torch.float16)``.

torch 2.13 supports float16 autocast on CPU (the CPU lower-precision list: mm, addmm, bmm,
baddbmm, linear, matmul, convolutions, ...), so no bfloat16 fallback is needed; the test
skips with that reason on a torch that rejects it. The autocast graph is the forward aten
graph torch.compile traces for the autocast model (dynamo + AOTAutograd, where autocast's
weight-cast cache is off and every cast is a node). Same CI models and A100 target as
``test_torch_compile`` (see its docstring for why).
"""

from __future__ import annotations

import functools

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from benchmarks.torch_amp import TORCH_MODELS, autocast_graph, count_casts, low_gemm_ops, rel_error  # noqa: E402

from .test_torch_compile import zoo_case  # noqa: E402


def _cpu_fp16_autocast() -> bool:
    try:
        with torch.autocast("cpu", dtype=torch.float16):
            return torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.float16
    except (RuntimeError, ValueError):
        return False


pytestmark = pytest.mark.skipif(not _cpu_fp16_autocast(), reason="this torch has no float16 autocast on CPU")


@functools.cache
def _autocast(name: str):
    case = zoo_case(name)
    return autocast_graph(case.model, case.args, torch.float16)


@pytest.mark.parametrize("name", TORCH_MODELS)
def test_same_allow_class_ops_in_fp16_and_close_outputs(name):
    case = zoo_case(name)
    auto_gm, auto_out = _autocast(name)
    ours_total, ours_low = low_gemm_ops(case.compiled)
    auto_total, auto_low = low_gemm_ops(auto_gm)
    assert ours_total == auto_total  # one decomposition, the same GEMMs/convs
    # autocast puts every one of them in FP16; so do we, except a GEMM the cost model finds
    # too small to pay for its casts (ResNet's classifier; test_torch_compile checks the reason)
    kept = {o["op_type"].split(".")[1] for o in case.compiled.report.ops
            if o["class"] == "allow" and o["precision"] == "float32"}
    assert auto_low == auto_total
    for packet, n in auto_low.items():
        assert ours_low[packet] == n or packet in kept, (packet, ours_low, auto_low)
    err_ours, err_auto, err_between = (rel_error(case.ref, case.out), rel_error(case.ref, auto_out),
                                       rel_error(auto_out, case.out))
    print(f"\n{name}: FP16 allow-class ops ours {dict(ours_low)} autocast {dict(auto_low)}; relative error "
          f"vs FP32: ours {err_ours:.2e}, autocast {err_auto:.2e}; ours vs autocast {err_between:.2e}")
    assert err_between < 1e-2


@pytest.mark.parametrize("name", TORCH_MODELS)
def test_no_more_casts_than_autocast_under_torch_compile(name):
    ours = count_casts(zoo_case(name).compiled)
    theirs = count_casts(_autocast(name)[0])
    print(f"\n{name}: dtype casts in the graph: amp_compiler {ours}, autocast + torch.compile {theirs}")
    assert ours <= theirs
