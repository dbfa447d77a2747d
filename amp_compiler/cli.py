"""``amp-compile``: the command-line entry point of the ONNX path."""

from __future__ import annotations

import argparse
import functools
import gc
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

# Only light modules here: --help, --version and bad options must answer without numpy, onnx or
# onnxruntime (docs/architecture.md, "The CLI"); _run imports them when there is a model to convert.
from cost_model.devices import DEVICES
from cost_model.runtime import RUNTIMES

from . import __version__
from .errors import ConversionError

EXAMPLES = """\
examples:
  amp-compile bert.onnx -o bert.fp16.onnx
      convert for the default target (H100), graph inputs/outputs stay FP32
  amp-compile bert.onnx -o bert.fp16.onnx --report bert.html --validate
      also write an HTML report and check the outputs against FP32 on ONNX Runtime
  amp-compile resnet.onnx --dry-run --report plan.json --target a100
      plan for an A100 and write the JSON report only; no model is written
  amp-compile gpt2.onnx -o gpt2.mp.onnx --deny Softmax --deny-node /lm_head/MatMul
      keep every Softmax and one named node in FP32
  amp-compile model.onnx -o model.mp.onnx --dim batch=32 --dim sequence=512
      give symbolic dims the sizes the cost model should plan for
  amp-compile model.onnx -o model.mp.onnx --calibrate --inputs batch.npz
      run the FP32 model once on real inputs; ops whose activations exceed FP16's range stay FP32
  amp-compile model.onnx -o model.mp.onnx --fallback --tolerance 1e-3 --runtime reference
      move the ops that add the most error to FP32, re-plan, repeat until within tolerance
  amp-compile model.onnx -o model.mp.onnx --exclude-nodes '/lm_head/.*' --force-op Gelu --max-reduction-depth 8192
      AutoCast-style rules: nodes by name pattern stay FP32, every Gelu runs FP16, long reductions stay FP32
  amp-compile model.onnx -o model.mp.onnx --target-file my_gpu.json --custom-ops plugins.json
      plan for a device described in JSON, classify plugin ops from a table (docs/migrating.md)
  amp-compile --compare plan_a.json plan_b.json
      which ops changed precision between two saved JSON reports, and the predicted effect

exit status: 0 converted (and validated, with --validate); 1 validation error above
--tolerance (the model is not written; --report files are, with the errors); 2 bad input
or options (one line on stderr names the file, op and reason; no output file is left
behind and the input is never modified); 3 internal error (a bug: please report it;
--debug shows the traceback); 130 interrupted (Ctrl-C), 143 terminated (SIGTERM): nothing left.
"""


