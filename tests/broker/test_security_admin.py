"""ACLs, SCRAM credentials and client quotas through the metadata log, end to end.

Three real ``logmq-server`` processes: changes sent to a broker that is not the
controller are forwarded to it, and once answered every broker describes them (each
from its own image). Then the typed SecurityAdmin over an in-process broker.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from logmq.broker.metadata.security_admin import SecurityAdmin
from logmq.cluster.controller_api import ClientQuotaAlteration
from logmq.cluster.security_image import MATCH_EXACT, QuotaFilterComponent
from logmq.errors import ErrorCode
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
from tests.harness import BrokerCluster, inprocess_broker
from tests.net.raw_client import RawClient

DEADLINE_S = 20.0
SHA512 = "SCRAM-SHA-512"


def binding(topic: str, principal: str = "User:alice") -> AclBinding:
    return AclBinding(
        ResourcePattern(ResourceType.TOPIC, topic, PatternType.LITERAL),
        AccessControlEntry(principal, "*", AclOperation.READ, AclPermissionType.ALLOW),
    )


@pytest.fixture(scope="module")
def cluster() -> Iterator[BrokerCluster]:
    c = BrokerCluster(3)
    try:
        c.start()
        yield c
    finally:
        c.close()


async def call(port: int, api_key: int, body: dict) -> dict:
    async with await RawClient.connect(port) as c:
        return (await c.call(api_key, body)).body


async def eventually(check, what: str):
    """``check()`` (async) until it returns a true value, with a deadline."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def test_changes_through_a_non_controller_are_described_by_every_broker(cluster):
    ports = {i: b.port for i, b in cluster.nodes.items()}

    async def controller_id():
        body = await call(ports[1], ApiKey.DESCRIBE_CLUSTER, {})
        return body["controller_id"] if body.get("controller_id", -1) >= 0 else None

    controller = await eventually(controller_id, "a controller")
    other = next(i for i in ports if i != controller)
    port = ports[other]

    # ACLs: one created twice (not duplicated), one refused
    bad = binding("t")
    bad_body = {**binding_body(bad), "resource_type": int(ResourceType.CLUSTER)}
    created = await call(
        port,
        ApiKey.CREATE_ACLS,
        {"creations": [binding_body(binding("t")), binding_body(binding("t")), bad_body]},
    )
    assert [r["error"] for r in created["results"]] == [0, 0, ErrorCode.INVALID_REQUEST]
    assert "metadata_offset" not in created  # the forwarding broker keeps it to itself

    # SCRAM: a salted credential travels, never a password
    cred = ScramCredential.from_password(SHA512, "secret", 4096)
    altered = await call(
        port,
        ApiKey.ALTER_USER_SCRAM_CREDENTIALS,
        {
            "upsertions": [scram_upsertion_body("alice", cred)],
            "deletions": [{"name": "nobody", "mechanism": SHA512}],
        },
    )
    assert {r["user"]: r["error"] for r in altered["results"]} == {
        "nobody": ErrorCode.RESOURCE_NOT_FOUND,
        "alice": 0,
    }
    # client quotas
    quotas = await call(
        port,
        ApiKey.ALTER_CLIENT_QUOTAS,
        {
            "entries": [
                {
                    "entity": [{"type": "user", "name": "alice"}],
                    "ops": [{"key": "producer_byte_rate", "value": 1048576}],
                }
            ]
        },
    )
    assert [e["error"] for e in quotas["entries"]] == [0]

    # the forwarding broker answered once its own image held the change; every broker
    # holds it once the log reaches it
    for node, p in ports.items():

        async def described(p=p):
            acls = await call(p, ApiKey.DESCRIBE_ACLS, {"filter": filter_body(AclBindingFilter())})
            scram = await call(p, ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, {"users": None})
            quota = await call(
                p,
                ApiKey.DESCRIBE_CLIENT_QUOTAS,
                {"components": [{"entity_type": "user", "match_type": 0, "match": "alice"}]},
            )
            if not (acls["bindings"] and scram["results"] and quota["entries"]):
                return None
            return acls, scram, quota

        if node == other:
            acls, scram, quota = await described()  # no waiting: read-your-writes
        else:
            acls, scram, quota = await eventually(described, f"broker {node} to catch up")
        assert acls["bindings"] == [binding_body(binding("t"))]
        assert scram["results"] == [
            {
                "user": "alice",
                "error": 0,
                "message": None,
                "credentials": [{"mechanism": SHA512, "iterations": 4096}],
            }
        ]
        assert quota["entries"] == [
            {
                "entity": [{"type": "user", "name": "alice"}],
                "values": {"producer_byte_rate": 1048576.0},
            }
        ]

    # delete through the non-controller: gone everywhere
    deleted = await call(
        port, ApiKey.DELETE_ACLS, {"filters": [filter_body(AclBindingFilter(name="t"))]}
    )
    assert deleted["results"][0]["matching"] == [binding_body(binding("t"))]
    for p in ports.values():

        async def no_acls(p=p):
            body = await call(p, ApiKey.DESCRIBE_ACLS, {})
            return body["bindings"] == []

        await eventually(no_acls, "the ACL to go")

    # malformed bodies are INVALID_REQUEST, never a crash
    body = await call(port, ApiKey.DESCRIBE_ACLS, {"filter": {"resource_type": "x"}})
    assert body["error"] == ErrorCode.INVALID_REQUEST
    body = await call(port, ApiKey.CREATE_ACLS, {"creations": [{"resource_type": 2}]})
    assert body["results"][0]["error"] == ErrorCode.INVALID_REQUEST
    body = await call(
        port,
        ApiKey.ALTER_USER_SCRAM_CREDENTIALS,
        {"upsertions": [{**scram_upsertion_body("bob", cred), "iterations": 10}]},
    )
    assert body["results"][0]["error"] == ErrorCode.UNACCEPTABLE_CREDENTIAL


