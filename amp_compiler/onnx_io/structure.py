"""Structural checks of an ONNX model: SSA names, dangling inputs, cycles, node order; graph walking.

Per graph and subgraph: unique value names (a name reused by a sibling subgraph is
renamed, which ONNX allows and the IR does not), every input produced by a node, a
graph input or an initializer of the graph or an enclosing one, graph outputs
produced, no cycles. A graph whose nodes are out of topological order but acyclic is
sorted (ONNX Runtime accepts such graphs too). docs/architecture.md, "Input handling".
"""

from __future__ import annotations

from typing import Iterator, NamedTuple

from onnx import AttributeProto, GraphProto, ModelProto, NodeProto

from ..errors import ConversionError
from .order import replace_nodes, stable_topological_order


def subgraphs(node: NodeProto) -> Iterator[GraphProto]:
    for a in node.attribute:
        if a.type == AttributeProto.GRAPH or a.HasField("g"):
            yield a.g
        yield from a.graphs


def node_label(node: NodeProto, idx: int) -> str:
    return f"node {node.name!r} ({node.op_type})" if node.name else f"node #{idx} ({node.op_type})"


def _where(node: NodeProto, idx: int, path: str) -> str:
    """``node_label``, with the subgraph it is in."""
    return node_label(node, idx) + (f" in subgraph {path}" if path else "")


class StructureFacts(NamedTuple):
    """What ``check_structure`` found besides errors."""

    #: the main graph's ``node_rows``, for later steps to read no node twice; None where it sorted them
    main_rows: list[tuple] | None
    #: the path of every subgraph (none: later walks of the model's graphs need not look into its nodes)
    subgraph_paths: list[str]
    #: whether it changed the model: sorted out-of-order nodes or renamed values, in any graph
    changed: bool


def check_structure(model: ModelProto, source: str, opsets: dict[str, int]) -> StructureFacts:
    """Valid UTF-8 names, SSA names, no dangling inputs, graph outputs produced, no cycles; sorts
    acyclic out-of-order graphs and renames values sibling subgraphs both define, in place. Each
    node's fields are read once (``_node_rows``): protobuf builds a new Python object per field
    read, which dominated this check on 100k-node graphs."""
    for o in model.opset_import:
        if _bad(o.domain):
            raise ConversionError(source, "opset_import", f"domain {o.domain!r} is not valid UTF-8")
    functions = {(f.domain, f.name) for f in model.functions}
    check = _Structure(source, opsets, functions)
    check.graph(model.graph, frozenset(), "")
    return StructureFacts(check.main_rows, check.subgraph_paths, check.changed)


def _bad(value) -> bool:
    """Names must be valid UTF-8: protobuf hands invalid ones to Python as bytes, and onnx chokes on them."""
    return not isinstance(value, str)


def node_rows(g: GraphProto) -> list[tuple]:
    """(node, outputs, inputs, domain, attributes, name, op type) per node of ``g``: each field read
    once, repeated ones as lists (a slice copies them faster than ``list()``)."""
    return [(node, node.output[:], node.input[:], node.domain, node.attribute[:], node.name, node.op_type)
            for node in g.node]


def holds_subgraphs(attributes: list) -> bool:
    """Whether a node has a graph attribute (``attributes``: each node's attribute list), as
    ``check_structure`` tells one."""
    return any(a.HasField("g") or a.graphs for attrs in attributes if attrs for a in attrs)


def _node_rows(g: GraphProto, where_g: str, source: str) -> list[tuple]:
    """``node_rows(g)``, the names in them and ``g``'s value names checked for valid UTF-8."""
    for kind, seq in (("graph input", g.input), ("graph output", g.output), ("value_info", g.value_info),
                      ("initializer", g.initializer)):
        for item in seq:
            if _bad(item.name):
                raise ConversionError(source, f"{kind} {item.name!r}{where_g}", "its name is not valid UTF-8")
    rows = node_rows(g)
    if not _all_text(rows):
        _raise_first_bad_name(rows, where_g, source)
    return rows


def _all_text(rows: list[tuple]) -> bool:
    """Whether every name, op type, domain, value name and attribute name in ``rows`` is a ``str``:
    the types of all of them gathered into one set, rather than a test per node."""
    kinds = {type(v) for row in rows for v in (row[3], row[5], row[6], *row[1], *row[2])}
    for row in rows:
        if row[4]:
            kinds.update(type(a.name) for a in row[4])
    return kinds <= {str}


def _raise_first_bad_name(rows: list[tuple], where_g: str, source: str) -> None:
    """The error for the first node of ``rows`` with a name that is not valid UTF-8."""
    for idx, (_, outputs, inputs, domain, attributes, name, op_type) in enumerate(rows):
        if _bad(name) or _bad(op_type) or _bad(domain) or any(_bad(t) for t in (*inputs, *outputs)) \
                or any(_bad(a.name) for a in attributes):
            label = f"node #{idx}" + (f" ({op_type})" if isinstance(op_type, str) else "")
            raise ConversionError(source, label + where_g, "a name, op type, domain or attribute name is not "
                                                          "valid UTF-8")


