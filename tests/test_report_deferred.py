"""The report ``convert_onnx`` returns defers the ops' per-op costs until the full report is read:
the terminal text and the annotations never compute them, and the full report is the same."""

from __future__ import annotations

import amp_compiler.onnx_api as onnx_api
from amp_compiler.onnx_api import convert_onnx
from amp_compiler.plan_report import build_report
from benchmarks.synthetic import transformer_graph

COSTS = ("flops", "bytes", "predicted_time_fp32_s", "predicted_time_fp16_s", "casts")


def test_text_and_annotations_leave_the_costs_uncomputed():
    report = convert_onnx(transformer_graph(300)).report  # annotated the model already
    text = report.to_text(max_rows=40)
    assert "predicted memory" in text and report.summary["gemm_flops"] > 0
    assert not any(key in row for row in report.decisions for key in COSTS)
    assert all(key in row for row in report.ops for key in COSTS)  # the first full read fills them in
    assert report.decisions is report.ops


def test_the_deferred_report_reads_as_the_eager_one(monkeypatch):
    model = transformer_graph(300)
    deferred = convert_onnx(model).report
    deferred.to_text()  # read before the costs, as the CLI does
    monkeypatch.setattr(onnx_api, "build_report", lambda result, defer_costs=False: build_report(result))
    eager = convert_onnx(model).report
    assert all(key in row for row in eager.decisions for key in COSTS)
    assert _untimed(deferred.to_dict()) == _untimed(eager.to_dict())


def _untimed(data: dict) -> dict:
    """``data`` without the passes' wall times, which differ from run to run."""
    return {**data, "passes": [{k: v for k, v in p.items() if k != "time_s"} for p in data["passes"]]}
