"""Capture: an aten-level, functional FX graph of a model's forward.

* ``export_graph`` (for ``amp_compiler.compile``): ``torch.export`` (non-strict) with the
  core-aten decompositions, unlifted into a ``GraphModule`` that keeps the model's module
  hierarchy, shares its parameters and buffers, takes the forward's signature and writes
  mutated buffers back (``copy_``, e.g. BatchNorm running statistics in training mode).
  Python control flow on shapes and constants is specialised; data-dependent control flow
  fails with a ``ConversionError`` that names the line.
* ``dynamo_aten_graph`` (for the ``torch.compile`` backend): dynamo's graph retraced with
  ``make_fx`` under dynamo's fake mode, functionalised (in-place ops become out-of-place
  ops plus ``copy_`` into mutated inputs) and decomposed the same way, so both entry
  points give the importer the same ops.
"""

from __future__ import annotations

import contextlib
import io
import linecache
import logging
import operator
import sys
import warnings
from typing import Any, Sequence

import torch
from torch import fx
from torch.utils import _pytree as pytree

from ..errors import ConversionError
from ..user_frame import is_user_file, user_line
from .autograd_functions import check_recorded, recording_functions
from .importer import WeightSpec, dotted_path
from .schemas import writes_arguments


#: ops core-aten decomposes that are tensor-core work as they are (mv/dot into mul + a deny sum, the
#: interpolating upsamples into gathers): kept whole, classed by the registry's rows
_KEEP = ("mv", "dot", "vdot", "upsample_linear1d", "upsample_bilinear2d", "upsample_trilinear3d",
         "upsample_bicubic2d")


def _decompositions():
    from torch._decomp import core_aten_decompositions

    table = core_aten_decompositions()
    kept = {getattr(torch.ops.aten, name) for name in _KEEP}
    return {op: fn for op, fn in table.items() if getattr(op, "_overloadpacket", None) not in kept}


@contextlib.contextmanager
def _quiet():
    """On failure torch.export prints the partial graph to stderr and logs warnings; the
    ``ConversionError`` says what matters (the partial graph stays on the chained exception)."""
    loggers = [logging.getLogger(n) for n in ("torch.fx.experimental.symbolic_shapes", "torch._export",
                                               "torch.export", "torch._subclasses.fake_tensor")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:  # fake_tensor logs a traceback at ERROR for each op it cannot run (a wrong example)
        lg.setLevel(logging.CRITICAL if lg.name.endswith("fake_tensor") else logging.ERROR)
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured), warnings.catch_warnings():
            # pytree deprecation raised inside torch.export itself; nothing a user can act on
            warnings.filterwarnings("ignore", message=r".*LeafSpec.*", category=FutureWarning)
            # nn.LSTM/GRU refresh their _flat_weights list while traced; torch's advice (register_buffer) is its own
            warnings.filterwarnings("ignore", message=r".*_flat_weights.*were assigned during export")
            yield
        sys.stderr.write(captured.getvalue())  # what a successful capture printed still reaches the user
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def export_graph(model: torch.nn.Module, args: tuple, kwargs: dict | None, *, source: str,
                 dynamic_shapes: Any = None, training: bool = False) -> fx.GraphModule:
    """The unlifted, decomposed export of ``model(*args, **kwargs)``; for ``training``, a forward
    applying a custom ``autograd.Function`` raises ``CustomBackwardError`` (``autograd_functions``)."""
    with recording_functions() as functions:
        try:
            with _quiet():
                program = torch.export.export(model, tuple(args), kwargs or {}, dynamic_shapes=dynamic_shapes,
                                              strict=False)
        except Exception as exc:  # noqa: BLE001 - every capture failure becomes one readable error
            raise capture_error(exc, source) from None  # torch's traceback stays the (unprinted) __context__
    table = _decompositions()
    if training:
        check_recorded(functions, source)
        if not functions:  # a Function's forward runs grad-disabled too (reentrant checkpoint): left as it was
            _detach_no_grad_regions(program.graph_module)
        table.pop(torch.ops.aten.detach.default, None)  # core-aten makes it an alias, which autograd goes through
    try:
        with _quiet():
            program = program.run_decompositions(table)
            return program.module()
    except Exception as exc:  # noqa: BLE001 - every capture failure becomes one readable error
        raise capture_error(exc, source) from None


def _detach_no_grad_regions(gm: fx.GraphModule) -> None:
    """Detach what a ``torch.no_grad()`` block of the forward computes (a teacher's output, spectral
    norm's power iteration), in place: export's training IR wraps the block in
    ``wrap_with_set_grad_enabled(False, ...)``, which decomposing inlines, and a training plan
    then sent gradients through it into weights eager leaves untouched."""
    hop = getattr(torch.ops.higher_order, "wrap_with_set_grad_enabled", None)
    graph = gm.graph
    for node in [n for n in graph.nodes if hop is not None and n.target is hop and n.args[0] is False]:
        items = list(node.users) if all(u.target is operator.getitem for u in node.users) else [node]
        for item in items:
            with graph.inserting_after(item):
                detached = graph.call_function(torch.ops.aten.detach.default, (item,))
            detached.meta.update(item.meta)
            item.replace_all_uses_with(detached, delete_user_cb=lambda user, d=detached: user is not d)
    gm.recompile()


