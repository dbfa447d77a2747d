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

from dataclasses import dataclass

__all__ = ["DeviceSpec", "DEVICES", "DEFAULT_DEVICE", "get_device"]


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
