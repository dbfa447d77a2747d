"""ONNX TensorProto dtype codes <-> the IR's dtype names."""

from __future__ import annotations

from onnx import TensorProto

_TO_NAME = {
    TensorProto.FLOAT: "float32", TensorProto.FLOAT16: "float16", TensorProto.BFLOAT16: "bfloat16",
    TensorProto.DOUBLE: "float64", TensorProto.INT64: "int64", TensorProto.INT32: "int32",
    TensorProto.INT16: "int16", TensorProto.INT8: "int8", TensorProto.UINT64: "uint64",
    TensorProto.UINT32: "uint32", TensorProto.UINT16: "uint16", TensorProto.UINT8: "uint8",
    TensorProto.BOOL: "bool", TensorProto.STRING: "string", TensorProto.COMPLEX64: "complex64",
    TensorProto.COMPLEX128: "complex128",
}
_TO_CODE = {v: k for k, v in _TO_NAME.items()}


def onnx_to_dtype(code: int) -> str:
    name = _TO_NAME.get(code)
    if name is None:  # built only on a miss: DataType.values() costs a list per call
        name = f"onnx:{TensorProto.DataType.Name(code) if code in TensorProto.DataType.values() else code}"
    return name


def dtype_to_onnx(name: str) -> int:
    return _TO_CODE[name]
