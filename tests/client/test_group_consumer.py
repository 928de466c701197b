"""Group consumers and group admin against a real broker, in one asyncio test process:
rebalance listeners, pattern subscriptions, pause/resume, commits (sync, async, auto,
with metadata), offset reset policies, fatal errors, standalone commits, admin calls,
and a broker restart under a live member."""

from __future__ import annotations

import asyncio

import pytest

from logmq import AsyncAdmin, AsyncConsumer, AsyncProducer, Consumer, OffsetAndMetadata
from logmq.errors import (
    CommitFailedError,
    ErrorCode,
    LogMQError,
    NoOffsetForPartitionError,
)
from tests.harness import BrokerProcess

GROUP_ARGS = [
    "--offsets-topic-partitions",
    "3",
    "--group-min-session-timeout-ms",
    "500",
    "--group-heartbeat-interval-ms",
    "100",
]


@pytest.fixture(scope="module")
def gbroker(tmp_path_factory):
    b = BrokerProcess(tmp_path_factory.mktemp("group-client") / "data", extra_args=GROUP_ARGS)
    b.start()
    try:
        yield b
    finally:
        b.close()


async def make_topic(broker, name: str, partitions: int, records: int = 0) -> None:
    async with AsyncAdmin(broker.bootstrap) as admin:
        await admin.create_topic(name, partitions)
    if records:
        async with AsyncProducer(broker.bootstrap) as p:
            for i in range(records):
                p.send(name, str(i).encode(), partition=i % partitions)
            await p.flush()


def consumer(broker, group: str, **kw) -> AsyncConsumer:
    kw.setdefault("auto_offset_reset", "earliest")
    kw.setdefault("session_timeout_ms", 3000)
    kw.setdefault("fetch_max_wait_ms", 100)
    return AsyncConsumer(broker.bootstrap, group_id=group, **kw)


async def drain(c: AsyncConsumer, n: int, timeout: float = 20) -> list:
    out: list = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while len(out) < n:
        assert loop.time() < deadline, f"got {len(out)} of {n} records"
        out += await c.poll(0.1)
    return out


async def test_incremental_rebalance_moves_only_what_must_move(gbroker, topic_name):
    await make_topic(gbroker, topic_name, 6, records=60)
    events: list = []

    async def on_assigned(parts):  # async listeners are awaited
        events.append(("a1+", parts))

    c1 = consumer(
        gbroker,
        topic_name,
        topics=[topic_name],
        on_assigned=on_assigned,
        on_revoked=lambda parts: events.append(("a1-", parts)),
    )
    c2 = consumer(gbroker, topic_name, topics=[topic_name])
    async with c1:
        got = await drain(c1, 60)
        assert len(got) == 60
        assert events == [("a1+", {(topic_name, p) for p in range(6)})]
        async with c2:

            async def balanced():
                while len(c1.assignment()) != 3 or len(c2.assignment()) != 3:
                    await c1.poll(0.05)
                    await c2.poll(0.05)

            await asyncio.wait_for(balanced(), 20)
            assert c1.assignment().isdisjoint(c2.assignment())
            # Only the partitions that moved were revoked; the rest never stopped.
            assert events[1] == ("a1-", c2.assignment())
            assert len(events) == 2
            # Auto-commit on revocation: the newcomer starts after what c1 consumed.
            assert await c2.poll(0.3) == []
        # c2 left: c1 gets everything back.
        await asyncio.wait_for(_until(c1, lambda: len(c1.assignment()) == 6), 20)
        assert events[-1][0] == "a1+"


async def _until(c: AsyncConsumer, condition) -> None:
    while not condition():
        await c.poll(0.05)


async def test_pattern_subscription_follows_new_topics(gbroker, topic_name):
    await make_topic(gbroker, f"{topic_name}.a", 1, records=3)
    c = consumer(gbroker, topic_name, pattern=rf"{topic_name}\..*", metadata_max_age_ms=200)
    async with c:
        assert len(await drain(c, 3)) == 3
        assert c.subscription() == {f"{topic_name}.a"}
        await make_topic(gbroker, f"{topic_name}.b", 2, records=4)
        await make_topic(gbroker, f"{topic_name}-not", 1, records=4)
        got = await drain(c, 4)
        assert {r.topic for r in got} == {f"{topic_name}.b"}
        assert c.subscription() == {f"{topic_name}.a", f"{topic_name}.b"}
        assert (f"{topic_name}-not", 0) not in c.assignment()


async def test_pause_and_resume_keep_membership(gbroker, topic_name):
    await make_topic(gbroker, topic_name, 2)
    c = consumer(gbroker, topic_name, topics=[topic_name])
    async with c, AsyncProducer(gbroker.bootstrap) as p:
        await asyncio.wait_for(_until(c, lambda: len(c.assignment()) == 2), 20)
        c.pause((topic_name, 0))
        assert c.paused() == {(topic_name, 0)}
        for i in range(10):
            p.send(topic_name, b"x", partition=i % 2)
        await p.flush()
        got = await drain(c, 5)
        assert {r.partition for r in got} == {1}
        assert await c.poll(0.5) == []  # still paused, still a member
        assert len(c.assignment()) == 2
        c.resume((topic_name, 0))
        got = await drain(c, 5)
        assert {r.partition for r in got} == {0}
        assert [r.offset for r in got] == list(range(5))


