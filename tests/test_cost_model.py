"""Tests for the cost_model package (analytic roofline, device table, measured profiles)."""

import json
import math
from pathlib import Path

import pytest

import cost_model
from cost_model import (
    DEFAULT_DEVICE,
    DEVICES,
    DeviceSpec,
    MeasuredProfile,
    Roofline,
    get_device,
    itemsize,
)
from cost_model.measured import default_profile_path
from cost_model.roofline import tensor_core_aligned


def gemm(m, n, k, dtype):
    flops = 2.0 * m * n * k
    nbytes = (m * k + k * n + m * n) * itemsize(dtype)
    return dict(flops=flops, bytes_moved=nbytes, dtype=dtype, tensor_core=True)


# --- devices -----------------------------------------------------------------------------


def test_exports():
    for name in ["DeviceSpec", "DEVICES", "DEFAULT_DEVICE", "get_device", "Roofline",
                 "MeasuredProfile", "itemsize"]:
        assert name in cost_model.__all__
        assert hasattr(cost_model, name)


def test_required_devices_present():
    for name in ["v100", "a100", "h100", "h200", "l4"]:
        assert name in DEVICES
    assert any(n.startswith("rtx") for n in DEVICES)
    assert DEFAULT_DEVICE == "h100" and DEFAULT_DEVICE in DEVICES


@pytest.mark.parametrize("name", sorted(DEVICES))
def test_device_numbers_sane(name):
    d = DEVICES[name]
    assert d.name == name
    for field in ["fp32_tflops", "tf32_tflops", "fp16_tflops", "bf16_tflops",
                  "fp16_simt_tflops", "mem_bandwidth_gbs", "launch_overhead_us"]:
        v = getattr(d, field)
        assert isinstance(v, float) and v > 0 and math.isfinite(v), field
    assert d.fp16_tflops > d.fp32_tflops
    assert d.tf32_tflops >= d.fp32_tflops
    assert d.fp16_tflops >= d.fp16_simt_tflops
    assert 1.0 <= d.launch_overhead_us <= 20.0
    assert d.source


def test_known_datasheet_figures():
    h100 = DEVICES["h100"]
    assert h100.fp16_tflops == pytest.approx(989.4)
    assert h100.mem_bandwidth_gbs == pytest.approx(3350)
    assert DEVICES["a100"].fp16_tflops == pytest.approx(312)
    assert DEVICES["v100"].fp16_tflops == pytest.approx(125)
    # H200 is Hopper compute with faster memory
    assert DEVICES["h200"].fp16_tflops == h100.fp16_tflops
    assert DEVICES["h200"].mem_bandwidth_gbs > h100.mem_bandwidth_gbs


def test_get_device_case_insensitive_and_passthrough():
    assert get_device("H100") is DEVICES["h100"]
    assert get_device(" a100 ") is DEVICES["a100"]
    custom = DeviceSpec("mine", 1.0, 1.0, 8.0, 8.0, 2.0, 100.0, 3.0, "test")
    assert get_device(custom) is custom
    with pytest.raises(Exception):
        custom.fp32_tflops = 2.0  # frozen


def test_unknown_device_lists_names():
    with pytest.raises(ValueError) as ei:
        get_device("tpu-v9")
    msg = str(ei.value)
    assert "tpu-v9" in msg
    for name in DEVICES:
        assert name in msg


# --- dtypes ------------------------------------------------------------------------------


def test_itemsize():
    assert itemsize("float32") == 4 and itemsize("fp32") == 4
    assert itemsize("float16") == 2 and itemsize("fp16") == 2
    assert itemsize("bfloat16") == 2 and itemsize("bf16") == 2
    assert itemsize("float64") == 8
    assert [itemsize(t) for t in ["int8", "int16", "int32", "int64"]] == [1, 2, 4, 8]
    assert itemsize("uint8") == 1 and itemsize("bool") == 1
    with pytest.raises(ValueError, match="float8"):
        itemsize("float8")


