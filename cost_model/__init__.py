"""Cost model for amp-compiler: device specs, a roofline op-time model and measured profiles.

The submodules ``flops`` (FLOP formulas, the alignment rule), ``traffic`` (bytes moved) and
``timer`` (``OpTimer``: the per-op costs every consumer reads) are imported on demand; none
of them needs ``amp_compiler`` at import time (docs/architecture.md, "Cost model").
"""

from .devices import DEFAULT_DEVICE, DEVICES, DeviceFileError, DeviceSpec, device_from_dict, get_device, load_device
from .dtypes import canonical_dtype, itemsize
from .measured import MeasuredProfile, default_profile_path
from .roofline import Roofline, tensor_core_aligned

__all__ = [
    "DeviceSpec",
    "DEVICES",
    "DEFAULT_DEVICE",
    "get_device",
    "load_device",
    "device_from_dict",
    "DeviceFileError",
    "Roofline",
    "MeasuredProfile",
    "itemsize",
    "canonical_dtype",
    "default_profile_path",
    "tensor_core_aligned",
]
