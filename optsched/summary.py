"""Plain-data summaries of graphs and simulated schedules, shared by the CLI's
tables and its `--json` output (and by notebooks)."""

from __future__ import annotations

from collections import Counter

from .cluster import Cluster
from .graph import Graph, drop_unneeded, largest_operation, unneeded
from .simulate import SimResult, describe


def graph_summary(graph: Graph) -> dict:
    a = graph.arrays
    kinds = Counter(n.kind for n in graph.nodes)
    node, lb = largest_operation(drop_unneeded(graph))     # no schedule needs to run the others
    total = {k: float(v[v == v].sum()) for k, v in a.cost.items()}
    return {"name": graph.name, "nodes": len(graph.nodes), "edges": graph.num_edges, "kinds": dict(kinds),
            "required": int(a.required.sum()), "total_compute_s": total,
            "activation_bytes": int(a.bytes.sum()), "memory_lower_bound": lb, "largest_operation": node,
            "unneeded": unneeded(graph)}


def sim_summary(result: SimResult, cluster: Cluster) -> dict:
    return {
        "valid": result.valid,
        "violation": None if result.violation is None else {
            "code": result.violation.code, "message": describe(result.violation),
            "instruction": result.violation.index, "node": result.violation.node,
            "device": result.violation.device, "bytes_over": result.violation.over},
        "step_time_s": result.makespan,
        "compute_s": result.compute_time,
        "recompute_s": result.recompute_time,
        "recomputed_ops": result.recomputed,
        "transfer_s": result.transfer_time,
        "transfer_bytes": result.transfer_bytes,
        "swap_out_bytes": result.swap_out_bytes,
        "swap_in_bytes": result.swap_in_bytes,
        "devices": [{"device": d.name, "kind": d.kind, "peak_bytes": result.peak[d.name], "budget_bytes": d.memory,
                     "busy_s": result.busy[d.name]} for d in cluster.devices],
    }
