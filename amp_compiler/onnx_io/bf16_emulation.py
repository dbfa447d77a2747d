"""Run a BF16 model on ONNX Runtime's CPU provider: FP32 kernels, every BF16 value rounded.

ONNX Runtime's CPU provider has almost no BF16 kernels (1.32: not even ``Add``), so a
``--dtype bf16`` conversion failed ``--validate`` at session creation. ``emulate_bf16``
rewrites a copy of the model the way a GPU runs it: every value the model stores in BF16
stays BF16 (ONNX Runtime's ``Cast`` to and from BF16 runs on CPU and rounds to nearest
even), and every op computes in FP32 on FP32 views of those values, its BF16 outputs
rounded back to BF16 on store (FP32 accumulation, as tensor-core kernels do). Graph inputs
declared BF16 become FP32 inputs rounded on entry, graph outputs FP32 views, so feeds and
results are plain numpy arrays. Subgraphs (``If``/``Loop``/``Scan`` bodies) are rewritten
the same way; a ``Loop``/``Scan`` hands its BF16 carried values to its body as they are.
Each node or value name the rewrite adds is new to the model, against its node and value names
in every graph: its Casts had been named after the value they write, so a node named like its
output (``t0`` writing ``t0``, as some exporters do) had ONNX Runtime refuse the copy ("two
nodes with same node name").
See docs/architecture.md, "Validation".
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import GraphProto, ModelProto, NodeProto, TensorProto, helper

from .structure import graphs, names_in_use, subgraphs

__all__ = ["FUSIONS_OFF", "bf16_values", "declares_bf16", "emulate_bf16", "for_cpu"]

#: ONNX Runtime fusions that absorb a view's Cast into a norm reading BF16, which the CPU
#: provider has no kernel for (docs/architecture.md, "ONNX emitter", on LayerNormFusion); 1.32
#: names LayerNormFusion by level, older releases did not (an unknown name is ignored)
FUSIONS_OFF = ["LayerNormFusion", "LayerNormFusionL1", "LayerNormFusionL2", "SimplifiedLayerNormFusion"]

_BF16, _FLOAT = TensorProto.BFLOAT16, TensorProto.FLOAT
#: ops that hand their inputs to a body whose formal inputs keep the declared (BF16) type
_BODY_INPUTS = frozenset({"Loop", "Scan"})
_TAG = "__amp_bf16emu"


def for_cpu(model: ModelProto | str, data_dir: str | None, always: bool = False
            ) -> tuple[ModelProto, str | None] | None:
    """``(emulated model, its external data folder)`` where ``model`` (a proto, or with ``always``
    a file, whose graph is then read) stores values in BF16; else None. A proto is checked by its
    declared types (no BF16 declared: run as it is)."""
    from .validation import infer_types

    if isinstance(model, str):
        if not always:
            return None
        path, model = model, onnx.load(model, load_external_data=False)
        data_dir = data_dir or str(Path(path).resolve().parent)
    if not declares_bf16(model):
        return None
    types = infer_types(model)
    for g, _ in graphs(model.graph, ""):  # inputs and initializers: inference leaves them out
        types.update((vi.name, (vi.type.tensor_type.elem_type, None)) for vi in g.input)
        types.update((t.name, (t.data_type, None)) for t in g.initializer)
    return emulate_bf16(model, bf16_values(types)), data_dir


def declares_bf16(model: ModelProto | str) -> bool:
    """Whether ``model`` (or the file's graph) declares a BF16 value: an input, output, value_info
    or initializer, in any graph."""
    if isinstance(model, str):
        model = onnx.load(model, load_external_data=False)
    for g, _ in graphs(model.graph, ""):
        if any(t.data_type == _BF16 for t in g.initializer) or any(
                vi.type.tensor_type.elem_type == _BF16 for vi in (*g.input, *g.output, *g.value_info)):
            return True
    return False


def bf16_values(types: dict[str, tuple[int, tuple | None]]) -> set[str]:
    """The value names ``types`` (``inference.inferred_types``, subgraphs included) types BF16."""
    return {name for name, (elem, _) in types.items() if elem == _BF16}


def emulate_bf16(model: ModelProto, bf16: set[str]) -> ModelProto:
    """A copy of ``model`` that ONNX Runtime's CPU provider runs with BF16 storage emulated (see
    module docstring); ``bf16``: the names of its BF16 values (``bf16_values``). ``model`` is not
    changed."""
    out = ModelProto()
    out.CopyFrom(model)
    _Rewrite(bf16, names_in_use(out)).graph(out.graph, main=True)
    return out


class _Rewrite:
    def __init__(self, bf16: set[str], taken: set[str]) -> None:
        self.bf16 = bf16
        self.taken = taken  # node and value names in use: the model's, and each one made here
        self.view: dict[str, str] = {}  # BF16 value -> its FP32 view, across scopes (names are unique)

    def graph(self, g: GraphProto, main: bool) -> None:
        nodes: list[NodeProto] = []
        for vi in g.input:
            if vi.type.tensor_type.elem_type != _BF16:
                continue
            if main:  # fed FP32, rounded on entry
                vi.type.tensor_type.elem_type = _FLOAT
                stored = self._name(vi.name, "in")
                nodes.append(self._cast(vi.name, stored, _BF16))
                nodes.append(self._view_of(stored, vi.name))
            else:
                nodes.append(self._view_of(vi.name))
        for init in g.initializer:
            if init.data_type == _BF16 and init.name not in self.view:
                nodes.append(self._view_of(init.name))
        for node in g.node:
            rewired = self._rewire(node)
            for sub in subgraphs(node):
                self.graph(sub, main=False)
            after = []
            for i, name in enumerate(node.output):
                if name not in self.bf16:
                    continue
                if rewired:  # it computed on FP32 views: round its result to BF16 as stored
                    raw = self._name(name, "raw")
                    node.output[i] = raw
                    after.append(self._cast(raw, name, _BF16))
                after.append(self._view_of(name))
            nodes.append(node)
            nodes.extend(after)
        del g.node[:]
        g.node.extend(nodes)
        if main:
            for vi in g.output:
                if vi.name in self.view:
                    vi.name = self.view[vi.name]
                    vi.type.tensor_type.elem_type = _FLOAT

    def _rewire(self, node: NodeProto) -> bool:
        """Point ``node``'s reads of BF16 values at their FP32 views; whether any was."""
        if node.op_type in _BODY_INPUTS and node.domain in ("", "ai.onnx"):
            return False
        rewired = False
        for i, name in enumerate(node.input):
            view = self.view.get(name)
            if view is not None:
                node.input[i] = view
                rewired = True
        return rewired

    def _view_of(self, stored: str, name: str | None = None) -> NodeProto:
        """The Cast making ``stored``'s FP32 view, recorded under ``name`` (default: ``stored``)."""
        view = self._name(name or stored, "f32")
        self.view[name or stored] = view
        return self._cast(stored, view, _FLOAT)

    def _name(self, name: str, what: str) -> str:
        return self._fresh(f"{name}{_TAG}_{what}")

    def _cast(self, src: str, dst: str, to: int) -> NodeProto:
        return helper.make_node("Cast", [src], [dst], to=to, name=self._fresh(f"{dst}_cast"))

    def _fresh(self, base: str) -> str:
        """``base``, or ``base_1``, ``base_2``, ...: the first no node or value of the model has."""
        name, k = base, 0
        while name in self.taken:
            k += 1
            name = f"{base}_{k}"
        self.taken.add(name)
        return name
