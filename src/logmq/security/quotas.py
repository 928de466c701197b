"""Client quotas: which configured quota applies to a connection, and how long to throttle it.

The sans-IO core of Kafka's ClientQuotaManager (KIP-13, KIP-55, KIP-124, KIP-219), fed the
metadata image's quotas (``SecurityImage.quotas``) and clock values; the pipeline records what
each request cost and answers with the throttle time it gets back (and mutes the connection
that long).

Resolution (KIP-55). For one quota kind, the first of these entities that has a value for it
applies; an entity with only other kinds' values does not count:

    1. user=<user>, client-id=<client-id>     5. user=<default>, client-id=<default>
    2. user=<user>, client-id=<default>       6. user=<default>
    3. user=<user>                            7. client-id=<client-id>
    4. user=<default>, client-id=<client-id>  8. client-id=<default>

The level that matched also says who shares one rate sensor (the "quota key"): levels 1, 2, 4
and 5 meter each (user, client id) pair alone, levels 3 and 6 all client ids of one user
together, levels 7 and 8 one client id across all users. So a user-level quota bounds the
sum of that user's connections, while ``user=<default>`` gives every user a budget of its own.

Measurement is Kafka's ``Rate`` over a ``WindowedSum``: ``window_num`` samples of
``window_seconds`` each (``quota.window.num``, ``quota.window.size.seconds``), one extra
sample kept so the oldest window can overlap the span; the rate is the samples' total over
the time since the oldest sample started, counted as at least ``window_num - 1`` whole windows
(a new client is not judged on its first few milliseconds). After each record, a rate above
the quota gives the delay that brings it back, assuming nothing more is recorded:
``(rate - quota) / quota * span`` (``throttle_time_ms``). Only the request quota's throttle
is capped, at one window, as Kafka caps it.

The result is Kafka's burstiness too: a client over its quota that honours the throttle
times runs at full speed for a few seconds whenever heavy samples age out, then is held
back, a sawtooth about one span long. Over whole minutes it gets its quota within a few
percent; over an arbitrary 30 s cut it can be off by a sixth.

Clock values are seconds (any monotonic origin) and are taken to the millisecond, as Kafka's
are, so windows and throttle times match Kafka's arithmetic exactly.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping
from typing import NamedTuple

# entity types and quota keys, as the metadata image spells them (cluster/security_image.py;
# repeated here because cluster imports security, never the other way round)
USER = "user"
CLIENT_ID = "client-id"
PRODUCE = "producer_byte_rate"
FETCH = "consumer_byte_rate"
REQUEST = "request_percentage"
CONTROLLER_MUTATION = "controller_mutation_rate"
QUOTA_KINDS = frozenset({PRODUCE, FETCH, REQUEST, CONTROLLER_MUTATION})

ANONYMOUS_USER = "ANONYMOUS"  # the user name of Kafka's User:ANONYMOUS principal
DEFAULT_WINDOW_NUM = 11  # quota.window.num: 10 whole windows plus the current one
DEFAULT_WINDOW_SECONDS = 1.0  # quota.window.size.seconds
DEFAULT_IDLE_SECONDS = 3600.0  # Kafka drops a client's sensors after an idle hour
DEFAULT_MAX_SENSORS = 10_000  # a few KB each: tens of MB at most
MAX_THROTTLE_MS = 2**31 - 1  # throttle_time_ms is an int32 on the wire

QuotaEntity = tuple[tuple[str, str | None], ...]  # ((type, name or None: default), ...)
QuotaKey = tuple[str | None, str | None]  # (user, client id): None = not part of the key


class Resolution(NamedTuple):
    """The quota a (user, client id) pair gets for one kind, and why."""

    entity: QuotaEntity  # the configured entity that matched (for logs and describe)
    value: float  # bytes/s, or percent of one thread for request_percentage
    key: QuotaKey  # who shares the rate sensor


def quota_user(principal: str | None) -> str:
    """The user name quotas are keyed by: the name part of ``Type:name`` (Kafka ignores the
    principal type), ``ANONYMOUS`` for an unauthenticated connection."""
    if not principal:
        return ANONYMOUS_USER
    _, sep, name = principal.partition(":")
    return name if sep else principal


def _levels(user: str | None, client_id: str | None) -> tuple[tuple[QuotaEntity, QuotaKey], ...]:
    """The eight candidate entities in Kafka's precedence order, each with its quota key;
    entities are in the image's canonical order (client-id sorts before user)."""
    pair = (user, client_id)
    return (
        (((CLIENT_ID, client_id), (USER, user)), pair),
        (((CLIENT_ID, None), (USER, user)), pair),
        (((USER, user),), (user, None)),
        (((CLIENT_ID, client_id), (USER, None)), pair),
        (((CLIENT_ID, None), (USER, None)), pair),
        (((USER, None),), (user, None)),
        (((CLIENT_ID, client_id),), (None, client_id)),
        (((CLIENT_ID, None),), (None, client_id)),
    )


