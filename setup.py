"""amp-compiler: a graph-rewriting automatic mixed-precision compiler."""

from setuptools import setup

setup(
    name="amp-compiler",
    version="0.1.0",
    description="Graph-rewriting automatic mixed-precision compiler for ONNX and PyTorch models",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=["amp_compiler", "amp_compiler.onnx_io", "amp_compiler.fx_io", "amp_compiler.report", "passes", "cost_model"],
    package_data={"cost_model": ["profiles/*.json", "fitted/*.json"]},
    install_requires=[
        "numpy>=1.24",
        "networkx>=3.0",
        "scipy>=1.10",  # C max-flow for the min-cut planner on large graphs (passes/maxflow.py)
        "onnx>=1.16",
        "protobuf>=4.25",
        "ml_dtypes>=0.4",
        "psutil>=5.9",
        # ONNX Runtime's symbolic shape inference relates the dims a Reshape makes up to the
        # inputs' (onnx_io/symbolic_dims.py); it imports sympy, which onnxruntime does not require
        "sympy>=1.12",
    ],
    # ONNX Runtime comes as an extra so that CUDA users pick onnxruntime-gpu
    # ("[gpu]") and nobody ends up with both builds in one environment.
    extras_require={
        "cpu": ["onnxruntime>=1.18"],
        "gpu": ["onnxruntime-gpu>=1.18"],
        "torch": ["torch>=2.4"],
        "dev": [
            "onnxruntime>=1.18",
            "pytest>=8",
            "torch>=2.4",
            "onnxscript>=0.3",
            "onnx-ir>=0.1",
            "transformers>=4.45",
        ],
        "bench": ["onnxruntime>=1.18", "onnxconverter-common>=1.14", "transformers>=4.45", "torch>=2.4", "onnxscript>=0.3"],
    },
    entry_points={
        "console_scripts": ["amp-compile=amp_compiler.cli:run"],
        # torch.compile(model, backend="amp_compiler") without importing amp_compiler first
        "torch_dynamo_backends": ["amp_compiler = amp_compiler.backend:amp_compiler_backend"],
    },
)