def automatic_dynamic_shapes(args: tuple, kwargs: dict, dims: dict[int, frozenset[int]]) -> Any:
    """A ``dynamic_shapes`` for ``torch.export`` making ``dims`` (by pytree leaf index, as
    ``plans.varying_dims`` gives them) ``Dim.AUTO``: export keeps a dim symbolic where the model
    allows it and specialises it where the model pins it, instead of refusing the capture
    (``None`` on a torch without ``Dim.AUTO``)."""
    try:
        from torch.export import Dim, ShapesCollection
        auto = Dim.AUTO
    except (ImportError, AttributeError):  # a torch before Dim.AUTO: static plans only
        return None
    collection = ShapesCollection()
    leaves = pytree.tree_leaves((tuple(args), dict(kwargs)))
    for i, leaf_dims in dims.items():
        if isinstance(leaves[i], torch.Tensor):
            collection[leaves[i]] = {d: auto for d in sorted(leaf_dims)}
    return collection


def _placeholder_values(gm: fx.GraphModule, args: tuple, kwargs: dict) -> list:
    """A call's values in the order of an unlifted export's placeholders (its input pytree spec);
    raises if the call's structure differs from the export's."""
    from torch.export import _unlift

    return [value for _, value in _unlift._check_inputs_match(tuple(args), dict(kwargs), gm._in_spec)]


def accepts(gm: fx.GraphModule, args: tuple, kwargs: dict) -> bool:
    """Whether an export's module takes a call, by torch.export's own input checks (the argument
    structure, then the guards of its symbolic dims: ranges, relations, specialisations) without
    running the graph."""
    try:
        from torch.export import _unlift

        flat = _placeholder_values(gm, args, kwargs)
        guards = getattr(gm, "_guards_fn", None)
        if guards is not None:
            guards(*flat)
        else:
            _unlift._check_input_constraints_for_module(gm, tuple(args), dict(kwargs))
    except Exception:  # noqa: BLE001 - a failed guard, or a torch without these checks: not taken
        return False
    return True


def input_symbols(gm: fx.GraphModule, args: tuple, kwargs: dict) -> dict[tuple[int, int], str]:
    """``(pytree leaf index, dim) -> symbol`` of the input dims an export of ``(args, kwargs)`` made
    symbolic ({} on a torch without export's input check)."""
    leaves = pytree.tree_leaves((tuple(args), dict(kwargs)))
    index = {id(leaf): i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)}
    try:
        flat = _placeholder_values(gm, args, kwargs)
    except Exception:  # noqa: BLE001 - the example's sizes, then
        return {}
    out: dict[tuple[int, int], str] = {}
    for node, value in zip(gm.graph.find_nodes(op="placeholder"), flat):
        i, val = index.get(id(value)), node.meta.get("val")
        if i is not None and isinstance(val, torch.Tensor):
            for d, size in enumerate(val.shape):
                expr = getattr(getattr(size, "node", None), "expr", None)
                if expr is not None and expr.is_Symbol:
                    out[(i, d)] = str(expr)
    return out


def raising_line(exc: BaseException) -> str:
    """``file:line in function: `source``` of the innermost user-code frame of ``exc``'s traceback, or ''."""
    where, tb = "", exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if is_user_file(code.co_filename):
            line = linecache.getline(code.co_filename, tb.tb_lineno).strip()
            where = f"{code.co_filename}:{tb.tb_lineno} in {code.co_name}" + (f": `{line}`" if line else "")
        tb = tb.tb_next
    return where


def capture_error(exc: BaseException, source: str, tool: str = "torch.export") -> ConversionError:
    """A ``ConversionError`` naming the construct and the user's line that torch could not capture."""
    text = str(exc)
    where = user_line(text) or raising_line(exc)
    name = type(exc).__name__
    if name == "GuardOnDataDependentSymNode" or "data-dependent" in text:
        reason = ("data-dependent Python control flow (an if/while/int()/.item() on a tensor's value) "
                  "cannot be captured as one graph; rewrite it with torch.where/torch.cond")
    else:
        first = next((line for line in text.splitlines() if line.strip()), name)
        reason = f"{tool} could not capture the model ({name}: {first.strip()[:300]})" + _suggested_fixes(text)
    return ConversionError(source, where or "forward", reason)


