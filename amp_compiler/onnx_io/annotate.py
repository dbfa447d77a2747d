"""Write each node's decision into the converted ONNX model, where graph viewers show it.

Applied after emission (``convert_onnx(..., annotate=True)``, the default; ``amp-compile
--no-annotate`` turns it off). Every node the report lists gets its precision, class and
reason; every inserted cast says which edge it serves. With IR version >= 10 they go into
the node's ``metadata_props`` (keys ``amp_compiler.*``), below that into its
``doc_string`` (one ``amp_compiler: ...`` line, after any doc string the node had).
Nodes are matched to report ops by an output tensor name (unique in ONNX; node names may
be empty or renamed by the importer). The other way, ``record_modules`` copies the module
path torch's exporter left in a node's metadata into its report op, for the HTML graph's
module groups. See docs/architecture.md (Decisions in the model file).
"""

from __future__ import annotations

import ast
from typing import Any, Iterator, Mapping

from onnx import AttributeProto, GraphProto, ModelProto, NodeProto

PREFIX = "amp_compiler."
_DOC_TAG = "amp_compiler: "
METADATA_IR_VERSION = 10  # NodeProto.metadata_props exists from IR version 10 (onnx 1.16)
NAME_SCOPES = "pkg.torch.onnx.name_scopes"  # a Python list literal: ['', 'm', 'm.encoder', ..., 'op name']


def annotate_model(model: ModelProto, report: Any, nodes: list[NodeProto] | None = None) -> ModelProto:
    """Annotate ``model``'s nodes in place from ``report`` (a ``Report`` or its dict); returns it.
    ``nodes``: ``model``'s nodes, subgraphs included, where the caller has them (``walk_nodes``)."""
    ops, casts = _sections(report)
    by_output: dict[str, dict[str, str]] = {}
    decisions: dict[tuple, dict[str, str]] = {}  # one dict per distinct decision: its doc line built once
    for op in ops:
        key = (str(op.get("precision") or "n/a"), str(op.get("class") or ""), str(op.get("reason") or ""))
        fields = decisions.get(key)
        if fields is None:
            fields = decisions[key] = {"precision": key[0], "class": key[1], "reason": key[2]}
        for t in op.get("outputs") or ():
            by_output[t] = fields
    inserted = [c for c in casts if c.get("inserted") and c.get("output")]
    if nodes is None:
        nodes = list(walk_nodes(model.graph))  # walked once: each walk reads every node's attributes
    readers = _readers(nodes, {c["output"] for c in inserted})
    for cast in inserted:
        out = cast["output"]
        edge = f"{cast.get('tensor')} -> {', '.join(readers.get(out, [])) or 'graph output'}"
        by_output[out] = {"precision": str(cast.get("to") or ""), "class": "inserted cast",
                          "reason": str(cast.get("reason") or ""),
                          "cast": f"{cast.get('from')} -> {cast.get('to')} on {edge}"}
    # what each node gets, built once per distinct decision: metadata entries or a doc line
    build, write = ((_metadata_entries, _set_metadata) if model.ir_version >= METADATA_IR_VERSION
                    else (_doc_line, _set_doc))
    written: dict[int, Any] = {}  # id(fields) -> build(fields)
    for node in nodes:
        outputs = node.output
        fields = by_output.get(outputs[0]) if outputs else None  # most nodes: the first output is the op's
        if fields is None and len(outputs) > 1:
            fields = next((by_output[o] for o in outputs if o in by_output), None)
        if fields is None:
            continue
        payload = written.get(id(fields))
        if payload is None:
            payload = written[id(fields)] = build(fields)
        write(node, payload)
    return model


def record_modules(model: ModelProto, report: Any, nodes: list[NodeProto] | None = None) -> ModelProto:
    """Give each report op the module the exporter names in its node's metadata (torch's dynamo
    exporter: ``pkg.torch.onnx.name_scopes``, the module path then the op): ``op["module"]``,
    which the HTML graph groups by. Ops of other exporters are left as they are. Returns ``model``.
    ``nodes`` as for ``annotate_model``."""
    by_output: dict[str, dict] | None = None
    for node in walk_nodes(model.graph) if nodes is None else nodes:
        props = node.metadata_props
        scopes = next((p.value for p in props if p.key == NAME_SCOPES), None) if props else None
        if not scopes:
            continue
        if by_output is None:  # only for models that have such metadata
            by_output = {t: op for op in _sections(report)[0] for t in op.get("outputs") or ()}
        op = next((by_output[o] for o in node.output if o in by_output), None)
        if op is None:
            continue
        try:
            path = ast.literal_eval(scopes)
        except (ValueError, SyntaxError):
            continue
        if isinstance(path, list) and len(path) >= 2 and isinstance(path[-2], str) and path[-2]:
            op["module"] = path[-2]
    return model


