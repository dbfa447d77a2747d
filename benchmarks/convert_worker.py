"""Run one converter on one ONNX file in this (fresh) process and write what happened as JSON.

Used by ``benchmarks.peers`` / ``benchmarks.torture``: one process per (tool, model), so
wall time and peak memory are the tool's own and a crash is a result, not the
benchmark's end. This file imports nothing from amp-compiler unless the tool is
amp-compiler, so it also runs in the ModelOpt virtual environment::

    python benchmarks/convert_worker.py TOOL MODEL.onnx OUT.onnx RESULT.json [OPTIONS_JSON]

``OPTIONS_JSON``: ``{"planner": ...}`` for amp-compiler; ``{"calibration_data": "x.npz"}`` for
amp-compiler (its ``calibration_inputs``) or ModelOpt (its ``calibration_data``).

What is timed, for every tool alike: from the file path in (``onnx.load`` or the
tool's own loading included) to the converted ``ModelProto`` in memory. Imports are
done before the clock starts; writing the output file is timed separately (``save_s``).
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
import traceback

TOOLS = ("amp-compiler", "ort-float16", "occ-float16", "modelopt-autocast")


def _rss_kb() -> int:
    """Current resident set size in KiB (Linux /proc; falls back to peak)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)
    except (OSError, ValueError, IndexError):
        return _peak_kb()


def _peak_kb() -> int:
    """Peak resident set size of this process image in KiB.

    Linux: ``VmHWM`` of /proc/self/status, the high-water mark of this (post-exec) address
    space. ``getrusage().ru_maxrss`` would not do: it carries over the RSS of the parent
    that forked us, so every worker would report at least the harness's size.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak // 1024 if sys.platform == "darwin" else peak


def _prepare(tool: str, options: dict):
    """Import the tool (not timed) and return (convert(path) -> ModelProto, versions, extras)."""
    import onnx

    versions = {"python": platform.python_version(), "onnx": onnx.__version__}
    extras: dict = {}
    if tool == "amp-compiler":
        import amp_compiler
        from amp_compiler.onnx_api import convert_onnx

        versions["amp_compiler"] = amp_compiler.__version__

        kwargs = {"planner": options.get("planner", "optimal"),
                  "deny_propagation": bool(options.get("deny_propagation", True))}
        if options.get("calibration_data"):
            import numpy as np

            with np.load(options["calibration_data"]) as data:
                kwargs["calibration_inputs"] = {k: data[k] for k in data.files}

        def convert(path):
            model, report = convert_onnx(path, keep_io_types=True, **kwargs)
            extras["summary"] = {k: v for k, v in report.summary.items() if isinstance(v, (int, float, str))}
            return model
    elif tool == "ort-float16":
        import onnxruntime
        from onnxruntime.transformers.float16 import convert_float_to_float16

        versions["onnxruntime"] = onnxruntime.__version__

        def convert(path):
            return convert_float_to_float16(onnx.load(path), keep_io_types=True)
    elif tool == "occ-float16":
        import onnxconverter_common
        from onnxconverter_common import float16

        versions["onnxconverter_common"] = onnxconverter_common.__version__

        def convert(path):
            return float16.convert_float_to_float16(onnx.load(path), keep_io_types=True)
    elif tool == "modelopt-autocast":
        import logging
        from importlib.metadata import version

        import onnxruntime
        from modelopt.onnx.autocast import convert_to_mixed_precision

        versions["modelopt"] = version("nvidia-modelopt")
        versions["onnxruntime"] = onnxruntime.__version__
        logging.getLogger("modelopt").setLevel(logging.WARNING)

        def convert(path):
            return convert_to_mixed_precision(onnx_path=path, low_precision_type="fp16", keep_io_types=True,
                                              providers=["cpu"], calibration_data=options.get("calibration_data"))
    else:
        raise ValueError(f"unknown tool {tool!r}; expected one of {TOOLS}")
    return convert, versions, extras


def _save(model, out: str) -> None:
    import onnx

    size = model.ByteSize()
    if size >= 2 ** 31 - (64 << 20):
        onnx.save_model(model, out, save_as_external_data=True, all_tensors_to_one_file=True,
                        location=os.path.basename(out) + ".data")
    else:
        onnx.save_model(model, out)


def main(argv: list[str]) -> int:
    tool, model_path, out_path, result_path = argv[:4]
    options = json.loads(argv[4]) if len(argv) > 4 else {}
    result: dict = {"tool": tool, "model": os.path.basename(model_path), "ok": False}  # no machine paths in results
    try:
        convert, versions, extras = _prepare(tool, options)
        result["versions"] = versions
        result["rss_after_imports_kb"] = _rss_kb()
        start = time.perf_counter()
        model = convert(model_path)
        result["convert_s"] = time.perf_counter() - start
        result["peak_rss_kb"] = _peak_kb()
        start = time.perf_counter()
        _save(model, out_path)
        result["save_s"] = time.perf_counter() - start
        result.update(extras)
        result["ok"] = True
    except BaseException as exc:  # noqa: BLE001 - any failure of the tool is the result
        lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
        result["error"] = f"{type(exc).__name__}: {lines[0] if lines else ''}"[:300]
        result["traceback"] = traceback.format_exc()[-4000:]
        result.setdefault("peak_rss_kb", _peak_kb())
    with open(result_path, "w") as f:
        json.dump(result, f, indent=1)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
