"""The tiered-storage parsers the ``remote`` target feeds, and what is a finding in each.

An input's first byte picks the parser (``PARSERS[data[0] % len(PARSERS)]``), the rest is
what that parser reads:

- ``records``: a metadata record batch (a Raft entry) to ``decode_records`` and to the
  streaming ``iter_records`` snapshots use; they must agree (both refuse, or both give
  the same records) and what they give must survive ``encode_records`` unchanged.
- ``snapshot``: a metadata snapshot to ``MetadataImage.from_bytes`` (a follower installs
  one a peer sent); an image it builds must snapshot again to the same records.
- ``manifest``: a remote segment's manifest object to ``Manifest.from_bytes`` (the store
  may hand back any bytes); what parses must round-trip and its chunks cover the log.
- ``epochs``: a ``.epochs`` object to ``decode_leader_epochs``; likewise round-trips.
- ``indexes``: a kind byte, a base offset (8 bytes), a log size (4) and an offset,
  time or txn index object to the reader's parsers, then a few lookups.
- ``alter_request``, ``describe_request``: a msgpack request body, as the native door
  decodes it, to the AlterRemoteSegments (1000) and DescribeRemoteTier (1001) handlers
  (stubs stop them after parsing: the controller check, the in-memory status).
- ``alter_answer``: a count byte and an AlterRemoteSegments answer body to the broker
  side's ``remote_segment_results``.

Each parser's clean errors are the ones its module documents (MetadataCodecError, and
MetadataError for an image; RemoteCorruptionError; InvalidFrameError for a body the
door refuses, InvalidRequestError for a malformed request, LogMQError for an answer
that is not one). Anything else escaping, or a broken property (``Finding``), is a
finding. Kept apart from atheris so the tests replay inputs without it.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from logmq.cluster import metadata_records as mr
from logmq.cluster.metadata_image import EMPTY_IMAGE, MetadataError, MetadataImage
from logmq.errors import ErrorCode, InvalidFrameError, LogMQError, Outcome
from logmq.native.cluster_api import (
    ClusterApi,
    remote_segment_change,
    remote_segment_change_body,
    remote_segment_results,
)
from logmq.native.remote_tier_api import ROW_FIELDS, RemoteTierApi
from logmq.native.request_fields import InvalidRequestError
from logmq.net import codec as native_codec
from logmq.net.codec import ApiKey, Request
from logmq.replication.raft_service import NotLeaderError
from logmq.storage.remote.reader import RemoteReader
from logmq.storage.remote.segment_files import (
    MAX_LOG_SIZE,
    Manifest,
    RemoteCorruptionError,
    decode_leader_epochs,
    encode_leader_epochs,
)
from logmq.storage.txn_index import collect_from

INT64_MAX = (1 << 63) - 1


class Finding(AssertionError):
    """A parser broke a property (no exception of its own, but a wrong answer)."""


def _same(a: Sequence[mr.Record], b: Sequence[mr.Record]) -> bool:
    """Equal records; a NaN quota value is never == itself, so equal encodings count."""
    if list(a) == list(b):
        return True
    return [type(r) for r in a] == [type(r) for r in b] and mr.encode_records(
        a
    ) == mr.encode_records(b)


def _outcome(decode: Callable[[bytes], list[mr.Record]], data: bytes) -> Any:
    try:
        return decode(data)
    except mr.MetadataCodecError as err:
        return err


def records(data: bytes) -> None:
    whole = _outcome(mr.decode_records, data)
    streamed = _outcome(lambda d: list(mr.iter_records(d)), data)
    refused = isinstance(whole, Exception), isinstance(streamed, Exception)
    if refused[0] != refused[1]:
        raise Finding(f"decode_records gave {whole!r:.200} but iter_records {streamed!r:.200}")
    if refused[0]:
        return
    if not _same(whole, streamed):
        raise Finding(f"decode_records gave {whole!r:.200} but iter_records {streamed!r:.200}")
    again = mr.decode_records(mr.encode_records(whole))
    if not _same(again, whole):
        raise Finding(f"{whole!r:.200} encoded and decoded again is {again!r:.200}")


def snapshot(data: bytes) -> None:
    try:
        image = MetadataImage.from_bytes(data, 5)
    except (mr.MetadataCodecError, MetadataError):
        return
    taken = image.to_records()
    again = MetadataImage.from_bytes(image.to_bytes(), 5).to_records()
    if not _same(again, taken):
        raise Finding(f"a snapshot of {taken!r:.200} rebuilds {again!r:.200}")


def manifest(data: bytes) -> None:
    try:
        m = Manifest.from_bytes(data)
    except RemoteCorruptionError:
        return
    again = Manifest.from_bytes(m.to_bytes())
    if again != m:
        raise Finding(f"{m!r:.200} encoded and parsed again is {again!r:.200}")
    if m.chunks:  # the reader fetches chunk_range(k) for every k < chunk_count
        first, last = m.chunk_range(0), m.chunk_range(m.chunk_count - 1)
        if first[0] != 0 or last[1] != m.log_size or not last[0] < last[1]:
            raise Finding(f"chunks {first}..{last} do not cover a log of {m.log_size} bytes")
    elif m.log_size:
        raise Finding(f"no chunks for a log of {m.log_size} bytes")


def epochs(data: bytes) -> None:
    try:
        entries = decode_leader_epochs(data)
    except RemoteCorruptionError:
        return
    again = decode_leader_epochs(encode_leader_epochs(entries))
    if again != entries:
        raise Finding(f"{entries!r:.200} encoded and parsed again is {again!r:.200}")


def indexes(data: bytes) -> None:
    if len(data) < 13:
        return
    kind = data[0] % 3
    base = int.from_bytes(data[1:9], "big") & INT64_MAX
    log_size = int.from_bytes(data[9:13], "big") & MAX_LOG_SIZE
    m = Manifest("s", base, base, 16, log_size, ())  # the parsers read only these two
    body = data[13:]
    try:
        if kind == 0:
            idx = RemoteReader._parse_offsets(body, m)
            for offset in (base, base + 1, base + (1 << 31), base + (1 << 33)):
                idx.lookup(offset)
            idx.lookup_position(log_size)
            idx.last()
        elif kind == 1:
            tidx = RemoteReader._parse_times(body, m)
            for ts in (-(1 << 63), 0, 1 << 40, INT64_MAX):
                tidx.lookup(ts)
            tidx.last()
        else:
            txns = RemoteReader._parse_txns(body, m)
            collect_from(txns, base, base + (1 << 20))
    except RemoteCorruptionError:
        return


class _NotController:
    """A quorum whose broker is not the controller: the handler refuses after parsing."""

    is_controller = False
    controller_id = None


def _run(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a handler that must finish (or raise) without waiting on anything."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise Finding("the handler waited: its stubs should have ended it")


def _body(data: bytes) -> dict[str, Any] | None:
    """The body as the native door hands it over (None: the door refuses it)."""
    try:
        return native_codec.unpack_body(data)
    except InvalidFrameError:
        return None


def alter_request(data: bytes) -> None:
    body = _body(data)
    if body is None:
        return
    req = Request(ApiKey.ALTER_REMOTE_SEGMENTS, 0, 1, "fuzz", body, memoryview(b""))
    try:
        _run(ClusterApi(1, _NotController()).alter_remote_segments(req))  # type: ignore[arg-type]
    except InvalidRequestError:
        return
    except NotLeaderError:
        pass  # every field parsed; the controller check came next
    else:
        raise Finding("a broker that is not the controller ran AlterRemoteSegments")
    for item in body["changes"]:
        change = remote_segment_change(item)
        again = remote_segment_change(remote_segment_change_body(change))
        if again != change:
            raise Finding(f"{change!r:.200} sent and parsed again is {again!r:.200}")


def alter_answer(data: bytes) -> None:
    if not data:
        return
    count, body = data[0], _body(data[1:])
    if body is None:
        return
    try:
        outcomes = remote_segment_results(body, count)
    except LogMQError:
        return
    if len(outcomes) != count:
        raise Finding(f"{len(outcomes)} outcomes of {count} changes")
    for o in outcomes:
        if not (isinstance(o, Outcome) and isinstance(o.error, ErrorCode)):
            raise Finding(f"an outcome that is not one: {o!r:.200}")
        if o.message is not None and not isinstance(o.message, str):
            raise Finding(f"an outcome message that is not a string: {o!r:.200}")


class _Remote:
    """A tiering broker's status rows (remote_status.py), in memory as the handler reads."""

    node_id = 1

    def status(self) -> list[dict[str, Any]]:
        return [
            {**dict.fromkeys(ROW_FIELDS, 0), "topic": t, "partition": p, "last_error": None}
            for t, p in (("t", 0), ("t", 1), ("u", 0), ("gone", 0))
        ]


