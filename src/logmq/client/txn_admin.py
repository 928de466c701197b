"""Transaction administration, as Kafka's kafka-transactions.sh: list, describe,
describe producers, abort a hanging transaction and find hanging ones.

The functions take the admin's ClusterClient; AsyncAdmin exposes them as methods.

* A transactional id is known only to its coordinator. DescribeTransactions goes to
  every broker (one round for any number of ids, rather than a FindCoordinator per id)
  and each id takes the answer of the broker that coordinates it (the others say
  NOT_COORDINATOR). ListTransactions likewise asks every broker and merges.
* DescribeProducers and the abort (WriteTxnMarkers) go to each partition's leader.
* A transaction *hangs* on a partition when the partition still has it open (the
  producer's ``current_txn_start_offset`` is set, which holds the last stable offset
  and so every read_committed consumer back) but no coordinator will ever end it there:
  no coordinator lists the producer id with an open transaction, or the open one does
  not include the partition, or it has been open longer than the largest transaction
  timeout a coordinator allows. :func:`hanging_of` is that decision, pure.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from logmq.client.cluster import ClusterClient, TopicPartition
from logmq.errors import ConnectionError_, ErrorCode, LogMQError, error_for
from logmq.net.codec import ApiKey

# Kafka's transaction states (their wire names)
STATES = (
    "Empty",
    "Ongoing",
    "PrepareCommit",
    "PrepareAbort",
    "CompleteCommit",
    "CompleteAbort",
    "Dead",
    "PrepareEpochFence",
)
# states in which the coordinator will still write markers for the transaction
OPEN_STATES = frozenset({"Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence"})
DEFAULT_MAX_AGE_MS = 900_000  # transaction.max.timeout.ms's default
_RETRY = frozenset(
    {
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
    }
)
_LEADER_MOVED = frozenset(
    {
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,  # a broker whose metadata lags
    }
)


@dataclass(slots=True, frozen=True)
class TransactionListing:
    transactional_id: str
    producer_id: int
    state: str
    coordinator_id: int = -1


@dataclass(slots=True, frozen=True)
class TransactionDescription:
    transactional_id: str
    state: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    start_ms: int  # -1: no transaction open
    partitions: list[TopicPartition]
    coordinator_id: int = -1


@dataclass(slots=True, frozen=True)
class ProducerState:
    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int
    current_txn_start_offset: int  # -1: no open transaction on the partition
    coordinator_epoch: int = -1  # of the producer's last marker here; -1: none yet


@dataclass(slots=True, frozen=True)
class HangingTransaction:
    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    current_txn_start_offset: int
    last_timestamp: int
    reason: str
    transactional_ids: list[str] = field(default_factory=list)


def _code(value: Any) -> ErrorCode:
    try:
        return ErrorCode(value)
    except (ValueError, TypeError):
        return ErrorCode.UNKNOWN_SERVER_ERROR


async def every_broker(
    cluster: ClusterClient,
    api_key: int,
    body: dict[str, Any],
    done: Any = lambda answer: _code(answer.get("error", 0)) not in _RETRY,
) -> dict[int, dict[str, Any]]:
    """Each live broker's answer to ``body`` (node id -> body).

    An answer ``done`` refuses (a coordinator still loading, by default) is asked for
    again, as is a broker that cannot be reached, until the cluster drops it from its
    metadata or the request timeout passes; then the last answer stands (or the
    connection error raises).
    """
    deadline = time.monotonic() + cluster.request_timeout

    async def ask(node: int) -> dict[str, Any] | None:
        delay = 0.02
        while True:
            try:
                answer = (await cluster.request_node(node, api_key, body)).body
            except ConnectionError_:
                if time.monotonic() >= deadline:
                    raise
                answer = None
            else:
                if done(answer) or time.monotonic() >= deadline:
                    return answer
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)
            if answer is None:
                await cluster.refresh_metadata()
                if node not in cluster.metadata.brokers:
                    return None

    await cluster.refresh_metadata()
    nodes = sorted(cluster.metadata.brokers)
    answers = await asyncio.gather(*(ask(n) for n in nodes))
    return {n: a for n, a in zip(nodes, answers, strict=True) if a is not None}


def _once(answer: dict[str, Any]) -> bool:
    return True


# -- ListTransactions, DescribeTransactions ----------------------------------------------


async def list_transactions(
    cluster: ClusterClient,
    states: Iterable[str] = (),
    producer_ids: Iterable[int] = (),
    duration_ms: int | None = None,
) -> list[TransactionListing]:
    """Every coordinator's transactions matching all filters (empty: any), sorted by id."""
    states = list(states)
    body: dict[str, Any] = {
        "states": states,
        "producer_ids": list(producer_ids),
        "duration_ms": -1 if duration_ms is None else duration_ms,
    }
    answers = await every_broker(cluster, ApiKey.LIST_TRANSACTIONS, body)
    out: dict[str, TransactionListing] = {}
    for node, answer in sorted(answers.items()):
        code = _code(answer.get("error", 0))
        if code is not ErrorCode.NONE:
            raise error_for(code, answer.get("message") or f"ListTransactions: {code.name}")
        unknown = answer.get("unknown_state_filters") or []
        if unknown:
            raise error_for(
                ErrorCode.INVALID_REQUEST,
                f"unknown transaction states {unknown}; known: {', '.join(STATES)}",
            )
        for t in answer.get("transactions") or ():
            out[t["transactional_id"]] = TransactionListing(
                t["transactional_id"], t.get("producer_id", -1), t.get("state", ""), node
            )
    return sorted(out.values(), key=lambda t: t.transactional_id)


