"""A byte-rate token bucket for the remote tier's copies and fetches.

Kafka's ``remote.log.manager.copy.max.bytes.per.second`` and
``remote.log.manager.fetch.max.bytes.per.second`` cap what one broker moves to and from
the store, so tiering never starves produce and fetch traffic of bandwidth. A transfer
takes its bytes up front and may run the bucket into debt: one upload larger than the
bucket (a whole segment) still goes, and the callers after it wait until the debt is
paid, so the average rate holds without splitting calls the store makes whole.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


class TokenBucket:
    """The sans-IO core: how long a transfer of ``n`` bytes must wait at time ``now``."""

    __slots__ = ("_last", "_tokens", "capacity", "rate")

    def __init__(self, rate: float, capacity: float | None = None, *, now: float = 0.0) -> None:
        if not rate > 0:
            raise ValueError(f"a byte rate must be positive, not {rate}")
        self.rate = float(rate)
        self.capacity = float(rate if capacity is None else capacity)
        if not self.capacity > 0:
            raise ValueError(f"a bucket capacity must be positive, not {capacity}")
        self._tokens = self.capacity
        self._last = now

    def reserve(self, n: int, now: float) -> float:
        """Take ``n`` bytes (debt allowed); the seconds to wait before using them."""
        if n < 0:
            raise ValueError(f"cannot reserve {n} bytes")
        if now > self._last:
            self._tokens = min(self.capacity, self._tokens + (now - self._last) * self.rate)
            self._last = now
        self._tokens -= n
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate

    @property
    def tokens(self) -> float:
        return self._tokens


class ByteRateLimiter:
    """An async shell over ``TokenBucket``: ``await acquire(n)`` before moving n bytes."""

    def __init__(
        self,
        bytes_per_second: float,
        *,
        burst_bytes: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        self._clock = clock
        self._sleep = sleep
        self.bucket = TokenBucket(bytes_per_second, burst_bytes, now=clock())
        self.waited_s = 0.0  # total time callers were held back (a throttle metric)

    @property
    def bytes_per_second(self) -> float:
        return self.bucket.rate

    async def acquire(self, n: int) -> None:
        delay = self.bucket.reserve(n, self._clock())
        if delay > 0:
            self.waited_s += delay
            await self._sleep(delay)
