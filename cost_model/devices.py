"""Device specifications for the analytic cost model.

All compute figures are *dense* (no 2:4 structured sparsity) vendor peaks in TFLOPS;
bandwidth is the datasheet memory bandwidth in GB/s (1 GB = 1e9 bytes).

``launch_overhead_us`` is the fixed cost charged per kernel. A bare CUDA kernel launch
costs roughly 2-5 us of host+device latency (NVIDIA CUDA Best Practices Guide / Nsight
Systems measurements of an empty kernel); framework dispatch (ORT, PyTorch eager) adds
a few more, so small elementwise kernels are dominated by it. We use 5 us for the
oldest part (V100, slower host path in typical deployments) and 4 us elsewhere.
The measured mode (``MeasuredProfile``) replaces these estimates with real timings.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields
from pathlib import Path

__all__ = ["DeviceSpec", "DEVICES", "DEFAULT_DEVICE", "DeviceFileError", "device_from_dict", "get_device",
           "load_device"]


@dataclass(frozen=True)
class DeviceSpec:
    """Peak throughputs of one accelerator (TFLOPS, GB/s, microseconds)."""

    name: str
    fp32_tflops: float  # FP32 on CUDA cores (no tensor cores)
    tf32_tflops: float  # TF32 tensor core, dense (== fp32_tflops where TF32 does not exist)
    fp16_tflops: float  # FP16 tensor core, FP32 accumulate, dense
    bf16_tflops: float  # BF16 tensor core, dense (== fp32_tflops where BF16 has no tensor cores)
    fp16_simt_tflops: float  # FP16 on CUDA cores (elementwise work, misaligned GEMMs)
    mem_bandwidth_gbs: float
    launch_overhead_us: float
    source: str


DEVICES: dict[str, DeviceSpec] = {
    # NVIDIA Tesla V100 datasheet, SXM2 column: FP32 15.7, tensor 125 TFLOPS, HBM2 900 GB/s.
    # FP16 non-tensor 31.4 TFLOPS from the NVIDIA A100 (GA100) whitepaper comparison table.
    # Volta has neither TF32 nor BF16 tensor cores: both fall back to the FP32 rate.
    "v100": DeviceSpec(
        name="v100",
        fp32_tflops=15.7,
        tf32_tflops=15.7,
        fp16_tflops=125.0,
        bf16_tflops=15.7,
        fp16_simt_tflops=31.4,
        mem_bandwidth_gbs=900.0,
        launch_overhead_us=5.0,
        source="NVIDIA Tesla V100 datasheet (SXM2); A100 whitepaper table for FP16 non-tensor",
    ),
    # NVIDIA T4 datasheet: FP32 8.1, mixed precision (FP16/FP32) 65 TFLOPS, GDDR6 320 GB/s.
    # Turing: no TF32/BF16 tensor cores; FP16 on CUDA cores runs at 2x FP32 (16.2).
    "t4": DeviceSpec(
        name="t4",
        fp32_tflops=8.1,
        tf32_tflops=8.1,
        fp16_tflops=65.0,
        bf16_tflops=8.1,
        fp16_simt_tflops=16.2,
        mem_bandwidth_gbs=320.0,
        launch_overhead_us=4.0,
        source="NVIDIA T4 Tensor Core GPU datasheet; Turing whitepaper for FP16 non-tensor rate",
    ),
    # NVIDIA A100 Tensor Core GPU datasheet, 80GB SXM column: FP32 19.5, TF32 156,
    # BF16/FP16 tensor 312 TFLOPS dense, HBM2e 2,039 GB/s.
    # FP16 non-tensor 78 TFLOPS from the NVIDIA A100 (GA100) whitepaper.
    "a100": DeviceSpec(
        name="a100",
        fp32_tflops=19.5,
        tf32_tflops=156.0,
        fp16_tflops=312.0,
        bf16_tflops=312.0,
        fp16_simt_tflops=78.0,
        mem_bandwidth_gbs=2039.0,
        launch_overhead_us=4.0,
        source="NVIDIA A100 Tensor Core GPU datasheet (80GB SXM); GA100 whitepaper",
    ),
    # NVIDIA H100 Tensor Core GPU datasheet, SXM column: FP32 67, TF32 tensor 494.7 dense
    # (989 with sparsity), BF16/FP16 tensor 989.4 dense (1,979 with sparsity), HBM3 3.35 TB/s.
    # FP16 non-tensor 133.8 TFLOPS from the NVIDIA H100 (Hopper) whitepaper, SXM5.
    "h100": DeviceSpec(
        name="h100",
        fp32_tflops=67.0,
        tf32_tflops=494.7,
        fp16_tflops=989.4,
        bf16_tflops=989.4,
        fp16_simt_tflops=133.8,
        mem_bandwidth_gbs=3350.0,
        launch_overhead_us=4.0,
        source="NVIDIA H100 Tensor Core GPU datasheet (SXM); Hopper whitepaper",
    ),
    # NVIDIA H200 Tensor Core GPU datasheet, SXM column: same Hopper compute as H100 SXM
    # (FP32 67, TF32 989 / FP16 1,979 TFLOPS with sparsity -> 494.7 / 989.4 dense),
    # HBM3e 141 GB at 4.8 TB/s.
    "h200": DeviceSpec(
        name="h200",
        fp32_tflops=67.0,
        tf32_tflops=494.7,
        fp16_tflops=989.4,
        bf16_tflops=989.4,
        fp16_simt_tflops=133.8,
        mem_bandwidth_gbs=4800.0,
        launch_overhead_us=4.0,
        source="NVIDIA H200 Tensor Core GPU datasheet (SXM); Hopper whitepaper",
    ),
    # NVIDIA L4 Tensor Core GPU datasheet: FP32 30.3, TF32 120 / FP16 and BF16 242 TFLOPS
    # with sparsity -> 60 / 121 dense, GDDR6 300 GB/s. Ada runs FP16 on CUDA cores at the
    # FP32 rate (Ada Lovelace whitepaper).
    "l4": DeviceSpec(
        name="l4",
        fp32_tflops=30.3,
        tf32_tflops=60.0,
        fp16_tflops=121.0,
        bf16_tflops=121.0,
        fp16_simt_tflops=30.3,
        mem_bandwidth_gbs=300.0,
        launch_overhead_us=4.0,
        source="NVIDIA L4 Tensor Core GPU datasheet; Ada Lovelace whitepaper",
    ),
    # NVIDIA Ada Lovelace GPU architecture whitepaper, GeForce RTX 4090 column: FP32 82.6,
    # TF32 tensor 82.6, FP16 and BF16 tensor with FP32 accumulate 165.2 TFLOPS dense
    # (GeForce runs FP32 accumulate at half the FP16-accumulate rate), GDDR6X 1,008 GB/s,
    # FP16 non-tensor 82.6 TFLOPS.
    "rtx4090": DeviceSpec(
        name="rtx4090",
        fp32_tflops=82.6,
        tf32_tflops=82.6,
        fp16_tflops=165.2,
        bf16_tflops=165.2,
        fp16_simt_tflops=82.6,
        mem_bandwidth_gbs=1008.0,
        launch_overhead_us=4.0,
        source="NVIDIA Ada Lovelace GPU architecture whitepaper (GeForce RTX 4090)",
    ),
    # NVIDIA Blackwell datasheet (GB200 NVL72 / HGX B200), individual-GPU column for HGX B200:
    # FP32 75 TFLOPS, TF32 tensor 2.2 and FP16/BF16 tensor 4.5 PFLOPS with sparsity -> 1,100 and
    # 2,250 dense, HBM3e 7.7 TB/s. FP16 on CUDA cores: not published; taken as 2x FP32 (Hopper's ratio).
    "b200": DeviceSpec(
        name="b200",
        fp32_tflops=75.0,
        tf32_tflops=1100.0,
        fp16_tflops=2250.0,
        bf16_tflops=2250.0,
        fp16_simt_tflops=150.0,
        mem_bandwidth_gbs=7700.0,
        launch_overhead_us=4.0,
        source="NVIDIA Blackwell datasheet, HGX B200 individual-GPU column (dense = 1/2 of sparse)",
    ),
    # The same datasheet, GB200 NVL72 individual-GPU column: FP32 80 TFLOPS, TF32 tensor 2.5 and
    # FP16/BF16 tensor 5 PFLOPS with sparsity -> 1,250 and 2,500 dense, HBM3e 8 TB/s. FP16 on CUDA
    # cores taken as 2x FP32 (not published).
    "gb200": DeviceSpec(
        name="gb200",
        fp32_tflops=80.0,
        tf32_tflops=1250.0,
        fp16_tflops=2500.0,
        bf16_tflops=2500.0,
        fp16_simt_tflops=160.0,
        mem_bandwidth_gbs=8000.0,
        launch_overhead_us=4.0,
        source="NVIDIA Blackwell datasheet, GB200 NVL72 individual-GPU column (dense = 1/2 of sparse)",
    ),
    # NVIDIA L40S datasheet: FP32 91.6, TF32 tensor 183, BF16/FP16 tensor 362.05 TFLOPS dense
    # (366 / 733 with sparsity), GDDR6 864 GB/s. Ada runs FP16 on CUDA cores at the FP32 rate.
    "l40s": DeviceSpec(
        name="l40s",
        fp32_tflops=91.6,
        tf32_tflops=183.0,
        fp16_tflops=362.05,
        bf16_tflops=362.05,
        fp16_simt_tflops=91.6,
        mem_bandwidth_gbs=864.0,
        launch_overhead_us=4.0,
        source="NVIDIA L40S GPU datasheet; Ada Lovelace whitepaper",
    ),
    # NVIDIA RTX Blackwell GPU architecture whitepaper, GeForce RTX 5090 column: FP32 104.8,
    # TF32 tensor 104.8, FP16/BF16 tensor with FP32 accumulate 209.5 TFLOPS dense (419 with
    # sparsity; GeForce runs FP32 accumulate at half the FP16-accumulate rate), GDDR7 1,792 GB/s,
    # FP16 non-tensor at the FP32 rate.
    "rtx5090": DeviceSpec(
        name="rtx5090",
        fp32_tflops=104.8,
        tf32_tflops=104.8,
        fp16_tflops=209.5,
        bf16_tflops=209.5,
        fp16_simt_tflops=104.8,
        mem_bandwidth_gbs=1792.0,
        launch_overhead_us=4.0,
        source="NVIDIA RTX Blackwell GPU architecture whitepaper (GeForce RTX 5090)",
    ),
    # NVIDIA Jetson AGX Orin series technical brief, 64GB module: Ampere GPU with 2,048 CUDA
    # cores and 64 tensor cores at 1.3 GHz -> FP32 5.3 TFLOPS; GPU 170 INT8 TOPS with sparsity
    # -> 85 dense, and Ampere tensor cores run FP16/BF16 at half the INT8 rate (42.5) and TF32 at
    # half that (21.25); FP16 on CUDA cores 2x FP32 (GA10x); LPDDR5 204.8 GB/s. Launches cost
    # more on the module's Arm host: 8 us.
    "jetson_orin": DeviceSpec(
        name="jetson_orin",
        fp32_tflops=5.3,
        tf32_tflops=21.25,
        fp16_tflops=42.5,
        bf16_tflops=42.5,
        fp16_simt_tflops=10.6,
        mem_bandwidth_gbs=204.8,
        launch_overhead_us=8.0,
        source="NVIDIA Jetson AGX Orin series technical brief (64GB); NVIDIA Ampere GA102 whitepaper ratios",
    ),
    # AMD Instinct MI300X data sheet: FP32 vector 163.4, TF32 matrix 653.7, FP16/BF16 matrix
    # 1,307.4 TFLOPS dense (2,614.9 with sparsity), HBM3 5.3 TB/s. FP16 vector: not published
    # separately; taken as the FP32 vector rate. Launches through ROCm/HIP (ORT's ROCm and
    # MIGraphX providers) cost a little more than CUDA's: 5 us.
    "mi300x": DeviceSpec(
        name="mi300x",
        fp32_tflops=163.4,
        tf32_tflops=653.7,
        fp16_tflops=1307.4,
        bf16_tflops=1307.4,
        fp16_simt_tflops=163.4,
        mem_bandwidth_gbs=5300.0,
        launch_overhead_us=5.0,
        source="AMD Instinct MI300X accelerator data sheet",
    ),
}

DEFAULT_DEVICE = "h100"


def get_device(name_or_spec: str | DeviceSpec) -> DeviceSpec:
    """Return the spec for a device name (case-insensitive); a DeviceSpec is returned unchanged."""
    if isinstance(name_or_spec, DeviceSpec):
        return name_or_spec
    if not isinstance(name_or_spec, str):
        raise TypeError(f"device must be a name or a DeviceSpec, got {type(name_or_spec).__name__}")
    spec = DEVICES.get(name_or_spec.strip().lower())
    if spec is None:
        raise ValueError(
            f"unknown device {name_or_spec!r}; known devices: {', '.join(sorted(DEVICES))}"
        )
    return spec


class DeviceFileError(ValueError):
    """A device description that cannot be used: ``str()`` is ``<file>: field '<name>': <reason>``."""

    def __init__(self, source: str, field: str, reason: str) -> None:
        self.source, self.field, self.reason = source, field, reason
        where = f"field {field!r}: " if field else ""
        super().__init__(f"{source}: {where}{reason}")


#: fields of a device description: required ones, and defaults for the others (a part
#: without TF32/BF16 tensor cores or a published FP16 CUDA-core rate runs them at the FP32 rate)
_REQUIRED = ("fp32_tflops", "fp16_tflops", "mem_bandwidth_gbs")
_DEFAULTS = {"tf32_tflops": "fp32_tflops", "bf16_tflops": "fp32_tflops", "fp16_simt_tflops": "fp32_tflops"}
_DEFAULT_LAUNCH_US = 4.0


def device_from_dict(data: object, source: str = "device") -> DeviceSpec:
    """A ``DeviceSpec`` from a JSON-like dict (``--target-file``); ``DeviceFileError`` names the bad field.

    Required: ``fp32_tflops``, ``fp16_tflops`` (dense tensor-core peak), ``mem_bandwidth_gbs``.
    Optional: ``name`` (default: ``source``'s stem), ``tf32_tflops``, ``bf16_tflops`` and
    ``fp16_simt_tflops`` (default: the FP32 rate), ``launch_overhead_us`` (default 4), ``source``.
    """
    if not isinstance(data, dict):
        raise DeviceFileError(source, "", f"expected a JSON object of device figures, got {type(data).__name__}")
    known = {f.name for f in fields(DeviceSpec)}
    for key in data:
        if key not in known:
            raise DeviceFileError(source, str(key), f"unknown field (known: {', '.join(sorted(known))})")
    for key in _REQUIRED:
        if key not in data:
            raise DeviceFileError(source, key, "missing (required: " + ", ".join(_REQUIRED) + ")")
    values: dict[str, float] = {"launch_overhead_us": _DEFAULT_LAUNCH_US}
    for key, value in data.items():
        if key in ("name", "source"):
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise DeviceFileError(source, key, f"expected a positive number, got {value!r}")
        values[key] = float(value)
    for key, default in _DEFAULTS.items():
        values.setdefault(key, values[default])
    if values["fp16_tflops"] < values["fp16_simt_tflops"]:
        raise DeviceFileError(source, "fp16_tflops", "the tensor-core peak is below the CUDA-core FP16 rate")
    name = data.get("name", Path(str(source)).stem)
    if not isinstance(name, str) or not name.strip():
        raise DeviceFileError(source, "name", f"expected a non-empty string, got {name!r}")
    note = data.get("source", f"described in {source}")
    return DeviceSpec(name=name.strip().lower(), source=str(note), **values)


def load_device(target: str | os.PathLike | dict | DeviceSpec) -> DeviceSpec:
    """A device by table name, ``DeviceSpec``, dict of figures, or path to a JSON file of them."""
    if isinstance(target, dict):
        return device_from_dict(target, str(target.get("name", "device")))
    if isinstance(target, DeviceSpec) or (isinstance(target, str) and target.strip().lower() in DEVICES):
        return get_device(target)
    if isinstance(target, (str, os.PathLike)) and (str(target).lower().endswith(".json") or os.path.exists(target)):
        return _load_device_file(str(target))
    return get_device(target)  # an unknown name: ValueError listing the known devices


def _load_device_file(path: str) -> DeviceSpec:
    import json  # here: the CLI imports this module before it has a file to read

    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as exc:
        raise DeviceFileError(path, "", f"cannot read the device file: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DeviceFileError(path, "", f"not valid JSON: {exc}") from None
    return device_from_dict(data, path)
