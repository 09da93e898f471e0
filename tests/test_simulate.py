"""The simulator against hand-computed cases of the schedule contract (DESIGN.md).

Every number below is worked out by hand from the contract: one compute stream
per device, one copy stream per directed link, list order on each stream, an
instruction starts when its stream is free and its inputs are resident (and
after the last sync), a compute allocates output + workspace when it starts and
releases the workspace when it ends, a copy allocates on the destination when
it starts, a free releases once every earlier reader on that device is done.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from optsched.cluster import Cluster, Device, Link
from optsched.errors import OptschedError
from optsched.graph import Graph, Node, check_graph
from optsched.schedule import Compute, Copy, Free, Schedule, Sync
from optsched.simulate import InvalidSchedule, describe, require_valid, simulate

BIG = 10**12


def node(id, inputs=(), cost=1.0, bytes=100, **kw):
    c = cost if isinstance(cost, dict) else {"cuda": cost, "cpu": 4 * cost}
    return Node(id, inputs=tuple(inputs), cost=c, bytes=bytes, **kw)


def graph(*nodes) -> Graph:
    return check_graph(Graph(tuple(nodes), name="hand"))


def cluster(gpu=BIG, host=BIG, bw=100.0, lat=0.5, speed=1.0, host_speed=1.0, gpu1=None) -> Cluster:
    """gpu <-> host over links of `bw` bytes/s and `lat` s; optional gpu1 linked to gpu only (gpu -> gpu1)."""
    devs = [Device("gpu", "cuda", gpu, speed), Device("host", "cpu", host, host_speed)]
    links = [Link("gpu", "host", bw, lat), Link("host", "gpu", bw, lat)]
    if gpu1 is not None:
        devs.append(Device("gpu1", "cuda", gpu1))
        links.append(Link("gpu", "gpu1", bw, lat))
    return Cluster(tuple(devs), tuple(links))


def run(g, c, *ins):
    return simulate(g, c, Schedule(tuple(ins)))


def ok(g, c, *ins):
    r = run(g, c, *ins)
    assert r.valid, r.violation
    assert r.violation is None
    return r


def bad(g, c, *ins, code, index, node=None, device=None):
    r = run(g, c, *ins)
    assert not r.valid
    v = r.violation
    assert (v.code, v.index, v.node, v.device) == (code, index, node, device), v
    return r


# --- time ------------------------------------------------------------------------------------

def test_copy_overlaps_compute():
    g = graph(node("a", cost=1.0, bytes=100), node("b", cost=2.0, bytes=50))
    r = ok(g, cluster(), Compute("a", "gpu"), Copy("a", "gpu", "host"), Compute("b", "gpu"))
    # a: 0-1; copy: 1 - 1+0.5+100/100 = 2.5 on the link; b: 1-3 on the compute stream, concurrently
    assert r.start.tolist() == [0.0, 1.0, 1.0]
    assert r.end.tolist() == [1.0, 2.5, 3.0]
    assert r.makespan == 3.0
    assert r.transfer_time == 1.5 and r.transfer_bytes == 100
    assert r.compute_time == 3.0 and r.busy == {"gpu": 3.0, "host": 0.0}
    assert r.peak == {"gpu": 150, "host": 100}


def test_sync_is_a_barrier():
    g = graph(node("a", cost=1.0, bytes=100), node("b", cost=2.0, bytes=50))
    r = ok(g, cluster(), Compute("a", "gpu"), Copy("a", "gpu", "host"), Sync(), Compute("b", "gpu"))
    # b waits for the copy (ends 2.5) although the compute stream is free at 1
    assert r.start[3] == 2.5 and r.end[3] == 4.5
    assert r.start[2] == r.end[2] == 2.5
    assert r.makespan == 4.5


def test_sync_delays_copies_too():
    g = graph(node("a", cost=1.0), node("b", cost=3.0))
    r = ok(g, cluster(), Compute("a", "gpu"), Compute("b", "gpu"), Sync(), Copy("a", "gpu", "host"))
    assert r.start[3] == 4.0 and r.end[3] == 5.5


def test_compute_waits_for_its_input_copy_and_copy_for_its_source():
    g = graph(node("a", cost=1.0, bytes=100), node("b", ["a"], cost=1.0, bytes=10))
    r = ok(g, cluster(), Compute("a", "host"), Copy("a", "host", "gpu"), Compute("b", "gpu"))
    # a on host: cpu cost 4 -> 0-4; copy waits for a: 4-5.5; b waits for the copy: 5.5-6.5
    assert r.start.tolist() == [0.0, 4.0, 5.5]
    assert r.end.tolist() == [4.0, 5.5, 6.5]
    assert r.makespan == 6.5
    assert r.swap_in_bytes == 100 and r.swap_out_bytes == 0


def test_each_stream_runs_in_list_order():
    # two copies on one link serialise; copies on opposite links and computes on two devices overlap
    g = graph(node("a", cost=1.0, bytes=100), node("b", cost=1.0, bytes=100), node("c", cost=2.0, bytes=1))
    r = ok(g, cluster(), Compute("a", "gpu"), Compute("b", "gpu"), Compute("c", "host"),
           Copy("a", "gpu", "host"), Copy("b", "gpu", "host"), Copy("c", "host", "gpu"))
    # a 0-1, b 1-2 (gpu stream); c 0-8 on host (cpu cost 4*2)
    assert r.end[:3].tolist() == [1.0, 2.0, 8.0]
    # gpu->host link: a 1-2.5, b waits for the link: 2.5-4; host->gpu: c 8-8.5+0.01
    assert r.start[3:].tolist() == [1.0, 2.5, 8.0]
    assert r.end[3] == 2.5 and r.end[4] == 4.0 and r.end[5] == pytest.approx(8.51)
    assert r.makespan == pytest.approx(8.51)
    assert r.swap_out_bytes == 200 and r.swap_in_bytes == 1 and r.transfer_bytes == 201


def test_device_speed_factor():
    g = graph(node("a", cost={"cuda": 1.0, "cpu": 2.0}), node("b", cost={"cuda": 1.0, "cpu": 2.0}))
    r = ok(g, cluster(speed=4.0, host_speed=0.5), Compute("a", "gpu"), Compute("b", "host"))
    assert r.end.tolist() == [0.25, 4.0]
    assert r.busy == {"gpu": 0.25, "host": 4.0}
    assert r.compute_time == 4.25 and r.makespan == 4.0


def test_link_latency_plus_bytes_over_bandwidth():
    g = graph(node("a", cost=0.0, bytes=1000))
    r = ok(g, cluster(bw=1000.0, lat=0.25), Compute("a", "gpu"), Copy("a", "gpu", "host"))
    assert r.start[1] == 0.0 and r.end[1] == 1.25
    assert r.transfer_time == 1.25 and r.makespan == 1.25


def test_copy_issue_holds_both_ends_compute_streams():
    """A link's issue time delays the next computation in list order on each end, not the copy itself."""
    g = graph(node("a", cost=1.0, bytes=1000), node("b", ["a"], cost=1.0, bytes=10, required=True),
              node("c", cost={"cuda": 1.0, "cpu": 1.0}, bytes=10, required=True))
    lk = [Link("gpu", "host", 1000.0, 0.25, issue=0.5), Link("host", "gpu", 1000.0, 0.25, issue=0.5)]
    c = Cluster((Device("gpu", "cuda", BIG), Device("host", "cpu", BIG)), tuple(lk))
    r = ok(g, c, Compute("a", "gpu"), Copy("a", "gpu", "host"), Compute("b", "gpu"), Compute("c", "host"))
    assert r.start[1] == 1.0 and r.end[1] == 2.25           # the copy: latency + bytes / bandwidth, as before
    assert r.start[2] == 1.5 and r.end[2] == 2.5            # b waits for the gpu's issue of the copy
    assert r.start[3] == 0.5 and r.end[3] == 1.5            # so does the host's first computation
    assert r.makespan == 2.5 and r.busy == {"gpu": 2.0, "host": 1.0}
    plain = ok(g, cluster(bw=1000.0, lat=0.25), *(Compute("a", "gpu"), Copy("a", "gpu", "host"),
                                                    Compute("b", "gpu"), Compute("c", "host")))
    assert plain.start[2] == 1.0 and plain.makespan == 2.25


