"""Fetch sessions (broker/replica/fetch_sessions.py): the sans-IO cache and session rules.

The replica manager's part (reading only ready partitions) and the clients' part are
covered end to end in tests/client/test_consumer_fetch_sessions.py and
tests/kafka/test_kafka_fetch_sessions.py.
"""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logmq.broker.replica.fetch_results import PartitionRead, TopicRead
from logmq.broker.replica.fetch_sessions import FetchSessionCache, FetchSessionError
from logmq.broker.replica.fetch_waiter import FetchWaiters
from logmq.errors import ErrorCode


def answer(topic: str, *parts: tuple[int, int, int, int, int]) -> list[TopicRead]:
    """The replica manager's shape from (partition, error, hw, log start, size)."""
    return [
        (
            topic,
            [
                PartitionRead(p, ErrorCode(e), hw, ls, b"R" * size if size else None)
                for p, e, hw, ls, size in parts
            ],
        )
    ]


def never(tp, sp) -> bool:
    return False


def test_open_get_epochs_and_errors():
    cache = FetchSessionCache(rng=random.Random(1))
    s = cache.open(-1, 0)
    assert s is not None and s.id != 0 and s.epoch == 1
    with pytest.raises(FetchSessionError) as e:
        cache.get(s.id, 2, -1, 0)
    assert e.value.code is ErrorCode.INVALID_FETCH_SESSION_EPOCH
    assert cache.get(s.id, 1, -1, 0) is s and s.epoch == 2
    with pytest.raises(FetchSessionError):  # the same epoch twice (a pipelined copy)
        cache.get(s.id, 1, -1, 0)
    with pytest.raises(FetchSessionError) as e:
        cache.get(s.id + 1, 1, -1, 0)
    assert e.value.code is ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    with pytest.raises(FetchSessionError) as e:  # a session is its owner's only
        cache.get(s.id, 2, 3, 0)
    assert e.value.code is ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    cache.close(s.id)
    assert s.closed and s.id not in cache


def test_a_requests_context_follows_kip_227_epochs_for_both_doors():
    cache = FetchSessionCache(max_sessions=1)
    named = [("t", [(0, 5, 1024, -1, -1), (1, 7, 1024, -1, -1)])]
    # epoch -1: no session, every partition answered
    ctx = cache.new_context(0, -1, -1, 0, named, ())
    assert ctx.session is None and ctx.full and ctx.session_id == 0
    # epoch 0 opens a session holding what the request names (its forgotten ignored)
    ctx = cache.new_context(0, 0, -1, 0, named, [("t", 0)])
    assert ctx.full and ctx.session is not None and len(ctx.session) == 2
    sid = ctx.session_id
    # the next epoch is incremental: it forgets what it names to forget
    ctx = cache.new_context(sid, 1, -1, 1, [], [("t", 0)])
    assert not ctx.full and ctx.session_id == sid and len(ctx.session) == 1
    with pytest.raises(FetchSessionError) as e:  # the same epoch again
        cache.new_context(sid, 1, -1, 2, [], ())
    assert e.value.code is ErrorCode.INVALID_FETCH_SESSION_EPOCH
    with pytest.raises(FetchSessionError) as e:  # another replica's session
        cache.new_context(sid, 2, 3, 2, [], ())
    assert e.value.code is ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    # a throttled incremental fetch keeps its session, a throttled new one does not
    ctx = cache.new_context(sid, 2, -1, 3, [], ())
    assert cache.throttled(ctx) == sid and sid in cache
    # epoch 0 naming a session replaces it; the cache (one slot) has room again
    ctx = cache.new_context(sid, 0, -1, 4, named, ())
    assert sid not in cache and ctx.session is not None
    assert cache.throttled(ctx) == 0 and len(cache) == 0
    # a full cache of busy sessions: epoch 0 fetches without one
    busy = cache.new_context(0, 0, -1, 5, named, ())
    ctx = cache.new_context(0, 0, -1, 6, named, ())
    assert ctx.session is None and ctx.full and busy.session_id in cache
    # epoch -1 naming a session closes it
    cache.new_context(busy.session_id, -1, -1, 7, named, ())
    assert len(cache) == 0


def test_a_full_cache_evicts_only_idle_sessions():
    cache = FetchSessionCache(max_sessions=2, evict_idle_ms=1000)
    a = cache.open(-1, 0)
    b = cache.open(-1, 500)
    assert cache.open(-1, 900) is None  # both in use: the newcomer goes without
    assert a is not None and b is not None
    cache.get(a.id, 1, -1, 1200)  # a is used again: b is now the least recent
    c = cache.open(-1, 1600)
    assert c is not None and b.closed and b.id not in cache and a.id in cache


