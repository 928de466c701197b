"""Every ACL, SCRAM-credential and client-quota change is audited once, by the
controller once committed, naming the client that asked, whichever door and broker
it came through.

Two brokers with SASL on both doors and the authorizer on: ``ops`` uses logmq's native
Admin, ``admin`` Kafka's clients (confluent-kafka, and kafka-python for client quotas,
which confluent-kafka has no API for); the brokers log in as ``broker``. Changes sent to
the broker that is not the controller arrive there forwarded by that broker, yet the
audit line must name the client, not ``User:broker``.
"""

from __future__ import annotations

import asyncio
import re
import time

import pytest

from logmq.client import AsyncAdmin
from logmq.client.security import ClientSecurity
from logmq.client.security_admin import QuotaAlteration
from logmq.net.codec import ApiKey
from logmq.security.acl import (
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)
from logmq.security.bodies import binding_body, filter_body, scram_upsertion_body
from logmq.security.scram import ScramCredential
from tests.harness import BrokerCluster, free_port

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import admin as kadmin  # noqa: E402

NATIVE_JAAS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    'username="broker" password="broker-secret" '
    'user_broker="broker-secret" user_ops="ops-secret";'
)
KAFKA_JAAS = (
    'org.apache.kafka.common.security.plain.PlainLoginModule required user_admin="admin-secret";'
)
DEADLINE_S = 20.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = BrokerCluster(2, base_dir=tmp_path_factory.mktemp("audit"))
    common = {
        "listener.security.protocol.map": "NATIVE:SASL_PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": "PLAIN",
        "sasl.mechanism.inter.broker.protocol": "PLAIN",
        "listener.name.native.plain.sasl.jaas.config": NATIVE_JAAS,
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": KAFKA_JAAS,
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:broker;User:ops;User:admin",
    }
    for node in c.nodes.values():
        port = free_port()
        for key, value in {**common, "listeners": f"SASL_PLAINTEXT://127.0.0.1:{port}"}.items():
            node.extra_args += ["--override", f"{key}={value}"]
        node.kafka_port = port
    c.start()
    try:
        yield c
    finally:
        c.close()


OPS = ClientSecurity.from_properties(
    {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "ops",
        "sasl.password": "ops-secret",
    }
)


def kafka_conf(node) -> dict:
    return {
        "bootstrap.servers": node.kafka_bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "admin",
        "sasl.password": "admin-secret",
    }


def binding(topic: str, principal: str) -> AclBinding:
    return AclBinding(
        ResourcePattern(ResourceType.TOPIC, topic, PatternType.LITERAL),
        AccessControlEntry(principal, "*", AclOperation.READ, AclPermissionType.ALLOW),
    )


def audited(cluster: BrokerCluster, what: str) -> dict[int, list[str]]:
    """node -> its audit lines that say ``what``."""
    out = {}
    for i, node in cluster.nodes.items():
        text = node.log_path.read_text(errors="replace")
        out[i] = [line for line in text.splitlines() if what in line]
    return out


def assert_audited_once(cluster, controller: int, what: str, by: str, listener: str) -> None:
    """``what`` is in the controller's log once, by ``by`` from a client address on
    ``listener``, and in no other broker's (the controller writes it before it answers,
    so it is there once the change is answered)."""
    lines = audited(cluster, what)
    assert [len(v) for i, v in sorted(lines.items())] == [
        int(i == controller) for i in sorted(lines)
    ], (what, lines)
    (line,) = lines[controller]
    assert re.search(rf"{re.escape(what)} by {by} from 127\.0\.0\.1:\d+ on {listener}$", line), line


async def controller_of(cluster: BrokerCluster) -> int:
    async with AsyncAdmin(cluster.bootstrap, security=OPS) as admin:
        deadline = time.monotonic() + DEADLINE_S
        while (controller := (await admin.describe_cluster()).get("controller_id", -1)) < 0:
            assert time.monotonic() < deadline, "no controller"
            await asyncio.sleep(0.1)
    return controller


