"""Tiered storage under faults, with real brokers: a leader killed (kill -9) while it
copies, a store that stops answering, a corrupted object. Every acknowledged record
stays readable from offset 0, nothing uncopied leaves the disk, and no orphan object
outlives recovery."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.harness import BrokerCluster, BrokerProcess
from tests.storage.remote.test_tiered_broker import (
    consume_confluent,
    local_log_files,
    tier_args,
    wait_for,
)

confluent_kafka = pytest.importorskip("confluent_kafka")

SEGMENT = 64 * 1024


def create_topic(bootstrap: str, name: str, rf: int, **configs: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    config = {
        "remote.storage.enable": "true",
        "segment.bytes": str(SEGMENT),
        "local.retention.bytes": str(2 * SEGMENT),
        **configs,
    }
    admin.create_topics([NewTopic(name, 1, rf, config=config)])[name].result(30)


def kafka_bootstrap(cluster: BrokerCluster) -> str:
    return ",".join(n.kafka_bootstrap for n in cluster.nodes.values() if n.running)


def produce_acked(bootstrap: str, topic: str, count: int, start: int = 0) -> list[bytes]:
    """Produce ``count`` records with acks=all; the values acknowledged, in order."""
    acked: list[bytes] = []

    def on_ack(err, msg):
        if err is None:
            acked.append(msg.value())

    p = confluent_kafka.Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 5,
            "batch.size": 16384,
            "enable.idempotence": True,
            "message.timeout.ms": 60_000,
        }
    )
    for i in range(start, start + count):
        v = b"%08d" % i + b"y" * 92
        while True:
            try:
                p.produce(topic, v, partition=0, on_delivery=on_ack)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    p.flush(90)
    return acked


def orphans(root: Path) -> list[Path]:
    """Segment objects with no manifest: a copy that never finished (or its leftovers)."""
    out = []
    for log in root.rglob("*.log"):
        if not log.with_suffix(".manifest").exists():
            out.append(log)
    return out


def leader_of(cluster: BrokerCluster, topic: str) -> int:
    from logmq.client import Admin

    with Admin(cluster.bootstrap) as admin:
        return admin.describe_topics([topic])[topic].partitions[0].leader


def test_leader_killed_during_copies_loses_nothing_and_leaves_no_orphan(tmp_path):
    root = tmp_path / "remote"
    root.mkdir()
    # a slow copy (the copy throttle) so that the kill lands while segments are being
    # copied: COPY_STARTED committed, objects partly written
    args = tier_args(root, "remote.log.manager.copy.max.bytes.per.second=200000")
    with BrokerCluster(3, base_dir=tmp_path / "c", extra_args=args) as cluster:
        boot = kafka_bootstrap(cluster)
        topic = "tiered-kill"
        create_topic(boot, topic, 3, **{"min.insync.replicas": "2"})
        cluster.wait_for_topic(topic, 1)
        acked = produce_acked(boot, topic, 6_000)
        assert len(acked) == 6_000
        leader = leader_of(cluster, topic)
        wait_for(lambda: list(root.rglob("*.log")), what="a copy to start")
        cluster.nodes[leader].kill()  # kill -9 mid-copy
        boot = kafka_bootstrap(cluster)
        acked += produce_acked(boot, topic, 4_000, start=6_000)
        cluster.nodes[leader].start()
        # the new leader deletes the dead copier's orphan and copies on: every closed
        # segment ends up with a finished copy, and the local logs shrink everywhere
        got = settled_and_read(cluster, root, topic, len(acked))
        assert set(acked) <= set(got)
        assert len(got) == len(set(got)), "duplicates"
        assert got == sorted(got), "order"


def settled_and_read(cluster: BrokerCluster, root: Path, topic: str, count: int) -> list[bytes]:
    """Wait until every broker's copied segments have left its disk and no orphan object
    is left, then read the topic from offset 0 (read_committed)."""
    for node in cluster.nodes.values():
        wait_for(
            lambda n=node: len(local_log_files(n, topic)) <= 5,
            timeout=120,
            what=f"node {node.node_id}'s copied segments to go",
        )
    wait_for(lambda: not orphans(root), timeout=60, what="orphans to be deleted")
    return consume_confluent_from(kafka_bootstrap(cluster), topic, count)


def consume_confluent_from(bootstrap: str, topic: str, count: int) -> list[bytes]:
    broker = type("B", (), {"kafka_bootstrap": bootstrap})()
    return consume_confluent(broker, topic, count, "read_committed")  # type: ignore[arg-type]


def test_corrupted_remote_object_is_never_served(tmp_path):
    root = tmp_path / "remote"
    root.mkdir()
    broker = BrokerProcess(tmp_path / "data", extra_args=tier_args(root))
    with broker:
        topic = "tiered-corrupt"
        create_topic(broker.kafka_bootstrap, topic, 1)
        acked = produce_acked(broker.kafka_bootstrap, topic, 5_000)
        wait_for(lambda: local_log_files(broker, topic)[0] > 0, what="local segments to go")
        first = min(root.rglob("*.log"))  # the segment holding offset 0
        data = bytearray(first.read_bytes())
        data[len(data) // 2] ^= 0xFF
        first.write_bytes(bytes(data))
        c = confluent_kafka.Consumer(
            {
                "bootstrap.servers": broker.kafka_bootstrap,
                "group.id": "corrupt",
                "enable.auto.commit": False,
            }
        )
        c.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
        got: list[bytes] = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            got += [m.value() for m in c.consume(100, 0.5) if m.error() is None]
        c.close()
        assert got == [], "records of a corrupted object were served"
        wait_for(lambda: "is corrupt and is not served" in broker.log_tail(200),
                 what="the corruption to be logged")  # fmt: skip
        assert acked  # what is past the corrupted segment is still served
        c = confluent_kafka.Consumer(
            {"bootstrap.servers": broker.kafka_bootstrap, "group.id": "corrupt2"}
        )
        local_start = local_log_files(broker, topic)[0]
        c.assign([confluent_kafka.TopicPartition(topic, 0, local_start)])
        msgs = [m for m in c.consume(10, 10) if m.error() is None]
        c.close()
        assert msgs and msgs[0].offset() == local_start


def test_a_corrupt_object_is_copied_again_from_a_replica_that_still_has_it(tmp_path):
    """The leader no longer holds a segment whose object is corrupt; a follower that was
    down while the leader copied and deleted it locally still does. The leader's read
    refuses the object and marks it corrupt in the quorum; the follower, back, copies
    those offsets again from its own log, the leader deletes the bad copy, and every
    record is read from offset 0 again."""
    from logmq.client import Admin

    root = tmp_path / "remote"
    root.mkdir()
    with BrokerCluster(3, base_dir=tmp_path / "c", extra_args=tier_args(root)) as cluster:
        boot = kafka_bootstrap(cluster)
        topic = "tiered-recopy"
        # copying off at first: every replica keeps the whole log locally
        off = {"remote.log.copy.disable": "true", "local.retention.bytes": "-2"}
        create_topic(boot, topic, 3, **off)
        cluster.wait_for_topic(topic, 1)
        acked = produce_acked(boot, topic, 5_000)
        assert len(acked) == 5_000
        lead = leader_of(cluster, topic)
        keeper = next(n for n in sorted(cluster.nodes) if n != lead)
        cluster.nodes[keeper].kill()  # it holds every offset, and misses what follows
        boot = kafka_bootstrap(cluster)
        with Admin(cluster.bootstrap) as admin:  # the brokers alive
            admin.alter_configs(
                topic, {"remote.log.copy.disable": "false", "local.retention.bytes": "0"}
            )
        leader = cluster.nodes[lead]
        wait_for(lambda: local_log_files(leader, topic)[0] > 0, what="the leader's copies to go")
        first = min(root.rglob("*.log"))  # the object holding offset 0
        data = bytearray(first.read_bytes())
        data[len(data) // 2] ^= 0xFF
        first.write_bytes(bytes(data))
        c = confluent_kafka.Consumer(
            {"bootstrap.servers": boot, "group.id": "recopy", "enable.auto.commit": False}
        )
        c.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
        got = [m.value() for m in c.consume(100, 3) if m.error() is None]
        c.close()
        assert got == [], "records of a corrupted object were served"
        wait_for(lambda: "corrupt: a replica that holds" in leader.log_tail(400),
                 what="the leader to mark the segment corrupt")  # fmt: skip
        cluster.nodes[keeper].start()
        wait_for(lambda: "again from this replica" in cluster.nodes[keeper].log_tail(400),
                 timeout=60, what="the follower to copy the offsets again")  # fmt: skip
        wait_for(lambda: not first.exists(), timeout=60, what="the corrupt copy to be deleted")
        got = consume_confluent_from(kafka_bootstrap(cluster), topic, len(acked))
        assert got == acked


OUTAGE_S = 60  # the figure: a store stopped for a minute under produce


def s3_args(server, bucket: str, *extra: str) -> list[str]:
    from logmq.testing.s3 import ACCESS_KEY_ID, SECRET_ACCESS_KEY

    out: list[str] = []
    for kv in (
        "remote.log.storage.system.enable=true",
        "rsm.config.storage.backend.class=io.aiven.kafka.tieredstorage.storage.s3.S3Storage",
        f"rsm.config.storage.s3.bucket.name={bucket}",
        f"rsm.config.storage.s3.endpoint.url={server.endpoint_url}",
        "rsm.config.storage.s3.region=us-east-1",
        "rsm.config.storage.s3.path.style.access.enabled=true",
        f"rsm.config.storage.aws.access.key.id={ACCESS_KEY_ID}",
        f"rsm.config.storage.aws.secret.access.key={SECRET_ACCESS_KEY}",
        "rsm.config.storage.s3.api.call.timeout=3000",
        "remote.log.manager.task.interval.ms=100",
        *extra,
    ):
        out += ["--override", kv]
    return out


def test_store_stopped_for_a_minute_under_produce_loses_nothing(tmp_path):
    from logmq.testing.s3 import MotoS3Server, moto_server_command

    if moto_server_command() is None:
        pytest.skip("moto_server is not installed (pip install 'moto[server]')")
    import threading

    with MotoS3Server() as server:
        bucket = server.create_bucket("outage")
        broker = BrokerProcess(tmp_path / "data", extra_args=s3_args(server, bucket))
        with broker:
            topic = "tiered-outage"
            create_topic(broker.kafka_bootstrap, topic, 1)
            acked = produce_acked(broker.kafka_bootstrap, topic, 3_000)
            wait_for(lambda: local_log_files(broker, topic)[0] > 0, what="first copies")
            before = len(local_log_files(broker, topic))
            stop = threading.Event()
            during: list[bytes] = []

            def keep_producing() -> None:
                n = 3_000
                while not stop.is_set():
                    during.extend(produce_acked(broker.kafka_bootstrap, topic, 500, start=n))
                    n += 500

            server.pause()  # SIGSTOP: the store accepts connections and never answers
            worker = threading.Thread(target=keep_producing)
            worker.start()
            try:
                time.sleep(OUTAGE_S)  # the fault's duration, not a synchronisation
            finally:
                stop.set()
                worker.join(120)
                # uncopied segments stayed: nothing was deleted locally meanwhile
                kept = len(local_log_files(broker, topic))
                server.resume()
            assert during, "produce stopped while the store was down"
            assert kept > before + 3
            acked += during
            # copying catches up by itself and local retention lets the copies go
            wait_for(lambda: len(local_log_files(broker, topic)) <= 5, timeout=180,
                     what="copying to catch up")  # fmt: skip
            got = consume_confluent(broker, topic, len(acked), "read_committed")
            assert got == acked


def test_a_new_replica_copies_only_the_local_tail(tmp_path):
    """KIP-405's follower path: a replica added to a tiered partition (a reassignment
    onto an empty broker) is answered OFFSET_MOVED_TO_TIERED_STORAGE, starts at the
    leader's local log start with the leader epochs and producer state the remote tier
    holds there, and copies only the local tail; it can then lead, serving the whole
    partition from offset 0 through both tiers."""
    from logmq.client import Admin

    root = tmp_path / "remote"
    root.mkdir()
    with BrokerCluster(3, base_dir=tmp_path / "c", extra_args=tier_args(root)) as cluster:
        boot = kafka_bootstrap(cluster)
        topic = "tiered-move"
        create_topic(boot, topic, 1)
        cluster.wait_for_topic(topic, 1)
        first = leader_of(cluster, topic)
        other = next(n for n in cluster.nodes if n != first)
        acked = produce_acked(boot, topic, 10_000)
        one = cluster.nodes[first]
        wait_for(lambda: len(local_log_files(one, topic)) <= 4, what="copied segments to go")
        local_start = local_log_files(one, topic)[0]
        assert local_start > 0
        with Admin(cluster.bootstrap) as a:
            a.alter_partition_reassignments({(topic, 0): [other, first]})

            def moved() -> bool:
                p = a.describe_topics([topic])[topic].partitions[0]
                return list(p.replicas) == [other, first] and set(p.isr) == {first, other}

            wait_for(moved, timeout=60, what="the new replica to join the ISR")
        two = cluster.nodes[other]
        files = local_log_files(two, topic)
        # only the leader's local tail came over: the new replica starts where the
        # leader's local log does, not at 0
        assert files and files[0] >= local_start
        copied = sum(p.stat().st_size for p in (two.data_dir / f"{topic}-0").glob("*.log"))
        assert copied <= 6 * SEGMENT
        epochs = (two.data_dir / f"{topic}-0" / "leader-epoch-checkpoint").read_text()
        assert epochs.strip(), "the new replica has no leader epochs"
        # the new replica leads (preferred leader 2 after the move) or can: kill the
        # old one and read everything from 0 through the new
        one.kill()
        with Admin(two.bootstrap) as a:
            wait_for(
                lambda: a.describe_topics([topic])[topic].partitions[0].leader == other,
                timeout=60,
                what="the new replica to lead",
            )
        got = consume_confluent_from(two.kafka_bootstrap, topic, len(acked))
        assert got == acked


def test_every_broker_killed_at_once_while_copying(tmp_path):
    """kill -9 of the whole cluster in the middle of copies and local deletions: after
    the restart every acknowledged record is read from offset 0 across both tiers,
    copying resumes, and no orphan object is left."""
    root = tmp_path / "remote"
    root.mkdir()
    args = tier_args(root, "remote.log.manager.copy.max.bytes.per.second=400000")
    with BrokerCluster(3, base_dir=tmp_path / "c", extra_args=args) as cluster:
        boot = kafka_bootstrap(cluster)
        topic = "tiered-all-killed"
        create_topic(boot, topic, 3, **{"min.insync.replicas": "2"})
        cluster.wait_for_topic(topic, 1)
        acked = produce_acked(boot, topic, 8_000)
        assert len(acked) == 8_000
        wait_for(lambda: list(root.rglob("*.log")), what="copies to start")
        for node in cluster.nodes.values():
            node.kill()
        cluster.start()
        cluster.wait_for_topic(topic, 1)
        assert settled_and_read(cluster, root, topic, len(acked)) == acked


def test_a_stalled_store_does_not_hold_back_local_records_on_the_same_connection(tmp_path):
    """One consumer (one connection to the broker) reads a tiered partition from offset
    0 while the store is stopped, and an untiered one: the untiered records arrive as
    they are produced, though remote.fetch.max.wait.ms is 30 s and each fetch asks for
    both partitions; once the store is back the tiered records arrive too."""
    from logmq.testing.s3 import MotoS3Server, moto_server_command

    if moto_server_command() is None:
        pytest.skip("moto_server is not installed (pip install 'moto[server]')")
    with MotoS3Server() as server:
        bucket = server.create_bucket("stall")
        args = s3_args(server, bucket, "remote.fetch.max.wait.ms=30000")
        broker = BrokerProcess(tmp_path / "data", extra_args=args)
        with broker:
            tiered, local = "tiered-stall", "local-stall"
            create_topic(broker.kafka_bootstrap, tiered, 1)
            acked = produce_acked(broker.kafka_bootstrap, tiered, 3_000)
            wait_for(lambda: local_log_files(broker, tiered)[0] > 0, what="first copies")
            from confluent_kafka.admin import AdminClient, NewTopic

            admin = AdminClient({"bootstrap.servers": broker.kafka_bootstrap})
            admin.create_topics([NewTopic(local, 1, 1)])[local].result(30)
            first = produce_acked(broker.kafka_bootstrap, local, 100)
            c = confluent_kafka.Consumer(
                {
                    "bootstrap.servers": broker.kafka_bootstrap,
                    "group.id": "stall",
                    "enable.auto.commit": False,
                    "fetch.wait.max.ms": 100,
                }
            )
            got: dict[str, list[bytes]] = {tiered: [], local: []}

            def read_until(done, seconds: float) -> bool:
                deadline = time.monotonic() + seconds
                while time.monotonic() < deadline and not done():
                    for m in c.consume(500, 0.2):
                        if m.error() is None:
                            got[m.topic()].append(m.value())
                return done()

            server.pause()  # SIGSTOP: the store accepts connections and never answers
            try:
                c.assign(
                    [
                        confluent_kafka.TopicPartition(tiered, 0, 0),
                        confluent_kafka.TopicPartition(local, 0, 0),
                    ]
                )
                # well under the 30 s a fetch could wait for the store
                assert read_until(lambda: len(got[local]) == 100, 10), "local records held back"
                more = produce_acked(broker.kafka_bootstrap, local, 100, start=100)
                assert read_until(lambda: len(got[local]) == 200, 10), "new records held back"
                assert got[local] == first + more
                assert got[tiered] == []
            finally:
                server.resume()
            assert read_until(lambda: len(got[tiered]) >= len(acked), 120), "tiered not read"
            c.close()
            assert got[tiered][: len(acked)] == acked


def test_delete_records_below_the_local_start_survives_a_leader_kill(tmp_path):
    """DeleteRecords below the leader's local log start is kept by the followers too
    (they learn it from the log start in the leader's fetch answers): after a kill -9 of
    the leader, the new leader answers the same low watermark and never serves below it."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    root = tmp_path / "remote"
    root.mkdir()
    with BrokerCluster(3, base_dir=tmp_path / "c", extra_args=tier_args(root)) as cluster:
        boot = kafka_bootstrap(cluster)
        topic = "tiered-cut"
        create_topic(boot, topic, 3)
        cluster.wait_for_topic(topic, 1)
        acked = produce_acked(boot, topic, 6_000)
        lead = leader_of(cluster, topic)
        wait_for(lambda: local_log_files(cluster.nodes[lead], topic)[0] > 2_000,
                 what="the leader's copied segments to go")  # fmt: skip
        cut = 1_234  # below every replica's local log start, inside a remote segment
        admin = AdminClient({"bootstrap.servers": boot})
        (result,) = admin.delete_records([TopicPartition(topic, 0, cut)]).values()
        assert result.result(30).low_watermark == cut
        followers = [n for n in cluster.nodes if n != lead]
        for n in followers:
            floor = cluster.nodes[n].data_dir / f"{topic}-0" / "remote-log-start-offset"
            wait_for(lambda f=floor: f.exists() and int(f.read_text()) == cut,
                     what=f"broker {n} to learn the cut")  # fmt: skip
        cluster.nodes[lead].kill()
        boot = kafka_bootstrap(cluster)
        wait_for(lambda: leader_of(cluster, topic) not in (lead, -1), what="a new leader")

        def low() -> int:
            c = confluent_kafka.Consumer({"bootstrap.servers": boot, "group.id": "cut"})
            try:
                return c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[0]
            finally:
                c.close()

        assert wait_for(lambda: low() == cut, what="the new leader's low watermark")
        got = consume_confluent_from(boot, topic, len(acked) - cut)
        assert got == acked[cut:]


def test_an_unclean_election_never_serves_the_lost_records_from_the_tier(tmp_path):
    """Broker 2, a follower, is killed; broker 1 goes on alone, copying its segments to
    the tier; then 1 is killed and 2, back, is elected uncleanly with a shorter log. The
    copies of what the election lost are of another leader-epoch lineage: the new leader
    deletes them and copies its own log in their place, so a consumer from offset 0 reads
    the records 2 had and those produced to it since, never the lost ones (Kafka's
    isRemoteSegmentWithinLeaderEpochs)."""
    from logmq.client import Admin
    from logmq.client.admin import NewTopic

    root = tmp_path / "remote"
    root.mkdir()
    args = [*tier_args(root), "--replica-lag-time-max-ms", "2000"]
    with BrokerCluster(3, base_dir=tmp_path / "c", extra_args=args) as cluster:
        boot = kafka_bootstrap(cluster)
        topic = "tiered-unclean"
        config = {
            "remote.storage.enable": "true",
            "segment.bytes": str(SEGMENT),
            "local.retention.bytes": str(2 * SEGMENT),
            "unclean.leader.election.enable": "true",
        }
        with Admin(cluster.bootstrap) as admin:
            admin.create_topics([NewTopic(topic, configs=config, assignments=[[1, 2]])])
        cluster.wait_for_topic(topic, 1)
        wait_for(lambda: leader_of(cluster, topic) == 1, what="broker 1 to lead")
        kept = produce_acked(boot, topic, 2_000)
        assert len(kept) == 2_000
        cluster.nodes[2].kill()
        lost = produce_acked(boot, topic, 4_000, start=2_000)  # acked by 1 alone
        assert lost
        one, two = cluster.nodes[1], cluster.nodes[2]
        wait_for(lambda: local_log_files(one, topic)[0] > 2_000, timeout=90,
                 what="broker 1 to copy, and let go of, what broker 2 never had")  # fmt: skip
        one.kill()
        two.start()
        wait_for(lambda: leader_of(cluster, topic) == 2, timeout=90, what="an unclean election")
        boot = kafka_bootstrap(cluster)
        after = produce_acked(boot, topic, 4_000, start=10_000)
        assert len(after) == 4_000
        wait_for(lambda: local_log_files(two, topic)[0] > 2_000, timeout=120,
                 what="broker 2's own copies to let its segments go")  # fmt: skip
        got = consume_confluent_from(boot, topic, len(kept) + len(after))
        assert got == kept + after
        assert "leader-epoch lineage" in two.log_tail(3_000)
