"""FX importer: an aten-level ``torch.fx.GraphModule`` -> ``PrecisionGraph``.

Every ``call_function`` node that reads or writes tensors becomes an IR op whose
canonical op comes from the registry's aten column; placeholders become graph inputs,
parameters and buffers (``get_attr`` nodes, or placeholders the caller names) become
constants: ``CONSTANT`` when the weights are frozen for inference (the casts pass folds
their casts, the emitter stores one low-precision copy), ``PARAMETER`` when gradients
must reach the FP32 master copy or the graph itself writes the buffer (the cast stays a
run-time op). ``operator.getitem`` on a multi-output op is not an op: it names one of
the op's output tensors. Nodes that only handle sizes (``sym_size``, guards) are left
out of the IR and untouched by the emitter.

The importer only translates: FP32 weights get their raw ``ValueStats`` and each op its
float scalar arguments (``full(..., -3.4e38)``, the usual attention-mask fill); the
numerics pass (``passes/numerics.py``) judges both for the target dtype, as for ONNX.

Op names are readable: the module path the op was traced in plus the aten op,
``encoder.layer.0.attention.self.query/aten.addmm``.
"""

from __future__ import annotations

import operator
import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensor

from ..ir import ACTIVATION, CONSTANT, GRAPH_INPUT, PARAMETER, Op, PrecisionGraph, Tensor
from ..numerics import stats_of
from ..registry import DEFAULT_REGISTRY, Registry
from .dtypes import torch_to_dtype
from .schemas import CAST_PACKETS, ir_order, is_pure_cast, packet_name, port_groups, writes_arguments


@dataclass(frozen=True)
class WeightSpec:
    """A parameter or buffer that reaches the graph as a placeholder (dynamo graphs)."""

    fqn: str
    is_parameter: bool
    index: int  # position among the graph's placeholders
    value: torch.Tensor | None = None  # the real tensor (placeholders only carry fake ones)


@dataclass
class FxImport:
    """The IR plus what the emitter needs to find its way back into the GraphModule."""

    graph: PrecisionGraph
    gm: fx.GraphModule
    nodes: dict[str, fx.Node] = field(default_factory=dict)  # IR op -> node
    ports: dict[str, list[int]] = field(default_factory=dict)  # IR op -> tensor-leaf index of each input port
    values: dict[str, tuple[fx.Node, int | None]] = field(default_factory=dict)  # IR tensor -> (node, index)
    output_leaves: list[str | None] = field(default_factory=list)  # IR tensor of each node leaf of the output
    weights: dict[str, tuple[torch.Tensor, str, int | None]] = field(default_factory=dict)  # tensor -> (value, fqn, ph)
    dim_values: dict[str, int] = field(default_factory=dict)
    training: bool = False
    size_hints: Mapping[str, int] = field(default_factory=dict)  # symbol -> size the cost model uses