def _suggested_fixes(text: str) -> str:
    """torch.export's own fix for a ``dynamic_shapes`` range the model does not support (``s =
    Dim('s', max=512)`` for BERT's 512 positions), with the guard it broke, else ''."""
    lines = [line.strip() for line in text.splitlines()]
    if "Suggested fixes:" not in lines:
        return ""
    at = lines.index("Suggested fixes:")
    guards = [line[2:] for line in lines[:at] if line.startswith("- Not all values")]
    fixes = [line for line in lines[at + 1:] if line and "=" in line and "Dim" in line]
    if not fixes:
        return ""
    return "; " + "; ".join(guards[:3]) + f"; use {', '.join(fixes[:6])} in dynamic_shapes"


def failing_module(exc: BaseException | None, model: torch.nn.Module) -> str:
    """``path (Class)`` of the innermost submodule of ``model`` running when ``exc`` (or its cause) was raised."""
    by_id = {id(m): (name, m) for name, m in model.named_modules()}
    found, seen = None, set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        tb = exc.__traceback__
        while tb is not None:
            found = by_id.get(id(tb.tb_frame.f_locals.get("self")), found)
            tb = tb.tb_next
        exc = exc.__cause__ or exc.__context__
    if found is None:
        return ""
    name, module = found
    return f"{name or '<root>'} ({type(module).__name__})"


# -- dynamo --------------------------------------------------------------------------------------

def dynamo_weights(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> dict[int, WeightSpec]:
    """Placeholders of a dynamo graph that carry module parameters or buffers, by position."""
    out: dict[int, WeightSpec] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, (node, example) in enumerate(zip(placeholders, example_inputs)):
        grapharg = node.meta.get("grapharg")
        src = getattr(grapharg, "source", None)
        name = getattr(src, "name", "")
        text = str(name() if callable(name) else name)
        is_param = isinstance(example, torch.nn.Parameter) or "_parameters" in text
        if not (is_param or "_buffers" in text) or not isinstance(example, torch.Tensor):
            continue
        out[i] = WeightSpec(dotted_path(text) or node.name, is_param, i, example)
    return out


class _DetachingNoGrad(fx.Interpreter):
    """Runs dynamo's graph detaching what its ``torch.no_grad()`` blocks compute (its
    ``_set_grad_enabled(False)`` nodes run, but make_fx records no grad mode)."""

    def run_node(self, n: fx.Node) -> Any:
        result = super().run_node(n)
        if torch.is_grad_enabled():
            return result
        return pytree.tree_map_only(torch.Tensor, lambda t: t.detach(), result)


def dynamo_aten_graph(gm: fx.GraphModule, example_inputs: Sequence[Any], source: str,
                      training: bool = False) -> fx.GraphModule:
    """Retrace dynamo's graph to functional core-aten ops, keeping its inputs and outputs (and, for
    ``training``, its no_grad blocks as ``aten.detach``)."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    fakes = [n.meta.get("example_value") for n in placeholders]
    # dynamo's own fakes (with its symbolic shapes); the tracing context may hold another mode
    mode = next((f.fake_mode for f in fakes if isinstance(f, FakeTensor)), None)
    if mode is None or any(f is None for f in fakes):
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        fakes = [mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in example_inputs]

    from torch._dispatch.python import enable_python_dispatcher

    table = _decompositions()
    if training:
        table.pop(torch.ops.aten.detach.default, None)  # as for export_graph

    def trace(fn):
        return make_fx(fn, decomposition_table=table, tracing_mode="real")(*fakes)

    try:  # decompose first: torch.func.functionalize cannot run composite ops (dropout) on symbolic sizes
        with mode, enable_python_dispatcher(), fx.traceback.preserve_node_meta():
            traced = trace((_DetachingNoGrad if training else fx.Interpreter)(gm).run)
            if any(n.op == "call_function" and writes_arguments(n.target) for n in traced.graph.nodes):
                traced = trace(torch.func.functionalize(fx.Interpreter(traced).run, remove="mutations"))
    except Exception as exc:  # noqa: BLE001
        raise capture_error(exc, source, "make_fx (retracing dynamo's graph)") from None
    return traced


__all__ = ["accepts", "automatic_dynamic_shapes", "capture_error", "dynamo_aten_graph", "dynamo_weights",
           "export_graph", "failing_module", "input_symbols", "raising_line", "views_as_reshapes"]


def views_as_reshapes(gm: fx.GraphModule) -> fx.GraphModule:
    """``gm`` with each ``aten.view`` made an ``aten.reshape``, in place (the plan's folded weights are
    refreshed on this module), for inductor.

    The retrace decides view against copy from the strides it sees; inductor's own trace
    propagates some strides differently (a ``cat`` keeps its inputs' layout), so a view valid
    here can be invalid there (T5's attention on its cache). The graph is functional, so a
    reshape, which views when it can and copies otherwise, computes the same values."""
    view = torch.ops.aten.view.default
    changed = False
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is view:
            node.target = torch.ops.aten.reshape.default
            changed = True
    if changed:
        gm.recompile()
    return gm