class _Structure:
    def __init__(self, source: str, opsets: dict[str, int], functions: set) -> None:
        self.source, self.opsets, self.functions = source, opsets, functions
        self.seen: set[str] = set()  # every name defined so far, in any scope (for sibling renames)
        self.fresh = 0
        self.main_rows: list[tuple] | None = None  # the main graph's rows, while its nodes are in them
        self.subgraph_paths: list[str] = []
        self.changed = False  # nodes sorted or values renamed

    def graph(self, g: GraphProto, outer: frozenset[str], path: str) -> set[str]:
        """Check ``g`` (names in ``outer`` are visible from enclosing graphs); returns the outer names it uses."""
        where_g = f"subgraph {path}" if path else "the main graph"
        rows = _node_rows(g, f" of subgraph {path}" if path else "", self.source)
        if self._rename_sibling_clashes(g, outer, rows):
            rows = _node_rows(g, f" of subgraph {path}" if path else "", self.source)
        defined: dict[str, str | int] = {}  # name -> what defines it (an int: the index of its node)

        def what_is(what: str | int) -> str:
            return node_label(g.node[what], what) if isinstance(what, int) else what

        def define(name: str, what: str | int) -> None:
            if not name:
                return
            if name in outer:
                raise ConversionError(self.source, f"tensor {name!r}", f"defined by {what_is(what)} in {where_g} "
                                                                       "shadows a value of an enclosing graph; ONNX "
                                                                       "names must be unique (SSA)")
            if name in defined:
                raise ConversionError(self.source, f"tensor {name!r}", f"defined twice in {where_g}: by "
                                                                       f"{what_is(defined[name])} and by "
                                                                       f"{what_is(what)}; ONNX names must be "
                                                                       "unique (SSA)")
            defined[name] = what

        initializers = set()
        for t in g.initializer:
            if not t.name:
                raise ConversionError(self.source, where_g, "an initializer has no name")
            if t.name in initializers:
                raise ConversionError(self.source, f"initializer {t.name!r}", f"defined twice in {where_g}")
            initializers.add(t.name)
            define(t.name, "an initializer")
        for s in g.sparse_initializer:
            define(s.values.name, "a sparse initializer")
        for inp in g.input:
            if not inp.name:
                raise ConversionError(self.source, where_g, "a graph input has no name")
            if inp.name not in initializers:  # IR < 4 lists initializers among the inputs as well
                define(inp.name, "a graph input")
        outputs = [(out, idx) for idx, row in enumerate(rows) for out in row[1] if out]
        producer = dict(outputs)  # all at once; one by one only to name a clash
        if len(producer) < len(outputs) or not producer.keys().isdisjoint(defined) \
                or not producer.keys().isdisjoint(outer):
            for out, idx in outputs:
                define(out, idx)  # raises at the first name defined twice or shadowing an outer one
        defined.update(producer)
        visible = outer | frozenset(defined)
        free: set[str] = set()
        captured: dict[int, set[str]] = {}  # node index -> the outer names its subgraphs use
        in_order = True
        known_domains: set[str] = set()  # each distinct domain is checked once
        for idx, (node, _, inputs, domain, attributes, _, _) in enumerate(rows):
            if domain not in known_domains:
                self._check_domain(node, domain, idx, path)
                known_domains.add(domain)
            for n in inputs:
                p = producer.get(n)
                if p is not None:
                    in_order = in_order and p < idx
                elif n and n not in visible:
                    raise ConversionError(self.source, _where(node, idx, path), f"input {n!r} is not produced by "
                                                                                "any node, graph input or initializer")
                elif n and n not in defined:
                    free.add(n)
            for a in attributes:
                if not (a.HasField("g") or a.graphs):
                    continue
                subs = ([a.g] if a.HasField("g") else []) + list(a.graphs)
                for k, sub in enumerate(subs):
                    sub_path = f"{path + '/' if path else ''}{node.name or node.op_type + str(idx)}.{a.name}" + \
                               (f"[{k}]" if len(subs) > 1 else "")
                    self.subgraph_paths.append(sub_path)
                    uses = self.graph(sub, visible, sub_path)
                    captured.setdefault(idx, set()).update(uses)
                    in_order = in_order and all(producer.get(n, -1) < idx for n in uses)
                    free.update(n for n in uses if n not in defined)
        for out in g.output:
            if not out.name or out.name not in visible:
                raise ConversionError(self.source, f"graph output {out.name!r}" + (f" of {where_g}" if path else ""),
                                      "is not produced by any node, graph input or initializer")
            if out.name not in defined:
                free.add(out.name)
        if not in_order:
            self._sort(g, _dependencies(rows, producer, captured), path)
        elif not path:
            self.main_rows = rows
        self.seen.update(defined)
        return free

    def _check_domain(self, node: NodeProto, domain: str, idx: int, path: str) -> None:
        """``node``'s domain has an opset (``node``: the first node of its graph with this domain)."""
        domain = "" if domain in ("", "ai.onnx") else domain
        if domain not in self.opsets:
            what = "the domain of a model function" if (node.domain, node.op_type) in self.functions else "domain"
            raise ConversionError(self.source, _where(node, idx, path), f"{what} {node.domain!r} has no "
                                                                        "opset_import entry")

    def _sort(self, g: GraphProto, deps: list[set[int]], path: str) -> None:
        """Put ``g``'s nodes, which are out of topological order, in it (or raise for a cycle)."""
        order, stuck = stable_topological_order(deps)
        if stuck:
            cycle = _find_cycle(deps, stuck)
            names = [g.node[i].name or f"#{i}" for i in cycle]
            first = g.node[cycle[0]]
            raise ConversionError(self.source, node_label(first, cycle[0]) + (f" in subgraph {path}" if path else ""),
                                  f"the graph has a cycle: {' -> '.join(names + names[:1])}")
        replace_nodes(g, [g.node[i] for i in order])
        self.changed = True

    def _rename_sibling_clashes(self, g: GraphProto, outer: frozenset[str], rows: list[tuple]) -> bool:
        """Names this subgraph defines that another, non-enclosing graph already defined get fresh
        names; True if any was renamed."""
        if not self.seen:  # the main graph: nothing defined before it
            return False
        local = [t.name for t in g.initializer] + [i.name for i in g.input] + \
                [o for row in rows for o in row[1] if o]
        clashes = {n for n in local if n in self.seen and n not in outer}
        for old in clashes:
            new = old
            while new in self.seen or new in outer or new in local:
                self.fresh += 1
                new = f"{old}__{self.fresh}"
            _rename(g, old, new)
        self.changed = self.changed or bool(clashes)
        return bool(clashes)


