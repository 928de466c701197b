"""ACLs and SCRAM users through Kafka's APIs, with confluent-kafka and kafka-python.

One broker with the authorizer on (Kafka's StandardAuthorizer name), ``super.users``
and a SASL_PLAINTEXT listener offering PLAIN and SCRAM, its first admin made with
``--add-scram`` as ``kafka-storage format --add-scram`` does.
"""

from __future__ import annotations

import uuid

import pytest

from tests.harness import BrokerProcess, free_port

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import admin as kadmin  # noqa: E402

PLAIN_JAAS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    'user_alice="alice-secret" user_bob="bob-secret";'
)


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory):
    port = free_port()
    broker = BrokerProcess(tmp_path_factory.mktemp("acls") / "data")
    overrides = {
        "listeners": f"SASL_PLAINTEXT://127.0.0.1:{port}",
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": PLAIN_JAAS,
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:admin",
    }
    for key, value in overrides.items():
        broker.extra_args += ["--override", f"{key}={value}"]
    broker.extra_args += ["--add-scram", "SCRAM-SHA-512=[name=admin,password=admin-secret]"]
    broker.kafka_port = port
    broker.start()
    yield broker
    broker.stop()


def conf(broker, user: str, password: str, mechanism: str = "PLAIN", **extra) -> dict:
    return {
        "bootstrap.servers": broker.kafka_bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": mechanism,
        "sasl.username": user,
        "sasl.password": password,
        **extra,
    }


def admin_conf(broker) -> dict:
    return conf(broker, "admin", "admin-secret", "SCRAM-SHA-512")


def _acl(principal: str, op, resource_type, name: str, pattern=None):
    return kadmin.AclBinding(
        resource_type,
        name,
        pattern or kadmin.ResourcePatternType.LITERAL,
        principal,
        "*",
        op,
        kadmin.AclPermissionType.ALLOW,
    )


def _create_acls(broker, *bindings) -> None:
    admin = kadmin.AdminClient(admin_conf(broker))
    for f in admin.create_acls(list(bindings), request_timeout=30).values():
        assert f.result(timeout=30) is None


def kafka_python_admin(broker, user: str, password: str, mechanism: str = "PLAIN"):
    from kafka import KafkaAdminClient

    return KafkaAdminClient(
        bootstrap_servers=broker.kafka_bootstrap,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism=mechanism,
        sasl_plain_username=user,
        sasl_plain_password=password,
    )


def alice_reading(broker, topic: str, group: str):
    """A consumer of ``group`` as alice, who may READ ``topic`` and ``group``."""
    _create_acls(
        broker,
        _acl("User:alice", kadmin.AclOperation.READ, kadmin.ResourceType.TOPIC, topic),
        _acl("User:alice", kadmin.AclOperation.READ, kadmin.ResourceType.GROUP, group),
    )
    return confluent_kafka.Consumer({**conf(broker, "alice", "alice-secret"), "group.id": group})


