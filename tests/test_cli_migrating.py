"""docs/migrating.md stays true: every peer option is in its table, and every test it names exists."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "migrating.md").read_text()

#: convert_to_mixed_precision's parameters (NVIDIA/Model-Optimizer, modelopt/onnx/autocast/convert.py)
AUTOCAST = ["onnx_path", "low_precision_type", "nodes_to_exclude", "op_types_to_exclude", "nodes_to_include",
            "op_types_to_include", "data_max", "init_max", "keep_io_types", "calibration_data", "custom_rule",
            "init_conversion_max_bytes", "providers", "trt_plugins", "trt_plugins_precision",
            "max_depth_of_reduction", "opset", "use_local_type_inference"]
#: onnxconverter-common (microsoft/onnxconverter-common, float16.py and auto_mixed_precision.py)
OCC = ["min_positive_val", "max_finite_val", "keep_io_types", "disable_shape_infer", "op_block_list",
       "node_block_list", "check_fp16_ready", "feed_dict", "validate_fn", "rtol", "atol"]


def section(title: str) -> str:
    start = DOC.index(f"## {title}")
    end = DOC.find("\n## ", start + 1)
    return DOC[start:end if end > 0 else None]


def test_every_peer_option_has_a_row():
    ort_float16 = pytest.importorskip("onnxruntime.transformers.float16")
    ort = list(inspect.signature(ort_float16.convert_float_to_float16).parameters)
    for title, options in (("ModelOpt AutoCast", AUTOCAST), ("ONNX Runtime", ort), ("onnxconverter-common", OCC)):
        rows = section(title) if title != "onnxconverter-common" else section(title) + section("ONNX Runtime")
        missing = [o for o in options if f"`{o}`" not in rows and f"`{o} " not in rows and f"`{o}(" not in rows]
        assert not missing, (title, missing)


def test_every_named_test_exists():
    named = set(re.findall(r"`(test_[a-z_]+)::(test_[a-z0-9_]+)`", DOC))
    assert len(named) > 20
    defined: dict[str, set[str]] = {}
    for module, name in sorted(named):
        if module not in defined:
            tree = ast.parse((ROOT / "tests" / f"{module}.py").read_text())
            defined[module] = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        assert name in defined[module], f"{module}::{name}"
