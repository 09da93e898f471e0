"""Coarsening: fold linear chains of operations into super-nodes, solve the
smaller graph, expand the schedule back to operation level.

A link u -> v is folded when u's only consumer is v and v's only input is u,
both have the same kind, may be recomputed, are not required results, can
run on the same device kinds, and the chain stays short (`max_len`) and cheap
(`max_cost` seconds on its fastest kind); so an op's other output (not
recomputable) stays apart, and so does its maker (which shares its inputs).
A chain x1 -> ... -> xk becomes one node with x1's inputs, xk's output bytes, the summed costs, and as workspace
whatever its intermediates need beyond xk's output:

    workspace = max_i (b[x_{i-1}] + b[x_i] + ws[x_i]) - b[x_k]     (b[x_0] = 0)

so the coarse node allocates, while it runs, at least what the fine sequence
"compute x_i, free x_{i-1}" holds at any moment: every schedule valid on the
coarse graph expands into one valid on the fine graph, with the same time.

Memory-critical boundary: a chain is never extended when the coarse node's
own need (its inputs, output and workspace) would exceed `max_need`, by
default the graph's memory lower bound (the largest single operation's
need), so coarsening never makes a budget infeasible that the fine graph's
lower bound admits. Device boundaries: nodes with different runnable kinds
are never folded together.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import numpy as np

from ..graph import Graph, Node, memory_lower_bound
from ..schedule import Compute, Copy, Free, Schedule, SolveReport, Sync


def coarsen(graph: Graph, *, max_len: int = 64, max_cost: float = float("inf"),
            max_need: int | None = None) -> tuple[Graph, dict[str, tuple[str, ...]]]:
    """(coarse graph, mapping coarse id -> fine ids in execution order)."""
    a = graph.arrays
    n = len(a.ids)
    if max_need is None:
        max_need = memory_lower_bound(graph)
    indeg = np.diff(a.in_ptr).tolist()
    outdeg = np.diff(a.out_ptr).tolist()
    in_ptr, in_idx = a.in_ptr.tolist(), a.in_idx.tolist()
    kind = a.kind.tolist()
    rec = a.recomputable.tolist()
    req = a.required.tolist()
    nb, ws = a.bytes.tolist(), a.workspace.tolist()
    kinds = sorted(a.cost)
    pattern = [tuple(not np.isnan(a.cost[k][v]) for k in kinds) for v in range(n)] if kinds else [()] * n
    fast = np.full(n, np.inf)
    for k in kinds:
        fast = np.fmin(fast, a.cost[k])
    fastl = fast.tolist()
    foldable = [rec[v] and not req[v] for v in range(n)]

    chain_of = [-1] * n
    chains: list[list[int]] = []
    # per chain: external input bytes, running max of b[x_{i-1}] + b[x_i] + ws[x_i], cost
    ext, peak, cost = [], [], []
    for v in a.topo.tolist():
        u = in_idx[in_ptr[v]] if indeg[v] == 1 else -1
        c = chain_of[u] if u >= 0 else -1
        if (c >= 0 and foldable[v] and foldable[u] and outdeg[u] == 1 and kind[u] == kind[v]
                and pattern[u] == pattern[v] and chains[c][-1] == u and len(chains[c]) < max_len
                and cost[c] + fastl[v] <= max_cost):
            step = nb[u] + nb[v] + ws[v]
            need = ext[c] + max(peak[c], step)
            if need <= max_need:
                chains[c].append(v)
                chain_of[v] = c
                peak[c] = max(peak[c], step)
                cost[c] += fastl[v]
                continue
        chain_of[v] = len(chains)
        chains.append([v])
        ext.append(sum(nb[in_idx[j]] for j in range(in_ptr[v], in_ptr[v + 1])))
        peak.append(nb[v] + ws[v])
        cost.append(fastl[v])

    ids = a.ids
    cid = []
    for ch in chains:
        cid.append(ids[ch[0]] if len(ch) == 1 else f"{ids[ch[0]]}..{ids[ch[-1]]}")
    taken = set(ids)
    for k, ch in enumerate(chains):   # a super-node name must not clash with a fine id
        if len(ch) > 1:
            base, m = cid[k], 1
            while cid[k] in taken:
                cid[k] = f"{base}#{m}"
                m += 1
            taken.add(cid[k])
    nodes, mapping = [], {}
    for k, ch in enumerate(chains):
        head, tail = ch[0], ch[-1]
        inputs = tuple(cid[chain_of[in_idx[j]]] for j in range(in_ptr[head], in_ptr[head + 1]))
        fine = graph.nodes[head]
        if len(ch) == 1:
            maker = a.output_of[head]    # never inside a chain: its other outputs read its inputs too
            nodes.append(Node(cid[k], fine.op, fine.kind, inputs, dict(fine.cost), fine.bytes, fine.workspace,
                              fine.recomputable, fine.required, cid[chain_of[maker]] if maker >= 0 else ""))
        else:
            c = {kd: float(sum(a.cost[kd][v] for v in ch)) for kd in kinds if not np.isnan(a.cost[kd][head])}
            nodes.append(Node(cid[k], "chain", fine.kind, inputs, c, nb[tail], int(peak[k] - nb[tail]), True, False))
        mapping[cid[k]] = tuple(ids[v] for v in ch)
    coarse = Graph(tuple(nodes), name=f"{graph.name}-coarse" if graph.name else "coarse",
                   meta={**dict(graph.meta), "coarsened_from": len(graph)})
    return coarse, mapping


def expand(schedule: Schedule, mapping: Mapping[str, tuple[str, ...]], graph: Graph | None = None) -> Schedule:
    """The fine schedule of a coarse one: a super-node's compute becomes its
    chain (each intermediate freed after the next one), its copies and frees
    those of the chain's last node."""
    out = []
    for x in schedule.instructions:
        t = type(x)
        if t is Compute:
            fine = mapping.get(x.node, (x.node,))
            out.append(Compute(fine[0], x.device))
            for k in range(1, len(fine)):
                out.append(Compute(fine[k], x.device))
                out.append(Free(fine[k - 1], x.device))
        elif t is Copy:
            out.append(Copy(mapping.get(x.node, (x.node,))[-1], x.src, x.dst))
        elif t is Free:
            out.append(Free(mapping.get(x.node, (x.node,))[-1], x.device))
        elif t is Sync:
            out.append(x)
        else:
            raise TypeError(f"unknown instruction {x!r}")
    return Schedule(tuple(out), schedule.report, graph=graph.name if graph is not None else schedule.graph)


def solve_coarsened(graph: Graph, cluster, solver, options=None, **coarsen_kw) -> Schedule:
    """Coarsen, run `solver` (a callable or a SOLVERS name) on the coarse
    graph, expand, and check the result in the simulator."""
    from ..simulate import require_valid, simulate
    from . import get_solver
    from .options import SolveOptions

    t0 = time.perf_counter()
    options = options or SolveOptions()
    fn = get_solver(solver) if isinstance(solver, str) else solver
    coarse, mapping = coarsen(graph, **coarsen_kw)
    sched = expand(fn(coarse, cluster, options), mapping, graph)
    r = require_valid(simulate(graph, cluster, sched))
    rep = sched.report or SolveReport(str(solver))
    extra = {**dict(rep.extra), "coarse_nodes": len(coarse), "fine_nodes": len(graph)}
    return Schedule(sched.instructions, SolveReport(rep.solver, rep.status, objective=r.makespan, bound=rep.bound,
                                                    gap=rep.gap, solve_time=time.perf_counter() - t0,
                                                    message=rep.message, extra=extra), graph=graph.name)