def annotated_fraction(model: ModelProto) -> float:
    """The share of nodes (subgraphs included) that carry a decision."""
    nodes = list(walk_nodes(model.graph))
    done = sum(1 for n in nodes if any(p.key == PREFIX + "precision" for p in n.metadata_props)
               or _DOC_TAG in n.doc_string)
    return done / len(nodes) if nodes else 1.0


def earlier_fp32(model: ModelProto) -> dict[str, str]:
    """Node name -> reason, for each node of the main graph an earlier conversion annotated as kept
    FP32 (inserted casts aside): a second run keeps those decisions instead of re-planning them."""
    found = {}
    for node in model.graph.node:
        props, doc = node.metadata_props, node.doc_string  # most nodes have neither: nothing built for them
        if not props and not doc:
            continue
        fields = {p.key[len(PREFIX):]: p.value for p in props if p.key.startswith(PREFIX)}
        if not fields and _DOC_TAG in doc:
            line = next(li for li in doc.splitlines() if li.startswith(_DOC_TAG))
            fields = dict(f.split("=", 1) for f in line[len(_DOC_TAG):].split("; ") if "=" in f)
        if node.name and fields.get("precision") == "float32" and fields.get("class") != "inserted cast":
            found[node.name] = fields.get("reason", "").split(": ", 1)[-1]
    return found


def _sections(report: Any) -> tuple[list, list]:
    """The op rows and cast rows of ``report``, a ``Report`` (its ``decisions``: the per-op costs
    are not needed here) or a report dict."""
    if isinstance(report, Mapping):
        return report.get("ops") or [], report.get("casts") or []
    return report.decisions, report.casts


def _set_metadata(node: NodeProto, entries: NodeProto) -> None:
    """Put the ``metadata_props`` of ``entries`` (``_metadata_entries``) in place of any ``amp_compiler.*``
    entries of the node."""
    props = node.metadata_props
    if props and any(p.key.startswith(PREFIX) for p in props):  # annotated before: replace
        keep = [(p.key, p.value) for p in props if not p.key.startswith(PREFIX)]
        del props[:]
        for key, value in keep:
            props.add(key=key, value=value)
    node.MergeFrom(entries)  # appends them, in C: a seventh of three ``add`` calls' time


def _metadata_entries(fields: Mapping[str, str]) -> NodeProto:
    """A node holding only ``fields`` as ``amp_compiler.*`` metadata entries: what ``_set_metadata`` merges."""
    entries = NodeProto()
    for key, value in fields.items():
        entries.metadata_props.add(key=PREFIX + key, value=value)
    return entries


def _set_doc(node: NodeProto, text: str) -> None:
    """Put ``text`` (an ``amp_compiler: ...`` line) in place of any such line of the node's doc string."""
    doc = node.doc_string  # most nodes have none
    if doc:
        text = "\n".join([line for line in doc.splitlines() if not line.startswith(_DOC_TAG)] + [text])
    node.doc_string = text


def _doc_line(fields: Mapping[str, str]) -> str:
    return _DOC_TAG + "; ".join(map("=".join, fields.items()))


def walk_nodes(graph: GraphProto, nested: bool = True) -> Iterator[NodeProto]:
    """Every node of ``graph`` and of the subgraphs its nodes hold, depth first. ``nested=False``
    where the caller knows no node holds one: reading each node's attributes to find out costs
    more than the walk itself (0.5 s at 100k nodes)."""
    if not nested:
        yield from graph.node
        return
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == AttributeProto.GRAPH:
                yield from walk_nodes(attr.g)
            elif attr.type == AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from walk_nodes(g)


def _readers(nodes: list[NodeProto], tensors: set[str]) -> dict[str, list[str]]:
    """The nodes (of ``nodes``) reading each of ``tensors``."""
    out: dict[str, list[str]] = {}
    if tensors:
        for node in nodes:
            for t in node.input:
                if t in tensors:
                    out.setdefault(t, []).append(node.name or node.op_type)
    return out


__all__ = ["PREFIX", "annotate_model", "annotated_fraction", "earlier_fp32", "record_modules", "walk_nodes"]