#: --validate's default budget per --dtype: BF16's errors on the zoo are 8-15x FP16's (0.6-1.2 %
#: against 0.05-0.08 %), so FP16's 1 % would fail correct BF16 plans
DEFAULT_TOLERANCE = {"fp16": 1e-2, "bf16": 5e-2}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="amp-compile",
        description="Rewrite an FP32 ONNX model into a mixed-precision one: tensor-core work in FP16/BF16, "
                    "numerically sensitive ops in FP32, casts placed where a cost model says they are cheapest.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", help="the FP32 .onnx file to convert (never modified)")
    p.add_argument("-o", "--output", help="where to write the converted model (required unless --dry-run)")
    p.add_argument("--version", action="version", version=f"amp-compile {__version__}")
    target = p.add_mutually_exclusive_group()
    target.add_argument("--target", default="h100", type=str.lower, choices=sorted(DEVICES), metavar="DEVICE",
                        help=f"device the cost model plans for: {', '.join(sorted(DEVICES))} (default: h100)")
    target.add_argument("--target-file", metavar="FILE.json",
                        help="a device outside the table, described in JSON: fp32_tflops, fp16_tflops (dense "
                             "tensor-core peak), mem_bandwidth_gbs; optional tf32_tflops, bf16_tflops, "
                             "fp16_simt_tflops, launch_overhead_us (default 4), name")
    p.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"], help="low-precision dtype (default: fp16)")
    io = p.add_mutually_exclusive_group()
    io.add_argument("--keep-io-types", dest="keep_io_types", action="store_true", default=True,
                    help="graph inputs and outputs keep their dtypes (default)")
    io.add_argument("--no-keep-io-types", dest="keep_io_types", action="store_false",
                    help="let graph inputs/outputs take the low dtype where their ops run in it")
    p.add_argument("--allow", action="append", default=[], metavar="OP",
                   help="treat op type OP as a tensor-core (allow) op; repeatable. e.g. --allow Einsum")
    p.add_argument("--deny", action="append", default=[], metavar="OP",
                   help="keep every op of type OP in FP32; repeatable. e.g. --deny Softmax")
    p.add_argument("--deny-node", action="append", default=[], metavar="NAME",
                   help="keep the node named NAME in FP32; repeatable")
    p.add_argument("--exclude-nodes", action="append", default=[], metavar="REGEX",
                   help="keep in FP32 every node whose name matches REGEX at its start (AutoCast's "
                        "nodes_to_exclude); repeatable")
    p.add_argument("--include-nodes", action="append", default=[], metavar="REGEX",
                   help="force nodes whose name matches REGEX into the low dtype where legal (schema, kernel "
                        "and weight range permitting), whatever their class or the cost model; wins over "
                        "--exclude-nodes, as in AutoCast; repeatable")
    p.add_argument("--force-op", action="append", default=[], metavar="TYPE",
                   help="force every op of type TYPE into the low dtype where legal (AutoCast's "
                        "op_types_to_include); unlike --allow, which only makes TYPE a tensor-core op the cost "
                        "model may still keep FP32; repeatable")
    p.add_argument("--max-reduction-depth", type=_positive(int), metavar="N",
                   help="keep in FP32 ops that accumulate over more than N elements (MatMul/Gemm K, Conv "
                        "Cin x kernel, attention head size, Reduce*); from shapes, no data needed")
    p.add_argument("--init-max-bytes", type=_positive(int), metavar="N",
                   help="initializers over N bytes stay FP32 in the file and are cast at run time instead of "
                        "being stored converted (AutoCast's init_conversion_max_bytes)")
    p.add_argument("--custom-ops", metavar="FILE.json",
                   help='classify ops of a plugin library from a table instead of as "unknown": {"ops": '
                        '[{"op_type": ..., "domain": ..., "class": "allow|infer|clear|deny", "tensor_core": '
                        'false, "fp32_inputs": [], "fp32_outputs": []}]}')
    p.add_argument("--planner", default="optimal", choices=["optimal", "greedy", "all"],
                   help="optimal: exact min-cut over op and cast costs (default); greedy: TF-style painter; "
                        "all: every op that can safely run in the low dtype does, whatever the cost")
    p.add_argument("--deny-propagation", action=argparse.BooleanOptionalAction, default=True,
                   help="TF's rule: an infer op fed by a deny op (Pow, a reduction) through infer/clear ops "
                        "stays FP32 too, up to an op whose output is bounded (tanh, softmax, a norm), so a value "
                        "of unknown range is never cast to FP16 without calibration data (on by default; "
                        "--no-deny-propagation leaves those ops to the cost model)")
    p.add_argument("--deploy", default="ort-cuda", choices=list(RUNTIMES),
                   help="runtime the model will be deployed on, whose kernel fusions and launch costs the cost "
                        "model prices (default: ort-cuda, ONNX Runtime's CUDA EP; tensorrt and inductor fuse casts "
                        "into neighbouring kernels)")
    p.add_argument("--objective", default="time", choices=["time", "memory", "fastest"],
                   help="time: fastest predicted plan, near-ties (within 1%% or 4 kernel launches) to the one "
                        "with less memory (default); memory: least weight+activation memory, time breaks ties; "
                        "fastest: the exact time minimum, never predicted slower than all-FP32")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                   help="size of a symbolic dim for the cost model (repeatable); others use --default-dim")
    p.add_argument("--default-dim", type=_positive(int), default=8, metavar="N",
                   help="size assumed for symbolic dims not given by --dim (default: 8)")
    p.add_argument("--report", action="append", default=[], metavar="FILE",
                   help="write the per-op report; format from the suffix: .json, .html, .txt (repeatable)")
    p.add_argument("--validate", action="store_true",
                   help="run the FP32 and the converted model on ONNX Runtime and print per-output errors")
    p.add_argument("--calibrate", action="store_true",
                   help="run the FP32 model once (on --inputs, else seeded random inputs) and keep in FP32 "
                        "every op that reads or writes an activation FP16 cannot hold (beyond its range, or "
                        "subnormal throughout)")
    p.add_argument("--data-max", type=_positive(float), metavar="X",
                   help="with --calibrate: keep FP32 every op reading or writing an activation above X "
                        "(AutoCast's data_max; default 32752, half FP16's maximum)")
    p.add_argument("--fallback", action="store_true",
                   help="validate, then move the ops that add the most error to FP32 and re-plan, until every "
                        "output is within --tolerance (exit 2 if it cannot get there); implies --validate")
    p.add_argument("--runtime", default="ort", choices=["ort", "reference"],
                   help="what --validate/--fallback run the models on: ort (ONNX Runtime CPU, default; it runs "
                        "FP16 ops without a CPU kernel in FP32, and BF16 plans with BF16 storage emulated) or reference (onnx.reference: rounds every op "
                        "to FP16 as a GPU would; slow, for small models)")
    p.add_argument("--inputs", metavar="FILE.npz",
                   help="inputs for --validate, --fallback and --calibrate (default: seeded inputs drawn as the "
                        "model sees them: token ids within the embedding table, masks of ones, images in [0, 1], "
                        "audio in [-1, 1]; the report says how)")
    p.add_argument("--tolerance", type=float, default=None,
                   help="largest max|mixed-fp32|/max|fp32| per output accepted by --validate (default: 0.01 "
                        "for fp16, 0.05 for bf16, whose 8 significant bits round 8x coarser)")
    p.add_argument("--dry-run", action="store_true", help="plan and report only; write no model")
    p.add_argument("--no-annotate", dest="annotate", action="store_false",
                   help="do not write each node's precision, class and reason into its metadata_props/doc_string")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="print only errors: no progress, table, per-output errors or warnings")
    p.add_argument("--debug", action="store_true", help="show the Python traceback on errors")
    return p