def _rename(g: GraphProto, old: str, new: str) -> None:
    """Rename value ``old`` to ``new`` everywhere in ``g`` and the subgraphs that capture it."""
    for seq in (g.input, g.output, g.value_info, g.initializer):
        for item in seq:
            if item.name == old:
                item.name = new
    for s in g.sparse_initializer:
        if s.values.name == old:
            s.values.name = new
    for node in g.node:
        for i, n in enumerate(node.input):
            if n == old:
                node.input[i] = new
        for i, n in enumerate(node.output):
            if n == old:
                node.output[i] = new
        for sub in subgraphs(node):
            _rename(sub, old, new)


def _dependencies(rows: list[tuple], producer: dict[str, int], captured: dict[int, set[str]]) -> list[set[int]]:
    """Per node, the indices of the nodes it reads from: its inputs and what its subgraphs use."""
    return [{producer[n] for n in (*row[2], *captured.get(idx, ())) if n in producer} for idx, row in enumerate(rows)]


def _find_cycle(deps: list[set[int]], stuck: set[int]) -> list[int]:
    """One cycle among the nodes that topological sorting could not place, in execution order."""
    start = min(stuck)
    path, index, node = [], {}, start
    while node not in index:
        index[node] = len(path)
        path.append(node)
        node = min(d for d in deps[node] if d in stuck)  # every stuck node waits on a stuck node
    cycle = list(reversed(path[index[node]:]))
    first = cycle.index(min(cycle))
    return cycle[first:] + cycle[:first]



def graphs(g: GraphProto, path: str) -> Iterator[tuple[GraphProto, str]]:
    yield g, path
    for idx, node in enumerate(g.node):
        for a in node.attribute:
            if a.HasField("g") or a.graphs:  # most attributes hold no graph: no lists built for them
                subs = ([a.g] if a.HasField("g") else []) + list(a.graphs)
                for sub in subs:
                    yield from graphs(sub, f"{path + '/' if path else ''}{node.name or node.op_type + str(idx)}.{a.name}")



def names_in_use(model: ModelProto) -> set[str]:
    """Every node name and value name in ``model``'s graphs, subgraphs included: what a name a
    rewrite adds must differ from."""
    names: set[str] = set()
    for g, _ in graphs(model.graph, ""):
        names.update(vi.name for vi in (*g.input, *g.output, *g.value_info))
        names.update(t.name for t in g.initializer)
        names.update(t.values.name for t in g.sparse_initializer)
        for node in g.node:
            names.add(node.name)
            names.update(node.input)
            names.update(node.output)
    return names