async def describe_transactions(
    cluster: ClusterClient, transactional_ids: Iterable[str]
) -> list[TransactionDescription]:
    """Each id as its coordinator sees it, in the order asked; the first id no
    coordinator could describe raises (TRANSACTIONAL_ID_NOT_FOUND for an unknown id,
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED, or a coordinator error after the timeout)."""
    ids = list(dict.fromkeys(transactional_ids))
    if not ids:
        return []

    found: dict[str, TransactionDescription] = {}
    final: dict[str, tuple[ErrorCode, str]] = {}  # answers no retry will change
    last: dict[str, tuple[ErrorCode, str]] = {}  # the latest retriable one
    deadline = time.monotonic() + cluster.request_timeout
    todo = list(ids)
    delay = 0.05
    while True:
        answers = await every_broker(
            cluster, ApiKey.DESCRIBE_TRANSACTIONS, {"transactional_ids": todo}, _once
        )
        for node, answer in sorted(answers.items()):
            top = _code(answer.get("error", 0))
            if top is not ErrorCode.NONE:
                raise error_for(top, answer.get("message") or f"DescribeTransactions: {top.name}")
            for t in answer.get("transactions") or ():
                txn_id = t.get("transactional_id")
                code = _code(t.get("error", 0))
                if code is ErrorCode.NONE:
                    found[txn_id] = _description(t, node)
                elif code not in _RETRY:
                    final.setdefault(txn_id, (code, t.get("message") or ""))
                elif code is not ErrorCode.NOT_COORDINATOR or txn_id not in last:
                    last[txn_id] = (code, t.get("message") or "")
        todo = [t for t in ids if t not in found and t not in final]
        if not todo or time.monotonic() + delay >= deadline:
            break
        await asyncio.sleep(delay)  # no coordinator answered yet (moving, loading): again
        delay = min(delay * 2, 0.5)
    for txn_id in ids:
        if txn_id not in found:
            code, message = final.get(txn_id) or last.get(
                txn_id, (ErrorCode.COORDINATOR_NOT_AVAILABLE, "")
            )
            raise error_for(code, message or f"transactional id {txn_id!r}: {code.name}")
    return [found[t] for t in ids]


def _description(t: dict[str, Any], node: int) -> TransactionDescription:
    return TransactionDescription(
        t["transactional_id"],
        t.get("state", ""),
        t.get("producer_id", -1),
        t.get("producer_epoch", -1),
        t.get("timeout_ms", 0),
        t.get("start_ms", -1),
        sorted((p["topic"], p["partition"]) for p in t.get("partitions") or ()),
        node,
    )


# -- DescribeProducers, abort ------------------------------------------------------------


