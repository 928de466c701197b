"""Consumer lag and under-replicated partitions on a real broker's ``/metrics``.

Both are computed when Prometheus scrapes, from state the broker already holds (the
metadata image's ISRs, the group coordinators' committed offsets, the logs' high
watermarks), so a scrape after a change shows it without anything on the hot path.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from logmq.client import Admin, Producer
from tests.harness import BrokerCluster, BrokerProcess, free_port

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def produce(bootstrap: str, topic: str, counts: dict[int, int]) -> None:
    with Producer(bootstrap, acks="all") as producer:
        futs = [
            producer.send(topic, b"v", partition=p) for p, n in counts.items() for _ in range(n)
        ]
        producer.flush()
        for f in futs:
            f.result(timeout=30)


def lag_of(samples: Samples, group: str) -> dict[str, dict]:
    out: dict[str, dict] = {"committed": {}, "lag": {}}
    for (name, labels), value in samples.items():
        d = dict(labels)
        if d.get("group") != group:
            continue
        if name == "logmq_consumer_group_committed_offset":
            out["committed"][(d["topic"], int(d["partition"]))] = value
        elif name == "logmq_consumer_group_lag":
            out["lag"][(d["topic"], int(d["partition"]))] = value
        elif name in ("logmq_consumer_group_lag_max", "logmq_consumer_group_lag_sum"):
            out[name.rsplit("_", 1)[1]] = value
    return out


def test_consumer_group_lag_per_partition_and_per_group(broker_factory):
    mport = free_port()
    broker: BrokerProcess = broker_factory(extra_args=["--metrics-port", str(mport)])
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("lagged", partitions=2)
        produce(broker.bootstrap, "lagged", {0: 10, 1: 4})
        admin.commit_group_offsets("billing", {("lagged", 0): 3, ("lagged", 1): 4})
        admin.commit_group_offsets("audit", {("lagged", 1): 1})
    assert lag_of(scrape(mport), "billing") == {
        "committed": {("lagged", 0): 3.0, ("lagged", 1): 4.0},
        "lag": {("lagged", 0): 7.0, ("lagged", 1): 0.0},
        "max": 7.0,
        "sum": 7.0,
    }
    produce(broker.bootstrap, "lagged", {1: 5})  # the next scrape sees it: no cache
    samples = scrape(mport)
    assert lag_of(samples, "billing")["lag"] == {("lagged", 0): 7.0, ("lagged", 1): 5.0}
    assert lag_of(samples, "billing")["sum"] == 12.0
    assert lag_of(samples, "audit") == {
        "committed": {("lagged", 1): 1.0},
        "lag": {("lagged", 1): 8.0},
        "max": 8.0,
        "sum": 8.0,
    }


def wait_for(condition: Callable[[], object], what: str, timeout: float = 60.0) -> object:
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"no {what} within {timeout}s"
        time.sleep(0.1)
    return value


def health(cluster: BrokerCluster, ports: dict[int, int]) -> dict[str, float]:
    """The three partition counts summed over the running brokers (each counts the
    partitions it leads)."""
    totals = dict.fromkeys(
        [
            "logmq_under_replicated_partitions",
            "logmq_under_min_isr_partitions",
            "logmq_at_min_isr_partitions",
        ],
        0.0,
    )
    for node_id, node in cluster.nodes.items():
        if node.running:
            samples = scrape(ports[node_id])
            for name in totals:
                totals[name] += samples[(name, ())]
    return {name.removeprefix("logmq_"): v for name, v in totals.items()}


def test_under_replicated_and_min_isr_partitions_in_a_cluster(tmp_path):
    cluster = BrokerCluster(3, base_dir=tmp_path, extra_args=["--replica-lag-time-max-ms", "2000"])
    ports = {}
    for node_id, node in cluster.nodes.items():
        ports[node_id] = free_port()
        node.extra_args += ["--metrics-port", str(ports[node_id])]
    with cluster:
        with Admin(cluster.bootstrap) as admin:
            admin.create_topic("two", 2, 3, {"min.insync.replicas": "2"})
            admin.create_topic("three", 1, 3, {"min.insync.replicas": "3"})
        cluster.wait_for_topic("two", 2)
        cluster.wait_for_topic("three", 1)
        produce(cluster.bootstrap, "two", {0: 1, 1: 1})  # every ISR complete (acks=all)
        assert health(cluster, ports) == {
            "under_replicated_partitions": 0.0,
            "under_min_isr_partitions": 0.0,
            "at_min_isr_partitions": 1.0,  # "three": ISR 3 == min.insync.replicas 3
        }

        assert cluster.nodes[3].stop() == 0  # its partitions' ISRs shrink to {1, 2}

        def shrunk() -> bool:
            with Admin(cluster.bootstrap) as admin:
                described = admin.describe_topics(["two", "three"])
            return all(
                p.leader in (1, 2) and 3 not in p.isr
                for d in described.values()
                for p in d.partitions
            )

        wait_for(shrunk, "ISR without broker 3")
        assert health(cluster, ports) == {
            "under_replicated_partitions": 3.0,
            "under_min_isr_partitions": 1.0,  # "three": ISR 2 < 3
            "at_min_isr_partitions": 2.0,  # "two": ISR 2 == 2
        }
        cluster.nodes[3].start()  # back in every ISR: all counts return to 0
        wait_for(
            lambda: health(cluster, ports)["under_replicated_partitions"] == 0,
            "ISRs complete again",
        )