def test_only_ready_partitions_are_read_and_only_news_is_sent():
    waiters = FetchWaiters()
    cache = FetchSessionCache(watch=waiters.watch, unwatch=waiters.unwatch)
    s = cache.open(-1, 0)
    assert s is not None
    cache.update(s, [("t", [(p, 0, 1000, 0, -1) for p in range(4)])], [])
    assert [p[0] for p in s.to_read()[0][1]] == [0, 1, 2, 3]
    # The full answer carries everything; all four are caught up: none stays ready.
    full = s.answered(answer("t", *[(p, 0, 0, 0, 0) for p in range(4)]), True, never)
    assert len(full[0][1]) == 4
    assert s.to_read() == [] and not s.ready
    # An append to 2 makes it ready (through the waiters); only it is read.
    waiters.notify(("t", 2))
    assert s.to_read() == [("t", [(2, 0, 1000, 0)])]
    sent = s.answered(answer("t", (2, 0, 5, 0, 70)), False, lambda tp, sp: True)
    assert [p.partition for p in sent[0][1]] == [2]
    assert ("t", 2) in s.ready  # data left at its session position until it moves on
    cache.update(s, [("t", [(2, 5, 1000, 0, -1)])], [])
    # caught up, same HW as sent: an incremental answer leaves it out
    assert s.answered(answer("t", (2, 0, 5, 0, 0)), False, never) == []
    assert not s.ready
    # An HW or log start change alone is news; an error is news and stays ready.
    waiters.notify(("t", 1))
    assert s.answered(answer("t", (1, 0, 0, 3, 0)), False, never)[0][1][0].log_start_offset == 3
    waiters.notify(("t", 0))
    assert s.answered(answer("t", (0, 6, -1, -1, 0)), False, never)
    assert ("t", 0) in s.ready


def test_forgotten_and_closed_sessions_stop_hearing_of_their_partitions():
    waiters = FetchWaiters()
    cache = FetchSessionCache(watch=waiters.watch, unwatch=waiters.unwatch)
    s = cache.open(-1, 0)
    assert s is not None
    cache.update(s, [("t", [(0, 0, 10, 0, -1), (1, 0, 10, 0, -1)])], [])
    s.answered(answer("t", (0, 0, 0, 0, 0), (1, 0, 0, 0, 0)), True, never)
    cache.update(s, [], [("t", 0)])
    assert ("t", 0) not in s.partitions
    waiters.notify(("t", 0))
    assert not s.ready
    cache.close(s.id)
    waiters.notify(("t", 1))
    assert not s.ready and waiters._watchers == {}


def test_partitions_that_sent_data_go_to_the_back_of_the_line():
    cache = FetchSessionCache()
    s = cache.open(-1, 0)
    assert s is not None
    cache.update(s, [("t", [(p, 0, 10, 0, -1) for p in range(3)])], [])
    # a max_bytes budget let only partition 0 send: it goes behind 1 and 2
    s.answered(answer("t", (0, 0, 9, 0, 10), (1, 0, 9, 0, 0), (2, 0, 9, 0, 0)), True,
               lambda tp, sp: True)  # fmt: skip
    assert [p[0] for p in s.to_read()[0][1]] == [1, 2, 0]


async def test_a_parked_session_fetch_wakes_on_an_append_and_times_out_otherwise():
    waiters = FetchWaiters()
    cache = FetchSessionCache(watch=waiters.watch, unwatch=waiters.unwatch)
    s = cache.open(-1, 0)
    assert s is not None
    cache.update(s, [("t", [(0, 0, 10, 0, -1)])], [])
    s.settle(answer("t", (0, 0, 0, 0, 0)), never)
    assert not await waiters.wait_session(s, 0.01)
    task = asyncio.ensure_future(waiters.wait_session(s, 30))
    await asyncio.sleep(0)
    waiters.notify(("t", 0))
    assert await task
    s.ready.clear()
    task = asyncio.ensure_future(waiters.wait_session(s, 30))
    await asyncio.sleep(0)
    cache.close(s.id)  # evicted while parked: answers at once
    assert not await task


# A model: whatever the order of requests, appends and answers, a partition with data
# at its session position is read at the next fetch, and an idle one is never read.
ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(0, 4)),
        st.tuples(st.just("fetch"), st.lists(st.integers(0, 4), max_size=3)),
    ),
    max_size=40,
)


@given(ops)
@settings(max_examples=200, deadline=None)
def test_reads_follow_the_data_model(steps):
    waiters = FetchWaiters()
    cache = FetchSessionCache(watch=waiters.watch, unwatch=waiters.unwatch)
    s = cache.open(-1, 0)
    assert s is not None
    end = [0] * 5  # the log end of each partition
    pos = [0] * 5  # the consumer's position
    cache.update(s, [("t", [(p, 0, 10, 0, -1) for p in range(5)])], [])

    def more(tp, sp) -> bool:
        return sp.fetch_offset < end[tp[1]]

    first = True
    named_first = set(range(5))
    for op, arg in steps:
        if op == "append":
            end[arg] += 1
            waiters.notify(("t", arg))
            continue
        # the consumer names the partitions whose position moved (and some others)
        moved = [p for p in range(5) if s.partitions[("t", p)].fetch_offset != pos[p]]
        named = sorted(set(moved) | set(arg))
        cache.update(s, [("t", [(p, pos[p], 10, 0, -1) for p in named])], [])
        read = {p for _, ps in s.to_read() for p, *_ in ps}
        # every partition with data at its position is read; nothing idle is
        assert {p for p in range(5) if pos[p] < end[p]} <= read
        assert read <= {p for p in range(5) if pos[p] < end[p]} | set(named) | named_first
        topics = answer("t", *[(p, 0, end[p], 0, end[p] - pos[p]) for p in sorted(read)])
        sent = s.answered(topics, first, more)
        first = False
        named_first = set()
        for _, parts in sent:
            for p in parts:
                pos[p.partition] += p.size