def import_graph_module(gm: fx.GraphModule, *, source: str = "model", training: bool = False,
                        weights: dict[str, WeightSpec] | None = None, registry: Registry | None = None,
                        default_dim: int = 8, input_peaks: Mapping[str, float] | None = None,
                        size_hints: Mapping[str, int] | None = None) -> FxImport:
    """Build the IR of ``gm``; ``weights`` maps placeholder names that carry parameters/buffers;
    ``input_peaks`` gives graph inputs' largest example magnitudes (an additive mask of
    ``finfo.min``), recorded as calibrated peaks for the numerics pass to judge. A symbolic
    dim is sized by its example's size, or by ``size_hints`` (symbol name -> size) where given."""
    registry = registry or DEFAULT_REGISTRY
    weights = weights or {}
    graph = PrecisionGraph(source)
    graph.inputs_retypable = False  # the caller's tensors arrive as they are
    graph.set_dim_sizes(default_dim)
    imp = FxImport(graph, gm, training=training, size_hints=dict(size_hints or {}))
    mutated = _written_nodes(gm)
    names: dict[fx.Node, str] = {}  # single-tensor nodes (incl. getitem) -> IR tensor
    op_names: set[str] = set()
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            val = _val(node)
            if not isinstance(val, torch.Tensor):
                continue
            spec = weights.get(node.name)
            if spec is None:
                names[node] = _add_tensor(imp, node.name, val, GRAPH_INPUT, (node, None))
                graph.inputs.append(names[node])
                if input_peaks and node.name in input_peaks:
                    graph.tensors[names[node]].calibrated_peak = input_peaks[node.name]
            else:
                real = spec.value if spec.value is not None else val
                kind = _weight_kind(real, spec.is_parameter, training, node in mutated)
                names[node] = _add_weight(imp, spec.fqn, real, kind, (node, None), spec.index)
        elif node.op == "get_attr":
            value = _fetch(gm, node.target)
            if isinstance(value, torch.Tensor):
                if node.target in graph.tensors:  # the same weight read twice
                    names[node] = node.target
                    continue
                kind = _weight_kind(value, isinstance(value, torch.nn.Parameter), training, node in mutated)
                names[node] = _add_weight(imp, node.target, value, kind, (node, None), None)
        elif node.op == "call_function":
            if node.target is operator.getitem:
                continue  # named when its producer was imported
            _import_op(imp, node, names, op_names, registry)
        elif node.op == "output":
            leaves: list[str | None] = []
            fx.node.map_arg(node.args, lambda n: leaves.append(names.get(n)) or n)
            imp.output_leaves = leaves
            for name in leaves:
                if name is not None:
                    graph.tensors[name].is_graph_output = True
                    graph.outputs.append(name)
    return imp


# -- tensors --------------------------------------------------------------------------------------

def _val(node: fx.Node) -> Any:
    return node.meta.get("val", node.meta.get("example_value"))


def _shape(imp: FxImport, val: torch.Tensor) -> tuple:
    dims = []
    for d in val.shape:
        if isinstance(d, int):
            dims.append(d)
            continue
        const = d.node.maybe_as_int() if hasattr(d.node, "maybe_as_int") else None
        if const is not None:
            dims.append(int(const))
            continue
        name = str(d)
        hint = _sized(d, imp.size_hints)
        if hint is not None:
            imp.dim_values[name] = int(hint)
        dims.append(name)
    return tuple(dims)


def _sized(d: torch.SymInt, size_hints: Mapping[str, int]) -> int | None:
    """The size of a symbolic dim: its expression at ``size_hints`` where they cover its symbols,
    else the example's (the symbol's hint)."""
    expr = getattr(d.node, "expr", None)
    if size_hints and expr is not None and expr.free_symbols and \
            all(str(sym) in size_hints for sym in expr.free_symbols):
        return int(expr.xreplace({sym: size_hints[str(sym)] for sym in expr.free_symbols}))
    return getattr(d.node, "hint", None)


def _add_tensor(imp: FxImport, name: str, val: torch.Tensor, kind: str, where: tuple[fx.Node, int | None]) -> str:
    graph = imp.graph
    base, k = name, 1
    while name in graph.tensors:
        name, k = f"{base}#{k}", k + 1
    graph.add_tensor(Tensor(name, torch_to_dtype(val.dtype), _shape(imp, val), kind))
    imp.values[name] = where
    return name


def _weight_kind(val: torch.Tensor, is_parameter: bool, training: bool, written: bool) -> str:
    if written or (training and is_parameter and val.requires_grad):
        return PARAMETER
    return CONSTANT


def _add_weight(imp: FxImport, fqn: str, value: torch.Tensor, kind: str, where, index: int | None) -> str:
    name = _add_tensor(imp, fqn, value, kind, where)
    imp.weights[name] = (value, fqn, index)
    t = imp.graph.tensors[name]
    t.origin = "parameter" if isinstance(value, torch.nn.Parameter) else "buffer"
    if value.dtype == torch.float32 and not _is_fake(value):
        t.stats = stats_of(value.detach().reshape(-1).cpu().numpy())
    return name