def test_tensor_core_aligned():
    assert tensor_core_aligned("float16", 64, 128, 4096)
    assert not tensor_core_aligned("fp16", 64, 127, 4096)
    assert tensor_core_aligned("float32", 4, 12)
    assert not tensor_core_aligned("int64", 8, 8)


# --- roofline ----------------------------------------------------------------------------


def test_compute_peak_selection():
    d = DEVICES["h100"]
    r = Roofline("h100")
    assert r.compute_peak("float16", True) == pytest.approx(d.fp16_tflops * 1e12)
    assert r.compute_peak("bf16", True) == pytest.approx(d.bf16_tflops * 1e12)
    assert r.compute_peak("fp16", True, aligned=False) == pytest.approx(d.fp16_simt_tflops * 1e12)
    assert r.compute_peak("float16", False) == pytest.approx(d.fp16_simt_tflops * 1e12)
    # TF32 is off by default (PyTorch / ORT defaults)
    assert r.compute_peak("float32", True) == pytest.approx(d.fp32_tflops * 1e12)
    assert r.compute_peak("fp32", False) == pytest.approx(d.fp32_tflops * 1e12)
    r32 = Roofline("h100", allow_tf32=True)
    assert r32.compute_peak("float32", True) == pytest.approx(d.tf32_tflops * 1e12)
    assert r32.compute_peak("float32", True, aligned=False) == pytest.approx(d.fp32_tflops * 1e12)
    with pytest.raises(ValueError):
        r.compute_peak("float8", True)


def test_default_device():
    assert Roofline().device is DEVICES[DEFAULT_DEVICE]


@pytest.mark.parametrize("name", sorted(DEVICES))
def test_large_aligned_gemm_fp16_speedup_matches_peak_ratio(name):
    d = DEVICES[name]
    r = Roofline(name)
    m = n = k = 8192
    t32 = r.op_time(**gemm(m, n, k, "float32"))
    t16 = r.op_time(**gemm(m, n, k, "float16"))
    ratio = d.fp16_tflops / d.fp32_tflops
    # compute bound: speed-up within 5% of the peak ratio (launch overhead is negligible)
    assert t32 / t16 == pytest.approx(ratio, rel=0.05)
    assert t16 == pytest.approx(2.0 * m * n * k / (d.fp16_tflops * 1e12), rel=0.01)


def test_misaligned_gemm_gets_no_tensor_core_speedup():
    d = DEVICES["a100"]
    r = Roofline("a100")
    g16 = gemm(8191, 8191, 8191, "float16")
    g32 = gemm(8191, 8191, 8191, "float32")
    t_aligned = r.op_time(**g16)
    t_misaligned = r.op_time(**g16 | {"aligned": False})
    t32 = r.op_time(**g32 | {"aligned": False})
    assert t_misaligned / t_aligned == pytest.approx(d.fp16_tflops / d.fp16_simt_tflops, rel=0.05)
    # at most the SIMT FP16 advantage over FP32, far from the tensor-core ratio
    assert t32 / t_misaligned <= d.fp16_simt_tflops / d.fp32_tflops * 1.01
    assert t32 / t_misaligned < 0.5 * d.fp16_tflops / d.fp32_tflops


def test_small_elementwise_is_launch_bound():
    r = Roofline("h100")
    numel = 1024
    t32 = r.op_time(flops=numel, bytes_moved=numel * 2 * 4, dtype="float32")
    t16 = r.op_time(flops=numel, bytes_moved=numel * 2 * 2, dtype="float16")
    assert t32 == pytest.approx(r.launch_overhead, rel=0.01)
    assert t16 == pytest.approx(r.launch_overhead, rel=0.01)


def test_large_elementwise_is_bandwidth_bound_and_fp16_halves_it():
    r = Roofline("h100")
    numel = 1 << 28
    b32 = numel * 2 * itemsize("float32")
    b16 = numel * 2 * itemsize("float16")
    t32 = r.op_time(flops=numel, bytes_moved=b32, dtype="float32")
    t16 = r.op_time(flops=numel, bytes_moved=b16, dtype="float16")
    assert t32 == pytest.approx(b32 / r.bandwidth + r.launch_overhead)
    assert (t32 - r.launch_overhead) / (t16 - r.launch_overhead) == pytest.approx(2.0)


