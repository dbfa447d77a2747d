"""The source side of a minimum s-t cut: the min-cut planner's solver (``convert.solve_mincut``).

Capacities are scaled to integers (finite costs so their total fits in 2**30, "infinite"
edges 2**30, repeated edges summed then capped), and the cut returned is the set of nodes
reachable from the source in the residual graph of a maximum flow: the same for every
maximum flow, so the two solvers below give the same answer. A node with one edge in and one
out (a cast term's auxiliary node with a single reader) is bypassed first (``_relays``):
half the nodes of a transformer's graph, half the max-flow's time. That reduction and the merging
of repeated edges depend on the edges alone: a ``CutNetwork`` makes them once for cuts of one graph
under several capacities (the planner's weighted cuts). Graphs of up to
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
    return CutNetwork(n_nodes, rows, cols, source, sink).source_side(caps)


class CutNetwork:
    """A graph's edges made ready for cuts of any capacities: the relays bypassed, repeated edges
    merged and the nodes renumbered once (these depend on the edges alone), so that cuts of one
    graph under several capacities (the planner's weighted cuts) only weigh and solve."""

    def __init__(self, n_nodes: int, rows: list[int], cols: list[int], source: int, sink: int) -> None:
        rows, cols = np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64)
        self.n_nodes = n_nodes
        self.relays = _relays(n_nodes, rows, cols, source, sink)
        node, e_in, e_out, before, after, new, keep = self.relays
        self.kept = np.ones(n_nodes, dtype=bool)
        self.kept[node] = False
        renumber = np.cumsum(self.kept) - 1  # the other nodes, numbered on in order
        self.m = n_nodes - node.size
        heads, tails = np.concatenate([rows[keep], before[new]]), np.concatenate([cols[keep], after[new]])
        keys = renumber[heads] * self.m + renumber[tails]  # the kept edges, then each relay's bypass
        unique, self.where = np.unique(keys, return_inverse=True)
        self.heads, self.tails = np.divmod(unique, self.m)
        self.s, self.t = int(renumber[source]), int(renumber[sink])

    def source_side(self, caps: list[float]) -> np.ndarray:
        """The source side of a minimum cut under ``caps`` (one per edge, in the order given; < 0: infinite)."""
        scaled = _scaled(caps)
        node, e_in, e_out, before, after, new, keep = self.relays
        cap_in, cap_out = scaled[e_in], scaled[e_out]
        summed = np.zeros(self.heads.size, dtype=np.int64)
        np.add.at(summed, self.where, np.concatenate([scaled[keep], np.minimum(cap_in, cap_out)[new]]))
        summed = np.minimum(summed, _INF)  # repeated edges add up in int64, then are capped: never wrap around
        if self.heads.size <= PURE_PYTHON_EDGES:
            reduced = _dinic_side(self.m, self.heads.tolist(), self.tails.tolist(), summed.tolist(), self.s, self.t)
        else:
            reduced = _scipy_side(self.m, self.heads, self.tails, summed.astype(np.int32), self.s, self.t)
        side = np.zeros(self.n_nodes, dtype=bool)
        side[self.kept] = reduced
        side[node] = side[before] & (side[after] | (cap_out < cap_in))
        return side


def _scaled(caps: list[float]) -> np.ndarray:
    """Capacities as integers: finite ones scaled so that their total is below ``_INF`` (each at least
    1), infinite ones (< 0) ``_INF``."""
    cap = np.asarray(caps, dtype=np.float64)
    finite = cap >= 0
    total = float(cap[finite].sum()) or 1.0
    return np.where(finite, np.maximum(np.rint(cap * ((_INF - 1) / total)), 1), _INF).astype(np.int64)


def _relays(n: int, heads: np.ndarray, tails: np.ndarray, s: int, t: int) -> tuple[np.ndarray, ...]:
    """The relays to bypass: each ``v`` (not ``s`` or ``t``: one edge in, ``u -> v``, one out, ``v -> w``;
    no edge between two relays) is replaced by an edge ``u -> w`` of the smaller capacity (none where
    ``u`` is ``w``): every cut of the other nodes costs the same, ``v`` on its cheaper side. So the
    smallest source side restricted to them is the same, and ``v`` is on it exactly when ``u`` is
    and either ``w`` is or ``v -> w`` is the cheaper edge to cut (a tie leaves ``v`` out).
    Returns ``(v, edge in, edge out, u, w, new, keep)``: the relays, the indices of their edges, their
    ends, which of them get an edge ``u -> w``, and which edges stay (those touching no relay)."""
    relay = (np.bincount(tails, minlength=n) == 1) & (np.bincount(heads, minlength=n) == 1)
    relay[[s, t]] = False
    chained = relay[heads] & relay[tails]
    relay[heads[chained]] = relay[tails[chained]] = False
    into, out = relay[tails], relay[heads]
    edge_in, edge_out = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    edge_in[tails[into]], edge_out[heads[out]] = np.flatnonzero(into), np.flatnonzero(out)
    node = np.flatnonzero(relay)
    e_in, e_out = edge_in[node], edge_out[node]
    before, after = heads[e_in], tails[e_out]
    return node, e_in, e_out, before, after, before != after, ~(into | out)


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
    """scipy's C max-flow (int32 capacities), then the residual reach from ``s``. The edges come
    sorted by (head, tail), none repeated (``CutNetwork``), so they are laid out as the sparse
    matrix's rows as they are, not sorted again."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import breadth_first_order, maximum_flow

    indptr = np.concatenate([[0], np.cumsum(np.bincount(heads, minlength=n))])
    graph = csr_matrix((caps, tails, indptr), shape=(n, n))
    residual = (graph - maximum_flow(graph, s, t).flow).tocsr()
    residual.data[residual.data < 0] = 0
    residual.eliminate_zeros()
    side = np.zeros(n, dtype=bool)
    side[breadth_first_order(residual, s, directed=True, return_predecessors=False)] = True
    return side
