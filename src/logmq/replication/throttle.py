"""Rate limits in bytes/s for reassignment traffic: a token bucket and a per-direction quota.

Sans-IO: every call takes ``now`` (seconds, any monotonic origin), nothing sleeps. The
shells (the follower's fetcher, the leader's fetch handler) ask how many bytes they may
request now, charge what they actually moved (whole batches, so a charge may overdraw
the bucket into debt) and, when there is nothing to ask for, how long to wait.

The burst is small (a tenth of a second of traffic) so that the rate measured over a
few seconds is within a few percent of the setting; debt is paid back before anything
more is granted, so overdrawing by a batch does not raise the long-run rate.
"""

from __future__ import annotations

import math
from typing import Any

BURST_SECONDS = 0.1  # the bucket holds this much traffic at most
MIN_BURST = 1024  # bytes: tiny rates still move a small batch at a time
MIN_WAIT = 1e-4  # seconds


def default_burst(rate: float) -> int:
    return max(MIN_BURST, int(rate * BURST_SECONDS))


class TokenBucket:
    """Tokens (bytes) refill at ``rate`` per second up to ``burst``; charges may go below 0.

    Over any interval of T seconds the bytes granted by ``take`` are at most
    ``rate * T + burst``; with ``charge`` each overdraft adds at most its own excess.
    """

    __slots__ = ("_burst", "_fixed_burst", "_rate", "_tokens", "_updated")

    def __init__(self, rate: float, now: float, *, burst: int | None = None) -> None:
        _check_rate(rate)
        if burst is not None and burst < 1:
            raise ValueError(f"burst must be >= 1 byte, got {burst}")
        self._rate = float(rate)
        self._fixed_burst = burst
        self._burst = burst if burst is not None else default_burst(rate)
        self._tokens = float(self._burst)  # a fresh bucket may send one burst at once
        self._updated = now

    @property
    def rate(self) -> float:
        return self._rate

    @property
    def burst(self) -> int:
        return self._burst

    def _refill(self, now: float) -> None:
        elapsed = now - self._updated
        if elapsed > 0:  # a clock that goes back adds nothing
            self._tokens = min(float(self._burst), self._tokens + elapsed * self._rate)
            self._updated = now

    def set_rate(self, rate: float, now: float) -> None:
        """Change the rate from ``now`` on; tokens earned so far and any debt are kept."""
        _check_rate(rate)
        self._refill(now)
        self._rate = float(rate)
        if self._fixed_burst is None:
            self._burst = default_burst(rate)
        self._tokens = min(self._tokens, float(self._burst))

    def tokens(self, now: float) -> float:
        """Bytes in the bucket now (negative: the debt still to pay back)."""
        self._refill(now)
        return self._tokens

    def available(self, now: float) -> int:
        """Bytes that may be asked for now (0 while empty or in debt)."""
        self._refill(now)
        return max(0, int(self._tokens))

    def in_debt(self, now: float) -> bool:
        return self.tokens(now) <= 0

    def wait_time(self, now: float, want: int = 1) -> float:
        """Seconds until ``min(want, burst)`` bytes are available (0: already)."""
        self._refill(now)
        missing = min(max(want, 1), self._burst) - self._tokens
        # A floor: a wait too short to move the clock (float rounding) would spin.
        return max(missing / self._rate, MIN_WAIT) if missing > 0 else 0.0

    def charge(self, nbytes: int, now: float) -> None:
        """Spend ``nbytes`` that were moved, even beyond what was available (debt)."""
        if nbytes < 0:
            raise ValueError(f"cannot charge {nbytes} bytes")
        self._refill(now)
        self._tokens -= nbytes

    def take(self, want: int, now: float) -> int:
        """Grant and charge up to ``want`` bytes, never more than available."""
        granted = min(max(want, 0), self.available(now))
        self._tokens -= granted
        return granted


def _check_rate(rate: float) -> None:
    if not (rate > 0 and math.isfinite(rate)):
        raise ValueError(f"rate must be a positive number of bytes/s, got {rate}")


def configured_rate(image: Any) -> int | None:
    """The metadata image's reassignment throttle (None: no image, none set, unreadable).

    The controller validates the rate it stores; a value that still does not parse must
    not stop replication, so it lifts the limit instead.
    """
    if image is None:
        return None
    try:
        return image.reassignment_throttle
    except (ValueError, TypeError):
        return None


class ReassignmentQuota:
    """One direction (inbound or outbound) of one broker's reassignment traffic.

    The rate comes from the metadata image on every round (``set_rate``; None or <= 0
    lifts the limit and forgets the bucket, so a new limit starts afresh). Grants wait
    for a quarter of the burst to build up, so a throttled partition is fetched in
    chunks rather than one small batch per round trip. ``bytes`` and ``delays`` count,
    for the metrics, the bytes moved under the limit and the partitions held back.
    """

    __slots__ = ("bucket", "bytes", "delays")

    def __init__(self) -> None:
        self.bucket: TokenBucket | None = None
        self.bytes = 0
        self.delays = 0

    @property
    def limited(self) -> bool:
        return self.bucket is not None

    @property
    def rate(self) -> int | None:
        return int(self.bucket.rate) if self.bucket is not None else None

    def set_rate(self, rate: int | None, now: float) -> None:
        if rate is None or rate <= 0:
            self.bucket = None
        elif self.bucket is None:
            self.bucket = TokenBucket(rate, now)
        elif rate != self.bucket.rate:
            self.bucket.set_rate(rate, now)

    def _min_grant(self, bucket: TokenBucket) -> int:
        return max(1, bucket.burst // 4)

    def allowance(self, now: float) -> int | None:
        """Bytes that may be asked for now: None without a limit, 0 to hold back."""
        bucket = self.bucket
        if bucket is None:
            return None
        available = bucket.available(now)
        return available if available >= self._min_grant(bucket) else 0

    def wait_time(self, now: float) -> float:
        """Seconds until ``allowance`` is above 0 again."""
        bucket = self.bucket
        if bucket is None:
            return 0.0
        return bucket.wait_time(now, self._min_grant(bucket))

    def held_back(self, partitions: int = 1) -> None:
        self.delays += partitions

    def charge(self, nbytes: int, now: float) -> None:
        if nbytes <= 0:
            return
        self.bytes += nbytes
        if self.bucket is not None:
            self.bucket.charge(nbytes, now)
