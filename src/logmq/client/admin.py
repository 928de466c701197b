"""AsyncAdmin: topics, configs, offsets, consumer groups, partition reassignment,
security (ACLs, SCRAM users, client quotas) and transactions.

Each call is one request (routed to the controller when the cluster names one, else any
broker); per-topic errors are raised as the matching ``errors.*`` exception after the
whole response is read, so a batch call reports the first failure by name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from logmq.client import group_admin, reassignment_admin, security_admin, txn_admin
from logmq.client.cluster import ClusterClient, PartitionInfo, TopicPartition
from logmq.client.group_admin import GroupDescription, GroupListing
from logmq.client.group_offsets import OffsetAndMetadata
from logmq.client.reassignment_admin import LogDirPartition, ReassignmentListing
from logmq.client.security import ClientSecurity
from logmq.client.security_admin import (
    QuotaAlteration,
    QuotaEntry,
    QuotaFilter,
    ScramCredentialInfo,
)
from logmq.client.transactions import complete_transaction
from logmq.client.txn_admin import (
    DEFAULT_MAX_AGE_MS,
    HangingTransaction,
    ProducerState,
    TransactionDescription,
    TransactionListing,
)
from logmq.errors import ErrorCode, LogMQError, error_for
from logmq.net.codec import ApiKey, Response
from logmq.security.acl import AclBinding, AclBindingFilter


@dataclass(slots=True, frozen=True)
class NewTopic:
    name: str
    partitions: int = 1
    replication_factor: int = 1
    configs: dict[str, str] = field(default_factory=dict)
    # replica lists by partition (0..n-1), first broker the preferred leader; when given,
    # partitions and replication_factor are taken from it
    assignments: list[list[int]] | None = None


@dataclass(slots=True, frozen=True)
class PartitionDescription:
    partition: int
    leader: int
    leader_epoch: int
    replicas: list[int]
    isr: list[int]
    log_start_offset: int
    log_end_offset: int  # the high watermark: the offset the next record will get
    adding_replicas: list[int] = field(default_factory=list)  # non-empty while moving
    removing_replicas: list[int] = field(default_factory=list)


@dataclass(slots=True, frozen=True)
class TopicDescription:
    name: str
    internal: bool
    partitions: list[PartitionDescription]


@dataclass(slots=True, frozen=True)
class TopicListing:
    """A topic as ``list_topic_listings`` shows it (rpk's ``topic list``)."""

    name: str
    internal: bool
    partitions: int
    # of partition 0 without the replicas a reassignment is adding (Kafka's TopicCommand)
    replication_factor: int


@dataclass(slots=True, frozen=True)
class ConfigEntry:
    name: str
    value: str | None
    default: bool
    read_only: bool


def _raise_first(entries: Iterable[dict[str, Any]], what: str, key: str = "topic") -> None:
    for e in entries:
        code = e.get("error", 0)
        if code:
            name = e.get(key) or e.get("name")
            raise error_for(code, e.get("message") or f"{what} {name}: {ErrorCode(code).name}")


class AsyncAdmin:
    def __init__(
        self,
        bootstrap: str,
        *,
        client_id: str = "logmq-admin",
        request_timeout_ms: int = 30000,
        retry_backoff_ms: int = 100,
        security: ClientSecurity | None = None,
    ) -> None:
        self.request_timeout_ms = request_timeout_ms
        self._cluster = ClusterClient(
            bootstrap,
            client_id=client_id,
            request_timeout_ms=request_timeout_ms,
            retry_backoff_ms=retry_backoff_ms,
            security=security,
        )

    async def start(self) -> AsyncAdmin:
        try:
            await self._cluster.refresh_metadata()
        except BaseException:
            await self._cluster.close()
            raise
        return self

    async def __aenter__(self) -> AsyncAdmin:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._cluster.close()

    async def _controller_request(self, api_key: int, body: dict[str, Any]) -> Response:
        controller = self._cluster.metadata.controller_id
        if controller >= 0 and controller in self._cluster.metadata.brokers:
            try:
                return await self._cluster.request_node(controller, api_key, body)
            except LogMQError as e:
                if not e.retriable:
                    raise
                await self._cluster.refresh_metadata()
        return await self._cluster.request_any(api_key, body)

    # -- cluster ------------------------------------------------------------------
    async def describe_cluster(self) -> dict[str, Any]:
        """Brokers (with fenced state), controller, under-replicated and offline partitions."""
        resp = await self._cluster.request_any(ApiKey.DESCRIBE_CLUSTER, {})
        return dict(resp.body)

    async def describe_quorum(self) -> dict[str, Any]:
        """The metadata quorum as the answering broker sees it (leader, epoch, voters)."""
        resp = await self._controller_request(ApiKey.DESCRIBE_QUORUM, {})
        return dict(resp.body)

    # -- topics -------------------------------------------------------------------
    async def create_topics(
        self, topics: Iterable[NewTopic], *, validate_only: bool = False
    ) -> None:
        """Create topics; raises the first per-topic error (e.g. TOPIC_ALREADY_EXISTS)."""
        body = {
            "topics": [_new_topic_body(t) for t in topics],
            "timeout_ms": self.request_timeout_ms,
            "validate_only": validate_only,
        }
        resp = await self._controller_request(ApiKey.CREATE_TOPICS, body)
        _raise_first(resp.body.get("topics") or (), "create topic")
        await self._cluster.refresh_metadata([t["topic"] for t in body["topics"]])

    async def create_topic(
        self,
        name: str,
        partitions: int = 1,
        replication_factor: int = 1,
        configs: Mapping[str, Any] | None = None,
    ) -> None:
        await self.create_topics(
            [NewTopic(name, partitions, replication_factor, dict(configs or {}))]
        )

    async def create_partitions(
        self,
        new_totals: Mapping[str, int],
        *,
        assignments: Mapping[str, Sequence[Sequence[int]]] | None = None,
        validate_only: bool = False,
    ) -> None:
        """Grow topics to ``{topic: new total partition count}``; raises the first
        per-topic error (INVALID_PARTITIONS when a count is not larger than now).

        ``assignments`` places a topic's new partitions by hand: ``{topic: [[broker,
        ...], ...]}``, one replica list per new partition in order, the first broker of
        each the preferred leader (as kafka-topics.sh --alter --replica-assignment).
        Lists that do not fit (their number, a replica count other than the topic's
        replication factor, a broker twice or not registered) raise
        INVALID_REPLICA_ASSIGNMENT naming what is wrong. ``validate_only`` checks all
        of that and changes nothing.

        Keyed records map to partitions by ``hash % count``: after this call, new
        records of a key may go to another partition than that key's older ones.
        """
        manual = dict(assignments or {})
        unknown = sorted(set(manual) - set(new_totals))
        if unknown:
            raise ValueError(f"assignments name topics without a new count: {unknown}")
        topics = []
        for t, n in new_totals.items():
            entry: dict[str, Any] = {"topic": str(t), "count": int(n)}
            if t in manual:
                entry["assignments"] = [[int(b) for b in r] for r in manual[t]]
            topics.append(entry)
        body = {
            "topics": topics,
            "timeout_ms": self.request_timeout_ms,
            "validate_only": validate_only,
        }
        resp = await self._controller_request(ApiKey.CREATE_PARTITIONS, body)
        _raise_first(resp.body.get("topics") or (), "create partitions")
        await self._cluster.refresh_metadata([t["topic"] for t in body["topics"]])

    async def delete_topics(self, names: Iterable[str]) -> None:
        body = {"topics": list(names), "timeout_ms": self.request_timeout_ms}
        resp = await self._controller_request(ApiKey.DELETE_TOPICS, body)
        _raise_first(resp.body.get("topics") or (), "delete topic")
        await self._cluster.refresh_metadata(body["topics"])

    async def delete_topic(self, name: str) -> None:
        await self.delete_topics([name])

    async def list_topics(self, *, internal: bool = False) -> list[str]:
        """Names of all topics (internal ones only when asked)."""
        await self._cluster.refresh_metadata()
        return sorted(
            name
            for name, t in self._cluster.metadata.topics.items()
            if t.error == ErrorCode.NONE and (internal or not t.internal)
        )

    async def list_topic_listings(self, *, internal: bool = False) -> list[TopicListing]:
        """Every topic with its partition count and replication factor, from one
        Metadata request (no offsets: cheap on thousands of partitions)."""
        await self._cluster.refresh_metadata()
        out = []
        for name, t in sorted(self._cluster.metadata.topics.items()):
            if t.error != ErrorCode.NONE or (t.internal and not internal):
                continue
            first = min(t.partitions, key=lambda p: p.partition, default=None)
            rf = len(first.replicas) - len(first.adding_replicas) if first is not None else 0
            out.append(TopicListing(name, t.internal, len(t.partitions), rf))
        return out

    async def describe_topics(self, names: Iterable[str]) -> dict[str, TopicDescription]:
        """Leaders, replicas and ISR per partition, with log start and end offsets."""
        names = list(names)
        resp = await self._cluster.request_any(
            ApiKey.METADATA, {"topics": names, "allow_auto_create": False}
        )
        _raise_first(resp.body.get("topics") or (), "describe topic")
        await self._cluster.refresh_metadata(names)
        parts: dict[str, list[PartitionInfo]] = {}
        for name in names:
            info = self._cluster.metadata.topics.get(name)
            if info is None:
                raise self._cluster.topic_error(name)
            parts[name] = info.partitions
        tps = [(n, p.partition) for n, ps in parts.items() for p in ps]
        starts = await self._cluster.list_offsets(dict.fromkeys(tps, -2)) if tps else {}
        ends = await self._cluster.list_offsets(dict.fromkeys(tps, -1)) if tps else {}
        out = {}
        for name, ps in parts.items():
            info = self._cluster.metadata.topics[name]
            out[name] = TopicDescription(
                name,
                info.internal,
                [
                    PartitionDescription(
                        p.partition,
                        p.leader,
                        p.leader_epoch,
                        p.replicas,
                        p.isr,
                        starts[(name, p.partition)][0],
                        ends[(name, p.partition)][0],
                        p.adding_replicas,
                        p.removing_replicas,
                    )
                    for p in ps
                ],
            )
        return out

    # -- partition reassignment (client/reassignment_admin.py) ----------------------
    async def alter_partition_reassignments(
        self,
        moves: Mapping[TopicPartition, Sequence[int] | None],
        *,
        throttle_bytes_per_sec: int | None = None,
    ) -> None:
        """Move partitions to ``{(topic, partition): target replicas}``; ``None`` as the
        target cancels that partition's move (back to its original replicas).

        All or nothing: ReassignmentError (``.partitions`` names each refused partition)
        and nothing started. ``throttle_bytes_per_sec`` limits reassignment traffic per
        broker (None: unchanged, 0: removed); the controller removes it once no move is
        left. Returns once the moves are started; ``list_partition_reassignments`` and
        ``describe_log_dirs`` follow their progress.
        """
        body = reassignment_admin.alter_body(moves, throttle_bytes_per_sec)
        resp = await self._controller_request(ApiKey.ALTER_PARTITION_REASSIGNMENTS, body)
        reassignment_admin.check_alter_response(resp.body)
        topics = sorted({e["topic"] for e in body["partitions"]})
        if topics:
            await self._cluster.refresh_metadata(topics)

    async def set_reassignment_throttle(self, rate: int) -> None:
        """Bytes/s per broker for reassignment traffic; 0 removes the throttle.

        It applies while moves run: the controller drops it when the last move ends (at
        once if nothing is moving), so start moves with ``throttle_bytes_per_sec``.
        """
        await self.alter_partition_reassignments({}, throttle_bytes_per_sec=rate)

    async def list_partition_reassignments(
        self, partitions: Iterable[TopicPartition] | None = None
    ) -> ReassignmentListing:
        """The partitions moving now (of ``partitions``, or all) and the throttle."""
        body = {"partitions": reassignment_admin.partitions_filter(partitions)}
        resp = await self._controller_request(ApiKey.LIST_PARTITION_REASSIGNMENTS, body)
        return reassignment_admin.parse_listing(resp.body)

    async def describe_log_dirs(
        self, broker_id: int, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, LogDirPartition]:
        """Broker ``broker_id``'s own copies: size on disk, log start and end offsets.

        Partitions without a copy on that broker are left out.
        """
        body = {"partitions": reassignment_admin.partitions_filter(partitions)}
        resp = await self._cluster.request_node(broker_id, ApiKey.DESCRIBE_LOG_DIRS, body)
        return reassignment_admin.parse_log_dirs(resp.body)

    async def elect_leaders(
        self, partitions: Iterable[TopicPartition] | None = None, *, unclean: bool = False
    ) -> dict[TopicPartition, tuple[ErrorCode, str]]:
        """Move leadership back to each partition's preferred (first) replica, or with
        ``unclean`` elect any live replica of leaderless partitions (may lose records).

        Returns ``(code, message)`` per partition: NONE when elected, ELECTION_NOT_NEEDED
        when nothing had to change. Without ``partitions``, only the partitions whose
        leader changed are listed.
        """
        body = {
            "partitions": reassignment_admin.partitions_filter(partitions),
            "election_type": 1 if unclean else 0,
        }
        resp = await self._controller_request(ApiKey.ELECT_LEADERS, body)
        results = reassignment_admin.parse_elections(resp.body)
        elected = sorted({t for (t, _), (code, _) in results.items() if code is ErrorCode.NONE})
        if elected:
            await self._cluster.refresh_metadata(elected)
        return results

    # -- configs ------------------------------------------------------------------
    async def describe_configs(
        self, names: Iterable[str], *, resource_type: str = "topic"
    ) -> dict[str, dict[str, ConfigEntry]]:
        body = {"resources": [{"type": resource_type, "name": str(n)} for n in names]}
        resp = await self._controller_request(ApiKey.DESCRIBE_CONFIGS, body)
        resources = resp.body.get("resources") or []
        _raise_first(resources, f"describe {resource_type} configs", key="name")
        return {
            r["name"]: {
                c["name"]: ConfigEntry(
                    c["name"], c.get("value"), bool(c.get("default")), bool(c.get("read_only"))
                )
                for c in r.get("configs") or ()
            }
            for r in resources
        }

    async def alter_configs(
        self,
        topic: str,
        set: Mapping[str, Any] | None = None,
        delete: Iterable[str] | None = None,
        *,
        validate_only: bool = False,
    ) -> None:
        """Incrementally set and delete (revert to default) topic configs."""
        body = {
            "resources": [
                {
                    "type": "topic",
                    "name": topic,
                    "set": {str(k): str(v) for k, v in (set or {}).items()},
                    "delete": list(delete or ()),
                }
            ],
            "validate_only": validate_only,
        }
        resp = await self._controller_request(ApiKey.ALTER_CONFIGS, body)
        _raise_first(resp.body.get("resources") or (), "alter configs", key="name")

    # -- offsets ------------------------------------------------------------------
    async def list_offsets(
        self, requests: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, tuple[int, int]]:
        """Map ``(topic, partition)`` to -2, -1 or a time; returns ``(offset, timestamp)`` each."""
        return await self._cluster.list_offsets(dict(requests))

    async def delete_records(
        self, offsets: Mapping[TopicPartition, int], *, timeout_ms: int = 30_000
    ) -> dict[TopicPartition, int]:
        """Make records below each offset unreadable (-1: below the high watermark).

        Returns each partition's low watermark: the lowest log start offset among its
        in-sync replicas, which the leader waits to reach before it answers.
        """
        return await self._cluster.delete_records(dict(offsets), timeout_ms)

    # -- consumer groups (client/group_admin.py) -----------------------------------
    async def list_groups(self, states: Iterable[str] | None = None) -> list[GroupListing]:
        """Every consumer group, optionally only those in ``states``."""
        return await group_admin.list_groups(self._cluster, states)

    async def describe_group(self, group_id: str) -> GroupDescription:
        """Members, assignment, committed offset, log end offset and lag per partition."""
        return await group_admin.describe_group(self._cluster, group_id)

    async def delete_group(self, group_id: str) -> None:
        """Delete an empty group and its committed offsets."""
        await group_admin.delete_groups(self._cluster, [group_id])

    async def delete_groups(self, group_ids: Iterable[str]) -> None:
        await group_admin.delete_groups(self._cluster, list(group_ids))

    async def commit_group_offsets(
        self,
        group_id: str,
        offsets: Mapping[TopicPartition, Any],
        metadata: str | None = None,
    ) -> None:
        """Commit ``{(topic, partition): offset}`` for a group with no live members
        (standalone consumers, the Spark source); NON_EMPTY_GROUP otherwise."""
        await group_admin.commit_group_offsets(self._cluster, group_id, offsets, metadata)

    async def alter_group_offsets(
        self,
        group_id: str,
        offsets: Mapping[TopicPartition, Any],
        metadata: str | None = None,
    ) -> None:
        """Reset a group's committed offsets (the group must have no live members)."""
        await group_admin.commit_group_offsets(self._cluster, group_id, offsets, metadata)

    async def group_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        """The group's committed offsets (partitions without a commit are left out)."""
        return await group_admin.group_offsets(self._cluster, group_id, partitions)

    async def delete_group_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition]
    ) -> None:
        await group_admin.delete_group_offsets(self._cluster, group_id, partitions)

    # -- security: ACLs, SCRAM users, client quotas (client/security_admin.py) ------------
    async def create_acls(self, bindings: Iterable[AclBinding]) -> None:
        """Create ACL bindings (one commit on the controller); raises the first refused
        binding's error with the broker's message (INVALID_REQUEST for a binding that can
        never be valid, SECURITY_DISABLED when the broker keeps no ACLs)."""
        body = {"creations": [security_admin.binding_body(b) for b in bindings]}
        if not body["creations"]:
            return
        resp = await self._controller_request(ApiKey.CREATE_ACLS, body)
        security_admin.check_results(
            resp.body.get("results"), len(body["creations"]), "create ACLs"
        )

    async def describe_acls(self, filter: AclBindingFilter | None = None) -> list[AclBinding]:
        """The bindings ``filter`` matches (None: every binding)."""
        f = AclBindingFilter() if filter is None else filter
        resp = await self._cluster.request_any(
            ApiKey.DESCRIBE_ACLS, {"filter": security_admin.filter_body(f)}
        )
        security_admin.raise_if_error(resp.body, "describe ACLs")
        return [security_admin.parse_binding(b) for b in resp.body.get("bindings") or ()]

    async def delete_acls(self, filters: Iterable[AclBindingFilter]) -> list[AclBinding]:
        """Delete every binding any of ``filters`` matches; returns those deleted (once
        each). A filter matching nothing is not an error."""
        body = {"filters": [security_admin.filter_body(f) for f in filters]}
        if not body["filters"]:
            return []
        resp = await self._controller_request(ApiKey.DELETE_ACLS, body)
        results = security_admin.check_results(
            resp.body.get("results"), len(body["filters"]), "delete ACLs"
        )
        return security_admin.parse_deleted(results)

    async def upsert_scram_user(
        self,
        name: str,
        password: str,
        mechanism: str = "SCRAM-SHA-512",
        iterations: int = 4096,
    ) -> None:
        """Create or replace ``name``'s credential for ``mechanism``. The password is
        salted here; only the salt and derived keys reach the broker."""
        cred = security_admin.scram_credential(password, mechanism, iterations)
        body = {"upsertions": [security_admin.scram_upsertion_body(name, cred)], "deletions": []}
        await self._alter_scram(body)

    async def delete_scram_user(self, name: str, mechanism: str | None = None) -> list[str]:
        """Delete ``name``'s credential for ``mechanism`` (None: every mechanism it has);
        returns the mechanisms deleted. RESOURCE_NOT_FOUND when there is none."""
        if mechanism is None:
            users = await self.describe_scram_users([name])
            mechanisms = [c.mechanism for c in users.get(name, ())]
        else:
            mechanisms = [mechanism]
        for m in mechanisms:  # one per request: a user may be named once per request
            await self._alter_scram(
                {"upsertions": [], "deletions": [{"name": name, "mechanism": m}]}
            )
        return mechanisms

    async def _alter_scram(self, body: dict[str, Any]) -> None:
        resp = await self._controller_request(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, body)
        security_admin.raise_if_error(resp.body, "alter SCRAM credentials")
        for r in resp.body.get("results") or ():
            security_admin.raise_if_error(r, f"alter SCRAM user {r.get('user')}")

    async def describe_scram_users(
        self, names: Iterable[str] | None = None
    ) -> dict[str, list[ScramCredentialInfo]]:
        """user -> its credentials' mechanisms and iteration counts (never keys), for
        ``names`` or every user; a named user without credentials raises
        RESOURCE_NOT_FOUND."""
        users = None if names is None else list(names)
        resp = await self._cluster.request_any(
            ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, {"users": users or None}
        )
        return security_admin.parse_scram_users(resp.body)

    async def alter_client_quotas(
        self, entries: Iterable[QuotaAlteration], *, validate_only: bool = False
    ) -> None:
        """Set (a number) or remove (None) quota values per entity; raises the first
        refused entry's error with the broker's message."""
        body = {
            "entries": [security_admin.quota_entry_body(e) for e in entries],
            "validate_only": validate_only,
        }
        if not body["entries"]:
            return
        resp = await self._controller_request(ApiKey.ALTER_CLIENT_QUOTAS, body)
        security_admin.check_results(
            resp.body.get("entries"), len(body["entries"]), "alter client quotas"
        )

    async def describe_client_quotas(
        self, components: Iterable[QuotaFilter] = (), *, strict: bool = False
    ) -> list[QuotaEntry]:
        """The entities every component matches (none: every entity with quotas), with
        their values; ``strict`` leaves out entities with a component of another type."""
        body = {
            "components": [security_admin.component_body(c) for c in components],
            "strict": strict,
        }
        resp = await self._cluster.request_any(ApiKey.DESCRIBE_CLIENT_QUOTAS, body)
        return security_admin.parse_quota_entries(resp.body)

    # -- transactions (client/txn_admin.py) ----------------------------------------------
    async def list_transactions(
        self,
        states: Iterable[str] = (),
        producer_ids: Iterable[int] = (),
        duration_ms: int | None = None,
    ) -> list[TransactionListing]:
        """Every coordinator's transactional ids matching all filters (empty: any);
        ``duration_ms``: only transactions open longer than that."""
        return await txn_admin.list_transactions(
            self._cluster, list(states), list(producer_ids), duration_ms
        )

    async def describe_transactions(self, ids: Iterable[str]) -> list[TransactionDescription]:
        """Each id's state, producer, timeout and partitions from its coordinator; the
        first id that cannot be described raises (TRANSACTIONAL_ID_NOT_FOUND...)."""
        return await txn_admin.describe_transactions(self._cluster, ids)

    async def describe_producers(
        self, topic: str, partitions: Iterable[int] | None = None
    ) -> dict[int, list[ProducerState]]:
        """Active producers of ``topic``'s partitions (None: all) from their leaders, with
        the first offset of each one's open transaction (-1: none)."""
        if partitions is None:
            parts = [p for _, p in await txn_admin.partitions_of(self._cluster, [topic])]
        else:
            parts = list(partitions)
        found = await txn_admin.describe_producers(self._cluster, [(topic, p) for p in parts])
        return {p: found[(topic, p)] for p in sorted(set(parts))}

    async def abort_transaction(
        self,
        topic: str,
        partition: int,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int | None = None,
    ) -> None:
        """End a hanging transaction on one partition with an ABORT marker (its leader
        appends it); needs CLUSTER_ACTION when the authorizer is on."""
        await txn_admin.abort_transaction(
            self._cluster, topic, partition, producer_id, producer_epoch, coordinator_epoch
        )

    async def find_hanging(
        self, topics: Iterable[str] | None = None, max_age_ms: int = DEFAULT_MAX_AGE_MS
    ) -> list[HangingTransaction]:
        """Open transactions on ``topics``' partitions (None: every non-internal topic)
        that no coordinator will end (see client/txn_admin.py)."""
        return await txn_admin.find_hanging(self._cluster, topics, max_age_ms)

    async def complete_transaction(
        self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool
    ) -> None:
        """Commit (``commit=True``) or abort a transaction another client prepared
        (``AsyncProducer.prepare_transaction``); succeeds again for one already completed
        the same way (client/transactions.py)."""
        await complete_transaction(
            self._cluster, transactional_id, producer_id, producer_epoch, commit
        )


def _new_topic_body(t: NewTopic) -> dict[str, Any]:
    body: dict[str, Any] = {
        "topic": t.name,
        "partitions": t.partitions,
        "replication_factor": t.replication_factor,
        "configs": {str(k): str(v) for k, v in (t.configs or {}).items()},
    }
    if t.assignments is not None:
        body["partitions"] = body["replication_factor"] = -1
        body["assignments"] = [
            {"partition": p, "replicas": [int(b) for b in replicas]}
            for p, replicas in enumerate(t.assignments)
        ]
    return body
