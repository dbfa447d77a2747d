"""amp-compiler: graph-rewriting automatic mixed precision for ONNX and PyTorch models.

Entry points: ``convert_onnx`` (ONNX in, ONNX out), the ``amp-compile`` CLI, ``compile``
(an ``nn.Module`` in, a mixed-precision module out), the ``torch.compile`` backend
``"amp_compiler"`` and ``compile_training`` (one captured mixed-precision training step);
every entry point returns or saves a ``Report`` that says what runs in which precision and why.
"""

import sys as _sys

__version__ = "0.1.0"

from .errors import ConversionError  # noqa: E402
from .onnx_api import convert_onnx  # noqa: E402
from .report import Report  # noqa: E402

__all__ = ["ConversionError", "Report", "__version__", "compile", "compile_training", "convert_onnx"]

#: public names whose modules import torch: resolved on first use, so ``import amp_compiler`` needs no torch
_TORCH_API = {"compile": "torch_api", "compile_training": "training"}


def __getattr__(name: str):
    if name in _TORCH_API:
        from importlib import import_module

        return getattr(import_module(f"{__name__}.{_TORCH_API[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if _sys.modules.get("torch") is not None:  # a torch user: torch.compile(backend="amp_compiler") works now
    try:
        from . import backend as _backend  # noqa: F401  (registers the backend)
    except ImportError:  # a torch too old for the backend; amp_compiler.compile reports it when called
        pass
