"""amp-compiler: graph-rewriting automatic mixed precision for ONNX and PyTorch models.

Entry points: ``convert_onnx`` (ONNX in, ONNX out), the ``amp-compile`` CLI, ``compile``
(an ``nn.Module`` in, a mixed-precision module out), the ``torch.compile`` backend
``"amp_compiler"`` and ``compile_training`` (one captured mixed-precision training step);
every entry point returns or saves a ``Report`` that says what runs in which precision and why.

The public names are resolved on first use (PEP 562): ``import amp_compiler`` loads neither
onnx, scipy nor torch, and ``passes`` / ``cost_model`` import cleanly on their own
(docs/architecture.md, "Packages and layering").
"""

import sys as _sys

__version__ = "0.1.0"

from .errors import ConversionError  # noqa: E402

__all__ = ["ConversionError", "Report", "__version__", "compile", "compile_training", "convert_onnx"]

#: public name -> the submodule defining it, imported on first access
_LAZY = {"convert_onnx": "onnx_api", "Report": "report", "compile": "torch_api", "compile_training": "training"}
_NEEDS_TORCH = ("compile", "compile_training")


def __getattr__(name: str):
    if name in _LAZY:
        from importlib import import_module

        try:
            module = import_module(f"{__name__}.{_LAZY[name]}")
        except ImportError as exc:  # a plain install carries no torch ("[torch]" extra)
            if name in _NEEDS_TORCH and (exc.name or "").split(".")[0] == "torch":
                raise ImportError(f"amp_compiler.{name} needs PyTorch, which cannot be imported ({exc}): "
                                  "pip install 'amp-compiler[torch]'") from None
            raise
        value = getattr(module, name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if _sys.modules.get("torch") is not None:  # a torch user: torch.compile(backend="amp_compiler") works now
    try:
        from . import backend as _backend  # noqa: F401  (registers the backend)
    except ImportError:  # a torch too old for the backend; amp_compiler.compile reports it when called
        pass
