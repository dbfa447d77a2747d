"""The report's memory measure for a plan not yet applied: the weights it stores plus the peak of
live activations, its casts' copies included (``docs/architecture.md``, "The objective").

The planner's memory term is a modular proxy (every output once, at its dtype; casts free). A
near-tie taken "for less memory" is checked here against the measure the report prints, which
the proxy can get wrong: ConvNeXt-V2's GRN reads its MLP's 4x-wide activation in FP32, so a
plan converting that MLP holds the activation twice (FP16 and its FP32 cast) at the peak; the
proxy counted the halved outputs elsewhere and took a plan slower than FP32 that needed more
memory than it. The walk is ``report_memory.activation_peaks``, over rows built from the IR with
the plan's dtypes and one cast per (tensor, dtype) its readers need, as the casts pass inserts.
"""

from __future__ import annotations

from amp_compiler.dtypes import FLOAT32, is_float
from amp_compiler.ir import CONSTANT, GRAPH_INPUT, PARAMETER, UNIT, PrecisionGraph
from amp_compiler.report_memory import ACTIVATION, INPUT, activation_peaks

from .costs import PlanEnergy

__all__ = ["plan_memory"]


def plan_memory(graph: PrecisionGraph, energy: PlanEnergy, plan: dict[int, int], low: str,
                keep_io_types: bool = True) -> float:
    """Bytes of the weights ``plan``'s units read plus its peak live activations: the report's mixed
    total less what no plan changes (weights only fixed ops read; the casts pass's merges), within
    a few bytes to about 1 % on real models, so it compares two plans, as the near-tie needs."""
    unit_of = {name: u for u, names in energy.unit_ops.items() for name in names}
    planned = (FLOAT32, low)

    def op_dtype(op) -> str | None:
        u = unit_of.get(op.name)
        return op.precision if u is None else low if plan[u] else FLOAT32

    table: dict[str, dict] = {}
    casts: list[dict] = []

    def cast_of(name: str, dtype: str, graph_output: bool = False) -> str:
        out = f"{name}\0{dtype}"  # no tensor name holds a NUL
        if out not in table:
            table[out] = {"name": out, "numel": table[name]["numel"], "dtype": dtype, "kind": ACTIVATION,
                          "graph_output": graph_output}
            casts.append({"output": out, "tensor": name})
        return out

    for t in graph.tensors.values():
        if not is_float(t.dtype) or t.kind in (CONSTANT, PARAMETER) or not (t.producer or t.consumers
                                                                            or t.is_graph_output):
            continue  # weights: ``energy.weight_bytes``
        dtype = t.dtype
        if t.producer is not None and dtype in planned:
            op = graph.ops[t.producer]
            if op.output_roles and op.output_roles[t.producer_port] == UNIT:
                dtype = op_dtype(op) or dtype
        table[t.name] = {"name": t.name, "numel": graph.numel(t), "dtype": dtype,
                         "kind": INPUT if t.kind == GRAPH_INPUT else ACTIVATION, "graph_output": t.is_graph_output}
        if t.is_graph_output and keep_io_types and dtype != t.dtype:
            table[t.name]["graph_output"] = False
            cast_of(t.name, t.dtype, graph_output=True)
    ops = []
    for op in graph.ops.values():
        dtype = op_dtype(op)
        inputs = []
        for port, name in enumerate(op.inputs):
            row = table.get(name)
            if (row is not None and dtype is not None and op.input_roles and op.input_roles[port] == UNIT
                    and row["dtype"] in planned and row["dtype"] != dtype):
                name = cast_of(name, dtype)
            inputs.append(name)
        ops.append({"inputs": inputs, "outputs": list(op.outputs), "canonical": op.canonical})
    return energy.weight_bytes(plan) + activation_peaks(table, ops, casts)["mixed"]
