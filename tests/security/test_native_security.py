"""TLS and SASL on the native listener: logmq's own clients, the CLI's environment
settings, and brokers replicating to each other over SASL_SSL."""

from __future__ import annotations

import asyncio

import pytest

from logmq.client import AsyncAdmin, AsyncConsumer, AsyncProducer
from logmq.client.admin import NewTopic
from logmq.client.security import ClientSecurity
from logmq.errors import ErrorCode, LogMQError
from logmq.testing.certs import make_ca, make_cert
from tests.harness import BrokerCluster, BrokerProcess

JAAS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    'username="broker" password="broker-secret" '
    'user_broker="broker-secret" user_alice="alice-secret";'
)


def secured_args(keystore: str, ca: str) -> list[str]:
    props = {
        "listener.security.protocol.map": "NATIVE:SASL_SSL,PLAINTEXT:PLAINTEXT",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": keystore,
        "ssl.truststore.location": ca,
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256",
        "sasl.mechanism.inter.broker.protocol": "PLAIN",
        "listener.name.native.plain.sasl.jaas.config": JAAS,
    }
    out: list[str] = []
    for key, value in props.items():
        out += ["--override", f"{key}={value}"]
    return out


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca = make_ca(d)
    return ca, make_cert(ca, d, "127.0.0.1")


def security(ca, user="alice", password="alice-secret") -> ClientSecurity:
    return ClientSecurity.from_properties(
        {
            "security.protocol": "SASL_SSL",
            "ssl.ca.location": str(ca.cert_path),
            "sasl.mechanism": "PLAIN",
            "sasl.username": user,
            "sasl.password": password,
        }
    )


def acl_broker_args(pki) -> list[str]:
    """A SASL_SSL native listener with Kafka's StandardAuthorizer: users broker (a
    super user), alice and bob."""
    ca, cert = pki
    jaas = (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        'username="broker" password="broker-secret" user_broker="broker-secret" '
        'user_alice="alice-secret" user_bob="bob-secret";'
    )
    authorizer = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    return [
        *secured_args(str(cert.keystore_path), str(ca.cert_path)),
        "--override", f"listener.name.native.plain.sasl.jaas.config={jaas}",
        "--override", f"authorizer.class.name={authorizer}",
        "--override", "super.users=User:broker",
    ]  # fmt: skip


async def round_trip(bootstrap: str, sec: ClientSecurity, topic: str, n: int = 50) -> list:
    async with AsyncAdmin(bootstrap, security=sec) as admin:
        await admin.create_topics([NewTopic(topic)])
    async with AsyncProducer(bootstrap, security=sec) as producer:
        for i in range(n):
            producer.send(topic, b"%d" % i)
        await producer.flush()
    got: list = []
    async with AsyncConsumer(bootstrap, security=sec, auto_offset_reset="earliest") as consumer:
        consumer.assign([(topic, 0)])
        while len(got) < n:
            batch = await asyncio.wait_for(consumer.poll(1.0), 20)
            got += [r.value for r in batch]
    return got


async def test_native_clients_over_sasl_ssl(pki, tmp_path):
    ca, cert = pki
    broker = BrokerProcess(
        tmp_path / "data",
        extra_args=secured_args(str(cert.keystore_path), str(ca.cert_path)),
    )
    broker.start()
    try:
        got = await round_trip(broker.bootstrap, security(ca), "native-secure")
        assert got == [b"%d" % i for i in range(50)]
        # a wrong password, and no login at all, are refused
        with pytest.raises(LogMQError):
            async with AsyncAdmin(
                broker.bootstrap, security=security(ca, password="guess")
            ) as admin:
                await admin.list_topics()
        plain_tls = ClientSecurity.from_properties(
            {"security.protocol": "SSL", "ssl.ca.location": str(ca.cert_path)}
        )
        with pytest.raises(LogMQError):
            async with AsyncAdmin(broker.bootstrap, security=plain_tls) as admin:
                await admin.list_topics()
        assert broker.running
    finally:
        broker.stop()


async def test_brokers_replicate_over_sasl_ssl(pki, tmp_path):
    ca, cert = pki
    cluster = BrokerCluster(
        3,
        base_dir=tmp_path / "cluster",
        log_level="warning",
        extra_args=secured_args(str(cert.keystore_path), str(ca.cert_path)),
    )
    cluster.start()
    try:
        sec = security(ca)
        async with AsyncAdmin(cluster.bootstrap, security=sec) as admin:
            await admin.create_topics([NewTopic("replicated", 1, 3)])
            async with AsyncProducer(cluster.bootstrap, security=sec, acks="all") as producer:
                for i in range(20):
                    producer.send("replicated", b"%d" % i)
                await producer.flush()

            async def in_sync() -> bool:
                (topic,) = (await admin.describe_topics(["replicated"])).values()
                return len(topic.partitions[0].isr) == 3

            for _ in range(100):
                if await in_sync():
                    break
                await asyncio.sleep(0.1)
            assert await in_sync(), "followers fetch from the leader over SASL_SSL"
    finally:
        cluster.close()