def test_recompute_is_counted_as_recompute():
    g = graph(node("a", cost=1.0, bytes=10), node("b", ["a"], cost=2.0, bytes=10, required=True))
    r = ok(g, cluster(), Compute("a", "gpu"), Free("a", "gpu"), Compute("a", "gpu"), Compute("b", "gpu"),
           Free("a", "gpu"))
    assert r.recomputed == 1
    assert r.recompute_time == 1.0 and r.compute_time == 3.0
    assert r.busy["gpu"] == 4.0 and r.makespan == 4.0


def test_swap_out_and_in_bytes():
    g = graph(node("a", cost=1.0, bytes=100), node("b", ["a"], cost=1.0, bytes=7, required=True))
    r = ok(g, cluster(gpu1=BIG), Compute("a", "gpu"), Copy("a", "gpu", "host"), Free("a", "gpu"),
           Copy("a", "host", "gpu"), Copy("a", "gpu", "gpu1"), Compute("b", "gpu"))
    assert r.swap_out_bytes == 100 and r.swap_in_bytes == 100
    assert r.transfer_bytes == 300               # the gpu->gpu1 copy is a transfer, not a swap
    assert r.transfer_time == pytest.approx(4.5)
    assert r.peak == {"gpu": 107, "host": 100, "gpu1": 100}