def resolve_quota(
    quotas: Mapping[QuotaEntity, Mapping[str, float]], kind: str, user: str, client_id: str
) -> Resolution | None:
    """The quota of ``kind`` that applies to ``user`` (a bare name, see ``quota_user``) with
    ``client_id``, or None when no level has one (unlimited). ``quotas`` is keyed by
    canonical entities (``SecurityImage.quotas``)."""
    for entity, key in _levels(user, client_id):
        values = quotas.get(entity)
        if values is not None:
            value = values.get(kind)
            if value is not None:
                return Resolution(entity, value, key)
    return None


def throttle_time_ms(observed: float, quota: float, span_ms: float) -> int:
    """How long a client whose rate over the last ``span_ms`` is ``observed`` must stay quiet
    for its rate to fall back to ``quota``: the X of ``observed * W / (W + X) = quota``,
    rounded half up as Kafka does; 0 when within quota."""
    if observed <= quota:
        return 0
    return min(MAX_THROTTLE_MS, math.floor((observed - quota) / quota * span_ms + 0.5))


class WindowedRate:
    """Kafka's ``Rate`` of a ``WindowedSum``, in integer milliseconds.

    Samples start when the first value after the previous one's window arrives (they are not
    aligned to the clock); a sample whose last value is ``num`` windows old no longer counts.
    """

    __slots__ = ("_current", "_lasts", "_num", "_size", "_starts", "_values", "last_record")

    def __init__(self, window_num: int, window_ms: int) -> None:
        self._num = window_num
        self._size = window_ms
        self._starts: list[int] = []
        self._lasts: list[int] = []
        self._values: list[float] = []
        self._current = 0
        self.last_record = 0  # ms of the last record: what idle expiry looks at

    def _add_sample(self, t: int) -> None:
        self._starts.append(t)
        self._lasts.append(t)
        self._values.append(0.0)

    def record(self, value: float, t: int) -> None:
        if not self._starts:
            self._add_sample(t)
        i = self._current
        if t - self._starts[i] >= self._size:
            i = self._current = (i + 1) % (self._num + 1)
            if i >= len(self._starts):
                self._add_sample(t)
            else:
                self._starts[i] = self._lasts[i] = t
                self._values[i] = 0.0
        self._values[i] += value
        self._lasts[i] = t
        self.last_record = t

    def measure(self, t: int) -> tuple[float, int]:
        """(total of the live samples, the span in ms they are measured over)."""
        expire = self._num * self._size
        for i, last in enumerate(self._lasts):
            if t - last >= expire:
                self._starts[i] = self._lasts[i] = t
                self._values[i] = 0.0
        if not self._starts:
            self._add_sample(t)
        elapsed = t - min(self._starts)
        missing = self._num - 1 - elapsed // self._size
        if missing > 0:
            elapsed += missing * self._size
        return sum(self._values), max(elapsed, 1)

    def rate(self, t: int) -> float:
        """Per second."""
        total, span = self.measure(t)
        return total * 1000.0 / span


