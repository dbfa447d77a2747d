"""Node order of an ONNX graph: a stable topological order, and replacing a graph's node list."""

from __future__ import annotations

import heapq

from onnx import GraphProto, NodeProto


def stable_topological_order(deps: list[set[int]]) -> tuple[list[int], set[int]]:
    """Kahn's algorithm over node indices, smallest ready index first (keeps the file's order where legal).

    ``deps[i]`` holds the indices of the nodes node ``i`` reads from. Returns the order and the
    nodes left out of it: those on or behind a cycle (empty for an acyclic graph).
    """
    users: list[list[int]] = [[] for _ in deps]
    waiting = [len(ds) for ds in deps]
    for i, ds in enumerate(deps):
        for d in ds:
            users[d].append(i)
    ready = [i for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    return order, {i for i, w in enumerate(waiting) if w > 0}


def replace_nodes(g: GraphProto, nodes: list[NodeProto]) -> None:
    """Make ``nodes`` the node list of ``g`` (which they may come from)."""
    if len(nodes) == len(g.node) and all(a is b for a, b in zip(nodes, g.node)):
        return
    # protobuf copies messages on extend; a node taken out of the list keeps its fields (the
    # ``nodes`` hold it), so one bulk copy in C does, no Python call per node
    del g.node[:]
    g.node.extend(nodes)