async def test_native_acls(pki, tmp_path):
    """The native door asks the same ACLs: alice may write one topic, bob nothing; only
    a broker's principal may act as a broker."""
    from logmq.security.acl import (
        AccessControlEntry,
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePattern,
        ResourceType,
    )

    ca, _ = pki
    broker = BrokerProcess(tmp_path / "data", extra_args=acl_broker_args(pki))
    broker.start()
    try:
        su = security(ca, "broker", "broker-secret")
        async with AsyncAdmin(broker.bootstrap, security=su) as admin:
            await admin.create_topics([NewTopic("alice-t")])
            await admin.create_acls(
                [
                    AclBinding(
                        ResourcePattern(ResourceType.TOPIC, "alice-t"),
                        AccessControlEntry(
                            "User:alice", "*", AclOperation.WRITE, AclPermissionType.ALLOW
                        ),
                    )
                ]
            )
        async with AsyncProducer(broker.bootstrap, security=security(ca)) as producer:
            await producer.send("alice-t", b"ok")
        bob = security(ca, "bob", "bob-secret")
        with pytest.raises(LogMQError, match="may not write to any topic"):
            async with AsyncProducer(broker.bootstrap, security=bob):
                pass  # an idempotent producer's InitProducerId (KIP-679)
        async with AsyncProducer(
            broker.bootstrap, security=bob, enable_idempotence=False, retries=0
        ) as producer:
            # bob may not describe it either: its metadata answers so, as Kafka's does
            with pytest.raises(LogMQError) as denied:
                await producer.send("alice-t", b"no")
            assert denied.value.code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
        async with AsyncAdmin(broker.bootstrap, security=bob) as admin:
            with pytest.raises(LogMQError, match="may not DESCRIBE cluster"):
                await admin.describe_acls()
            with pytest.raises(LogMQError):
                await admin.create_topics([NewTopic("bob-t")])
    finally:
        broker.stop()


async def test_native_transactions_under_acls(pki, tmp_path):
    """Transactions through the secured native door ask Kafka's ACLs: WRITE on the
    transactional id (InitProducerId, AddPartitionsToTxn, EndTxn...), WRITE on each
    topic added, READ on the group whose offsets join the transaction and on their
    topics."""
    from logmq.errors import (
        ErrorCode,
        TransactionalIdAuthorizationError,
    )
    from logmq.security.acl import (
        AccessControlEntry,
        AclBinding,
        AclOperation,
        AclPermissionType,
        PatternType,
        ResourcePattern,
        ResourceType,
    )

    ca, _ = pki
    args = acl_broker_args(pki)
    args += ["--transaction-state-partitions", "1", "--offsets-topic-partitions", "1"]

    def allow(rtype: ResourceType, name: str, op: AclOperation, user: str = "User:alice"):
        pattern = PatternType.PREFIXED if name.endswith("-") else PatternType.LITERAL
        return AclBinding(
            ResourcePattern(rtype, name, pattern),
            AccessControlEntry(user, "*", op, AclPermissionType.ALLOW),
        )

    broker = BrokerProcess(tmp_path / "data", extra_args=args)
    broker.start()
    try:
        su = security(ca, "broker", "broker-secret")
        async with AsyncAdmin(broker.bootstrap, security=su) as admin:
            await admin.create_topics([NewTopic("etl-out", 2), NewTopic("secret", 1)])
            await admin.create_acls(
                [
                    allow(ResourceType.TOPIC, "etl-out", AclOperation.WRITE),
                    allow(ResourceType.TOPIC, "etl-out", AclOperation.READ),
                    allow(ResourceType.TRANSACTIONAL_ID, "etl-", AclOperation.WRITE),
                    allow(ResourceType.GROUP, "etl-group", AclOperation.READ),
                    allow(ResourceType.TOPIC, "etl-out", AclOperation.WRITE, "User:bob"),
                ]
            )
        alice, bob = security(ca), security(ca, "bob", "bob-secret")

        async with AsyncProducer(broker.bootstrap, security=alice, transactional_id="etl-1") as p:
            await p.init_transactions()
            p.begin_transaction()
            p.send("etl-out", b"committed", partition=0)
            await p.send_offsets_to_transaction({("etl-out", 1): 7}, "etl-group")
            await p.commit_transaction()

            # a group she may not read: the transaction fails, aborting recovers it
            p.begin_transaction()
            p.send("etl-out", b"aborted", partition=1)
            with pytest.raises(LogMQError) as refused:
                await p.send_offsets_to_transaction({("etl-out", 1): 9}, "other-group")
            assert refused.value.code is ErrorCode.GROUP_AUTHORIZATION_FAILED
            await p.abort_transaction()

            # a topic she may not write: AddPartitionsToTxn refuses it
            p.begin_transaction()
            refused_send = p.send("secret", b"no", partition=0)
            with pytest.raises(LogMQError) as refused:
                await refused_send
            assert refused.value.code is ErrorCode.TOPIC_AUTHORIZATION_FAILED
            await p.abort_transaction()

        # an id outside her prefix, and bob on her id: InitProducerId refuses both
        for sec, tid in ((alice, "other-1"), (bob, "etl-1")):
            async with AsyncProducer(broker.bootstrap, security=sec, transactional_id=tid) as p:
                with pytest.raises(TransactionalIdAuthorizationError):
                    await p.init_transactions()

        async with AsyncConsumer(
            broker.bootstrap, security=su, auto_offset_reset="earliest",
            isolation_level="read_committed",
        ) as consumer:  # fmt: skip
            consumer.assign([("etl-out", 0), ("etl-out", 1)])
            seen: list[bytes] = []
            for _ in range(6):
                seen += [r.value for r in await consumer.poll(0.25)]
            assert seen == [b"committed"]
        async with AsyncAdmin(broker.bootstrap, security=su) as admin:
            offsets = await admin.group_offsets("etl-group")
            assert offsets[("etl-out", 1)].offset == 7
    finally:
        broker.stop()
