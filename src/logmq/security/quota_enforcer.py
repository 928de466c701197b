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

from logmq.security.quotas import FETCH, ClientQuotas, quota_user

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

    def fetch_gate(self, context: Any, client_id: str) -> FetchGate | None:
        """The check of a consumer Fetch's answer, or None when no quota is configured."""
        return FetchGate(self, context, client_id) if self.active() else None

    def fetch_max_bytes(self, context: Any, client_id: str, max_bytes: int) -> int:
        """A consumer's fetch budget, capped as Kafka caps it at what its quota allows in
        the measured windows: an answer bigger would be throttled, and empty, forever."""
        if not self.active():
            return max_bytes
        user = quota_user(context.principal if context is not None else None)
        cap = self.quotas.max_value_in_window(FETCH, user, client_id or "")
        return max_bytes if cap is None else min(max_bytes, int(cap))

    def fetch(self, context: Any, client_id: str, nbytes: int) -> int:
        """Throttle time (ms) of a fetch answer of ``nbytes`` to this client.

        As Kafka: when these bytes would take the client over its quota they are taken
        back, and the door answers empty with the throttle time (the client reads them
        after its mute, within its rate); otherwise they are counted and 0 comes back."""
        if not self.active():
            return 0
        user = quota_user(context.principal if context is not None else None)
        now = self._now()
        throttle = self.quotas.fetch(user, client_id or "", nbytes, now)
        if throttle:
            self.quotas.unrecord_fetch(user, client_id or "", nbytes, now)
        return throttle

    # -- controller_mutation_rate (KIP-599): metered on the controller, for the cluster ----

    @staticmethod
    def identity(context: Any, client_id: str) -> tuple[str, str]:
        """(user, client id) a connection is metered as; what a broker forwarding a topic
        mutation to the controller sends along (native/admin_api.py)."""
        user = quota_user(context.principal if context is not None else None)
        return user, client_id or ""

    def mutation_quota(self, user: str, client_id: str, *, strict: bool) -> MutationQuota:
        """One topic request's metering against the pair's controller_mutation_rate."""
        return MutationQuota(self, user, client_id, strict)


class FetchGate:
    """One consumer Fetch's check of its answer against the consumer's byte rate, for
    ``ReplicaManager.fetch_session_for_consumer``'s ``admit``: False (throttled, the bytes
    not counted) means the door answers empty with ``throttle_ms``."""

    __slots__ = ("_client_id", "_context", "_enforcer", "throttle_ms")

    def __init__(self, enforcer: QuotaEnforcer, context: Any, client_id: str) -> None:
        self._enforcer = enforcer
        self._context = context
        self._client_id = client_id
        self.throttle_ms = 0

    def __call__(self, read: list[tuple[str, list[Any]]]) -> bool:
        size = sum(p.size for _, parts in read for p in parts)
        self.throttle_ms = self._enforcer.fetch(self._context, self._client_id, size)
        return not self.throttle_ms


class RequestTimeQuota:
    """A door's step after each handler (``FrontDoor.after``): a client over its
    request_percentage quota gets the throttle in its answer and is muted (KIP-219).

    ``throttle(reply, ms)`` writes the throttle into the door's answer; requests
    ``exempt`` says (brokers' own) and unanswered ones (acks=0) are not metered, as in
    Kafka."""

    __slots__ = ("exempt", "quotas", "throttle")

    def __init__(
        self,
        quotas: QuotaEnforcer,
        throttle: Callable[[Any, int], Any],
        exempt: Callable[[Any], bool] | None = None,
    ) -> None:
        self.quotas = quotas
        self.throttle = throttle
        self.exempt = exempt

    def active(self) -> bool:
        return self.quotas.active()

    def __call__(self, req: Any, reply: Any, seconds: float) -> Any:
        if reply is None or reply.silent or (self.exempt is not None and self.exempt(req)):
            return reply
        throttle = self.quotas.request_time(req.context, req.client_id, seconds)
        if throttle <= reply.throttle_ms:
            return reply
        return self.throttle(reply, throttle)


def quota_caller(context: Any, client_id: str, strict: bool) -> dict[str, Any]:
    """Who the controller meters a topic mutation run for a client as: what a broker
    sends along with it (native/admin_api.py reads it)."""
    user, client = QuotaEnforcer.identity(context, client_id)
    return {"user": user, "client_id": client, "strict": strict}


class MutationQuota:
    """The controller_mutation_rate of one CreateTopics, DeleteTopics or CreatePartitions
    (KIP-599), topic by topic in request order.

    Strict (CreateTopics v6+, DeleteTopics v5+, CreatePartitions v3+, the native door): a
    topic arriving while the caller's bucket is overdrawn is refused with
    THROTTLING_QUOTA_EXCEEDED; one that passes is taken whole. Permissive (older
    versions, whose clients know no such error): every topic goes ahead and the answer is
    throttled instead. ``throttle_ms`` is what the answer carries.
    """

    __slots__ = ("_client_id", "_enforcer", "_user", "strict", "throttle_ms")

    def __init__(self, enforcer: QuotaEnforcer, user: str, client_id: str, strict: bool) -> None:
        self._enforcer = enforcer
        self._user = user
        self._client_id = client_id
        self.strict = strict
        self.throttle_ms = 0

    def admit(self, partitions: int) -> bool:
        """May a topic mutating ``partitions`` partitions go ahead? (Counted if so.)"""
        quotas = self._enforcer.quotas
        now = self._enforcer._now()
        if self.strict:
            throttle = quotas.mutation_throttle(self._user, self._client_id, now)
            if throttle:
                self.throttle_ms = max(self.throttle_ms, throttle)
                return False
        throttle = quotas.mutations(self._user, self._client_id, max(partitions, 0), now)
        if not self.strict:
            self.throttle_ms = max(self.throttle_ms, throttle)
        return True

    def give_back(self, partitions: int) -> None:
        """A counted topic the controller then refused: its partitions were not mutated."""
        if partitions > 0:
            quotas = self._enforcer.quotas
            quotas.mutations(self._user, self._client_id, -partitions, self._enforcer._now())