class TokenBucket:
    """Kafka's ``TokenBucket`` (KIP-599), which meters ``controller_mutation_rate``:
    credits refill at the quota per second up to a burst of quota x ``window_num`` windows;
    a mutation spends its partitions' worth, and the quota is exhausted below zero credits.

    Unlike a windowed rate, one big burst costs only the time to earn it back. The bucket
    starts full. Its quota is given at each call, so a changed quota applies at once.
    """

    __slots__ = ("_burst_s", "_tokens", "_updated", "last_record")

    def __init__(self, window_num: int, window_ms: int) -> None:
        self._burst_s = window_num * window_ms / 1000.0  # seconds of quota the burst holds
        self._tokens: float | None = None  # None: full
        self._updated = 0
        self.last_record = 0

    def tokens(self, quota: float, t: int) -> float:
        burst = quota * self._burst_s
        if self._tokens is None:
            self._tokens = burst
        else:
            self._tokens = min(burst, self._tokens + quota * (t - self._updated) / 1000.0)
        self._updated = t
        return self._tokens

    def record(self, value: float, t: int, quota: float) -> None:
        self._tokens = min(quota * self._burst_s, self.tokens(quota, t) - value)
        self.last_record = t


Sensor = WindowedRate | TokenBucket


def bucket_throttle_ms(tokens: float, quota: float) -> int:
    """How long until an overdrawn bucket is back at zero credits (0 when it is not)."""
    if tokens >= 0:
        return 0
    return min(MAX_THROTTLE_MS, math.floor(-tokens / quota * 1000 + 0.5))


