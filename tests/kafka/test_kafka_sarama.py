"""Go's Sarama (Debian's golang-github-shopify-sarama-dev 1.22.1) against a real broker.

Sarama 1.2x speaks old protocol versions: it commits group offsets with OffsetCommit v1
and describes configs with DescribeConfigs v0, which logmq refused before it served
every version Kafka 3.9 serves, so a Sarama consumer group read everything again on
every start. The client is tests/kafka/sarama/main.go, built once per session in GOPATH
mode from the Debian packages (no network, no Go modules).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from logmq.client import Admin
from tests.kafka.test_kafka_clients import create, native_read

SOURCE = Path(__file__).parent / "sarama" / "main.go"
GOPATH = Path("/usr/share/gocode")
SARAMA = GOPATH / "src" / "github.com" / "Shopify" / "sarama"
INVALID_TOPIC_EXCEPTION = 17


@pytest.fixture(scope="session")
def sarama_client(tmp_path_factory) -> Path:
    go = shutil.which("go")
    if go is None:
        pytest.skip("no Go toolchain: apt-get install golang-go")
    if not SARAMA.is_dir():
        pytest.skip(
            f"no Sarama sources in {SARAMA}: apt-get install golang-github-shopify-sarama-dev"
        )
    out = tmp_path_factory.mktemp("sarama") / "sarama-client"
    env = {**os.environ, "GO111MODULE": "off", "GOPATH": str(GOPATH), "GOFLAGS": ""}
    if "GOCACHE" not in env and not os.access(os.path.expanduser("~"), os.W_OK):
        env["GOCACHE"] = str(out.parent / "gocache")
    proc = subprocess.run(
        [go, "build", "-o", str(out), str(SOURCE)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    return out


def sarama(client: Path, *args: str) -> list[dict]:
    proc = subprocess.run([str(client), *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def committed(broker, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offsets, as the native admin reads them."""
    with Admin(broker.bootstrap) as admin:
        offsets = admin.group_offsets(group)
    return {p: c.offset for (t, p), c in offsets.items() if t == topic and p < partitions}


def test_sarama_sync_producer_writes_what_the_native_consumer_reads(kbroker, sarama_client):
    create(kbroker, "sarama-produce", 3)
    acks = sarama(sarama_client, "produce", kbroker.kafka_bootstrap, "sarama-produce", "30")
    assert len(acks) == 30
    for p in {a["partition"] for a in acks}:  # each partition's offsets run from 0 in order
        offsets = [a["offset"] for a in acks if a["partition"] == p]
        assert offsets == list(range(len(offsets)))
    records = native_read(kbroker, "sarama-produce", 3, 30)
    assert sorted((r.key, r.value) for r in records) == sorted(
        (f"k{i}".encode(), f"v{i}".encode()) for i in range(30)
    )


def test_sarama_producer_gets_kafkas_error_for_an_invalid_topic(kbroker, sarama_client):
    [answer] = sarama(sarama_client, "produce-invalid", kbroker.kafka_bootstrap, "bad topic!")
    assert answer["code"] == INVALID_TOPIC_EXCEPTION, answer


def test_sarama_consumer_group_commits_and_the_next_member_resumes(kbroker, sarama_client):
    topic, group = "sarama-group", "sarama-readers"
    create(kbroker, topic, 2)
    sarama(sarama_client, "produce", kbroker.kafka_bootstrap, topic, "10")
    first = sarama(sarama_client, "group", kbroker.kafka_bootstrap, group, topic, "6")
    assert len(first) == 6
    # Sarama commits what it marked (OffsetCommit v1) when it leaves the group
    assert sum(committed(kbroker, group, topic, 2).values()) == 6
    second = sarama(sarama_client, "group", kbroker.kafka_bootstrap, group, topic, "4")
    seen = [(r["partition"], r["offset"]) for r in first + second]
    assert len(set(seen)) == 10, "the second run read again what the first committed"
    assert sorted(r["value"] for r in first + second) == sorted(f"v{i}" for i in range(10))
    assert sum(committed(kbroker, group, topic, 2).values()) == 10


def test_sarama_cluster_admin_creates_lists_describes_and_deletes(kbroker, sarama_client):
    [answer] = sarama(sarama_client, "admin", kbroker.kafka_bootstrap, "sarama-admin")
    assert answer["listed"] and answer["partitions"] == 3
    assert answer["configs"] == {"retention.ms": "3600000"}
    assert "already exists" in answer["create_again"]
    assert not answer["listed_after_delete"]
