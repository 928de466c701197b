"""Run these tests on uvloop, the loop the broker uses in production."""

from __future__ import annotations

import pytest
import uvloop


@pytest.fixture(scope="session")
def event_loop_policy():
    return uvloop.EventLoopPolicy()


@pytest.fixture
async def logs(tmp_path):
    """A LogManager holding ``__consumer_offsets-0``, for the group shard tests."""
    from logmq.broker.coordinator.group_service import OFFSETS_TOPIC_CONFIGS
    from logmq.group import OFFSETS_TOPIC
    from logmq.storage.log_manager import LogManager

    manager = LogManager(tmp_path / "data")
    await manager.start()
    manager.create_log(OFFSETS_TOPIC, 0, dict(OFFSETS_TOPIC_CONFIGS))
    yield manager
    await manager.stop()