class ClientQuotas:
    """Every client quota one broker enforces: resolution, sensors and throttle times.

    ``user`` arguments are bare user names (``quota_user(principal)``, once per connection).
    A pair with no quota of a kind is not metered at all. Sensors live in least-recently-
    recorded order; ``expire`` drops those idle for ``idle_seconds``. At most ``max_sensors``
    exist: when a new key arrives at the cap, sensors idle for a whole span (whose samples
    would all be discarded anyway, so dropping them changes nothing) make room first, and
    failing that the key shares one catch-all sensor per kind, checked against each
    request's own quota. The catch-all throttles a client that cycles client ids (or users)
    as one, instead of letting it evict the history of well-behaved clients; the price is
    that genuine newcomers arriving while the table is full of active keys share its budget
    until room frees up.
    """

    def __init__(
        self,
        window_num: int = DEFAULT_WINDOW_NUM,
        window_seconds: float = DEFAULT_WINDOW_SECONDS,
        *,
        max_sensors: int = DEFAULT_MAX_SENSORS,
        idle_seconds: float = DEFAULT_IDLE_SECONDS,
        quotas: Mapping[QuotaEntity, Mapping[str, float]] | None = None,
    ) -> None:
        window_ms = round(window_seconds * 1000)
        if window_num < 1:
            raise ValueError(f"window_num must be >= 1, got {window_num}")
        if not window_ms >= 1:
            raise ValueError(f"window_seconds must be >= 0.001, got {window_seconds}")
        if max_sensors < 1:
            raise ValueError(f"max_sensors must be >= 1, got {max_sensors}")
        self.window_num = window_num
        self.window_ms = window_ms
        self.max_sensors = max_sensors
        self._idle_ms = round(idle_seconds * 1000)
        self._quotas: dict[QuotaEntity, Mapping[str, float]] = {}
        self._sensors: OrderedDict[tuple[str, str | None, str | None], Sensor] = OrderedDict()
        self._overflow: dict[str, Sensor] = {}  # kind -> the catch-all sensor
        if quotas:
            self.update(quotas)

    # -- configuration ---------------------------------------------------------------------

    def update(self, quotas: Mapping[QuotaEntity, Mapping[str, float]]) -> None:
        """Take the image's quotas (on every change of ``image.security.quotas``).

        As in Kafka, sensors keep their samples: a changed quota is the bound the next record
        is checked against, and a connection that now resolves to another key (a user quota
        appeared, say) starts a fresh sensor under it. Entities are canonicalized; unknown
        entity types and non-positive or non-finite values are ignored.
        """
        table: dict[QuotaEntity, Mapping[str, float]] = {}
        for entity, values in quotas.items():
            if any(t not in (USER, CLIENT_ID) for t, _ in entity):
                continue
            kept = {
                k: float(v)
                for k, v in values.items()
                if isinstance(v, int | float) and math.isfinite(v) and v > 0
            }
            if kept:
                table[tuple(sorted(entity, key=lambda p: p[0]))] = kept
        self._quotas = table

    def resolve(self, kind: str, user: str, client_id: str) -> Resolution | None:
        return resolve_quota(self._quotas, kind, user, client_id)

    def quota_for(self, kind: str, user: str, client_id: str) -> float | None:
        """The quota of ``kind`` that applies to the pair, None if unlimited."""
        found = resolve_quota(self._quotas, kind, user, client_id)
        return None if found is None else found.value

    def max_value_in_window(self, kind: str, user: str, client_id: str) -> float | None:
        """The most one request can carry without being throttled for sure (quota times the
        ``window_num - 1`` whole windows); Kafka caps a consumer's fetch size with it."""
        quota = self.quota_for(kind, user, client_id)
        if quota is None:
            return None
        return quota * (self.window_num - 1) * self.window_ms / 1000.0

    # -- recording -------------------------------------------------------------------------

    def produce(self, user: str, client_id: str, nbytes: int, now: float) -> int:
        """Bytes appended by a produce request; the throttle time in ms (0: within quota)."""
        return self._record(PRODUCE, user, client_id, nbytes, now)

    def fetch(self, user: str, client_id: str, nbytes: int, now: float) -> int:
        """Bytes of a fetch response. Kafka answers a throttled fetch with an empty
        response, and then takes the bytes back: ``unrecord_fetch``."""
        return self._record(FETCH, user, client_id, nbytes, now)

    def unrecord_fetch(self, user: str, client_id: str, nbytes: int, now: float) -> None:
        """Take back a fetch's bytes whose response went out empty (Kafka records the
        negative amount in the current sample)."""
        found = self.resolve(FETCH, user, client_id)
        if found is None:
            return
        sensor = self._existing(FETCH, found.key)
        if sensor is not None:
            sensor.record(-float(nbytes), _ms(now))

    def request_time(self, user: str, client_id: str, seconds: float, now: float) -> int:
        """Time the broker spent handling one request of the pair. ``request_percentage`` is
        a percentage of one thread's time per window; logmq's one event loop is that thread,
        so ``seconds`` is the handler's time on the loop. The throttle is capped at one
        window, as Kafka caps request-quota throttles."""
        return self._record(REQUEST, user, client_id, seconds * 100.0, now, cap=self.window_ms)

    def mutation_throttle(self, user: str, client_id: str, now: float) -> int:
        """Is the pair's controller_mutation_rate exhausted already? Its throttle time (ms),
        0 when a mutation may go ahead. Kafka's strict check (CreateTopics v6+,
        DeleteTopics v5+, CreatePartitions v3+ refuse a topic with
        THROTTLING_QUOTA_EXCEEDED then); nothing is recorded."""
        found = resolve_quota(self._quotas, CONTROLLER_MUTATION, user, client_id)
        if found is None:
            return 0
        t = _ms(now)
        bucket = self._existing(CONTROLLER_MUTATION, found.key)
        if bucket is None:
            return 0  # a fresh bucket is full
        assert isinstance(bucket, TokenBucket)
        return bucket_throttle_ms(bucket.tokens(found.value, t), found.value)

    def mutations(self, user: str, client_id: str, partitions: int, now: float) -> int:
        """Partitions created or deleted by the pair; the throttle time (ms) after them, 0
        while the bucket is not overdrawn. A mutation that passed the check is taken whole,
        even when it overdraws the bucket, as in Kafka."""
        found = resolve_quota(self._quotas, CONTROLLER_MUTATION, user, client_id)
        if found is None:
            return 0
        t = _ms(now)
        bucket = self._sensor(CONTROLLER_MUTATION, found.key, t)
        assert isinstance(bucket, TokenBucket)
        bucket.record(float(partitions), t, found.value)
        return bucket_throttle_ms(bucket.tokens(found.value, t), found.value)

    def _record(
        self, kind: str, user: str, client_id: str, value: float, now: float, cap: int | None = None
    ) -> int:
        found = resolve_quota(self._quotas, kind, user, client_id)
        if found is None:
            return 0
        t = _ms(now)
        sensor = self._sensor(kind, found.key, t)
        sensor.record(float(value), t)
        total, span = sensor.measure(t)
        throttle = throttle_time_ms(total * 1000.0 / span, found.value, span)
        return throttle if cap is None else min(throttle, cap)

    def _sensor(self, kind: str, key: QuotaKey, t: int) -> Sensor:
        name = (kind, *key)
        sensor = self._sensors.get(name)
        if sensor is not None:
            self._sensors.move_to_end(name)
            return sensor
        if len(self._sensors) >= self.max_sensors:
            self._drop_idle(t, min(self._idle_ms, self.window_num * self.window_ms))
        if len(self._sensors) >= self.max_sensors:
            sensor = self._overflow.get(kind)
            if sensor is None:
                sensor = self._overflow[kind] = self._new_sensor(kind)
            return sensor
        sensor = self._sensors[name] = self._new_sensor(kind)
        return sensor

    def _new_sensor(self, kind: str) -> Sensor:
        if kind == CONTROLLER_MUTATION:
            return TokenBucket(self.window_num, self.window_ms)
        return WindowedRate(self.window_num, self.window_ms)

    # -- memory ----------------------------------------------------------------------------

    def expire(self, now: float) -> int:
        """Drop the sensors idle for ``idle_seconds``; how many went."""
        t = _ms(now)
        dropped = self._drop_idle(t, self._idle_ms)
        for kind in [k for k, s in self._overflow.items() if t - s.last_record >= self._idle_ms]:
            del self._overflow[kind]
            dropped += 1
        return dropped

    def _drop_idle(self, t: int, idle_ms: int) -> int:
        dropped = 0
        sensors = self._sensors
        while sensors:
            name, sensor = next(iter(sensors.items()))
            if t - sensor.last_record < idle_ms:
                break
            del sensors[name]
            dropped += 1
        return dropped

    @property
    def sensor_count(self) -> int:
        """Sensors held, the catch-all ones included."""
        return len(self._sensors) + len(self._overflow)

    def rate(self, kind: str, user: str, client_id: str, now: float) -> float | None:
        """The measured rate of the sensor the pair records into (per second; percent for
        request time), None if it has none yet; for metrics and tests."""
        found = self.resolve(kind, user, client_id)
        if found is None:
            return None
        sensor = self._existing(kind, found.key)
        return None if sensor is None else sensor.rate(_ms(now))

    def _existing(self, kind: str, key: QuotaKey) -> Sensor | None:
        """The sensor ``key`` records into now, without making one."""
        sensor = self._sensors.get((kind, *key))
        if sensor is None and len(self._sensors) >= self.max_sensors:
            sensor = self._overflow.get(kind)
        return sensor

    def overflowed(self, kind: str) -> bool:
        """Whether some keys of ``kind`` are metered by the catch-all sensor."""
        return kind in self._overflow


def _ms(now: float) -> int:
    return round(now * 1000)