def test_sequential_makespan_is_the_sum_of_costs():
    g = graph(node("a", cost=0.5), node("b", ["a"], cost=0.25), node("c", ["b", "a"], cost=2.0, required=True))
    r = ok(g, cluster(), Compute("a", "gpu"), Compute("b", "gpu"), Compute("c", "gpu"))
    assert r.makespan == 2.75 and r.end.tolist() == [0.5, 0.75, 2.75]


# --- memory ----------------------------------------------------------------------------------

def test_peak_includes_workspace_while_running():
    g = graph(node("a", cost=1.0, bytes=100, workspace=1000), node("b", ["a"], cost=1.0, bytes=10, required=True))
    r = ok(g, cluster(), Compute("a", "gpu"), Compute("b", "gpu"), Free("a", "gpu"))
    assert r.peak["gpu"] == 1100
    t, lv = r.timeline["gpu"]
    # a+ws at 0; ws released at 1 before b allocates at 1; a freed at 2 when b ends
    assert t.tolist() == [0.0, 1.0, 1.0, 2.0]
    assert lv.tolist() == [1100, 100, 110, 10]
    r = run(g, cluster(gpu=1099), Compute("a", "gpu"), Compute("b", "gpu"), Free("a", "gpu"))
    assert r.violation.code == "over-budget" and r.violation.over == 1 and r.violation.index == 0


def test_free_waits_for_the_last_earlier_reader():
    g = graph(node("a", cost=1.0, bytes=100), node("c", ["a"], cost=2.0, bytes=10, required=True),
              node("d", cost=1.0, bytes=100, required=True))
    r = ok(g, cluster(), Compute("a", "gpu"), Compute("c", "gpu"), Free("a", "gpu"), Compute("d", "gpu"))
    assert r.start[2] == r.end[2] == 3.0          # the free takes effect when c ends
    # d starts at 3, when a is released: a step ending at t makes room for one starting at t
    assert r.peak["gpu"] == 110
    ok(g, cluster(gpu=110), Compute("a", "gpu"), Compute("c", "gpu"), Free("a", "gpu"), Compute("d", "gpu"))


def test_free_waits_for_an_in_flight_copy():
    g = graph(node("a", cost=1.0, bytes=100), node("b", cost=2.0, bytes=50, required=True))
    ins = (Compute("a", "gpu"), Copy("a", "gpu", "host"), Free("a", "gpu"), Compute("b", "gpu"))
    r = ok(g, cluster(), *ins)
    # the copy reads a on gpu until 2.5, so a is released at 2.5, not at 1 when the free is reached
    assert r.start[2] == 2.5
    t, lv = r.timeline["gpu"]
    assert t.tolist() == [0.0, 1.0, 2.5] and lv.tolist() == [100, 150, 50]
    assert r.peak["gpu"] == 150
    bad(g, cluster(gpu=149), *ins, code="over-budget", index=3, node="b", device="gpu")


def test_free_after_sync_is_not_earlier_than_the_barrier():
    # a on gpu ends at 1, host works until 8; after the sync a is freed, so a and a2 (started at 1) coexist
    g = graph(node("a", cost=1.0, bytes=100), node("a2", cost=1.0, bytes=100, required=True),
              node("h", cost=2.0, bytes=1, required=True))
    r = ok(g, cluster(), Compute("a", "gpu"), Compute("h", "host"), Compute("a2", "gpu"), Sync(), Free("a", "gpu"))
    assert r.start[4] == 8.0
    assert r.peak["gpu"] == 200