def _is_fake(t: torch.Tensor) -> bool:
    return isinstance(t, FakeTensor) or t.device.type == "meta"


def _fetch(gm: fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _written_nodes(gm: fx.GraphModule) -> set[fx.Node]:
    """Nodes (weights, inputs) that an op of the graph writes in place (``copy_`` into a buffer)."""
    out: set[fx.Node] = set()
    for node in gm.graph.nodes:
        if node.op == "call_function" and writes_arguments(node.target):
            schema = node.target._schema
            for i, arg in enumerate(schema.arguments):
                if arg.alias_info is not None and arg.alias_info.is_write:
                    value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
                    if isinstance(value, fx.Node):
                        out.add(value)
    return out


# -- ops ------------------------------------------------------------------------------------------

#: ops that read a tensor's sizes, never its data or dtype (a symbolic graph's ``sym_size``): as IR ops
#: they were "unknown" FP32 readers, and a low tensor they read paid a cast for a size.
#: (``_assert_tensor_metadata`` checks the dtype too: it stays an op, and reads what it asserts.)
_METADATA_QUERIES = frozenset({"sym_size", "sym_numel", "sym_stride", "sym_storage_offset"})


def _import_op(imp: FxImport, node: fx.Node, names: dict, op_names: set, registry: Registry) -> None:
    graph = imp.graph
    val = _val(node)
    results = _tensor_results(val)
    leaves: list[fx.Node] = []
    scalars: list[Any] = []

    def collect(n):
        leaves.append(n)
        return n

    fx.node.map_arg((node.args, node.kwargs), collect)
    tensor_leaves = [i for i, n in enumerate(leaves) if n in names]
    packet = packet_name(node.target)
    if results is None and (not tensor_leaves or packet in _METADATA_QUERIES):
        return  # size arithmetic, guards, a symbolic size read off a tensor: not an op on its data
    _scalars(node.args, scalars)
    _scalars(list(node.kwargs.values()), scalars)
    order = ir_order(packet, len(tensor_leaves))
    ports = [tensor_leaves[i] for i in order]
    inputs = [names[leaves[i]] for i in ports]
    op_name = _unique(_op_name(node, packet), op_names)
    outputs = _import_results(imp, node, results, names)
    canonical = _canonical(registry, packet, node)
    namespace = getattr(node.target, "namespace", "")
    op = Op(op_name, str(node.target), inputs, outputs, domain="" if namespace == "aten" else namespace,
            attrs=_attrs(packet, node), canonical=canonical, scalars=tuple(scalars))
    row = registry.by_canonical.get(canonical) if canonical else None
    in_dtypes = [graph.tensors[t].dtype for t in inputs]
    out_dtypes = [graph.tensors[t].dtype if t else None for t in outputs]  # "": an absent result
    op.port_groups = port_groups(packet, node.target, node, in_dtypes, out_dtypes,
                                 row.fp32_inputs if row else (), row.fp32_outputs if row else ())
    if canonical == "unscale_marker":  # gradients divided by the loss scale (training.py)
        for t in outputs:
            graph.tensors[t].unscale_marker = True
    graph.add_op(op)
    imp.nodes[op_name] = node
    imp.ports[op_name] = ports


def _tensor_results(val: Any) -> list[torch.Tensor | None] | None:
    """The op's results as a list (None entries for non-tensors), or None when it returns no tensor."""
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (tuple, list)) and any(isinstance(v, torch.Tensor) for v in val):
        return [v if isinstance(v, torch.Tensor) else None for v in val]
    return None


