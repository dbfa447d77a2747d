"""Cases found by the field sweep on the ONNX path (models and options the other tests do not name)."""

from __future__ import annotations

import pytest

from amp_compiler import convert_onnx

from .test_kv_cache import _kv_decoder, merged_decoder


def test_a_merged_decoder_is_priced_as_one_branch_runs_not_both():
    """An ``If`` runs one of its branches: a merged decoder (the same step in both) was predicted at
    twice its step's time, FP32 and mixed, since each branch was priced once (``cost_model/repeats.py``)."""
    step = convert_onnx(_kv_decoder())[1].summary
    merged = convert_onnx(merged_decoder(_kv_decoder()))[1].summary
    for key in ("predicted_time_fp32_s", "predicted_time_mixed_s"):
        assert merged[key] == pytest.approx(step[key], rel=0.05), key
