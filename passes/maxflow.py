"""The source side of a minimum s-t cut: the min-cut planner's solver (``convert.solve_mincut``).

Capacities are scaled to integers (finite costs so their total fits in 2**30, "infinite"
edges 2**30, repeated edges summed then capped), and the cut returned is the set of nodes
reachable from the source in the residual graph of a maximum flow: the same for every
maximum flow, so the two solvers below give the same answer. A node with one edge in and one
out (a cast term's auxiliary node with a single reader) is bypassed first (``_bypass_relays``):
half the nodes of a transformer's graph, half the max-flow's time. Graphs of up to
``PURE_PYTHON_EDGES`` edges (a model of a few thousand ops) are solved here in Python
(Dinic's algorithm, milliseconds); larger ones by scipy's C max-flow, imported only then:
scipy's import costs more than the whole small solve (docs/architecture.md, "Performance").
"""

from __future__ import annotations

from collections import deque

import numpy as np

#: graphs with at most this many (distinct) edges are solved without scipy
PURE_PYTHON_EDGES = 20_000
_INF = 2 ** 30


def min_cut_source_side(n_nodes: int, rows: list[int], cols: list[int], caps: list[float], source: int,
                        sink: int) -> np.ndarray:
    """Boolean mask of the nodes on the source side of a minimum ``source``-``sink`` cut.

    ``caps`` below zero are "infinite" (more than any finite cut).
    """
    cap = np.asarray(caps, dtype=np.float64)
    finite = cap >= 0
    total = float(cap[finite].sum()) or 1.0
    scaled = np.where(finite, np.maximum(np.rint(cap * ((_INF - 1) / total)), 1), _INF).astype(np.int64)
    rows, cols, scaled, relays = _bypass_relays(n_nodes, np.asarray(rows, dtype=np.int64),
                                                np.asarray(cols, dtype=np.int64), scaled, source, sink)
    node, before, after, cap_in, cap_out = relays
    kept = np.ones(n_nodes, dtype=bool)
    kept[node] = False
    renumber = np.cumsum(kept) - 1  # the other nodes, numbered on in order
    m = n_nodes - node.size
    keys = renumber[rows] * m + renumber[cols]
    unique, where = np.unique(keys, return_inverse=True)
    summed = np.zeros(unique.size, dtype=np.int64)
    np.add.at(summed, where, scaled)  # repeated edges add up in int64, then are capped: never wrap around
    summed = np.minimum(summed, _INF)
    heads, tails = np.divmod(unique, m)
    s, t = renumber[source], renumber[sink]
    if unique.size <= PURE_PYTHON_EDGES:
        reduced = _dinic_side(m, heads.tolist(), tails.tolist(), summed.tolist(), s, t)
    else:
        reduced = _scipy_side(m, heads, tails, summed.astype(np.int32), s, t)
    side = np.zeros(n_nodes, dtype=bool)
    side[kept] = reduced
    side[node] = side[before] & (side[after] | (cap_out < cap_in))
    return side


def _bypass_relays(n: int, heads: np.ndarray, tails: np.ndarray, caps: np.ndarray, s: int,
                   t: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple]:
    """Each relay ``v`` (not ``s`` or ``t``: one edge in, ``u -> v``, one out, ``v -> w``; no edge
    between two relays) replaced by an edge ``u -> w`` of the smaller capacity (none where ``u``
    is ``w``): every cut of the other nodes costs the same, ``v`` on its cheaper side. So the
    smallest source side restricted to them is the same, and ``v`` is on it exactly when ``u`` is
    and either ``w`` is or ``v -> w`` is the cheaper edge to cut (a tie leaves ``v`` out).
    Returns the new edges and the relays as ``(v, u, w, cap in, cap out)`` arrays."""
    relay = (np.bincount(tails, minlength=n) == 1) & (np.bincount(heads, minlength=n) == 1)
    relay[[s, t]] = False
    chained = relay[heads] & relay[tails]
    relay[heads[chained]] = relay[tails[chained]] = False
    into, out = relay[tails], relay[heads]
    edge_in, edge_out = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    edge_in[tails[into]], edge_out[heads[out]] = np.flatnonzero(into), np.flatnonzero(out)
    node = np.flatnonzero(relay)
    e_in, e_out = edge_in[node], edge_out[node]
    before, after, cap_in, cap_out = heads[e_in], tails[e_out], caps[e_in], caps[e_out]
    new = before != after
    keep = ~(into | out)
    return (np.concatenate([heads[keep], before[new]]), np.concatenate([tails[keep], after[new]]),
            np.concatenate([caps[keep], np.minimum(cap_in, cap_out)[new]]), (node, before, after, cap_in, cap_out))


