"""The real ``logmq-server`` process: startup, configuration, signals, crashes, metrics."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import urllib.request

from logmq.net.codec import ApiKey
from logmq.storage import batch as b
from tests.harness import BrokerProcess, free_port
from tests.net.raw_client import RawClient


async def test_sigterm_exits_zero_with_clean_shutdown_marker(broker):
    async with await RawClient.connect(broker.port) as c:
        assert (await c.create_topic("t", 1))["error"] == 0
        r = await c.produce("t", 0, b.encode_values([b"x"], timestamp=1))
        assert r["error"] == 0
    assert broker.stop() == 0
    assert (broker.data_dir / ".clean-shutdown").exists()
    meta = (broker.data_dir / "meta.properties").read_text()
    assert "node.id=1" in meta and "cluster.id=" in meta and "format.version=1" in meta


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


async def test_sigterm_answers_a_parked_fetch(broker_factory):
    mport = free_port()
    broker = broker_factory(extra_args=["--metrics-port", str(mport)])
    loop = asyncio.get_running_loop()
    async with await RawClient.connect(broker.port) as c:
        await c.create_topic("t", 1)
        corr = c.send(
            ApiKey.FETCH,
            {
                "max_wait_ms": 30_000,
                "min_bytes": 1,
                "max_bytes": 1000,
                "topics": [
                    {
                        "topic": "t",
                        "partitions": [
                            {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1000}
                        ],
                    }
                ],
            },
        )

        async def parked() -> bool:
            text = await loop.run_in_executor(None, scrape, mport)
            return "logmq_parked_fetches 1.0" in text

        async with asyncio.timeout(20):
            while not await parked():
                pass
        stopping = loop.run_in_executor(None, broker.stop)
        resp = await c.recv(timeout=20)
        assert resp.correlation_id == corr and resp.body["error"] == 0
        assert await stopping == 0


def test_refuses_a_different_node_id(broker):
    assert broker.stop() == 0
    other = BrokerProcess(broker.data_dir, node_id=2)
    proc = subprocess.run(other.command(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "node.id=1" in proc.stderr and "--node-id 2" in proc.stderr


async def test_restart_keeps_data_and_port(broker):
    async with await RawClient.connect(broker.port) as c:
        await c.create_topic("t", 1)
        await c.produce("t", 0, b.encode_values([b"a", b"b"], timestamp=1))
    port = broker.port
    broker.restart()
    assert broker.port == port
    async with await RawClient.connect(broker.port) as c:
        assert (await c.produce("t", 0, b.encode_values([b"c"], timestamp=1)))["base_offset"] == 2


async def test_toml_config_and_environment(tmp_path, broker_factory):
    cfg = tmp_path / "server.toml"
    cfg.write_text(
        '[server]\nnode_id = 7\nadvertised_host = "localhost"\n'
        'auto_create_topics = true\n[server.topic_defaults]\n"retention.ms" = "1234"\n'
    )
    env = {"LOGMQ_DEFAULT_PARTITIONS": "3"}
    br = broker_factory(node_id=7, extra_args=["--config", str(cfg)], env=env)
    async with await RawClient.connect(br.port) as c:
        resp = await c.call(ApiKey.METADATA, {"topics": ["auto"], "allow_auto_create": True})
        assert resp.body["brokers"] == [{"node_id": 7, "host": "localhost", "port": br.port}]
        assert len(resp.body["topics"][0]["partitions"]) == 3
        resp = await c.call(
            ApiKey.DESCRIBE_CONFIGS, {"resources": [{"type": "topic", "name": "auto"}]}
        )
        cfgs = {x["name"]: x for x in resp.body["resources"][0]["configs"]}
        assert cfgs["retention.ms"]["value"] == "1234"


async def test_metrics_endpoint(broker_factory):
    mport = free_port()
    br = broker_factory(extra_args=["--metrics-port", str(mport)])
    async with await RawClient.connect(br.port) as c:
        await c.create_topic("m", 2)
        await c.produce("m", 1, b.encode_values([b"x"] * 5, timestamp=1))
        await c.fetch("m", 1, 0)
    # the Kafka door's requests go through the same pipeline and metrics: one good
    # Metadata and one malformed one
    from tests.kafka.kafka_frames import encode_frame, request_class

    metadata = request_class(3, 12)(topics=None, include_topic_authorized_operations=False)
    good = encode_frame(3, 12, metadata)
    bad = encode_frame(3, 12, metadata)[:-2] + b"\xff\xff\xff\xff\x0f"
    reader, writer = await asyncio.open_connection("127.0.0.1", br.kafka_port)
    for frame in (good, bad):
        writer.write(len(frame).to_bytes(4, "big") + frame)
    for _ in range(2):
        await reader.readexactly(int.from_bytes(await reader.readexactly(4), "big"))
    writer.close()

    text = await asyncio.get_running_loop().run_in_executor(None, scrape, mport)
    assert 'logmq_requests_total{api="produce",listener="native"} 1.0' in text
    assert 'logmq_request_latency_seconds_count{api="fetch",listener="native"} 1.0' in text
    assert 'logmq_requests_total{api="metadata",listener="kafka"} 1.0' in text
    assert 'logmq_request_bytes_in_total{api="metadata",listener="kafka"}' in text
    assert 'logmq_bad_requests_total{listener="kafka",reason="INVALID_REQUEST"} 1.0' in text
    assert 'logmq_log_end_offset{partition="1",topic="m"} 5.0' in text
    assert "logmq_partitions 2.0" in text
    assert "logmq_bytes_in_total" in text and "logmq_bytes_out_total" in text


def test_help_runs():
    proc = subprocess.run(
        [sys.executable, "-m", "logmq_cli.server", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and "--data-dir" in proc.stdout and "--metrics-port" in proc.stdout


def test_a_normal_restart_with_groups_logs_no_warnings(tmp_path):
    """Issue 12: every restart logged ~49 WARNINGs about ``__consumer_offsets-N`` (shards
    loaded while the metadata log replayed, then unloaded under their pending update)."""
    from logmq import Admin
    from logmq.client.admin import NewTopic

    with BrokerProcess(tmp_path / "data") as broker:
        with Admin(broker.bootstrap) as admin:
            admin.create_topics([NewTopic("t", 1, 1)])
            admin.commit_group_offsets("g", {("t", 0): 5})
        assert broker.stop() == 0
        broker.start()
        with Admin(broker.bootstrap) as admin:
            assert admin.group_offsets("g")[("t", 0)].offset == 5
        assert broker.stop() == 0
        noisy = [
            line
            for line in broker.log_path.read_text().splitlines()
            if " WARNING " in line or " ERROR " in line
        ]
        assert noisy == []
