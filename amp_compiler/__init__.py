"""amp-compiler: graph-rewriting automatic mixed precision for ONNX and PyTorch models.

Entry points: ``convert_onnx`` (ONNX in, ONNX out) and the ``amp-compile`` CLI; every
entry point returns or saves a ``Report`` that says what runs in which precision and why.
"""

__version__ = "0.1.0"

from .errors import ConversionError  # noqa: E402
from .onnx_api import convert_onnx  # noqa: E402
from .report import Report  # noqa: E402

__all__ = ["ConversionError", "Report", "__version__", "convert_onnx"]
