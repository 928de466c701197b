"""The generic shard machinery with a toy core: what any core may rely on.

Effects reach ``on_effects`` only after their round is answered, never from a round
whose append failed; messages name the shard's own topic; tasks started for a core's
effects end when that core is dropped.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from logmq.broker.coordinator.shard_runtime import CoordinatorError, CoordinatorShard, ShardState
from logmq.errors import ErrorCode, StorageError
from logmq.storage.log_manager import LogManager
from tests.broker.test_group_shard import SingleReplica
from tests.harness import wait_until

TOPIC = "__toy_state"


@dataclass(frozen=True)
class Record:
    key: bytes
    value: bytes | None


class ToyCore:
    """A key-value map whose every put asks for an effect."""

    def __init__(self, values: dict[bytes, bytes]) -> None:
        self.values = dict(values)
        self._records: list[Record] = []
        self._effects: list[str] = []

    def put(self, key: str, value: str) -> str:
        self.values[key.encode()] = value.encode()
        self._records.append(Record(key.encode(), value.encode()))
        self._effects.append(f"put {key}")
        return "ok"

    def take_records(self):
        out, self._records = self._records, []
        return out

    def take_completions(self):
        return []

    def take_effects(self):
        out, self._effects = self._effects, []
        return out

    def next_deadline_ms(self):
        return None

    def tick(self, now_ms: int) -> None:
        return None


@pytest.fixture
async def toy_logs(tmp_path):
    manager = LogManager(tmp_path / "data")
    await manager.start()
    manager.create_log(TOPIC, 0, {"cleanup.policy": "compact"})
    yield manager
    await manager.stop()


async def loaded(logs: LogManager, effects: list) -> CoordinatorShard[ToyCore]:
    futures: list[asyncio.Future] = []

    def on_effects(batch: list) -> None:
        # every operation of the round has its answer by now
        assert all(f.done() for f in futures)
        effects.extend(batch)

    shard: CoordinatorShard[ToyCore] = CoordinatorShard(
        TOPIC,
        0,
        logs,
        lambda: logs.get_log(TOPIC, 0),
        lambda newest, now: ToyCore(newest),
        replication=SingleReplica(),
        on_effects=on_effects,
        kind="toy",
    )
    shard.futures = futures  # type: ignore[attr-defined]
    shard.load()
    await wait_until(lambda: shard.state is ShardState.ACTIVE, what="loaded")
    return shard


def put(key: str, value: str):
    return lambda core, now: core.put(key, value)


async def test_effects_follow_the_answers_of_their_round(toy_logs):
    effects: list[str] = []
    shard = await loaded(toy_logs, effects)
    futures = [shard.submit(put(k, "1")) for k in "abc"]
    shard.futures.extend(futures)  # type: ignore[attr-defined]
    assert await asyncio.gather(*futures) == ["ok"] * 3
    await wait_until(lambda: len(effects) == 3)
    assert effects == ["put a", "put b", "put c"]
    await shard.unload()
    with pytest.raises(CoordinatorError) as gone:
        shard.submit(put("d", "1"))
    assert gone.value.code is ErrorCode.NOT_COORDINATOR and f"{TOPIC}-0" in str(gone.value)
    again = await loaded(toy_logs, [])
    assert again._run is not None and again._run.core.values == {
        k: b"1" for k in (b"a", b"b", b"c")
    }
    await again.unload()


async def test_a_failed_append_drops_its_effects_and_the_cores_side_tasks(toy_logs, monkeypatch):
    effects: list[str] = []
    shard = await loaded(toy_logs, effects)
    started = asyncio.Event()

    async def forever() -> None:
        started.set()
        await asyncio.Event().wait()

    side = shard.spawn_side_task(forever(), "side")
    assert side is not None
    await started.wait()
    plog = toy_logs.get_log(TOPIC, 0)

    def broken(data, **kw):
        raise StorageError("disk on fire")

    monkeypatch.setattr(plog, "append", broken)
    with pytest.raises(CoordinatorError) as failed:
        await shard.submit(put("a", "1"))
    assert failed.value.code is ErrorCode.COORDINATOR_NOT_AVAILABLE
    await asyncio.sleep(0)
    assert side.cancelled() or side.done()
    monkeypatch.undo()
    await wait_until(lambda: shard.state is ShardState.ACTIVE, what="reloaded")
    await asyncio.sleep(0.05)
    assert effects == []
    await shard.unload()
