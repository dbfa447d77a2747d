"""ONNX Runtime's symbolic shape inference module, loaded without its package's side effect.

``import onnxruntime.tools.symbolic_shape_infer`` first runs ``onnxruntime/tools/__init__.py``,
which imports torch whenever torch is installed (for an export helper this tool never uses):
seconds on every conversion of a model with symbolic dims, an ONNX-only run included. The module
itself imports only numpy, onnx, sympy and packaging, so it is loaded from its file instead.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

_ORT_NAME = "onnxruntime.tools.symbolic_shape_infer"
_OWN_NAME = "amp_compiler._ort_symbolic_shape_infer"


def symbolic_shape_infer() -> ModuleType | None:
    """The ``symbolic_shape_infer`` module of the installed ONNX Runtime; None where ONNX Runtime
    or its tools are missing or the module fails to load (callers then keep onnx's shapes)."""
    for name in (_ORT_NAME, _OWN_NAME):  # imported already: by the user, or by an earlier call
        if name in sys.modules:
            return sys.modules[name]
    try:
        spec = importlib.util.find_spec("onnxruntime")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "tools" / "symbolic_shape_infer.py"
    if not path.is_file():  # an ONNX Runtime build without its tools
        return None
    module_spec = importlib.util.spec_from_file_location(_OWN_NAME, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[_OWN_NAME] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception:  # noqa: BLE001 - a missing sympy, or a build whose module differs
        del sys.modules[_OWN_NAME]
        return None
    return module