async def partitions_of(
    cluster: ClusterClient, topics: Iterable[str] | None
) -> list[TopicPartition]:
    """Every partition of ``topics`` (None: every topic but the internal ones)."""
    if topics is None:
        await cluster.refresh_metadata()
        names = [n for n, t in cluster.metadata.topics.items() if not t.internal and not t.error]
    else:
        names = list(topics)
        await cluster.refresh_metadata(names)
    out = []
    for name in names:
        count = cluster.metadata.partition_count(name)
        if count <= 0 and topics is not None:
            raise cluster.topic_error(name)
        out += [(name, p) for p in range(count)]
    return sorted(out)


async def describe_producers(
    cluster: ClusterClient, partitions: Iterable[TopicPartition], *, retries: int = 5
) -> dict[TopicPartition, list[ProducerState]]:
    """Each partition's active producers, from its leader."""
    todo = sorted(set(partitions))
    out: dict[TopicPartition, list[ProducerState]] = {}
    while todo:
        by_leader: dict[int, dict[str, list[int]]] = {}
        for topic, p in todo:
            leader = cluster.metadata.leader_for(topic, p)
            if leader < 0:
                await cluster.refresh_metadata([topic])
                leader = cluster.metadata.leader_for(topic, p)
                if leader < 0:
                    raise cluster.topic_error(topic, p)
            by_leader.setdefault(leader, {}).setdefault(topic, []).append(p)
        retry: LogMQError | None = None

        async def ask(node: int, topics: dict[str, list[int]]) -> dict[str, Any]:
            body = {"topics": [{"topic": t, "partitions": ps} for t, ps in topics.items()]}
            return (await cluster.request_node(node, ApiKey.DESCRIBE_PRODUCERS, body)).body

        answers = await asyncio.gather(*(ask(n, ts) for n, ts in by_leader.items()))
        for answer in answers:
            top = _code(answer.get("error", 0))
            if top is not ErrorCode.NONE:
                raise error_for(top, answer.get("message") or f"DescribeProducers: {top.name}")
            for t in answer.get("topics") or ():
                for p in t.get("partitions") or ():
                    tp = (t["topic"], p["partition"])
                    code = _code(p.get("error", 0))
                    if code is ErrorCode.NONE:
                        out[tp] = [_producer(s) for s in p.get("producers") or ()]
                    elif code in _LEADER_MOVED:
                        retry = error_for(code, p.get("message") or f"{tp}: {code.name}")
                    else:
                        raise error_for(code, p.get("message") or f"{tp[0]}-{tp[1]}: {code.name}")
        todo = [tp for tp in todo if tp not in out]
        if todo:
            if retries <= 0:
                raise retry or error_for(ErrorCode.UNKNOWN_SERVER_ERROR, f"no answer for {todo}")
            retries -= 1
            await asyncio.sleep(0.1)
            await cluster.refresh_metadata({t for t, _ in todo})
    return out


def _producer(s: dict[str, Any]) -> ProducerState:
    return ProducerState(
        s["producer_id"],
        s.get("producer_epoch", -1),
        s.get("last_sequence", -1),
        s.get("last_timestamp", -1),
        s.get("current_txn_start_offset", -1),
        s.get("coordinator_epoch", -1),
    )