class _Progress:
    """One line per stage on stderr with the time since start."""

    def __init__(self, quiet: bool) -> None:
        self.quiet, self.start = quiet, time.perf_counter()

    def __call__(self, stage: str) -> None:
        if not self.quiet:
            print(f"[{time.perf_counter() - self.start:7.2f}s] {stage}", file=sys.stderr, flush=True)


def _positive(kind: type) -> Callable[[str], float]:
    """An argparse ``type``: a finite number of ``kind`` above zero."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = 0
        if not 0 < value < float("inf"):
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text!r}")
        return value
    return parse


def main(argv: list[str] | None = None) -> int:
    """Run ``amp-compile``; returns the exit status (see ``EXAMPLES``). Errors are one line on stderr."""
    argv = sys.argv[1:] if argv is None else argv
    if "--compare" in argv:  # two saved plans, no model: plan_diff.py
        from .plan_diff import main as compare_main
        return compare_main(argv)
    args = build_parser().parse_args(argv)
    if args.tolerance is None:
        args.tolerance = DEFAULT_TOLERANCE[args.dtype]
    from .terminate import Terminated, terminate_as_exception

    try:
        with terminate_as_exception():
            return _run(args)
    except Terminated:  # SIGTERM: the staged files are gone, as after Ctrl-C
        return _fail(args, "amp-compile: terminated", 143)
    except ConversionError as exc:
        exc = _naming_the_model(args, _inputs_rejected(args, exc))
        return _fail(args, f"amp-compile: error: {exc}{_drawn_inputs_hint(args, exc)}", 2)
    except OSError as exc:  # I/O the file helpers do not wrap (writing a report, ...)
        where = exc.filename or args.input
        return _fail(args, f"amp-compile: error: {where}: {exc.strerror or exc}", 2)
    except MemoryError:
        return _fail(args, f"amp-compile: error: {args.input}: out of memory", 2)
    except KeyboardInterrupt:
        return _fail(args, "amp-compile: interrupted", 130)
    except Exception as exc:  # a bug, not bad input: say so, in one line
        detail = " ".join(str(exc).split())[:300]
        return _fail(args, f"amp-compile: internal error: {type(exc).__name__}: {detail} (this is a bug: please "
                           f"report it with the model; --debug shows the traceback)", 3)


def _fail(args: argparse.Namespace, line: str, status: int) -> int:
    if args.debug:
        traceback.print_exc()
    print(line, file=sys.stderr, flush=True)
    return status


def _run(args: argparse.Namespace) -> int:
    source = Path(args.input)  # the cheap checks of files.load_model, before the heavy imports
    if not source.exists() or source.is_dir():
        raise ConversionError(args.input, "", "is a folder, not an ONNX file" if source.is_dir() else "file not found")
    if not args.output and not args.dry_run:
        raise ConversionError(args.input, "", "no output path: pass -o OUT.onnx, or --dry-run to only plan")
    runs_models = args.validate or args.fallback or args.calibrate
    if args.inputs and not runs_models:
        raise ConversionError(args.inputs, "", "--inputs is read only by --validate, --calibrate or --fallback")
    if args.data_max is not None and not args.calibrate:
        raise ConversionError(args.input, "", "--data-max applies only with --calibrate")
    if args.runtime != "ort" and not (args.validate or args.fallback):
        raise ConversionError(args.input, "", f"--runtime {args.runtime} applies only with --validate or --fallback")
    for report_path in args.report:
        if Path(report_path).suffix.lower() not in (".json", ".html", ".htm", ".txt"):
            raise ConversionError(report_path, "", "report format unknown: use a .json, .html or .txt suffix")
    dims = _parse_dims(args.dim)
    if args.inputs:
        _check_inputs_file(args.inputs)
    options = _rule_options(args)
    from .fallback import convert_with_fallback  # the heavy modules, once the options are known good
    from .onnx_api import convert_onnx
    from .onnx_io.files import check_output_path, load_model_files

    out = check_output_path(args.output, [args.input]) if args.output and not args.dry_run else None
    for report_path in args.report:
        check_output_path(report_path, [args.input])
    progress = _Progress(args.quiet)
    if args.quiet:
        _silence_warnings(runs_models)
    progress("load")
    # External data stays on disk and is streamed tensor by tensor (models over 2 GB never sit in
    # memory whole); only what runs the models from memory (a dry run with --validate,
    # --calibrate, --fallback, the reference runtime) loads it.
    in_memory = (args.dry_run and args.validate) or args.calibrate or args.fallback or args.runtime == "reference"
    # the files it was read from, named before a load into memory clears the model's references to them
    original, args.read_from = load_model_files(args.input, external_data="load" if in_memory else "lazy")
    base_dir = Path(args.input).resolve().parent
    if out is not None:  # nor may its .data file be one the input reads from
        check_output_path(out, args.read_from)
    feeds = _feeds(args, original) if (args.validate or args.fallback or args.calibrate) else None
    convert = functools.partial(convert_onnx, original, dtype=args.dtype, **options,
                                keep_io_types=args.keep_io_types, allow=args.allow, deny=args.deny,
                                planner=args.planner, default_dim=args.default_dim, progress=progress,
                                dim_values=dims, source=args.input, base_dir=base_dir,
                                calibration_inputs=feeds if args.calibrate else None,
                                deny_propagation=args.deny_propagation, annotate=args.annotate,
                                deploy=args.deploy, objective=args.objective,
                                copy=runs_models)  # only runs of the models read the original again
    if args.fallback:
        result, _ = convert_with_fallback(convert, original, feeds, args.tolerance, deny_nodes=args.deny_node,
                                          progress=progress, runner=_runner(args))
    else:
        result = convert(deny_nodes=args.deny_node)
    return _write_checked(args, result, original, out, feeds, progress)


def _write_checked(args, result, original, out, feeds, progress) -> int:
    """Stage the model and reports, check them, publish: a failed run leaves nothing behind.

    Exit 1 (validation above --tolerance) publishes the reports, which hold the errors,
    but not the model.
    """
    from .atomic import Staging

    report = result.report
    if feeds is not None:
        report.summary["inputs_drawn"] = args.inputs_drawn  # how the validation/calibration inputs were made
    with Staging() as staging:  # leaving the block removes whatever was not published
        staged = None
        if out is not None:
            progress(f"write {out}")
            result.save(out, protect=[args.input, *args.read_from], staging=staging)
            staged = staging.path(out)
        status = 0
        if args.validate or args.fallback:
            progress(f"validate on {'the onnx reference evaluator' if args.runtime == 'reference' else 'ONNX Runtime'}")
            status = _validate(args, original, result, staged, report, feeds)
        for report_path in args.report:
            report.save(report_path, staging=staging)
        staging.publish(only=None if status == 0 else args.report)
    if not args.quiet:
        print(report.to_text(max_rows=40))
    return status


def _feeds(args, model) -> dict:
    from .input_gen import model_inputs
    from .validate import load_inputs

    if args.inputs:
        args.inputs_drawn = {"*": f"read from {args.inputs}"}
        return load_inputs(args.inputs, model)
    try:
        feeds, args.inputs_drawn = model_inputs(model, dims=_parse_dims(args.dim))
    except ConversionError as exc:  # a graph input no data can be drawn for: input_gen knows no file
        raise ConversionError(exc.source or args.input, exc.where, exc.reason) from None
    args.drawn_shapes = {name: list(value.shape) for name, value in feeds.items()}
    return feeds


def _inputs_rejected(args, exc: ConversionError) -> ConversionError:
    """ONNX Runtime failing to run the FP32 model on inputs we drew, under ``--calibrate`` or
    ``--fallback`` as under ``--validate``: ``validate.source_rejects``' message (the sizes drawn, a
    position table shorter than the sequence and the ``--dim`` that fits), not ORT's alone."""
    shapes = getattr(args, "drawn_shapes", None)
    if not shapes:  # nothing drawn (and nothing heavy imported for a bad path: tests/test_cli_start.py)
        return exc
    from .validate import InputsRejected, fp32_run_refused, source_rejects

    if isinstance(exc, InputsRejected) or not fp32_run_refused(exc):
        return exc
    try:
        import onnx

        graph = onnx.load(str(args.input), load_external_data=False)
    except Exception:  # noqa: BLE001  the file loaded once already; without it, ORT's message stands
        return exc
    return source_rejects(exc, graph, shapes, str(args.input))