def _import_results(imp: FxImport, node: fx.Node, results, names: dict) -> list[str]:
    if results is None:
        return []
    if isinstance(_val(node), torch.Tensor):
        names[node] = _add_tensor(imp, node.name, results[0], ACTIVATION, (node, None))
        return [names[node]]
    getitems = {u.args[1]: u for u in node.users if u.op == "call_function" and u.target is operator.getitem}
    outputs = []
    for i, r in enumerate(results):
        if r is None:
            outputs.append("")
            continue
        user = getitems.get(i)
        name = _add_tensor(imp, user.name if user is not None else f"{node.name}#{i}", r, ACTIVATION, (node, i))
        if user is not None:
            names[user] = name
        outputs.append(name)
    while outputs and not outputs[-1]:
        outputs.pop()
    return outputs


def _scalars(args, out: list) -> None:
    for a in args:
        if isinstance(a, (list, tuple)):
            _scalars(a, out)
        elif isinstance(a, float):
            out.append(a)


def _canonical(registry: Registry, packet: str, node: fx.Node) -> str | None:
    if packet in CAST_PACKETS:
        if is_pure_cast(packet, node):
            return "cast"
        return "identity" if node.kwargs.get("dtype") is None else None
    if packet == "convolution" and len(node.args) > 6 and node.args[6]:
        return "conv_transpose"
    row = registry.lookup_aten(packet)
    if row is None and packet.endswith("_") and not packet.endswith("__"):
        row = registry.lookup_aten(packet[:-1])  # in-place variant: add_ -> add
    return row.canonical if row else None


#: aten reduce names -> the ONNX ``reduction`` attribute the registry's ``deny_attrs`` read
_REDUCTIONS = {"add": "add", "sum": "add", "mean": "add", "multiply": "mul", "prod": "mul", "amax": "max",
               "amin": "min"}


def _argument(node: fx.Node, index: int, name: str) -> Any:
    return node.args[index] if len(node.args) > index else node.kwargs.get(name)