async def test_native_changes_are_audited_once_with_the_clients_principal(cluster):
    controller = await controller_of(cluster)
    other = next(i for i in cluster.nodes if i != controller)
    async with AsyncAdmin(cluster.bootstrap, security=OPS) as admin:
        # the Admin sends changes to the controller: its own connection is the client's
        await admin.create_acls([binding("audit-n", "User:reader")])
        await admin.delete_acls([AclBindingFilter(principal="User:reader")])
        await admin.upsert_scram_user("n-user", "n-secret", "SCRAM-SHA-256")
        await admin.delete_scram_user("n-user", "SCRAM-SHA-256")
        await admin.alter_client_quotas(
            [QuotaAlteration({"user": "n-user"}, {"producer_byte_rate": 1024})]
        )
        # the same changes through the other broker, which forwards them

        async def through_other(api_key: int, body: dict, key: str = "results") -> None:
            answer = (await admin._cluster.request_node(other, api_key, body)).body
            assert [e["error"] for e in answer[key]] == [0], answer

        f_acl = binding_body(binding("audit-f", "User:f"))
        await through_other(ApiKey.CREATE_ACLS, {"creations": [f_acl]})
        f_filter = filter_body(AclBindingFilter(principal="User:f"))
        await through_other(ApiKey.DELETE_ACLS, {"filters": [f_filter]})
        cred = ScramCredential.from_password("SCRAM-SHA-512", "f-secret", 4096)
        upsert = scram_upsertion_body("f-user", cred)
        await through_other(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, {"upsertions": [upsert]})
        entry = {
            "entity": [{"type": "client-id", "name": "f-app"}],
            "ops": [{"key": "request_percentage", "value": 12.5}],
        }
        await through_other(ApiKey.ALTER_CLIENT_QUOTAS, {"entries": [entry]}, "entries")
    for what in (
        "ACL created: ALLOW User:reader from * READ TOPIC:LITERAL:audit-n",
        "ACL deleted: ALLOW User:reader from * READ TOPIC:LITERAL:audit-n",
        "SCRAM-SHA-256 credential of User:n-user set",
        "SCRAM-SHA-256 credential of User:n-user deleted",
        "client quotas of user=n-user changed: producer_byte_rate=1024",
        "ACL created: ALLOW User:f from * READ TOPIC:LITERAL:audit-f",
        "ACL deleted: ALLOW User:f from * READ TOPIC:LITERAL:audit-f",
        "SCRAM-SHA-512 credential of User:f-user set",
        "client quotas of client-id=f-app changed: request_percentage=12.5",
    ):
        assert_audited_once(cluster, controller, what, "User:ops", "NATIVE")


def test_kafka_changes_are_audited_once_with_the_clients_principal(cluster):
    from kafka.protocol.admin import AlterClientQuotasRequest

    from kafka import KafkaAdminClient

    controller = asyncio.run(controller_of(cluster))
    for node_id, node in cluster.nodes.items():
        topic = f"audit-k{node_id}"
        admin = kadmin.AdminClient(kafka_conf(node))
        acl = kadmin.AclBinding(
            kadmin.ResourceType.TOPIC,
            topic,
            kadmin.ResourcePatternType.LITERAL,
            "User:k-reader",
            "*",
            kadmin.AclOperation.READ,
            kadmin.AclPermissionType.ALLOW,
        )
        for f in admin.create_acls([acl], request_timeout=30).values():
            assert f.result(timeout=30) is None
        acl_filter = kadmin.AclBindingFilter(
            kadmin.ResourceType.TOPIC,
            topic,
            kadmin.ResourcePatternType.LITERAL,
            None,
            None,
            kadmin.AclOperation.ANY,
            kadmin.AclPermissionType.ANY,
        )
        for f in admin.delete_acls([acl_filter], request_timeout=30).values():
            assert len(f.result(timeout=30)) == 1
        user = f"k-user{node_id}"
        upsert = kadmin.UserScramCredentialUpsertion(
            user, kadmin.ScramCredentialInfo(kadmin.ScramMechanism.SCRAM_SHA_256, 4096), b"pw"
        )
        for f in admin.alter_user_scram_credentials([upsert]).values():
            assert f.result(timeout=30) is None
        delete = kadmin.UserScramCredentialDeletion(user, kadmin.ScramMechanism.SCRAM_SHA_256)
        for f in admin.alter_user_scram_credentials([delete]).values():
            assert f.result(timeout=30) is None

        # client quotas: kafka-python's AlterClientQuotas, sent to this very broker
        kp = KafkaAdminClient(
            bootstrap_servers=node.kafka_bootstrap,
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="PLAIN",
            sasl_plain_username="admin",
            sasl_plain_password="admin-secret",
        )
        try:
            E = AlterClientQuotasRequest.EntryData
            request = AlterClientQuotasRequest(
                entries=[
                    E(
                        entity=[E.EntityData(entity_type="user", entity_name=user)],
                        ops=[E.OpData(key="request_percentage", value=50.0, remove=False)],
                    )
                ],
                validate_only=False,
            )

            async def send(kp=kp, request=request, node_id=node_id):
                return await kp._manager.send(request, node_id=node_id)

            response = kp._manager.run(send)
            assert [e.error_code for e in response.entries] == [0]
        finally:
            kp.close()

        for what in (
            f"ACL created: ALLOW User:k-reader from * READ TOPIC:LITERAL:{topic}",
            f"ACL deleted: ALLOW User:k-reader from * READ TOPIC:LITERAL:{topic}",
            f"SCRAM-SHA-256 credential of User:{user} set",
            f"SCRAM-SHA-256 credential of User:{user} deleted",
            f"client quotas of user={user} changed: request_percentage=50",
        ):
            assert_audited_once(cluster, controller, what, "User:admin", "SASL_PLAINTEXT")
