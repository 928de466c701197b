"""Topic admin for either door: create, delete and grow topics on the controller.

The controller's topic requests travel between brokers in the inter-broker (native)
protocol, so this service is the one place that speaks them on a door's behalf: it takes
typed requests, runs them on the controller (here, or forwarded: ``run_on_controller``
answers once this broker's image holds the change) and answers typed outcomes, one per
topic in request order. Validation and internal-topic protection stay the controller's,
the same for both doors; the native door's own requests are forwarded as they come.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from logmq.errors import ErrorCode, LogMQError
from logmq.net.codec import ApiKey

RunOnController = Callable[[int, dict[str, Any]], Awaitable[dict[str, Any]]]


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """A topic to create; -1 partitions or replication factor: the broker's default."""

    name: str
    partitions: int = -1
    replication_factor: int = -1
    configs: Mapping[str, str] = field(default_factory=dict)
    # (partition, replicas) in request order (the first replica is the preferred leader;
    # a partition named twice is the controller's to refuse), or none for automatic
    assignments: Sequence[tuple[int, Sequence[int]]] | None = None


@dataclass(frozen=True, slots=True)
class PartitionsSpec:
    """A topic to grow to ``count`` partitions in all."""

    name: str
    count: int
    # one replica list per new partition, in order (the first broker the preferred
    # leader), or none for the controller's placement
    assignments: Sequence[Sequence[int]] | None = None


@dataclass(frozen=True, slots=True)
class TopicOutcome:
    """What became of one topic of a request."""

    name: str
    error: ErrorCode = ErrorCode.NONE
    message: str | None = None
    topic_id: uuid.UUID | None = None
    partitions: int | None = None  # what the defaults or an assignment came to
    replication_factor: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is ErrorCode.NONE


class TopicOutcomes(list[TopicOutcome]):
    """One outcome per topic in request order, and the controller's throttle of the
    caller's controller_mutation_rate (KIP-599; 0: none), which the door answers."""

    throttle_ms: int = 0


class TopicAdmin:
    """Typed topic requests run on the controller (``run_on_controller`` from
    native/controller_forwarding.py, given by the composition root)."""

    def __init__(self, run_on_controller: RunOnController) -> None:
        self._run = run_on_controller

    # ``caller``: who the controller meters the mutation as, ``{"user", "client_id",
    # "strict"}`` (native/controller_forwarding.quota_caller); None: not metered.

    async def create_topics(
        self,
        specs: Sequence[TopicSpec],
        *,
        validate_only: bool = False,
        caller: Mapping[str, Any] | None = None,
    ) -> TopicOutcomes:
        body = {
            "topics": [_create_entry(s) for s in specs],
            "validate_only": validate_only,
        }
        return await self._outcomes(ApiKey.CREATE_TOPICS, body, [s.name for s in specs], caller)

    async def delete_topics(
        self, names: Sequence[str], *, caller: Mapping[str, Any] | None = None
    ) -> TopicOutcomes:
        body = {"topics": list(names)}
        return await self._outcomes(ApiKey.DELETE_TOPICS, body, names, caller)

    async def create_partitions(
        self,
        specs: Sequence[PartitionsSpec],
        *,
        validate_only: bool = False,
        caller: Mapping[str, Any] | None = None,
    ) -> TopicOutcomes:
        """Grow each named topic to its new total partition count."""
        body = {
            "topics": [_partitions_entry(s) for s in specs],
            "timeout_ms": 0,
            "validate_only": validate_only,
        }
        names = [s.name for s in specs]
        return await self._outcomes(ApiKey.CREATE_PARTITIONS, body, names, caller)

    async def _outcomes(
        self,
        api_key: int,
        body: dict[str, Any],
        names: Sequence[str],
        caller: Mapping[str, Any] | None,
    ) -> TopicOutcomes:
        if not names:
            return TopicOutcomes()
        if caller is not None:
            body["quota"] = dict(caller)
        try:
            answer = await self._run(api_key, body)
        except LogMQError as e:  # no controller answered: every topic failed alike
            return TopicOutcomes(TopicOutcome(n, e.code, str(e)) for n in names)
        entries = answer.get("topics")
        by_name = {
            e.get("topic"): e for e in (entries if isinstance(entries, list) else ()) if _is_map(e)
        }
        lost = {"error": int(ErrorCode.UNKNOWN_SERVER_ERROR), "message": "no answer for it"}
        out = TopicOutcomes(_outcome(n, by_name.get(n, lost)) for n in names)
        throttle = answer.get("throttle_ms")
        if isinstance(throttle, int) and throttle > 0:
            out.throttle_ms = throttle
        return out


def _create_entry(spec: TopicSpec) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "topic": spec.name,
        "partitions": spec.partitions,
        "replication_factor": spec.replication_factor,
        "configs": dict(spec.configs),
    }
    if spec.assignments:
        entry["assignments"] = [{"partition": p, "replicas": list(r)} for p, r in spec.assignments]
    return entry


def _partitions_entry(spec: PartitionsSpec) -> dict[str, Any]:
    entry: dict[str, Any] = {"topic": spec.name, "count": spec.count}
    if spec.assignments is not None:
        entry["assignments"] = [list(r) for r in spec.assignments]
    return entry


def _is_map(entry: object) -> bool:
    return isinstance(entry, dict)


def _outcome(name: str, entry: Mapping[str, Any]) -> TopicOutcome:
    try:
        code = ErrorCode(entry.get("error", 0))
    except ValueError:
        code = ErrorCode.UNKNOWN_SERVER_ERROR
    topic_id = None
    raw = entry.get("topic_id")
    if isinstance(raw, str):
        try:
            topic_id = uuid.UUID(raw)
        except ValueError:
            topic_id = None
    partitions = entry.get("partitions")
    rf = entry.get("replication_factor")
    message = entry.get("message")
    return TopicOutcome(
        name,
        code,
        message if isinstance(message, str) else None,
        topic_id,
        partitions if isinstance(partitions, int) else None,
        rf if isinstance(rf, int) else None,
    )