async def test_security_admin_service(tmp_path):
    async with inprocess_broker(tmp_path / "d") as br:
        admin = SecurityAdmin(br.forwarder.run_on_controller, lambda: br.quorum.image)
        results = await admin.create_acls([binding("a"), binding("b", "User:bob")])
        assert all(r.ok for r in results)
        assert admin.describe_acls(AclBindingFilter(principal="User:bob")) == [
            binding("b", "User:bob")
        ]
        version = br.quorum.image.security.acl_version
        (deleted,) = await admin.delete_acls([AclBindingFilter(name="a")])
        assert deleted.deleted == (binding("a"),)
        assert br.quorum.image.security.acl_version > version

        cred = ScramCredential.from_password(SHA512, "pw", 8192)
        out = await admin.alter_scram([("carol", cred), ("dave", cred)], [("carol", SHA512)])
        assert out["carol"].error is ErrorCode.DUPLICATE_RESOURCE and out["dave"].ok
        assert br.quorum.image.security.scram_credential("dave", SHA512) == cred
        (d,) = admin.describe_scram(["dave"])
        assert d.credentials == ((SHA512, 8192),)
        assert admin.describe_scram(["carol"])[0].error is ErrorCode.RESOURCE_NOT_FOUND

        results = await admin.alter_client_quotas(
            [
                ClientQuotaAlteration({"user": "dave"}, {"consumer_byte_rate": 100}),
                ClientQuotaAlteration({"user": "dave"}, {"bogus": 1.0}),
            ]
        )
        assert [r.error for r in results] == [ErrorCode.NONE, ErrorCode.INVALID_REQUEST]
        d = admin.describe_client_quotas([QuotaFilterComponent("user", MATCH_EXACT, "dave")])
        assert d.entries == (((("user", "dave"),), {"consumer_byte_rate": 100.0}),)


async def test_bootstrap_credentials_are_written_on_the_first_start_only(tmp_path):
    from logmq.broker.config import BrokerConfig
    from logmq.server import Broker

    async def start(password: str) -> Broker:
        config = BrokerConfig(
            data_dir=tmp_path / "d",
            port=0,
            bootstrap_scram=(f"SCRAM-SHA-512=[name=admin,password={password}]",),
        )
        broker = Broker(config)
        # what the composition root passes on (MetadataQuorum(bootstrap_scram=...))
        broker.quorum.bootstrap_scram = tuple(config.bootstrap_scram_credentials())
        await broker.start()
        return broker

    broker = await start("first")
    try:
        stored = broker.quorum.image.security.scram_credential("admin", SHA512)
        assert stored is not None
        assert (
            stored.stored_key
            == ScramCredential.from_password(
                SHA512, "first", stored.iterations, stored.salt
            ).stored_key
        )
    finally:
        await broker.stop()
    broker = await start("second")
    try:
        assert broker.quorum.image.security.scram_credential("admin", SHA512) == stored
    finally:
        await broker.stop()
