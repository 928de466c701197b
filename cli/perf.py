"""Sans-IO pieces of ``logmq bench``: rate limiting, latency statistics, progress text.

They take the time as an argument instead of reading a clock, so tests drive them with
made-up times and the benchmark shell owns the only clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


class TokenBucket:
    """Caps a long-run rate at ``rate`` per second, allowing bursts of ``burst``.

    ``reserve(n, now)`` takes ``n`` tokens and says how long to wait before using them.
    Tokens may go negative (a debt repaid by waiting), so a request larger than the
    burst is still served at the right average rate instead of never.
    """

    def __init__(self, rate: float, burst: float | None = None, now: float = 0.0) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self.rate = float(rate)
        self.burst = float(burst) if burst is not None else max(1.0, self.rate / 100)
        if self.burst <= 0:
            raise ValueError("burst must be positive")
        self.tokens = self.burst
        self.stamp = now

    def _refill(self, now: float) -> None:
        if now > self.stamp:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now

    def reserve(self, n: float, now: float) -> float:
        """Take ``n`` tokens; returns seconds to wait before acting (0.0: go now)."""
        self._refill(now)
        self.tokens -= n
        if self.tokens >= 0:
            return 0.0
        return -self.tokens / self.rate

    def available(self, now: float) -> int:
        """Whole tokens that could be taken now without waiting."""
        self._refill(now)
        return max(0, int(self.tokens))


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of already sorted values.

    Nearest rank never invents a value that was not measured, which is what a latency
    report should show: p99 of 100 samples is the 99th smallest one.
    """
    if not sorted_values:
        raise ValueError("no values")
    if not 0 <= q <= 100:
        raise ValueError("q must be within 0..100")
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


@dataclass(slots=True, frozen=True)
class LatencySummary:
    count: int
    p50_ms: float
    p99_ms: float
    p999_ms: float
    max_ms: float
    mean_ms: float


def summarize_latencies(latencies_ns: Sequence[int]) -> LatencySummary:
    """Percentiles in milliseconds of end-to-end latencies measured in nanoseconds."""
    values = sorted(latencies_ns)
    if not values:
        raise ValueError("no latencies measured")
    ms = 1e6
    return LatencySummary(
        count=len(values),
        p50_ms=percentile(values, 50) / ms,
        p99_ms=percentile(values, 99) / ms,
        p999_ms=percentile(values, 99.9) / ms,
        max_ms=values[-1] / ms,
        mean_ms=sum(values) / len(values) / ms,
    )


def throughput(records: int, nbytes: int, seconds: float) -> dict[str, float]:
    """The common fields of every bench result; MB means 10**6 bytes."""
    seconds = max(seconds, 1e-9)
    return {
        "records": records,
        "seconds": round(seconds, 6),
        "records_per_sec": round(records / seconds, 1),
        "mb_per_sec": round(nbytes / seconds / 1e6, 3),
    }


class Progress:
    """Builds the live progress line and decides when it is due (every ``interval`` s)."""

    def __init__(self, label: str, total: int | None, now: float, interval: float = 0.5) -> None:
        self.label = label
        self.total = total
        self.start = now
        self.interval = interval
        self.next_due = now + interval

    def due(self, now: float) -> bool:
        if now >= self.next_due:
            self.next_due = now + self.interval
            return True
        return False

    def line(self, records: int, nbytes: int, now: float) -> str:
        elapsed = max(now - self.start, 1e-9)
        done = f"{records:,}" if self.total is None else f"{records:,}/{self.total:,}"
        return (
            f"{self.label}: {done} records, {records / elapsed:,.0f} rec/s, "
            f"{nbytes / elapsed / 1e6:,.1f} MB/s, {elapsed:.1f} s"
        )