_IMAGE = EMPTY_IMAGE.apply(
    [
        mr.TopicRecord("t", "0" * 32),
        mr.PartitionRecord("t", 0, (1, 2), (1, 2), 1, 0, 0),
        mr.PartitionRecord("t", 1, (1, 2), (1, 2), 2, 0, 0),
        mr.TopicRecord("u", "1" * 32),
        mr.PartitionRecord("u", 0, (2, 1), (2,), 2, 0, 0),
    ]
)


def describe_request(data: bytes) -> None:
    body = _body(data)
    if body is None:
        return
    req = Request(ApiKey.DESCRIBE_REMOTE_TIER, 0, 1, "fuzz", body, memoryview(b""))
    api = RemoteTierApi(_Remote(), lambda: _IMAGE)  # type: ignore[arg-type]
    try:
        reply = _run(api.describe_remote_tier(req))
    except InvalidRequestError:
        return
    native_codec.pack_body(reply.body)  # the answer must be one the door can send
    rows = reply.body["partitions"]
    if any((r["topic"], r["partition"]) not in {("t", 0), ("t", 1), ("u", 0)} for r in rows):
        raise Finding(f"rows of partitions the image does not hold: {rows!r:.200}")


PARSERS: tuple[Callable[[bytes], None], ...] = (
    records,
    snapshot,
    manifest,
    epochs,
    indexes,
    alter_request,
    alter_answer,
    describe_request,
)
SELECTOR = {f.__name__: i for i, f in enumerate(PARSERS)}


def exercise(data: bytes) -> None:
    """One fuzz input: its first byte picks the parser, the rest is that parser's input."""
    if data:
        PARSERS[data[0] % len(PARSERS)](data[1:])