async def test_commits_sync_async_auto_and_metadata(gbroker, topic_name):
    await make_topic(gbroker, topic_name, 2, records=20)
    tp0, tp1 = (topic_name, 0), (topic_name, 1)
    c = consumer(gbroker, topic_name, topics=[topic_name], enable_auto_commit=False)
    async with c:
        await drain(c, 20)
        assert await c.committed([tp0, tp1]) == {tp0: None, tp1: None}
        await c.commit()  # every consumed position
        got = await c.committed([tp0, tp1])
        assert {tp: o.offset for tp, o in got.items()} == {tp0: 10, tp1: 10}
        await c.commit({tp0: 4, tp1: (6, "batch-6")}, metadata="m")
        got = await c.committed([tp0, tp1])
        assert (got[tp0].offset, got[tp0].metadata) == (4, "m")
        assert (got[tp1].offset, got[tp1].metadata) == (6, "batch-6")
        assert got[tp0].commit_timestamp > 0
        seen = []
        fut = c.commit_async({tp0: OffsetAndMetadata(7)}, callback=lambda o, e: seen.append(e))
        await fut
        assert seen == [None]
        assert (await c.committed([tp0]))[tp0].offset == 7
        with pytest.raises(ValueError):
            await c.commit({tp0: -1})
        bad = c.commit_async({(topic_name, 9): 1})
        with pytest.raises(LogMQError) as e:
            await bad
        assert e.value.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION

    # Auto-commit takes what the application finished with: positions at its last poll.
    auto = consumer(gbroker, topic_name + "-auto", topics=[topic_name], auto_commit_interval_ms=50)
    async with auto:
        await drain(auto, 20)
        await auto.poll(0.05)  # the records above are now processed

        async def committed_all():
            got = await auto.committed([tp0, tp1])
            return all(o is not None and o.offset == 10 for o in got.values())

        while not await committed_all():
            await auto.poll(0.05)


async def test_offset_reset_none_and_committed_start(gbroker, topic_name):
    await make_topic(gbroker, topic_name, 1, records=10)
    tp = (topic_name, 0)
    c = consumer(
        gbroker,
        topic_name,
        topics=[topic_name],
        auto_offset_reset="none",
        enable_auto_commit=False,  # or closing would commit the position, 10
    )
    async with c:
        with pytest.raises(NoOffsetForPartitionError):
            await asyncio.wait_for(_until(c, lambda: False), 20)
        c.seek(topic_name, 0, 8)  # choosing a position clears it
        assert [r.offset for r in await drain(c, 2)] == [8, 9]
        await c.commit({tp: 3})
    async with AsyncAdmin(gbroker.bootstrap) as admin:
        assert (await admin.group_offsets(topic_name))[tp].offset == 3
    c = consumer(gbroker, topic_name, topics=[topic_name], auto_offset_reset="none")
    async with c:
        assert [r.offset for r in await drain(c, 7)] == list(range(3, 10))


async def test_listener_errors_and_fatal_group_errors_reach_poll(gbroker, topic_name):
    await make_topic(gbroker, topic_name, 1)

    def broken(parts):
        raise RuntimeError("listener bug")

    c = consumer(gbroker, topic_name + "-a", topics=[topic_name], on_assigned=broken)
    async with c:
        with pytest.raises(RuntimeError, match="listener bug"):
            await asyncio.wait_for(_until(c, lambda: False), 20)
        assert c.assignment() == {(topic_name, 0)}  # the partition was still taken

    bad = consumer(gbroker, topic_name + "-b", topics=[topic_name], session_timeout_ms=100)
    async with bad:
        with pytest.raises(LogMQError) as e:
            await asyncio.wait_for(_until(bad, lambda: False), 20)
        assert e.value.code is ErrorCode.INVALID_SESSION_TIMEOUT

    first = consumer(gbroker, topic_name + "-c", topics=[topic_name], server_assignor="range")
    other = consumer(gbroker, topic_name + "-c", topics=[topic_name], server_assignor="sticky")
    async with first:
        await asyncio.wait_for(_until(first, lambda: first.assignment()), 20)
        async with other:
            with pytest.raises(LogMQError) as e:
                await asyncio.wait_for(_until(other, lambda: False), 20)
            assert e.value.code is ErrorCode.INVALID_REQUEST