async def abort_transaction(
    cluster: ClusterClient,
    topic: str,
    partition: int,
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int | None = None,
    *,
    retries: int = 5,
) -> None:
    """Write an ABORT marker for ``producer_id`` to the partition's leader, ending the
    transaction the partition holds open. WriteTxnMarkers is an inter-broker API: with
    the authorizer on, the principal needs CLUSTER_ACTION (a super user), as Kafka's.
    ``coordinator_epoch``: by default the one of the producer's last marker there, from
    DescribeProducers, as kafka-transactions.sh does (the partition refuses a marker
    from an older coordinator epoch than its last, TRANSACTION_COORDINATOR_FENCED)."""
    if coordinator_epoch is None:
        found = await describe_producers(cluster, [(topic, partition)])
        epochs = [
            s.coordinator_epoch
            for s in found.get((topic, partition), ())
            if s.producer_id == producer_id
        ]
        coordinator_epoch = max(epochs[0], 0) if epochs else 0
    marker = {
        "producer_id": producer_id,
        "producer_epoch": producer_epoch,
        "coordinator_epoch": coordinator_epoch,
        "commit": False,
        "topics": [{"topic": topic, "partitions": [partition]}],
    }
    await cluster.refresh_metadata([topic])
    while True:
        leader = cluster.metadata.leader_for(topic, partition)
        if leader < 0:
            raise cluster.topic_error(topic, partition)
        resp = await cluster.request_node(leader, ApiKey.WRITE_TXN_MARKERS, {"markers": [marker]})
        body = resp.body
        top = _code(body.get("error", 0))
        if top is not ErrorCode.NONE:
            raise error_for(top, body.get("message") or f"WriteTxnMarkers: {top.name}")
        code = ErrorCode.UNKNOWN_SERVER_ERROR
        for m in body.get("markers") or ():
            for t in m.get("topics") or ():
                for p in t.get("partitions") or ():
                    if t.get("topic") == topic and p.get("partition") == partition:
                        code = _code(p.get("error", -1))
        if code is ErrorCode.NONE:
            return
        if code not in _LEADER_MOVED or retries <= 0:
            raise error_for(code, f"aborting producer {producer_id} on {topic}-{partition}")
        retries -= 1
        await asyncio.sleep(0.1)
        await cluster.refresh_metadata([topic])


# -- hanging transactions ----------------------------------------------------------------


def hanging_of(
    producers: Mapping[TopicPartition, Iterable[ProducerState]],
    open_ids: Mapping[int, Iterable[str]],
    descriptions: Mapping[str, TransactionDescription],
    now_ms: int,
    max_age_ms: int = DEFAULT_MAX_AGE_MS,
) -> list[HangingTransaction]:
    """The partitions' open transactions no coordinator will end.

    ``open_ids``: producer id -> the transactional ids the coordinators list with that
    producer id in an open state; ``descriptions``: those ids described.
    """
    out = []
    for (topic, partition), states in sorted(producers.items()):
        for s in states:
            if s.current_txn_start_offset < 0:
                continue
            ids = sorted(open_ids.get(s.producer_id, ()))
            covering = [
                t
                for t in ids
                if t in descriptions
                and descriptions[t].state in OPEN_STATES
                and (topic, partition) in descriptions[t].partitions
            ]
            if not ids:
                reason = "no coordinator has an open transaction for this producer id"
            elif not covering:
                reason = "the producer's open transaction does not include this partition"
            elif s.last_timestamp >= 0 and now_ms - s.last_timestamp > max_age_ms:
                reason = f"open for longer than {max_age_ms} ms"
            else:
                continue
            out.append(
                HangingTransaction(
                    topic,
                    partition,
                    s.producer_id,
                    s.producer_epoch,
                    s.current_txn_start_offset,
                    s.last_timestamp,
                    reason,
                    ids,
                )
            )
    return out


async def find_hanging(
    cluster: ClusterClient,
    topics: Iterable[str] | None = None,
    max_age_ms: int = DEFAULT_MAX_AGE_MS,
    *,
    now_ms: int | None = None,
) -> list[HangingTransaction]:
    """Hanging transactions on ``topics``' partitions (None: every non-internal topic)."""
    tps = await partitions_of(cluster, None if topics is None else list(topics))
    producers = await describe_producers(cluster, tps) if tps else {}
    pids = sorted(
        {s.producer_id for ss in producers.values() for s in ss if s.current_txn_start_offset >= 0}
    )
    if not pids:
        return []
    listings = await list_transactions(cluster, sorted(OPEN_STATES), pids)
    open_ids: dict[int, list[str]] = {}
    for t in listings:
        open_ids.setdefault(t.producer_id, []).append(t.transactional_id)
    descriptions: dict[str, TransactionDescription] = {}
    if listings:
        ids = [t.transactional_id for t in listings]
        try:
            descriptions = {
                d.transactional_id: d for d in await describe_transactions(cluster, ids)
            }
        except LogMQError:
            # one id may have ended (and been removed) since the listing: describe one
            # at a time, leaving out those that fail
            for txn_id in ids:
                try:
                    (d,) = await describe_transactions(cluster, [txn_id])
                except LogMQError:
                    continue
                descriptions[txn_id] = d
    now = int(time.time() * 1000) if now_ms is None else now_ms
    return hanging_of(producers, open_ids, descriptions, now, max_age_ms)