def test_batch1_linear_is_memory_bound():
    # the tensor-core seed: batch 1 makes linear layers memory bound
    r = Roofline("a100")
    g = gemm(1, 4096, 4096, "float16")
    t = r.op_time(**g)
    assert t == pytest.approx(g["bytes_moved"] / r.bandwidth + r.launch_overhead)


def test_cast_time_scales_with_bytes():
    r = Roofline("h100")
    n = 1 << 26
    t_32_16 = r.cast_time(n, "float32", "float16")
    t_16_32 = r.cast_time(n, "float16", "float32")
    t_32_64 = r.cast_time(n, "float32", "float64")
    assert t_32_16 == pytest.approx(n * 6 / r.bandwidth + r.launch_overhead)
    assert t_32_16 == pytest.approx(t_16_32)
    assert (t_32_64 - r.launch_overhead) / (t_32_16 - r.launch_overhead) == pytest.approx(2.0)
    assert r.cast_time(2 * n, "fp32", "fp16") - r.launch_overhead == pytest.approx(
        2 * (t_32_16 - r.launch_overhead))
    assert r.cast_time(0, "float32", "float16") == pytest.approx(r.launch_overhead)


def test_faster_memory_device_is_faster_when_memory_bound():
    kw = dict(flops=1e6, bytes_moved=1e9, dtype="float16")
    assert Roofline("h200").op_time(**kw) < Roofline("h100").op_time(**kw)


def test_op_time_rejects_unknown_dtype():
    with pytest.raises(ValueError):
        Roofline("h100").op_time(flops=1, bytes_moved=1, dtype="float8")


# --- measured profiles -------------------------------------------------------------------


def test_measured_profile_overrides_analytic():
    prof = MeasuredProfile("h100")
    prof.record("MatMul[4096x4096x4096]", "float16", 1.5e-3)
    r = Roofline("h100", prof)
    g = gemm(4096, 4096, 4096, "float16")
    analytic = Roofline("h100").op_time(**g)
    assert r.op_time(**g, key="MatMul[4096x4096x4096]") == 1.5e-3
    assert analytic != pytest.approx(1.5e-3)
    # alias dtype hits the same entry; other dtype / key / no key fall back to the roofline
    assert r.op_time(**(g | {"dtype": "fp16"}), key="MatMul[4096x4096x4096]") == 1.5e-3
    g32 = gemm(4096, 4096, 4096, "float32")
    assert r.op_time(**g32, key="MatMul[4096x4096x4096]") == Roofline("h100").op_time(**g32)
    assert r.op_time(**g, key="other") == pytest.approx(analytic)
    assert r.op_time(**g) == pytest.approx(analytic)


def test_profile_for_other_device_is_rejected():
    with pytest.raises(ValueError, match="a100"):
        Roofline("h100", MeasuredProfile("a100"))


def test_profile_record_lookup():
    p = MeasuredProfile("L4")
    assert p.device == "l4"
    assert p.lookup("k", "float16") is None
    p.record("k", "fp16", 2e-6)
    assert p.lookup("k", "float16") == 2e-6
    assert p.lookup("k", "float32") is None
    with pytest.raises(ValueError):
        p.record("k", "float16", -1.0)
    with pytest.raises(ValueError):
        p.record("k", "float16", float("nan"))


