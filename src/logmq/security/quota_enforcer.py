"""The broker's client quotas over the metadata image: what a door asks per request.

The quotas are the image's (AlterClientQuotas through the controller); the rates are
this broker's, as in Kafka (each broker enforces its share). Without any quota
configured a request costs one identity check. Sensors of clients gone quiet are
dropped once a minute (security/quotas.py bounds them).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from logmq.security.quotas import ClientQuotas, quota_user

EXPIRE_EVERY_S = 60.0


class QuotaEnforcer:
    def __init__(
        self,
        image: Callable[[], Any],
        clock: Callable[[], float] = time.monotonic,
        *,
        window_num: int = 11,
        window_seconds: float = 1.0,
    ) -> None:
        """``image()``: the current metadata image (its ``security.quotas``); the
        windows are Kafka's quota.window.num and quota.window.size.seconds."""
        self._image = image
        self._clock = clock
        self.quotas = ClientQuotas(window_num, window_seconds)
        self._seen: Any = None
        self._next_expiry = 0.0

    def active(self) -> bool:
        """Is any quota configured? (Callers skip measuring a request when not.)"""
        quotas = self._image().security.quotas
        if quotas is not self._seen:
            self._seen = quotas
            self.quotas.update(quotas)
        return bool(quotas)

    def _now(self) -> float:
        now = self._clock()
        if now >= self._next_expiry:
            self._next_expiry = now + EXPIRE_EVERY_S
            self.quotas.expire(now)
        return now

    def produce(self, context: Any, client_id: str, nbytes: int) -> int:
        """Throttle time (ms) after a produce of ``nbytes`` by this connection's client."""
        if not self.active():
            return 0
        user = quota_user(context.principal if context is not None else None)
        return self.quotas.produce(user, client_id or "", nbytes, self._now())

    def request_time(self, context: Any, client_id: str, seconds: float) -> int:
        """Throttle time (ms) after a request that took ``seconds`` of the broker's time
        (Kafka's request_percentage: a share of one request thread, here the loop)."""
        if not self.active():
            return 0
        user = quota_user(context.principal if context is not None else None)
        return self.quotas.request_time(user, client_id or "", seconds, self._now())

    def fetch(self, context: Any, client_id: str, nbytes: int) -> int:
        """Throttle time (ms) after a fetch answer of ``nbytes`` to this client."""
        if not self.active():
            return 0
        user = quota_user(context.principal if context is not None else None)
        return self.quotas.fetch(user, client_id or "", nbytes, self._now())