async def test_standalone_commits_and_group_admin(gbroker, topic_name):
    await make_topic(gbroker, topic_name, 2, records=10)
    group = topic_name
    tp0, tp1 = (topic_name, 0), (topic_name, 1)
    async with AsyncAdmin(gbroker.bootstrap) as admin:
        # A consumer that assigns partitions itself commits without membership.
        manual = AsyncConsumer(gbroker.bootstrap, group_id=group, auto_offset_reset="earliest")
        async with manual:
            manual.assign([tp0])
            await drain(manual, 5)
            await manual.commit()
        assert {tp: o.offset for tp, o in (await admin.group_offsets(group)).items()} == {tp0: 5}
        await admin.commit_group_offsets(group, {tp1: 2}, metadata="spark")
        await admin.alter_group_offsets(group, {tp0: 1})
        found = await admin.group_offsets(group)
        assert (found[tp0].offset, found[tp1].offset, found[tp1].metadata) == (1, 2, "spark")
        d = await admin.describe_group(group)
        assert d.state == "empty" and d.members == []
        assert [(p.partition, p.committed_offset, p.lag) for p in d.partitions] == [
            (0, 1, 4),
            (1, 2, 3),
        ]

        member = consumer(gbroker, group, topics=[topic_name])
        async with member:
            await asyncio.wait_for(_until(member, lambda: len(member.assignment()) == 2), 20)
            for call in (
                admin.alter_group_offsets(group, {tp0: 0}),
                admin.commit_group_offsets(group, {tp0: 0}),
                admin.delete_group(group),
                admin.delete_group_offsets(group, [tp0]),
            ):
                with pytest.raises(LogMQError) as e:
                    await call
                assert e.value.code is ErrorCode.NON_EMPTY_GROUP
            listing = {g.group_id: g for g in await admin.list_groups()}
            assert listing[group].members == 1
            d = await admin.describe_group(group)
            assert [m.member_id for m in d.members] == [member.member_id]
            assert d.members[0].assignment == [tp0, tp1]
            assert {p.member_id for p in d.partitions} == {member.member_id}

        await admin.delete_group_offsets(group, [tp0])
        assert set(await admin.group_offsets(group)) == {tp1}
        await admin.delete_group(group)
        with pytest.raises(LogMQError) as e:
            await admin.describe_group(group)
        assert e.value.code is ErrorCode.GROUP_ID_NOT_FOUND
        with pytest.raises(LogMQError) as e:
            await admin.delete_group(group)
        assert e.value.code is ErrorCode.GROUP_ID_NOT_FOUND


def test_blocking_consumer_listener_may_commit(gbroker, topic_name):
    asyncio.run(make_topic(gbroker, topic_name, 2, records=10))
    calls = []

    def on_revoked(parts):
        c.commit()  # a blocking call from the listener: it runs in a worker thread
        calls.append(parts)

    c = Consumer(
        gbroker.bootstrap,
        group_id=topic_name,
        topics=[topic_name],
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        on_revoked=on_revoked,
    )
    got = []
    while len(got) < 10:
        got += c.poll(0.1)
    c.close()  # gives up its partitions: on_revoked commits
    assert calls == [{(topic_name, 0), (topic_name, 1)}]
    with Consumer(gbroker.bootstrap, group_id=topic_name) as probe:
        committed = probe.committed([(topic_name, 0), (topic_name, 1)])
    assert {o.offset for o in committed.values()} == {5}


async def test_commit_after_leaving_fails_clearly(gbroker, topic_name):
    await make_topic(gbroker, topic_name, 1, records=3)
    c = consumer(gbroker, topic_name, topics=[topic_name], enable_auto_commit=False)
    await c.start()
    await drain(c, 3)
    session = c._group
    assert session is not None
    await session.close(5)  # the member left the group, the consumer lives on
    with pytest.raises(CommitFailedError) as e:
        await c.commit({(topic_name, 0): 3})
    assert e.value.code is ErrorCode.UNKNOWN_MEMBER_ID
    await c.close()


async def test_member_survives_a_broker_restart(tmp_path, topic_name):
    broker = BrokerProcess(tmp_path / "data", extra_args=GROUP_ARGS)
    broker.start()
    try:
        await make_topic(broker, topic_name, 2, records=4)
        c = consumer(
            broker,
            topic_name,
            topics=[topic_name],
            session_timeout_ms=10_000,
            request_timeout_ms=2000,
        )
        async with c:
            await drain(c, 4)
            await c.commit()
            broker.restart()  # coordinator and leaders gone, then back on the same port
            async with AsyncProducer(broker.bootstrap) as p:
                for i in range(4):
                    p.send(topic_name, b"after", partition=i % 2)
                await p.flush()
            got = await drain(c, 4, timeout=30)
            assert {r.value for r in got} == {b"after"}
            await c.commit()
            assert c.assignment() == {(topic_name, 0), (topic_name, 1)}
            committed = await c.committed(c.assignment())
            assert {o.offset for o in committed.values()} == {4}
            broker.stop()
            # Closing without a coordinator gives up within the request timeout: no hang.
            await asyncio.wait_for(c.close(), 30)
    finally:
        broker.close()
