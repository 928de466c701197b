"""Parking lot for long-poll fetches: woken by appends, never by a polling loop.

A fetch that finds fewer than ``min_bytes`` registers one future on every partition it
reads; an append to any of them (``notify``) resolves the future and the fetch re-reads.
``wake_all`` releases everybody at shutdown so in-flight fetches answer promptly.

Fetch sessions (broker/replica/fetch_sessions.py) are *watchers*: registered once per partition when
they take it, they hear of every notify (``mark_ready``), so a session's fetch parks
on one future of its own instead of registering on each of its partitions each time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from logmq.broker.replica.fetch_sessions import FetchSession

TopicPartition = tuple[str, int]


class FetchWaiters:
    def __init__(self) -> None:
        self._waiting: dict[TopicPartition, set[asyncio.Future[bool]]] = {}
        self._watchers: dict[TopicPartition, set[FetchSession]] = {}
        self._closed = False
        self._parked = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    def notify(self, tp: TopicPartition) -> None:
        futs = self._waiting.pop(tp, None)
        if futs:
            for fut in futs:
                if not fut.done():
                    fut.set_result(True)
        sessions = self._watchers.get(tp)
        if sessions:
            for session in sessions:
                session.mark_ready(tp)

    def watch(self, session: FetchSession, tps: Iterable[TopicPartition]) -> None:
        watchers = self._watchers
        for tp in tps:
            s = watchers.get(tp)
            if s is None:
                watchers[tp] = {session}
            else:
                s.add(session)

    def unwatch(self, session: FetchSession, tps: Iterable[TopicPartition]) -> None:
        watchers = self._watchers
        for tp in tps:
            s = watchers.get(tp)
            if s is not None:
                s.discard(session)
                if not s:
                    del watchers[tp]

    async def wait_session(self, session: FetchSession, timeout: float) -> bool:
        """Wait until one of ``session``'s partitions gets ready or ``timeout`` passes.

        Returns True when woken (something is ready), False on timeout, at shutdown or
        when the session was closed meanwhile.
        """
        if self._closed or timeout <= 0 or session.closed:
            return False
        if session.ready:
            return True
        loop = self._loop
        if loop is None or loop.is_closed():
            loop = self._loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()

        def wake() -> None:
            if not fut.done():
                fut.set_result(True)

        session.wake = wake
        self._parked += 1
        timer = loop.call_later(timeout, _expire, fut)
        try:
            return await fut and not self._closed and not session.closed
        finally:
            timer.cancel()
            self._parked -= 1
            if session.wake is wake:
                session.wake = None

    @property
    def closed(self) -> bool:
        return self._closed

    def wake_all(self) -> None:
        """Shutdown: wake every parked fetch now and every later one immediately."""
        self._closed = True
        for tp in list(self._waiting):
            self.notify(tp)
        for sessions in list(self._watchers.values()):
            for session in list(sessions):
                if session.wake is not None:
                    session.wake()

    @property
    def parked(self) -> int:
        return self._parked

    async def wait(self, tps: Iterable[TopicPartition], timeout: float) -> bool:
        """Wait until one of ``tps`` gets an append or ``timeout`` seconds pass.

        Returns True when woken by an append, False on timeout or once shut down (so
        a fetch answers with what it has instead of parking again).
        """
        if self._closed:
            return False
        if timeout <= 0:
            return False
        loop = self._loop
        if loop is None or loop.is_closed():
            loop = self._loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        keys = list(tps)
        for tp in keys:
            self._waiting.setdefault(tp, set()).add(fut)
        self._parked += 1
        # A timer that resolves the future (False) instead of asyncio.timeout, which
        # looks the loop and task up per call: this runs for every parked fetch.
        timer = loop.call_later(timeout, _expire, fut)
        try:
            return await fut and not self._closed
        finally:
            timer.cancel()
            self._parked -= 1
            for tp in keys:
                s = self._waiting.get(tp)
                if s is not None:
                    s.discard(fut)
                    if not s:
                        del self._waiting[tp]


def _expire(fut: asyncio.Future[bool]) -> None:
    if not fut.done():
        fut.set_result(False)