def _topic(broker, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    admin = kadmin.AdminClient(admin_conf(broker))
    admin.create_topics([kadmin.NewTopic(name, 1, 1)])[name].result(timeout=30)
    return name


def _delivery_errors(producer_conf: dict, topic: str, n: int = 5) -> list:
    errors: list = []
    producer = confluent_kafka.Producer(
        {**producer_conf, "message.timeout.ms": 10_000, "enable.idempotence": False}
    )
    for i in range(n):
        producer.produce(topic, b"%d" % i, on_delivery=lambda err, msg: errors.append(err))
    producer.flush(30)
    return errors


def test_the_bootstrap_scram_admin_is_a_super_user(acl_broker):
    md = kadmin.AdminClient(admin_conf(acl_broker)).list_topics(timeout=10)
    assert md.brokers


def test_acls_allow_and_deny_produce_and_consume(acl_broker):
    topic = _topic(acl_broker, "acl")
    group = f"g-{topic}"
    _create_acls(
        acl_broker,
        _acl("User:alice", kadmin.AclOperation.WRITE, kadmin.ResourceType.TOPIC, topic),
        _acl("User:alice", kadmin.AclOperation.READ, kadmin.ResourceType.TOPIC, topic),
        _acl("User:alice", kadmin.AclOperation.READ, kadmin.ResourceType.GROUP, group),
    )
    alice = conf(acl_broker, "alice", "alice-secret")
    bob = conf(acl_broker, "bob", "bob-secret")
    assert _delivery_errors(alice, topic) == [None] * 5
    denied = _delivery_errors(bob, topic)
    assert denied and all(
        e is not None and e.code() == confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED
        for e in denied
    )
    # bob does not even see the topic
    assert topic not in kadmin.AdminClient(bob).list_topics(timeout=10).topics
    assert topic in kadmin.AdminClient(alice).list_topics(timeout=10).topics
    consumer = confluent_kafka.Consumer(
        {**alice, "group.id": group, "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    got = []
    try:
        for _ in range(200):
            if len(got) == 5:
                break
            msg = consumer.poll(0.2)
            if msg is not None:
                assert msg.error() is None, msg.error()
                got.append(msg.value())
    finally:
        consumer.close()
    assert sorted(got) == [b"%d" % i for i in range(5)]


def test_a_group_without_an_acl_is_refused(acl_broker):
    topic = _topic(acl_broker, "acl-group")
    _create_acls(
        acl_broker,
        _acl("User:bob", kadmin.AclOperation.READ, kadmin.ResourceType.TOPIC, topic),
    )
    errors: list = []
    consumer = confluent_kafka.Consumer(
        {
            **conf(acl_broker, "bob", "bob-secret"),
            "group.id": f"nope-{topic}",
            "error_cb": errors.append,
        }
    )
    consumer.subscribe([topic])
    seen = None
    try:
        for _ in range(100):
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is not None:
                seen = msg.error()
                break
            if errors:
                seen = errors[0]
                break
    finally:
        consumer.close()
    assert seen is not None
    assert seen.code() == confluent_kafka.KafkaError.GROUP_AUTHORIZATION_FAILED


def test_topic_creation_needs_create(acl_broker):
    bob = kadmin.AdminClient(conf(acl_broker, "bob", "bob-secret"))
    name = f"bob-{uuid.uuid4().hex[:8]}"
    with pytest.raises(confluent_kafka.KafkaException) as e:
        bob.create_topics([kadmin.NewTopic(name, 1, 1)])[name].result(timeout=30)
    assert e.value.args[0].code() == confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED
    _create_acls(
        acl_broker,
        _acl(
            "User:bob",
            kadmin.AclOperation.CREATE,
            kadmin.ResourceType.TOPIC,
            "bob-",
            kadmin.ResourcePatternType.PREFIXED,
        ),
    )
    bob.create_topics([kadmin.NewTopic(name, 1, 1)])[name].result(timeout=30)


def test_acl_admin_describe_and_delete(acl_broker):
    topic = f"adm-{uuid.uuid4().hex[:8]}"
    binding = _acl("User:carol", kadmin.AclOperation.READ, kadmin.ResourceType.TOPIC, topic)
    _create_acls(acl_broker, binding)
    admin = kadmin.AdminClient(admin_conf(acl_broker))
    flt = kadmin.AclBindingFilter(
        kadmin.ResourceType.TOPIC,
        topic,
        kadmin.ResourcePatternType.ANY,
        None,
        None,
        kadmin.AclOperation.ANY,
        kadmin.AclPermissionType.ANY,
    )
    assert admin.describe_acls(flt, request_timeout=30).result(timeout=30) == [binding]
    (deleted,) = admin.delete_acls([flt], request_timeout=30).values()
    assert deleted.result(timeout=30) == [binding]
    assert admin.describe_acls(flt, request_timeout=30).result(timeout=30) == []
    # and only a super user (or ALTER on the cluster) may
    alice = kadmin.AdminClient(conf(acl_broker, "alice", "alice-secret"))
    (refused,) = alice.create_acls([binding], request_timeout=30).values()
    with pytest.raises(confluent_kafka.KafkaException) as e:
        refused.result(timeout=30)
    assert e.value.args[0].code() == confluent_kafka.KafkaError.CLUSTER_AUTHORIZATION_FAILED


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_users_made_through_the_admin_api_log_in(acl_broker, mechanism):
    user = f"dave{mechanism[-3:]}"
    admin = kadmin.AdminClient(admin_conf(acl_broker))
    kind = getattr(kadmin.ScramMechanism, mechanism.replace("-", "_"))
    upsert = kadmin.UserScramCredentialUpsertion(
        user, kadmin.ScramCredentialInfo(kind, 4096), b"dave-secret"
    )
    for f in admin.alter_user_scram_credentials([upsert]).values():
        assert f.result(timeout=30) is None
    described = admin.describe_user_scram_credentials([user])[user].result(timeout=30)
    (info,) = described.scram_credential_infos
    assert (info.mechanism, info.iterations) == (kind, 4096)
    # dave logs in (the topic list is empty for him: no ACL lets him describe any)
    md = kadmin.AdminClient(conf(acl_broker, user, "dave-secret", mechanism)).list_topics(
        timeout=10
    )
    assert md.brokers
    errors: list = []
    wrong = confluent_kafka.Producer(
        {**conf(acl_broker, user, "guess", mechanism), "error_cb": errors.append}
    )
    for _ in range(100):
        if errors:
            break
        wrong.poll(0.1)
    assert errors and errors[0].code() == confluent_kafka.KafkaError._AUTHENTICATION
    deletion = kadmin.UserScramCredentialDeletion(user, kind)
    for f in admin.alter_user_scram_credentials([deletion]).values():
        assert f.result(timeout=30) is None


def test_kafka_python_acl_admin(acl_broker):
    from kafka.admin import (
        ACL,
        ACLFilter,
        ACLOperation,
        ACLPermissionType,
        ACLResourcePatternType,
        ResourcePattern,
        ResourcePatternFilter,
        ResourceType,
    )
    from kafka.errors import ClusterAuthorizationFailedError

    admin = kafka_python_admin(acl_broker, "admin", "admin-secret", "SCRAM-SHA-512")
    try:
        topic = f"kp-{uuid.uuid4().hex[:8]}"
        acl = ACL(
            principal="User:erin",
            host="*",
            operation=ACLOperation.READ,
            permission_type=ACLPermissionType.ALLOW,
            resource_pattern=ResourcePattern(ResourceType.TOPIC, topic),
        )
        result = admin.create_acls([acl])
        assert result["failed"] == []
        flt = ACLFilter(
            principal=None,
            host="*",
            operation=ACLOperation.ANY,
            permission_type=ACLPermissionType.ANY,
            resource_pattern=ResourcePatternFilter(
                ResourceType.TOPIC, topic, ACLResourcePatternType.ANY
            ),
        )
        acls, _ = admin.describe_acls(flt)
        assert [a.principal for a in acls] == ["User:erin"]
        deleted = admin.delete_acls([flt])
        assert len(deleted[0][1]) == 1
    finally:
        admin.close()
    alice = kafka_python_admin(acl_broker, "alice", "alice-secret", "PLAIN")
    try:
        with pytest.raises(ClusterAuthorizationFailedError):
            alice.describe_acls(flt)
    finally:
        alice.close()


def test_list_groups_shows_only_the_groups_a_principal_may_describe(acl_broker):
    topic = _topic(acl_broker, "lg")
    group = f"lg-{topic}"
    consumer = alice_reading(acl_broker, topic, group)
    consumer.subscribe([topic])
    for _ in range(50):
        consumer.poll(0.1)
        if consumer.assignment():
            break
    try:

        def listed(user: str, password: str, mechanism: str = "PLAIN") -> set[str]:
            admin = kadmin.AdminClient(conf(acl_broker, user, password, mechanism))
            result = admin.list_consumer_groups(request_timeout=10).result(timeout=30)
            return {g.group_id for g in result.valid}

        assert group in listed("alice", "alice-secret")  # READ implies DESCRIBE
        assert group not in listed("bob", "bob-secret")
        assert group in listed("admin", "admin-secret", "SCRAM-SHA-512")  # a super user
    finally:
        consumer.close()


def test_delete_groups_answers_each_group_on_its_own(acl_broker):
    """DeleteGroups names two groups: the one the principal may delete is tried (it does
    not exist), the other is GROUP_AUTHORIZATION_FAILED, each in its own entry."""

    allowed, other = f"mine-{uuid.uuid4().hex[:6]}", f"theirs-{uuid.uuid4().hex[:6]}"
    _create_acls(
        acl_broker,
        _acl("User:alice", kadmin.AclOperation.DELETE, kadmin.ResourceType.GROUP, allowed),
    )
    admin = kafka_python_admin(acl_broker, "alice", "alice-secret", "PLAIN")
    try:
        results = dict(admin.delete_groups([allowed, other], group_coordinator_id=1))
    finally:
        admin.close()
    assert results[other] == "GroupAuthorizationFailedError"
    assert results[allowed] == "GroupIdNotFoundError"


def test_offset_fetch_answers_per_topic(acl_broker):
    """OffsetFetch (librdkafka's committed(), v8+): a topic the principal may not
    describe is answered TOPIC_AUTHORIZATION_FAILED per partition, beside the others."""
    topic = _topic(acl_broker, "of")
    hidden = _topic(acl_broker, "of-hidden")
    group = f"of-{topic}"
    consumer = alice_reading(acl_broker, topic, group)
    try:
        tps = [confluent_kafka.TopicPartition(topic, 0), confluent_kafka.TopicPartition(hidden, 0)]
        got = {tp.topic: tp for tp in consumer.committed(tps, timeout=10)}
        assert got[topic].error is None
        assert got[hidden].error.code() == confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED
    finally:
        consumer.close()
