"""Topic configs live in one place, the broker's topic store; the logs only mirror it."""

from __future__ import annotations

from logmq.net.codec import ApiKey
from tests.harness import inprocess_broker
from tests.net.raw_client import RawClient


async def alter(c: RawClient, topic: str, **changes: str) -> None:
    resp = await c.call(
        ApiKey.ALTER_CONFIGS,
        {
            "resources": [
                {
                    "type": "topic",
                    "name": topic,
                    "set": {k.replace("_", "."): v for k, v in changes.items()},
                }
            ]
        },
    )
    assert resp.body["resources"][0]["error"] == 0, resp.body


async def test_logs_reopen_with_the_configs_of_the_metadata_image(tmp_path):
    data = tmp_path / "d"
    async with inprocess_broker(data) as br, await RawClient.connect(br.port) as c:
        assert (await c.create_topic("keep", 2, {"retention.ms": "60000"}))["error"] == 0
        await alter(c, "keep", flush_messages="7")
        stored = dict(br.image.topic_config("keep"))
    assert stored == {"retention.ms": "60000", "flush.messages": "7"}

    async with inprocess_broker(data) as br:
        for p in range(2):
            cfg = br.logs.get_log("keep", p).config
            assert (cfg.retention_ms, cfg.flush_messages) == (60000, 7)