def test_profile_json_round_trip(tmp_path):
    p = MeasuredProfile("h100")
    p.record("Conv[1x64x56x56,k3]", "float32", 1.25e-4)
    p.record("Conv[1x64x56x56,k3]", "float16", 4.5e-5)
    p.record("Softmax[32x128]", "bf16", 3.1e-6)
    path = p.save(tmp_path / "sub" / "h100.json")
    assert path.exists()
    assert not [f for f in path.parent.iterdir() if f.name != "h100.json"]  # no temp left
    raw = json.loads(path.read_text())
    assert raw["schema_version"] == 1
    assert raw["device"] == "h100"
    assert isinstance(raw["created"], str) and raw["created"][:4].isdigit()
    assert raw["entries"]["Softmax[32x128]"] == {"bfloat16": 3.1e-6}
    q = MeasuredProfile.load(path)
    assert q.device == "h100" and q.created == p.created
    assert q.entries == p.entries
    assert q.lookup("Conv[1x64x56x56,k3]", "float16") == 4.5e-5
    # overwrite atomically
    q.record("Softmax[32x128]", "float32", 5e-6)
    q.save(path)
    assert MeasuredProfile.load(path).lookup("Softmax[32x128]", "fp32") == 5e-6


@pytest.mark.parametrize(
    "content, fragment",
    [
        ("{not json", "invalid JSON"),
        ("[1, 2]", "top level"),
        ('{"schema_version": 2, "device": "h100", "entries": {}}', "schema_version"),
        ('{"schema_version": 1, "entries": {}}', "device"),
        ('{"schema_version": 1, "device": "h100", "entries": []}', "entries"),
        ('{"schema_version": 1, "device": "h100", "entries": {"k": 3}}', "'k'"),
        ('{"schema_version": 1, "device": "h100", "entries": {"k": {"float16": "fast"}}}', "number"),
        ('{"schema_version": 1, "device": "h100", "entries": {"k": {"float16": -1}}}', "non-negative"),
        ('{"schema_version": 1, "device": "h100", "entries": {"k": {"float8": 1e-6}}}', "float8"),
    ],
)
def test_malformed_profile_error_names_file(tmp_path, content, fragment):
    path = tmp_path / "broken_profile.json"
    path.write_text(content)
    with pytest.raises(ValueError) as ei:
        MeasuredProfile.load(path)
    assert "broken_profile.json" in str(ei.value)
    assert fragment in str(ei.value)


def test_default_profile_path():
    p = default_profile_path("H100")
    assert p.name == "h100.json"
    assert p.parent.name == "profiles"
    assert p.parent.parent == Path(cost_model.__file__).resolve().parent
    assert p.parent.is_dir()


def _check_profile_file(path: Path) -> MeasuredProfile:
    prof = MeasuredProfile.load(path)
    assert path.stem == prof.device and prof.device in DEVICES
    assert len(prof) > 0
    for per_dtype in prof.entries.values():
        assert per_dtype and all(math.isfinite(t) and t >= 0 for t in per_dtype.values())
    return prof


def test_shipped_profiles_are_valid(tmp_path):
    """Every profile shipped in ``cost_model/profiles`` (the H100's, measured by ``benchmarks.gpu_suite``
    on ONNX Runtime's CUDA EP) loads, names its device and holds sane times; the same check runs on a
    profile written the way ``gpu_suite`` writes one."""
    written = MeasuredProfile("a100", {"matmul[64x64;64x64]": {"float32": 4e-6, "fp16": 3e-6}})
    shipped = sorted(default_profile_path("h100").parent.glob("*.json"))
    checked = [_check_profile_file(p) for p in [*shipped, written.save(tmp_path / "a100.json")]]
    assert len(checked) == len(shipped) + 1 and "h100" in [p.stem for p in shipped]
    assert checked[-1].entries == {"matmul[64x64;64x64]": {"float32": 4e-6, "float16": 3e-6}}


def test_one_dtype_table_for_the_ir_and_the_cost_model():
    from amp_compiler.dtypes import itemsize as ir_itemsize
    from cost_model.dtypes import DTYPE_ALIASES, UNKNOWN_ITEMSIZE

    for alias in DTYPE_ALIASES:
        assert ir_itemsize(alias) == itemsize(alias)
    # a dtype the source leaves unknown: the IR sizes it explicitly, the cost model refuses the name
    assert ir_itemsize(None) == ir_itemsize("onnx:FLOAT4E2M1") == UNKNOWN_ITEMSIZE
    with pytest.raises(ValueError, match="unknown dtype 'onnx:FLOAT4E2M1'"):
        itemsize("onnx:FLOAT4E2M1")