def test_copy_allocates_on_the_destination_when_it_starts():
    g = graph(node("a", cost=1.0, bytes=100), node("b", cost=1.0, bytes=30))
    r = ok(g, cluster(), Compute("a", "gpu"), Compute("b", "host"), Copy("a", "gpu", "host"))
    t, lv = r.timeline["host"]
    # b: host 0 (+30); copy of a starts at 1 (+100), before it completes at 2.5
    assert t.tolist() == [0.0, 1.0] and lv.tolist() == [30, 130]


def test_zero_length_operation_counts_its_inputs_and_output():
    g = graph(node("a", cost=1.0, bytes=100), node("b", ["a"], cost=0.0, bytes=50, required=True))
    r = ok(g, cluster(), Compute("a", "gpu"), Compute("b", "gpu"), Free("a", "gpu"))
    assert r.peak["gpu"] == 150
    bad(g, cluster(gpu=149), Compute("a", "gpu"), Compute("b", "gpu"), Free("a", "gpu"), code="over-budget",
        index=1, node="b", device="gpu")


def test_zero_length_value_freed_before_a_later_allocation():
    # a costs nothing and is freed before b is listed: they never coexist
    g = graph(node("a", cost=0.0, bytes=100), node("b", cost=1.0, bytes=100, required=True))
    r = ok(g, cluster(), Compute("a", "gpu"), Free("a", "gpu"), Compute("b", "gpu"))
    assert r.peak["gpu"] == 100
    # but a zero-length value still counts while it exists
    g2 = graph(node("a", cost=0.0, bytes=100, required=True))
    assert ok(g2, cluster(), Compute("a", "gpu")).peak["gpu"] == 100


def test_memory_timeline_ends_at_what_stays_resident():
    g = graph(node("a", cost=1.0, bytes=100), node("b", ["a"], cost=1.0, bytes=7, required=True))
    r = ok(g, cluster(), Compute("a", "gpu"), Copy("a", "gpu", "host"), Compute("b", "gpu"), Free("a", "gpu"))
    assert r.timeline["gpu"][1][-1] == 7 and r.timeline["host"][1][-1] == 100
    assert r.peak == {"gpu": 107, "host": 100}
    assert r.budget == {"gpu": BIG, "host": BIG}


def test_budget_equal_to_peak_is_enough():
    g = graph(node("a", bytes=100), node("b", ["a"], bytes=100), node("c", ["b"], bytes=100, required=True))
    ins = (Compute("a", "gpu"), Compute("b", "gpu"), Free("a", "gpu"), Compute("c", "gpu"), Free("b", "gpu"))
    assert ok(g, cluster(), *ins).peak["gpu"] == 200
    ok(g, cluster(gpu=200), *ins)
    r = bad(g, cluster(gpu=199), *ins, code="over-budget", index=1, node="b", device="gpu")
    assert r.violation.over == 1
    assert r.peak["gpu"] == 200 and not math.isnan(r.makespan)     # full metrics for over-budget


def test_over_budget_reports_the_first_crossing():
    g = graph(node("a", cost=1.0, bytes=100), node("b", cost=1.0, bytes=300), node("c", cost=5.0, bytes=60))
    # gpu: a 0-1, b 1-2 -> over at 1 by 400-350=50; host: c 0-20 at t=0 over by 10
    r = run(g, cluster(gpu=350, host=50), Compute("a", "gpu"), Compute("b", "gpu"), Compute("c", "host"))
    v = r.violation
    assert (v.code, v.index, v.node, v.device, v.over) == ("over-budget", 2, "c", "host", 10)
    r = run(g, cluster(gpu=350), Compute("a", "gpu"), Compute("b", "gpu"), Compute("c", "host"))
    v = r.violation
    assert (v.code, v.index, v.node, v.device, v.over) == ("over-budget", 1, "b", "gpu", 50)
    assert "gpu" in describe(v) and "instruction 1" in describe(v)


# --- violations ------------------------------------------------------------------------------

def g3():
    return graph(node("w", kind="param", recomputable=False, cost=0.0, bytes=10),
                 node("a", cost=1.0, bytes=100),
                 node("b", ["a", "w"], cost=1.0, bytes=10, required=True),
                 node("r", ["a"], cost=1.0, bytes=10, recomputable=False),
                 node("cpuonly", cost={"cpu": 1.0}, bytes=1))


