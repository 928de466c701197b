"""No listing leaks a name, on either door: a principal sees the topics and groups it
may DESCRIBE, through the native door (logmq's client and CLI) and the Kafka door
(confluent-kafka) alike, as Kafka lists them.

The broker lets anonymous clients in on both doors (a PLAINTEXT Kafka listener, and the
native listener mapped to PLAINTEXT), with one ACL: DESCRIBE on the topic ``visible``
and on the group ``g-visible``. Before, the native door's topic list showed every
topic and its ListGroups refused the request outright.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from logmq.client import AsyncAdmin
from logmq.client.cluster import ClusterClient
from logmq.errors import ErrorCode
from logmq.net.codec import ApiKey
from tests.harness import BrokerProcess, free_port

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import admin as kadmin  # noqa: E402

JAAS = 'org.apache.kafka.common.security.plain.PlainLoginModule required user_admin="admin-secret";'
TOPICS = ("visible", "hidden-1", "hidden-2")
GROUPS = ("g-visible", "g-hidden")


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess(tmp_path_factory.mktemp("listings") / "data")
    b.sasl_port = free_port()
    props = {
        "listeners": f"PLAINTEXT://127.0.0.1:{b.kafka_port},SASL_PLAINTEXT://127.0.0.1:{b.sasl_port}",
        "listener.security.protocol.map": "NATIVE:PLAINTEXT",  # anonymous there too
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:admin",
    }
    for key, value in props.items():
        b.extra_args += ["--override", f"{key}={value}"]
    b.extra_args += ["--offsets-topic-partitions", "1"]
    b.start()
    try:
        setup(b)
        yield b
    finally:
        b.stop()


def admin_conf(b) -> dict:
    return {
        "bootstrap.servers": f"127.0.0.1:{b.sasl_port}",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "admin",
        "sasl.password": "admin-secret",
    }


def setup(b) -> None:
    """Three topics with records, two groups with offsets on every topic, one ACL each."""
    admin = kadmin.AdminClient(admin_conf(b))
    for f in admin.create_topics([kadmin.NewTopic(t, 1, 1) for t in TOPICS]).values():
        f.result(timeout=30)
    producer = confluent_kafka.Producer(admin_conf(b))
    for topic in TOPICS:
        for i in range(5):
            producer.produce(topic, b"%d" % i)
    assert producer.flush(30) == 0
    for group in GROUPS:
        offsets = [confluent_kafka.TopicPartition(t, 0, 3) for t in TOPICS]
        request = [confluent_kafka.ConsumerGroupTopicPartitions(group, offsets)]
        for f in admin.alter_consumer_group_offsets(request).values():
            f.result(timeout=30)
    acls = [
        kadmin.AclBinding(
            rtype, name, kadmin.ResourcePatternType.LITERAL, "User:ANONYMOUS", "*", op,
            kadmin.AclPermissionType.ALLOW,
        )
        for rtype, name, op in (
            (kadmin.ResourceType.TOPIC, "visible", kadmin.AclOperation.DESCRIBE),
            (kadmin.ResourceType.TOPIC, "visible", kadmin.AclOperation.DESCRIBE_CONFIGS),
            (kadmin.ResourceType.GROUP, "g-visible", kadmin.AclOperation.DESCRIBE),
        )
    ]  # fmt: skip
    for f in admin.create_acls(acls).values():
        assert f.result(timeout=30) is None


def logmq(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOGMQ_")}
    return subprocess.run(
        [sys.executable, "-m", "logmq_cli.main", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def kafka_admin(b) -> kadmin.AdminClient:
    return kadmin.AdminClient({"bootstrap.servers": b.kafka_bootstrap})


def test_topic_listings_show_the_same_single_topic_on_both_doors(broker):
    kafka = kafka_admin(broker).list_topics(timeout=30).topics
    assert sorted(t for t in kafka if not t.startswith("__")) == ["visible"]
    cli = logmq("topic", "list", "--json", "-b", broker.bootstrap)
    assert cli.returncode == 0, cli.stderr
    assert [t["topic"] for t in json.loads(cli.stdout)] == ["visible"]
    internal = logmq("topic", "list", "--json", "--internal", "-b", broker.bootstrap)
    # __consumer_offsets is hidden too
    assert [t["topic"] for t in json.loads(internal.stdout)] == ["visible"]


async def test_a_named_topic_it_may_not_describe_answers_alone_on_both_doors(broker):
    cluster = ClusterClient(broker.bootstrap)
    try:
        body = {"topics": ["visible", "hidden-1", "no-such-topic"], "allow_auto_create": False}
        answer = (await cluster.request_any(ApiKey.METADATA, body)).body
    finally:
        await cluster.close()
    codes = {t["topic"]: ErrorCode(t["error"]) for t in answer["topics"]}
    denied = ErrorCode.TOPIC_AUTHORIZATION_FAILED
    # a hidden topic and a missing one answer alike: the name tells nothing
    assert codes == {"visible": ErrorCode.NONE, "hidden-1": denied, "no-such-topic": denied}
    md = kafka_admin(broker).list_topics("hidden-1", timeout=30).topics["hidden-1"]
    assert (
        md.error is not None
        and md.error.code() == confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED
    )


async def test_describe_configs_of_many_topics_answers_each_on_both_doors(broker):
    cluster = ClusterClient(broker.bootstrap)
    try:
        body = {
            "resources": [{"type": "topic", "name": t} for t in ("visible", "hidden-1", "nope")]
        }
        answer = (await cluster.request_any(ApiKey.DESCRIBE_CONFIGS, body)).body
    finally:
        await cluster.close()
    codes = {r["name"]: ErrorCode(r["error"]) for r in answer["resources"]}
    denied = ErrorCode.TOPIC_AUTHORIZATION_FAILED
    assert codes == {"visible": ErrorCode.NONE, "hidden-1": denied, "nope": denied}
    visible = next(r for r in answer["resources"] if r["name"] == "visible")
    assert visible["configs"]
    resources = [
        kadmin.ConfigResource(kadmin.ResourceType.TOPIC, t) for t in ("visible", "hidden-1")
    ]
    kafka = kafka_admin(broker)  # kept: futures fail once their client is collected
    futures = kafka.describe_configs(resources)
    by_name = {r.name: f for r, f in futures.items()}
    assert by_name["visible"].result(timeout=30)  # its configs, despite its neighbour
    with pytest.raises(confluent_kafka.KafkaException) as e:
        by_name["hidden-1"].result(timeout=30)
    assert e.value.args[0].code() == confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_group_listings_show_the_same_single_group_on_both_doors(broker):
    kafka = kafka_admin(broker)
    listed = kafka.list_consumer_groups().result(timeout=30)
    assert sorted(g.group_id for g in listed.valid) == ["g-visible"]
    cli = logmq("group", "list", "--json", "-b", broker.bootstrap)
    assert cli.returncode == 0, cli.stderr
    assert [g["group_id"] for g in json.loads(cli.stdout)] == ["g-visible"]


async def test_a_groups_offsets_show_only_topics_it_may_describe_on_both_doors(broker):
    async with AsyncAdmin(broker.bootstrap) as admin:
        offsets = await admin.group_offsets("g-visible")
    assert sorted(offsets) == [("visible", 0)]
    request = [confluent_kafka.ConsumerGroupTopicPartitions("g-visible")]
    kafka = kafka_admin(broker)
    (future,) = kafka.list_consumer_group_offsets(request).values()
    got = future.result(timeout=30)
    assert [(tp.topic, tp.partition, tp.offset) for tp in got.topic_partitions] == [
        ("visible", 0, 3)
    ]


async def test_a_group_it_may_not_describe_answers_alone_on_the_native_door(broker):
    cluster = ClusterClient(broker.bootstrap)
    try:
        body = {"group_ids": ["g-visible", "g-hidden"]}
        answer = (await cluster.request_any(ApiKey.CONSUMER_GROUP_DESCRIBE, body)).body
    finally:
        await cluster.close()
    codes = {g["group_id"]: ErrorCode(g["error"]) for g in answer["groups"]}
    assert codes["g-hidden"] == ErrorCode.GROUP_AUTHORIZATION_FAILED
    assert codes["g-visible"] != ErrorCode.GROUP_AUTHORIZATION_FAILED