_MODEL_LABELS = ("model", "the FP32 model", "the converted model")  # validate.py's and fallback.py's


def _naming_the_model(args, exc: ConversionError) -> ConversionError:
    """An error that names a model by its role, not its file (ONNX Runtime refusing "the
    converted model") with the input's path in front, as every error names its file."""
    if exc.source not in _MODEL_LABELS:
        return exc
    return ConversionError(args.input, ": ".join(part for part in (exc.source, exc.where) if part), exc.reason)


def _drawn_inputs_hint(args, exc: ConversionError) -> str:
    """When the FP32 model itself fails on inputs we drew, the sizes we guessed for its symbolic
    dims are the likely cause (an export specialised to batch 1, a waveform too short): say them."""
    shapes = getattr(args, "drawn_shapes", None)
    if not shapes or "FP32 model" not in f"{exc.source}: {exc.where}" or exc.reason.startswith("cannot load"):
        return ""
    drawn = ", ".join(f"{name} {shape}" for name, shape in shapes.items())
    return (f" (on inputs drawn as {drawn}: size the symbolic dims with --dim NAME=SIZE, "
            "or pass --inputs FILE.npz)")


def _runner(args):
    from .validate import run_model, run_reference

    return run_reference if args.runtime == "reference" else run_model


def _low(args) -> str:
    from .dtypes import normalize_low_dtype

    return normalize_low_dtype(args.dtype)