@pytest.mark.parametrize("ins, code, index, nd, dev", [
    ((Compute("zz", "gpu"),), "unknown-node", 0, "zz", "gpu"),
    ((Compute("a", "gpu"), Copy("zz", "gpu", "host")), "unknown-node", 1, "zz", "gpu"),
    ((Compute("a", "gpu"), Free("zz", "gpu")), "unknown-node", 1, "zz", "gpu"),
    ((Compute("a", "tpu"),), "unknown-device", 0, "a", "tpu"),
    ((Compute("a", "gpu"), Copy("a", "gpu", "moon")), "unknown-device", 1, "a", "moon"),
    ((Compute("a", "gpu"), Copy("a", "mars", "gpu")), "unknown-device", 1, "a", "mars"),
    ((Compute("a", "gpu"), Free("a", "tpu")), "unknown-device", 1, "a", "tpu"),
    ((Compute("a", "host"), Copy("a", "host", "gpu1")), "no-link", 1, "a", "host"),
    ((Compute("a", "gpu"), Copy("a", "gpu", "gpu")), "no-link", 1, "a", "gpu"),
    ((Compute("cpuonly", "gpu"),), "not-runnable", 0, "cpuonly", "gpu"),
    ((Compute("a", "gpu1"), Compute("cpuonly", "gpu1")), "not-runnable", 1, "cpuonly", "gpu1"),
    ((Compute("w", "gpu"), Compute("b", "gpu")), "not-resident", 1, "b", "gpu"),             # input missing
    ((Compute("a", "gpu"), Compute("w", "host"), Compute("b", "gpu")), "not-resident", 2, "b", "gpu"),
    ((Compute("a", "gpu"), Compute("w", "gpu"), Free("a", "gpu"), Compute("b", "gpu")),
     "not-resident", 3, "b", "gpu"),                                                           # use after free
    ((Copy("a", "gpu", "host"),), "not-resident", 0, "a", "gpu"),
    ((Compute("a", "gpu"), Free("a", "gpu"), Copy("a", "gpu", "host")), "not-resident", 2, "a", "gpu"),
    ((Compute("a", "gpu"), Free("a", "host")), "not-resident", 1, "a", "host"),
    ((Compute("a", "gpu"), Free("a", "gpu"), Free("a", "gpu")), "not-resident", 2, "a", "gpu"),
    ((Compute("a", "gpu"), Compute("a", "gpu")), "already-resident", 1, "a", "gpu"),
    ((Compute("a", "gpu"), Compute("a", "host"), Copy("a", "gpu", "host")), "already-resident", 2, "a", "host"),
    ((Compute("w", "gpu"), Free("w", "gpu"), Compute("w", "gpu")), "not-recomputable", 2, "w", "gpu"),
    ((Compute("w", "gpu"), Compute("w", "host")), "not-recomputable", 1, "w", "host"),
    ((Compute("a", "gpu"), Compute("r", "gpu"), Free("r", "gpu"), Compute("r", "gpu")),
     "not-recomputable", 3, "r", "gpu"),
])
def test_violations(ins, code, index, nd, dev):
    r = bad(g3(), cluster(gpu1=BIG), *ins, code=code, index=index, node=nd, device=dev)
    # the check stops at the fault: nothing after it is timed
    assert np.isnan(r.start[index:]).all()
    with pytest.raises(InvalidSchedule) as info:
        require_valid(r)
    assert info.value.violation is r.violation
    assert isinstance(info.value, OptschedError)
    assert f"instruction {index}" in str(info.value)


def test_param_computed_once_copied_elsewhere_is_fine():
    r = ok(g3(), cluster(), Compute("w", "gpu"), Copy("w", "gpu", "host"), Free("w", "gpu"),
           Copy("w", "host", "gpu"), Compute("a", "gpu"), Compute("b", "gpu"))
    assert r.recomputed == 0


def test_over_budget_with_bytes_over():
    g = graph(node("a", bytes=600), node("b", ["a"], bytes=500, required=True))
    r = bad(g, cluster(gpu=1000), Compute("a", "gpu"), Compute("b", "gpu"), Free("a", "gpu"),
            code="over-budget", index=1, node="b", device="gpu")
    assert r.violation.over == 100
    assert r.peak["gpu"] == 1100 and r.makespan == 2.0
    assert "100 B over" in r.violation.message