def _attrs(packet: str, node: fx.Node) -> dict[str, Any]:
    """The ONNX attributes of the same canonical op that the registry reads (``group``, ``reduction``, ``mode``)."""
    packet = packet[:-1] if packet.endswith("_") and not packet.endswith("__") else packet  # index_put_
    if packet == "convolution" and len(node.args) > 8:
        return {"group": int(node.args[8]) if isinstance(node.args[8], int) else 1}
    if packet == "scatter_add":
        return {"reduction": "add"}
    if packet in ("scatter", "scatter_reduce"):
        reduce = _argument(node, 4, "reduce")
        return {"reduction": _REDUCTIONS.get(reduce, reduce)} if reduce else {}
    if packet in ("index_put", "_unsafe_index_put"):
        return {"reduction": "add"} if _argument(node, 3, "accumulate") else {}
    if packet == "pow" and len(node.args) > 1 and type(node.args[1]) is int:  # x.pow(2): not a float scalar
        return {"exponent": float(node.args[1])}
    if packet.startswith(("upsample_", "_upsample_")):
        return {"mode": "cubic" if "cubic" in packet else "nearest" if "nearest" in packet else "linear"}
    if packet in _CLAMP_BOUNDS:  # Clip-6's ``min``/``max``: the bounds numerics rule 2 and bounded_exp read
        bounds = {key: _argument(node, *where) for key, where in _CLAMP_BOUNDS[packet].items()}
        return {key: float(v) for key, v in bounds.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return {}


#: where each clamp's scalar bounds are, as Clip-6's attributes: {attribute: (position, keyword)}
_CLAMP_BOUNDS = {"clamp": {"min": (1, "min"), "max": (2, "max")}, "clamp_min": {"min": (1, "min")},
                 "clamp_max": {"max": (1, "max")}, "hardtanh": {"min": (1, "min_val"), "max": (2, "max_val")}}


_SUBSCRIPT = re.compile(r"\[['\"]?([^'\"\]]+)['\"]?\]")


def dotted_path(text: str) -> str:
    """A dynamo source or module path as a dotted path: ``L['self']._modules['fc'].w`` -> ``fc.w``."""
    path = re.sub(r"^L\[['\"]\w+['\"]\]", "", str(text))  # the frame's local (self, fn, ...)
    path = re.sub(r"\._(?:modules|parameters|buffers)(?=\[)", "", path)
    return _SUBSCRIPT.sub(lambda m: "." + m.group(1), path).strip(".")


def module_path(node: fx.Node) -> str:
    """The innermost module the node was traced in, as a dotted path (``""`` at top level)."""
    stack = node.meta.get("nn_module_stack")
    return dotted_path(list(stack.values())[-1][0]) if stack else ""


def _op_name(node: fx.Node, packet: str) -> str:
    namespace = getattr(node.target, "namespace", None) or "fn"
    scope = module_path(node)
    return f"{scope}/{namespace}.{packet}" if scope else f"{namespace}.{packet}"


def _unique(name: str, taken: set[str]) -> str:
    base, k = name, 1
    while name in taken:
        k += 1
        name = f"{base}#{k}"
    taken.add(name)
    return name


def aten_op_types(graph: PrecisionGraph, names, registry: Registry = DEFAULT_REGISTRY) -> tuple[frozenset[str], set[str]]:
    """(``names`` plus what they name in the graph, the names that name none of its ops).

    Users write ``"addmm"`` or ``"aten.addmm"``; the IR's op types are overloads
    (``"aten.addmm.default"``), which the classify pass matches exactly. An ONNX op type the
    registry maps to a canonical op names it too (``"Softmax"``: ``softmax``), as on the ONNX path:
    ``deny=["Softmax"]``, the README's spelling, had denied nothing here.
    """
    names = frozenset(names)
    onnx_named = {name: row.canonical for name in names if (row := registry.lookup_onnx("", name)) is not None}
    out, matched = set(names) | set(onnx_named.values()), set()
    for op in graph.ops.values():
        namespace, _, rest = op.op_type.partition(".")
        packet = rest.rpartition(".")[0] or rest
        named = (names & {packet, f"{namespace}.{packet}", op.op_type, op.canonical or ""}) | \
            {name for name, canonical in onnx_named.items() if canonical == op.canonical}
        if named:
            out.add(op.op_type)
            matched |= named
    return frozenset(out), set(names - matched)


def resolve_rule_names(graph: PrecisionGraph, ctx, source: str, node_names=()) -> None:
    """Point ``ctx.allow``/``ctx.deny`` at the ops the user's names name (``aten_op_types``), and refuse
    a name that names nothing ONNX or the registry knows, or a ``deny_nodes`` name no node has, or warn
    that a real op type the model lacks changes nothing (``rule_names.check_rule_names``, as on the ONNX
    path: ``deny=["sofmax"]`` had planned as if not given)."""
    from ..rule_names import check_rule_names
    from ..user_frame import user_stacklevel

    registry = getattr(ctx, "registry", None) or DEFAULT_REGISTRY
    ctx.allow, no_allow = aten_op_types(graph, ctx.allow, registry)
    ctx.deny, no_deny = aten_op_types(graph, ctx.deny, registry)
    for option, name in [("deny", n) for n in sorted(no_deny) if _is_aten(n)] + \
                        [("allow", n) for n in sorted(no_allow) if _is_aten(n)]:
        warnings.warn(f"{source}: {option} {name}: the model has no {name} op; the option changes nothing",
                      stacklevel=user_stacklevel())
    check_rule_names(graph, source, registry, op_types={"deny": sorted(n for n in no_deny if not _is_aten(n)),
                                                        "allow": sorted(n for n in no_allow if not _is_aten(n))},
                     node_names=node_names, stacklevel=user_stacklevel() + 1)


def _is_aten(name: str) -> bool:
    """Whether ``name`` (``addmm``, ``aten.addmm``, ``aten.addmm.default``) is an aten op."""
    packet = name.removeprefix("aten.").split(".")[0]
    return bool(packet) and hasattr(torch.ops.aten, packet)


__all__ = ["FxImport", "WeightSpec", "aten_op_types", "dotted_path", "import_graph_module", "module_path",
           "resolve_rule_names"]