def _validate(args, original, converted, staged, report, feeds) -> int:
    """Compare the outputs: ONNX Runtime runs the staged files (external data and all)."""
    from .validate import validate

    if staged is not None and args.runtime == "ort":
        result = validate(str(args.input), str(staged), feeds, args.tolerance, low=_low(args))
    else:
        result = validate(original, converted.model, feeds, args.tolerance, runner=_runner(args), low=_low(args),
                          source=str(args.input))
    report.data["validation"] = result
    if result.get("emulation") and not args.quiet:
        print(f"  {result['emulation']}", file=sys.stderr)
    for row in [] if args.quiet else result["outputs"]:
        print(f"  {row['name']}: max abs error {row['max_abs_error']:.3g}, "
              f"max rel error {row['max_rel_error']:.3g}" + (f"; {row['note']}" if "note" in row else ""),
              file=sys.stderr)
    if result.get("overflows"):
        from .overflow import overflow_line

        print(f"amp-compile: validation failed: {overflow_line(result['overflows'])}; no model written",
              file=sys.stderr)
        return 1
    if not result["passed"]:
        print(f"amp-compile: validation failed: max rel error {result['max_rel_error']:.3g} > "
              f"tolerance {args.tolerance}; no model written", file=sys.stderr)
        return 1
    return 0