def test_missing_result_never_computed():
    g = graph(node("a", bytes=1), node("b", ["a"], bytes=1, required=True))
    r = bad(g, cluster(), Compute("a", "gpu"), code="missing-result", index=None, node="b", device=None)
    assert r.peak["gpu"] == 1 and r.makespan == 1.0


def test_missing_result_freed():
    g = graph(node("a", bytes=1), node("b", ["a"], bytes=1, required=True))
    bad(g, cluster(), Compute("a", "gpu"), Compute("b", "gpu"), Free("b", "gpu"), code="missing-result",
        index=None, node="b")


def test_required_result_on_any_device_is_enough():
    g = graph(node("a", bytes=1), node("b", ["a"], bytes=1, required=True))
    ok(g, cluster(), Compute("a", "gpu"), Compute("b", "gpu"), Copy("b", "gpu", "host"), Free("b", "gpu"))


def test_over_budget_is_reported_before_missing_result():
    g = graph(node("a", bytes=10), node("b", bytes=1, required=True))
    bad(g, cluster(gpu=5), Compute("a", "gpu"), code="over-budget", index=0, node="a", device="gpu")


def test_empty_schedule():
    g = graph(node("a", bytes=1))
    r = ok(g, cluster())
    assert r.makespan == 0.0 and r.peak == {"gpu": 0, "host": 0}
    g2 = graph(node("a", bytes=1, required=True))
    bad(g2, cluster(), code="missing-result", index=None, node="a")


# --- an operation's other outputs (Node.output_of) ------------------------------------------

def _two_outputs():
    """p's op also makes o (60 bytes, p's workspace while it runs); z runs between them."""
    return graph(node("x", cost=0.0, bytes=10, kind="input", recomputable=False),
                 node("p", ["x"], cost=1.0, bytes=100, workspace=60),
                 node("o", ["p", "x"], cost=0.0, bytes=60, recomputable=False, output_of="p"),
                 node("z", ["x"], cost=2.0, bytes=40))


def test_an_ops_other_output_is_counted_from_the_run_that_makes_it():
    g = _two_outputs()
    ins = (Compute("x", "gpu"), Compute("p", "gpu"), Compute("z", "gpu"), Compute("o", "gpu"))
    r = ok(g, cluster(), *ins)
    # p runs 0-1 with x, its output and the workspace (170); from 1 on o is held: z runs 1-3 beside
    # x + p + o + z = 210; o's own compute at 3 adds nothing
    assert r.peak["gpu"] == 210
    assert r.start[3] == r.end[3] == 3.0
    # computed right after p, the same peak: holding o until later costs the same memory
    assert ok(g, cluster(), ins[0], ins[1], ins[3], ins[2]).peak["gpu"] == 210
    # a budget that fits only if o appeared at its own compute is too small: z crosses it
    bad(g, cluster(gpu=209), *ins, code="over-budget", index=2, node="z", device="gpu")


def test_an_ops_other_output_is_made_where_that_op_ran_not_where_its_maker_was_copied():
    g = _two_outputs()
    r = bad(g, cluster(), Compute("x", "host"), Compute("p", "host"), Copy("p", "host", "gpu"),
            Copy("x", "host", "gpu"), Compute("o", "gpu"), code="not-made-here", index=4, node="o", device="gpu")
    assert "copied there, not computed" in describe(r.violation)
    # after a recomputation of p on the GPU, o is made by that run
    ok(g, cluster(), Compute("x", "host"), Compute("p", "host"), Copy("x", "host", "gpu"), Compute("p", "gpu"),
       Compute("o", "gpu"))


def test_a_freed_and_recomputed_maker_makes_its_output_from_the_latest_run():
    g = _two_outputs()
    r = ok(g, cluster(), Compute("x", "gpu"), Compute("p", "gpu"), Free("p", "gpu"), Compute("z", "gpu"),
           Compute("p", "gpu"), Compute("o", "gpu"))
    # z runs 1-3 without o (x + z = 50 after p's release; the first run's o is not the one handed over);
    # p again 3-4 with its workspace: x + z + p + 60 = 210, then o from 4
    assert r.peak["gpu"] == 210
    t, level = r.timeline["gpu"]
    assert level[t < 3.0].max() == 170
