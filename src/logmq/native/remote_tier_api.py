"""Handler of DescribeRemoteTier (1001): a broker's view of the remote tier of its
partitions, for ``logmq storage remote status`` and ``logmq topic describe``.

Each broker answers about the copies it holds (the leader's row is the one that copies;
a follower's shows what it has let go locally), from its remote tier's
``status()`` (broker/replica/remote_status.py), so the operator asks every broker and
merges. A broker that does not tier (``remote.log.storage.system.enable=false``) has no
manager and answers ``tiering: false`` with no partitions, not an error: the CLI can
then say which brokers tier. Nothing here touches the store: every figure is in memory
(the metadata image's remote segments, the local logs' sizes), so an answer is cheap
however slow the store is. Body schema in docs/protocol.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from logmq.native.request_fields import InvalidRequestError, req_field, req_int, req_str
from logmq.net.codec import Request
from logmq.net.reply import Reply

if TYPE_CHECKING:
    from logmq.broker.replica.remote_status import RemoteTierStatus
    from logmq.cluster.metadata_image import MetadataImage

TopicPartition = tuple[str, int]

# the fields of a status row the answer carries (remote_status.py partition_status), so a
# field added there for the broker's own use does not become wire format unasked
ROW_FIELDS = (
    "topic",
    "partition",
    "tiered",
    "log_start_offset",
    "local_log_start_offset",
    "local_bytes",
    "remote_segments",
    "remote_bytes",
    "highest_copied_offset",
    "copy_lag_segments",
    "copy_lag_bytes",
    "pending_deletes",
    "corrupt_segments",
    "last_error",
)


def _wanted(body: dict[str, Any]) -> set[TopicPartition] | None:
    """The optional ``partitions: [{"topic", "partition"}]`` filter; None means all."""
    entries = req_field(body, "partitions", list, None)
    if entries is None:
        return None
    return {(req_str(e, "topic"), req_int(e, "partition")) for e in entries}


def _topics(body: dict[str, Any]) -> set[str] | None:
    """The optional ``topics: [str]`` filter (every partition of each); None means all."""
    names = req_field(body, "topics", list, None)
    if names is None:
        return None
    if any(type(n) is not str for n in names):
        raise InvalidRequestError("'topics' must list topic names (strings)")
    return set(names)


class RemoteTierApi:
    """DescribeRemoteTier, answered from this broker's remote log manager.

    ``remote`` is None on a broker that does not tier; ``image`` gives the current
    metadata image (who leads each partition, which topics still exist)."""

    def __init__(self, remote: RemoteTierStatus | None, image: Callable[[], MetadataImage]) -> None:
        self.remote = remote
        self.image = image

    async def describe_remote_tier(self, req: Request) -> Reply:
        wanted, topics = _wanted(req.body), _topics(req.body)
        remote = self.remote
        if remote is None:
            return Reply({"error": 0, "tiering": False, "broker_id": None, "partitions": []})
        image = self.image()
        rows = []
        for status in remote.status():
            key = (status["topic"], status["partition"])
            if wanted is not None and key not in wanted:
                continue
            if topics is not None and key[0] not in topics:
                continue
            part = image.partition(*key)
            if part is None:
                continue  # deleted: its data goes with the topic, not the operator's concern
            row = {name: status.get(name) for name in ROW_FIELDS}
            row["leader"] = part.leader == remote.node_id
            rows.append(row)
        rows.sort(key=lambda r: (r["topic"], r["partition"]))
        return Reply({"error": 0, "tiering": True, "broker_id": remote.node_id, "partitions": rows})