def _rule_options(args: argparse.Namespace) -> dict:
    """The device and the AutoCast-style rules, checked before any model is read."""
    import re

    from cost_model.devices import DeviceFileError, load_device

    for option in ("exclude_nodes", "include_nodes"):
        for pattern in getattr(args, option):
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ConversionError("", f"--{option.replace('_', '-')} {pattern}",
                                      f"not a regular expression: {exc}") from None
    try:
        target = load_device(args.target_file) if args.target_file else args.target
    except DeviceFileError as exc:
        raise ConversionError(exc.source, f"field {exc.field!r}" if exc.field else "", exc.reason) from None
    custom_ops = None
    if args.custom_ops:
        from .custom_ops import load_custom_ops

        try:
            custom_ops = load_custom_ops(args.custom_ops)
        except ValueError as exc:
            raise ConversionError("", "", str(exc)) from None
    return dict(target=target, exclude_nodes=args.exclude_nodes, include_nodes=args.include_nodes,
                force_ops=args.force_op, max_reduction_depth=args.max_reduction_depth,
                init_max_bytes=args.init_max_bytes, custom_ops=custom_ops, data_max=args.data_max)


def _check_inputs_file(path: str) -> None:
    """``--inputs`` must be an ``.npz`` archive; say so in our words before numpy reads it."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError as exc:
        raise ConversionError(path, "", f"cannot read the inputs file: {exc.strerror or exc}") from None
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return
    if head.startswith(b"\x93NUMPY"):
        kind = "a single .npy array, which has no input names"
    elif head[:1] == b"\x08" or path.lower().endswith(".onnx"):
        kind = "an ONNX model, not inputs (the model is the first argument)"
    else:
        kind = "not a numpy .npz archive"
    raise ConversionError(path, "--inputs", f"{kind}: save the inputs by graph-input name with "
                                            "numpy.savez(path, input_ids=..., ...)")


def _plain_warnings() -> None:
    """Python warnings printed as one line each, as errors are (``amp-compile: warning: ...``), not
    with the path and source line of the module that raised them; for the console command only
    (``run``): ``main`` called in a process leaves the caller's warning display alone."""
    import warnings

    warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: print(
        f"amp-compile: warning: {message}", file=sys.stderr)


def _silence_warnings(runs_models: bool) -> None:
    """-q: Python warnings and ONNX Runtime's log lines are not errors."""
    import warnings

    warnings.simplefilter("ignore")
    if runs_models:
        try:
            import onnxruntime
        except ImportError:
            return  # said where the model is run (``validate.onnxruntime``)
        onnxruntime.set_default_logger_severity(3)


def _parse_dims(items: list[str]) -> dict[str, int]:
    dims = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value.isdigit() or int(value) < 1:
            raise ConversionError("", f"--dim {item}", "expected NAME=SIZE with a positive integer size")
        if dims.get(name, int(value)) != int(value):  # the last had silently won
            raise ConversionError("", f"--dim {item}", f"{name} is sized twice ({name}={dims[name]} before); "
                                                       "give each dim one size")
        dims[name] = int(value)
    return dims


def run() -> None:
    """The console script: ``main``, then exit at once. Everything is written, published and flushed
    by then; tearing the interpreter down would free the model and the IR object by object (a
    fifth of a second on BERT-base, for nothing). The cyclic garbage collector stays off for the
    whole run: a conversion leaves almost no cyclic garbage, and re-enabling it after the
    conversion cost one full walk over every object the IR holds (0.8 s at 100k nodes;
    docs/architecture.md, "Performance")."""
    gc.disable()
    _plain_warnings()
    status = main()
    if sys.getprofile() is not None or sys.gettrace() is not None:
        sys.exit(status)  # a profiler or coverage writes its results at the interpreter's exit
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:  # a closed pipe: nobody left to read the rest
        pass
    os._exit(status)


if __name__ == "__main__":
    run()
