"""``logmq acl|user|quota`` as real subprocesses against a real broker, plus the usage
errors that never reach one."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest
from click.testing import CliRunner

from logmq.client import Admin
from logmq.client.security_admin import QuotaAlteration, QuotaFilter
from logmq.errors import ErrorCode, LogMQError
from logmq.security.acl import (
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    ResourcePattern,
    ResourceType,
)
from logmq_cli.main import cli
from tests.cli.test_cli_e2e import DEADLINE


def run(broker, *args: str, env: dict[str, str] | None = None, check: bool = True):
    """``logmq ARGS`` as a subprocess with no terminal: a prompt reads end-of-file."""
    proc = subprocess.run(
        [sys.executable, "-m", "logmq_cli.main", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        env={**os.environ, "LOGMQ_BOOTSTRAP": broker.bootstrap, **(env or {})},
        timeout=DEADLINE,
    )
    if check:
        assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    return proc


def run_json(broker, *args: str):
    return json.loads(run(broker, *args).stdout)


def acls(broker, *args: str) -> list[tuple[str, str, str, str, str, str, str]]:
    return sorted(tuple(b.values()) for b in run_json(broker, "acl", "list", *args, "--json"))


def test_acl_add_list_remove(broker):
    added = run_json(
        broker,
        "acl", "add", "--allow-principal", "User:alice", "--operation", "read",
        "--operation", "Describe", "--topic", "orders", "--group", "billing", "--json",
    )  # fmt: skip
    assert len(added["created"]) == 4
    run(
        broker,
        "acl", "add", "--deny-principal", "User:bob", "--deny-host", "10.0.0.9",
        "--operation", "WRITE", "--topic", "orders-", "--resource-pattern-type", "prefixed",
    )  # fmt: skip
    run(broker, "acl", "add", "--allow-principal", "User:ops", "--cluster")
    run(broker, "acl", "add", "--allow-principal", "User:ops", "--cluster")  # again: no error

    assert acls(broker) == [
        ("cluster", "kafka-cluster", "literal", "User:ops", "*", "All", "Allow"),
        ("group", "billing", "literal", "User:alice", "*", "Describe", "Allow"),
        ("group", "billing", "literal", "User:alice", "*", "Read", "Allow"),
        ("topic", "orders", "literal", "User:alice", "*", "Describe", "Allow"),
        ("topic", "orders", "literal", "User:alice", "*", "Read", "Allow"),
        ("topic", "orders-", "prefixed", "User:bob", "10.0.0.9", "Write", "Deny"),
    ]
    # literal by default, as kafka-acls; match finds what applies to a name
    assert acls(broker, "--topic", "orders-eu") == []
    matched = acls(broker, "--topic", "orders-eu", "--resource-pattern-type", "match")
    assert [a[3] for a in matched] == ["User:bob"]
    assert {a[0] for a in acls(broker, "--principal", "User:alice")} == {"group", "topic"}
    table = run(broker, "acl", "list", "--topic", "orders").stdout.decode()
    assert "Describe" in table and "Read" in table and "permission" in table

    gone = run_json(
        broker,
        "acl", "remove", "--topic", "orders", "--allow-principal", "User:alice",
        "--operation", "Read", "--force", "--json",
    )  # fmt: skip
    assert [(b["resource_name"], b["operation"]) for b in gone["removed"]] == [("orders", "Read")]
    # no principal: every ACL of the resource goes
    gone = run_json(broker, "acl", "remove", "--group", "billing", "-f", "--json")
    assert len(gone["removed"]) == 2
    nothing = run(broker, "acl", "remove", "--group", "billing", "--force")
    assert b"nothing removed" in nothing.stdout
    assert [a[1] for a in acls(broker)] == ["kafka-cluster", "orders", "orders-"]


def test_acl_errors_are_clear(broker):
    bad_op = run(
        broker, "acl", "add", "--allow-principal", "User:a", "--operation", "fly", "--topic", "t",
        check=False,
    )  # fmt: skip
    assert bad_op.returncode == 2
    assert b"unknown operation 'fly'" in bad_op.stderr and b"ClusterAction" in bad_op.stderr

    no_resource = run(broker, "acl", "add", "--allow-principal", "User:a", check=False)
    assert no_resource.returncode == 2 and b"name a resource" in no_resource.stderr

    # an operation the resource type lacks: refused with the broker's message, and the
    # valid ACLs of the same command are not added either
    refused = run(
        broker, "acl", "add", "--allow-principal", "User:a", "--operation", "Read",
        "--operation", "Write", "--group", "g", check=False,
    )  # fmt: skip
    assert refused.returncode == 1
    assert b"INVALID_REQUEST" in refused.stderr and b"GROUP only supports" in refused.stderr
    assert b"Traceback" not in refused.stderr
    assert acls(broker) == []

    # remove without --force asks first; no answer, nothing removed
    run(broker, "acl", "add", "--allow-principal", "User:a", "--topic", "t")
    asked = run(broker, "acl", "remove", "--topic", "t", check=False)
    assert asked.returncode == 1 and b"Remove the ACLs" in asked.stderr
    assert len(acls(broker)) == 1


def test_user_add_list_remove(broker):
    run(broker, "user", "add", "alice", env={"LOGMQ_USER_PASSWORD": "s3cret-from-env"})
    doc = run_json(
        broker, "user", "add", "bob", "--password", "pw-bob",
        "--mechanism", "scram-sha-256", "--iterations", "8192", "--json",
    )  # fmt: skip
    assert doc == {"user": "bob", "mechanism": "SCRAM-SHA-256", "iterations": 8192}

    listed = run(broker, "user", "list", "--json").stdout.decode()
    assert json.loads(listed) == [
        {"user": "alice", "credentials": [{"mechanism": "SCRAM-SHA-512", "iterations": 4096}]},
        {"user": "bob", "credentials": [{"mechanism": "SCRAM-SHA-256", "iterations": 8192}]},
    ]
    table = run(broker, "user", "list").stdout.decode()
    assert "SCRAM-SHA-256" in table and "8192" in table
    for secret in ("pw-bob", "s3cret", "salt", "key"):
        assert secret not in listed and secret not in table

    missing = run(broker, "user", "list", "nobody", check=False)
    assert missing.returncode == 1 and b"RESOURCE_NOT_FOUND" in missing.stderr

    run(broker, "user", "remove", "alice")
    assert [u["user"] for u in run_json(broker, "user", "list", "--json")] == ["bob"]
    again = run(broker, "user", "remove", "alice", check=False)
    assert again.returncode == 1 and b"Traceback" not in again.stderr


def test_user_add_prompts_for_a_hidden_password(broker):
    runner = CliRunner()
    result = runner.invoke(cli, ["-b", broker.bootstrap, "user", "add", "carol"], input="pw\npw\n")
    assert result.exit_code == 0, result.output
    assert "pw" not in result.output.replace("Password", "")  # prompted, not echoed
    mismatch = runner.invoke(
        cli, ["-b", broker.bootstrap, "user", "add", "dave"], input="one\ntwo\n"
    )
    assert mismatch.exit_code != 0
    with Admin(broker.bootstrap) as admin:
        assert list(admin.describe_scram_users()) == ["carol"]


def test_quota_set_describe(broker):
    run(
        broker, "quota", "set", "--user", "alice", "--producer-byte-rate", "1048576",
        "--request-percentage", "12.5",
    )  # fmt: skip
    run(broker, "quota", "set", "--user-default", "--client-id-default",
        "--consumer-byte-rate", "2048")  # fmt: skip
    run(broker, "quota", "set", "--client-id", "etl", "--consumer-byte-rate", "4096")

    everything = run_json(broker, "quota", "describe", "--json")
    assert {json.dumps(e["entity"], sort_keys=True): e["values"] for e in everything} == {
        '{"client-id": null, "user": null}': {"consumer_byte_rate": 2048},
        '{"user": "alice"}': {"producer_byte_rate": 1048576, "request_percentage": 12.5},
        '{"client-id": "etl"}': {"consumer_byte_rate": 4096},
    }
    alice = run_json(broker, "quota", "describe", "--user", "alice", "--json")
    assert alice == [
        {
            "entity": {"user": "alice"},
            "values": {"producer_byte_rate": 1048576, "request_percentage": 12.5},
        }
    ]
    table = run(broker, "quota", "describe").stdout.decode()
    assert "<default>" in table and "producer_byte_rate" in table

    run(broker, "quota", "set", "--user", "alice", "--remove", "producer-byte-rate")
    alice = run_json(broker, "quota", "describe", "--user", "alice", "--json")
    assert alice[0]["values"] == {"request_percentage": 12.5}

    bad = run(broker, "quota", "set", "--user", "alice", "--remove", "bogus", check=False)
    assert bad.returncode == 2 and b"unknown quota 'bogus'" in bad.stderr
    nobody = run(broker, "quota", "set", "--producer-byte-rate", "1", check=False)
    assert nobody.returncode == 2 and b"name the entity" in nobody.stderr


# -- the admin client directly -----------------------------------------------------------


def test_admin_client_security_calls(broker):
    with Admin(broker.bootstrap) as admin:
        admin.upsert_scram_user("eve", "pw", "SCRAM-SHA-256", 4096)
        admin.upsert_scram_user("eve", "pw", "SCRAM-SHA-512", 5000)
        creds = admin.describe_scram_users(["eve"])["eve"]
        assert sorted((c.mechanism, c.iterations) for c in creds) == [
            ("SCRAM-SHA-256", 4096),
            ("SCRAM-SHA-512", 5000),
        ]
        assert admin.delete_scram_user("eve", "SCRAM-SHA-256") == ["SCRAM-SHA-256"]
        assert admin.delete_scram_user("eve") == ["SCRAM-SHA-512"]
        assert admin.describe_scram_users() == {}
        with pytest.raises(ValueError):
            admin.upsert_scram_user("eve", "pw", iterations=10)  # refused before sending

        assert admin.describe_acls() == []
        cluster_named_wrong = AclBinding(
            ResourcePattern(ResourceType.CLUSTER, "mine"),
            AccessControlEntry("User:a", "*", AclOperation.ALTER, AclPermissionType.ALLOW),
        )
        with pytest.raises(LogMQError, match="only valid name for the CLUSTER") as caught:
            admin.create_acls([cluster_named_wrong])
        assert caught.value.code == ErrorCode.INVALID_REQUEST
        assert admin.delete_acls([AclBindingFilter(ResourceType.TOPIC, "t")]) == []
        with pytest.raises(LogMQError, match="Unknown"):
            admin.describe_acls(AclBindingFilter(operation=AclOperation.UNKNOWN))

        admin.alter_client_quotas([QuotaAlteration({"user": None}, {"producer_byte_rate": 10})])
        [entry] = admin.describe_client_quotas([QuotaFilter.default("user")], strict=True)
        assert entry.entity == {"user": None} and entry.values == {"producer_byte_rate": 10.0}
        with pytest.raises(LogMQError, match="whole number"):
            admin.alter_client_quotas([QuotaAlteration({"user": "x"}, {"producer_byte_rate": 1.5})])


# -- usage errors: no broker needed ----------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ("acl add --topic t", "--allow-principal or --deny-principal"),
        ("acl add --allow-principal alice --topic t", "TYPE:NAME"),
        ("acl add --allow-principal User:a --allow-host h", "name a resource"),
        (
            "acl add --deny-host h --allow-principal User:a --topic t",
            "--deny-host needs --deny-principal",
        ),
        (
            "acl add --allow-principal User:a --topic t --resource-pattern-type match",
            "literal or prefixed",
        ),
        ("acl remove --allow-principal User:a", "name a resource"),
        ("acl list --operation nope", "unknown operation 'nope'"),
        ("user add u --password ''", "must not be empty"),
        ("user add u --password p --iterations 100", "--iterations"),
        ("quota set --user a", "give a quota to set"),
        ("quota set --user a --user-default --producer-byte-rate 1", "not both"),
        (
            "quota set --user a --producer-byte-rate 5 --remove producer_byte_rate",
            "both set and removed",
        ),
        ("quota set --user a --producer-byte-rate 0", "--producer-byte-rate"),
    ],
)
def test_usage_errors(args, message):
    result = CliRunner().invoke(cli, ["-b", "127.0.0.1:1", *shlex.split(args)])
    assert result.exit_code == 2, result.output
    assert message in result.output