def _dinic_side(n: int, heads: list[int], tails: list[int], caps: list[int], s: int, t: int) -> np.ndarray:
    """Dinic's maximum flow on paired edges (edge ``e ^ 1`` is ``e``'s reverse); then the residual reach."""
    adj: list[list[int]] = [[] for _ in range(n)]
    to: list[int] = []
    residual: list[int] = []
    for u, v, c in zip(heads, tails, caps):
        adj[u].append(len(to))
        to.append(v)
        residual.append(c)
        adj[v].append(len(to))
        to.append(u)
        residual.append(0)
    while True:
        level = _levels(n, adj, to, residual, s)
        if level[t] < 0:
            break
        _blocking_flow(adj, to, residual, level, s, t)
    side = np.zeros(n, dtype=bool)
    side[[v for v, d in enumerate(_levels(n, adj, to, residual, s)) if d >= 0]] = True
    return side


def _levels(n: int, adj: list[list[int]], to: list[int], residual: list[int], s: int) -> list[int]:
    """Breadth-first distance from ``s`` over edges with residual capacity (-1: unreached)."""
    level = [-1] * n
    level[s] = 0
    queue = deque([s])
    while queue:
        u = queue.popleft()
        for e in adj[u]:
            v = to[e]
            if residual[e] > 0 and level[v] < 0:
                level[v] = level[u] + 1
                queue.append(v)
    return level


def _blocking_flow(adj: list[list[int]], to: list[int], residual: list[int], level: list[int], s: int,
                   t: int) -> None:
    """Saturate every shortest path of the level graph: depth-first from ``s``, retreating from dead
    ends (never entered again this phase) and back only to the first edge a push saturated."""
    nxt = [0] * len(adj)
    path: list[int] = []
    u = s
    while True:
        if u == t:
            pushed = min(residual[e] for e in path)
            cut = len(path)
            for k, e in enumerate(path):
                residual[e] -= pushed
                residual[e ^ 1] += pushed
                if not residual[e] and k < cut:
                    cut = k
            del path[cut:]
            u = to[path[-1]] if path else s
            continue
        edges = adj[u]
        i = nxt[u]
        want = level[u] + 1
        while i < len(edges) and not (residual[edges[i]] > 0 and level[to[edges[i]]] == want):
            i += 1
        nxt[u] = i
        if i < len(edges):
            path.append(edges[i])
            u = to[edges[i]]
            continue
        level[u] = -1
        if not path:
            return
        u = to[path.pop() ^ 1]
        nxt[u] += 1


def _scipy_side(n: int, heads: np.ndarray, tails: np.ndarray, caps: np.ndarray, s: int, t: int) -> np.ndarray:
    """scipy's C max-flow (int32 capacities), then the residual reach from ``s``."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import breadth_first_order, maximum_flow

    graph = csr_matrix((caps, (heads, tails)), shape=(n, n))
    residual = (graph - maximum_flow(graph, s, t).flow).tocsr()
    residual.data[residual.data < 0] = 0
    residual.eliminate_zeros()
    side = np.zeros(n, dtype=bool)
    side[breadth_first_order(residual, s, directed=True, return_predecessors=False)] = True
    return side
