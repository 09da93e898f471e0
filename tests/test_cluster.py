"""The cluster IR: devices, links, `--mem` shorthand, structural checks."""

from __future__ import annotations

import math

import pytest

from optsched.cluster import (
    DEFAULT_PCIE_BANDWIDTH,
    DEFAULT_PCIE_LATENCY,
    Cluster,
    Device,
    Link,
    check_cluster,
    single_accelerator,
)
from optsched.errors import ClusterError


def test_link_time_is_latency_plus_bytes_over_bandwidth():
    lk = Link("a", "b", bandwidth=1e9, latency=5e-6)
    assert lk.time(0) == pytest.approx(5e-6)
    assert lk.time(2_000_000) == pytest.approx(5e-6 + 2e-3)


def test_single_accelerator_shape():
    c = single_accelerator(16 * 10**9)
    assert [(d.name, d.kind) for d in c.devices] == [("gpu0", "cuda"), ("host", "cpu")]
    assert c.device("gpu0").memory == 16 * 10**9
    assert [d.name for d in c.accelerators] == ["gpu0"]
    for src, dst in (("gpu0", "host"), ("host", "gpu0")):
        lk = c.link(src, dst)
        assert lk is not None
        assert lk.bandwidth == DEFAULT_PCIE_BANDWIDTH and lk.latency == DEFAULT_PCIE_LATENCY and lk.issue == 0.0
    assert len(c.links) == 2


def test_single_accelerator_several_gpus():
    c = single_accelerator(10**9, gpus=3, host_memory=5, bandwidth=1e10, latency=0.0, issue=6e-5)
    assert [d.name for d in c.accelerators] == ["gpu0", "gpu1", "gpu2"]
    assert c.device("host").memory == 5
    assert len(c.links) == 6
    assert c.link("gpu0", "gpu1") is None          # GPUs talk through the host only
    assert c.link("gpu2", "host").bandwidth == 1e10
    assert all(lk.issue == 6e-5 for lk in c.links)


def test_lookup_indexes():
    c = single_accelerator(10**9)
    assert c.device_index == {"gpu0": 0, "host": 1}
    assert c.link_index[("host", "gpu0")] == 1
    with pytest.raises(ClusterError, match="unknown device 'tpu'"):
        c.device("tpu")


def dev(name="g", kind="cuda", memory=10, speed=1.0):
    return Device(name, kind, memory, speed)


@pytest.mark.parametrize("cluster, field, match", [
    (Cluster(()), None, "at least one device"),
    (Cluster((dev(name=""),)), "name", "non-empty"),
    (Cluster((dev(), dev())), "name", "duplicate device"),
    (Cluster((dev(kind="tpu"),)), "kind", "unknown kind"),
    (Cluster((dev(memory=-1),)), "memory", "memory"),
    (Cluster((dev(memory=1.5),)), "memory", "memory"),
    (Cluster((dev(memory=True),)), "memory", "memory"),
    (Cluster((dev(speed=0),)), "speed", "speed"),
    (Cluster((dev(speed=-2.0),)), "speed", "speed"),
    (Cluster((dev(speed=math.nan),)), "speed", "speed"),
    (Cluster((dev(speed=math.inf),)), "speed", "speed"),
    (Cluster((dev("a"), dev("b")), (Link("a", "c", 1e9),)), "links", "unknown device 'c'"),
    (Cluster((dev("a"), dev("b")), (Link("a", "a", 1e9),)), "links", "itself"),
    (Cluster((dev("a"), dev("b")), (Link("a", "b", 1e9), Link("a", "b", 2e9))), "links", "duplicate link"),
    (Cluster((dev("a"), dev("b")), (Link("a", "b", 0.0),)), "bandwidth", "bandwidth"),
    (Cluster((dev("a"), dev("b")), (Link("a", "b", math.inf),)), "bandwidth", "bandwidth"),
    (Cluster((dev("a"), dev("b")), (Link("a", "b", 1e9, -1e-6),)), "latency", "latency"),
    (Cluster((dev("a"), dev("b")), (Link("a", "b", 1e9, math.nan),)), "latency", "latency"),
    (Cluster((dev("a"), dev("b")), (Link("a", "b", 1e9, 0.0, -1e-6),)), "issue", "issue"),
    (Cluster((dev("a"), dev("b")), (Link("a", "b", 1e9, 0.0, math.inf),)), "issue", "issue"),
])
def test_check_cluster_rejects(cluster, field, match):
    with pytest.raises(ClusterError, match=match) as info:
        check_cluster(cluster)
    assert info.value.field == field


def test_check_cluster_accepts_and_returns():
    c = Cluster((dev("a", memory=0), dev("b", kind="cpu", speed=0.5)), (Link("a", "b", 1.0), Link("b", "a", 1.0)))
    assert check_cluster(c) is c
