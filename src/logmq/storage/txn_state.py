"""The partition side of transactions (sans-IO): open transactions, the LSO, aborts.

A read_committed consumer may only read below the last stable offset (LSO) and must
learn which fetched batches belong to aborted transactions. Both follow from batch
headers alone, plus the one record of each control batch (the COMMIT/ABORT marker):

* a transactional data batch (attribute 0x10) opens its producer's transaction if
  none is open, at the batch's base offset;
* a marker (control batch, 0x20, key = version int16 + type int16, value = version
  int16 + coordinator epoch int32) closes it. An ABORT of a transaction that had data
  here yields the ``AbortedTxn`` the caller appends to the txn index of the segment
  holding the marker; a marker for a producer with no open transaction (the
  coordinator writes markers to every partition of a transaction, with data or not)
  changes nothing.

An entry's ``last_stable_offset`` is Kafka's: the first offset of the earliest
transaction still open once this one is aborted, else the marker's offset + 1. Kafka
derives it from the partition's open transactions alone (not from the HW), so the
state computes it itself and a rebuild from the log yields the very same entries; the
caller supplies nothing. The txn index relies on it to stop scanning early.

The LSO follows Kafka: a transaction stays unstable until its marker is below the
high watermark (a marker that is not replicated yet may still be truncated away, which
reopens the transaction), so ``lso(hw)`` is min(hw, first offset of every transaction
that is open or whose marker is at or after hw). ``on_high_watermark`` forgets the
ended transactions the HW has passed.

Epochs: a transactional batch or marker older than the newest epoch seen for its
producer is ignored. The leader refuses those (a fenced producer's late writes); on
replay and on followers they can only come from a zombie, whose transaction the
coordinator will never end, so opening one would hold the LSO back for good.

Recovery and truncation rebuild the state: ``from_snapshot`` (or an empty state) and
then ``replay_rows`` over the ``batch_scan`` rows after the snapshot, per batch, never
per record. The snapshot carries the open transactions, as Kafka's producer snapshot
carries each producer's current transaction's first offset.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

import msgpack

from logmq.errors import CorruptRecordError, ErrorCode, LogMQError
from logmq.storage import batch as b
from logmq.storage import records_codec
from logmq.storage.batch_scan import (
    R_ATTRIBUTES,
    R_BASE_OFFSET,
    R_LAST_OFFSET_DELTA,
    R_POS,
    R_PRODUCER_EPOCH,
    R_PRODUCER_ID,
    HeaderRow,
)
from logmq.storage.txn_index import AbortedTxn

CONTROL_ABORT = 0
CONTROL_COMMIT = 1
CONTROL_KEY_VERSION = 0
END_TXN_MARKER_VERSION = 0
SNAPSHOT_VERSION = 1

_CONTROL_KEY = struct.Struct(">hh")  # version, type
_END_TXN_VALUE = struct.Struct(">hi")  # version, coordinator epoch
_TXN_OR_CONTROL = b.ATTR_TRANSACTIONAL | b.ATTR_CONTROL

ControlTypes = Mapping[int, int] | Callable[[HeaderRow], int]


class ControlRecord(NamedTuple):
    type: int  # CONTROL_ABORT, CONTROL_COMMIT, or another (non-transaction) control type
    coordinator_epoch: int  # -1 for types that are not transaction markers


class TxnSnapshotError(LogMQError, ValueError):
    """A transaction snapshot that cannot be read: use an older one or replay more."""

    code = ErrorCode.CORRUPT_MESSAGE


# -- control records ----------------------------------------------------------------


def is_control(attributes: int, producer_id: int) -> bool:
    """Whether ``on_batch`` needs the batch's control type (decode it with
    ``control_record``): a control batch with a producer id."""
    return bool(attributes & b.ATTR_CONTROL) and producer_id >= 0


def control_record(buf: Any, pos: int = 0, *, verify: bool = True) -> ControlRecord:
    """Decode the single record of the control batch at ``pos``.

    ``verify`` checks the batch (length, CRC) first; pass False only for a batch
    already validated. Any malformation raises CorruptRecordError saying what.
    """
    if verify:
        h = b.validate(buf, pos, contiguous=False)
    else:
        if len(buf) - pos < b.HEADER_SIZE:
            raise CorruptRecordError("truncated control batch header")
        h = b.read_header(buf, pos)
    where = f"control batch at offset {h.base_offset}"
    if not h.attributes & b.ATTR_CONTROL:
        raise CorruptRecordError(f"batch at offset {h.base_offset} is not a control batch")
    if h.record_count != 1:
        raise CorruptRecordError(f"{where} holds {h.record_count} records, not 1")
    rows = b.decode_rows(buf, pos, h)
    if len(rows) != 1:
        raise CorruptRecordError(f"{where} decodes to {len(rows)} records, not 1")
    key, value = rows[0][2], rows[0][3]
    if key is None or len(key) < _CONTROL_KEY.size:
        raise CorruptRecordError(f"{where}: control key is shorter than 4 bytes")
    version, ctype = _CONTROL_KEY.unpack_from(key)
    if version < 0:
        raise CorruptRecordError(f"{where}: invalid control key version {version}")
    if ctype not in (CONTROL_ABORT, CONTROL_COMMIT):
        return ControlRecord(ctype, -1)
    if value is None or len(value) < _END_TXN_VALUE.size:
        raise CorruptRecordError(f"{where}: end-transaction marker value is shorter than 6 bytes")
    vversion, coordinator_epoch = _END_TXN_VALUE.unpack_from(value)
    if vversion < 0:
        raise CorruptRecordError(f"{where}: invalid end-transaction marker version {vversion}")
    # Later versions only append fields, so they read as version 0 (as in Kafka).
    return ControlRecord(ctype, coordinator_epoch)


def encode_control_batch(
    control_type: int,
    *,
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int = 0,
    timestamp: int = 0,
    base_offset: int = 0,
    leader_epoch: int = -1,
) -> bytes:
    """A COMMIT/ABORT marker batch (transactional + control, no sequence)."""
    key = _CONTROL_KEY.pack(CONTROL_KEY_VERSION, control_type)
    value = _END_TXN_VALUE.pack(END_TXN_MARKER_VERSION, coordinator_epoch)
    return b.assemble(
        records_codec.encode_rows([(0, 0, key, value, None)]),
        count=1,
        last_offset_delta=0,
        first_timestamp=timestamp,
        max_timestamp=timestamp,
        attributes=b.ATTR_CONTROL | b.ATTR_TRANSACTIONAL,
        base_offset=base_offset,
        leader_epoch=leader_epoch,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=b.NO_SEQUENCE,
    )


def control_types_in(buf: Any, rows: Iterable[HeaderRow], origin: int = 0) -> dict[int, int]:
    """``{base_offset: control type}`` of the control rows among ``rows``, read from
    ``buf`` (which holds row ``r`` at ``r[R_POS] - origin``, as ``scan_batches`` with
    that ``origin`` reports). The batches must be validated already."""
    out = {}
    for r in rows:
        if is_control(r[R_ATTRIBUTES], r[R_PRODUCER_ID]):
            out[r[R_BASE_OFFSET]] = control_record(buf, r[R_POS] - origin, verify=False).type
    return out


# -- the state ------------------------------------------------------------------------


class TxnPartitionState:
    """Open transactions of one partition, fed every batch in log order.

    ``ongoing``: producer id -> first offset of its open transaction, in increasing
    first-offset order (insertion order is log order). ``epochs``: producer id -> the
    newest epoch seen on its transactional batches and markers. ``ended``: (marker
    offset, producer id, first offset) of transactions ended by a marker at or after
    ``high_watermark``, in marker order. ``next_offset``: just past the last batch
    applied (or the snapshot's offset).
    """

    __slots__ = ("ended", "epochs", "high_watermark", "next_offset", "ongoing")

    def __init__(self, next_offset: int = 0) -> None:
        self.ongoing: dict[int, int] = {}
        self.epochs: dict[int, int] = {}
        self.ended: deque[tuple[int, int, int]] = deque()
        self.next_offset = next_offset
        self.high_watermark = 0

    # -- appends ----------------------------------------------------------------------

    def on_batch(self, h: b.BatchHeader, control_type: int | None = None) -> AbortedTxn | None:
        """Apply one batch just appended (leader or follower), after its write.

        ``control_type``: for a control batch with a producer id (``is_control``), the
        type its record holds (``control_record(...).type``); ignored otherwise.
        Returns the entry to append to the txn index of the segment holding this
        batch when it is an ABORT that ends a transaction with data here, else None.
        Raises ValueError for a batch below ``next_offset`` (out of log order) or a
        control batch without its type; the state is unchanged then. Batches without
        a producer id change nothing but ``next_offset``, so a caller may skip them.
        """
        return self._checked(
            h.base_offset,
            h.base_offset + h.last_offset_delta,
            h.attributes,
            h.producer_id,
            h.producer_epoch,
            control_type,
        )

    def on_row(self, row: HeaderRow, control_type: int | None = None) -> AbortedTxn | None:
        """``on_batch`` for a ``batch_scan`` row."""
        base = row[R_BASE_OFFSET]
        return self._checked(
            base,
            base + row[R_LAST_OFFSET_DELTA],
            row[R_ATTRIBUTES],
            row[R_PRODUCER_ID],
            row[R_PRODUCER_EPOCH],
            control_type,
        )

    def _checked(
        self, base: int, last: int, attrs: int, pid: int, epoch: int, ctype: int | None
    ) -> AbortedTxn | None:
        if base < self.next_offset:
            raise ValueError(f"batch at offset {base} is below the next offset {self.next_offset}")
        if ctype is None and attrs & b.ATTR_CONTROL and pid >= 0:
            raise ValueError(f"control batch at offset {base} needs its control type")
        return self._apply(base, last, attrs, pid, epoch, ctype)

    def _apply(
        self, base: int, last: int, attrs: int, pid: int, epoch: int, ctype: int | None
    ) -> AbortedTxn | None:
        self.next_offset = last + 1
        if pid < 0 or not attrs & _TXN_OR_CONTROL:
            return None
        known = self.epochs.get(pid, -1)
        if epoch < known:
            return None  # a fenced producer's write: see the module docstring
        if not attrs & b.ATTR_CONTROL:
            if epoch > known:
                self.epochs[pid] = epoch
            if pid not in self.ongoing:
                self.ongoing[pid] = base
            return None
        if ctype != CONTROL_ABORT and ctype != CONTROL_COMMIT:
            return None  # another kind of control record: not about transactions
        if epoch > known:
            self.epochs[pid] = epoch
        first = self.ongoing.pop(pid, None)
        if first is None:
            return None  # no data of this transaction here (or a repeated marker)
        if last >= self.high_watermark:
            self.ended.append((last, pid, first))
        if ctype == CONTROL_COMMIT:
            return None
        # Kafka's value: the first open transaction left, else just past the marker.
        # Every transaction aborted later began at or after it, which lets a fetch stop
        # reading the index there.
        return AbortedTxn(pid, first, last, next(iter(self.ongoing.values()), last + 1))

    def replay_rows(
        self,
        rows: Iterable[HeaderRow],
        control_types: ControlTypes | None = None,
        *,
        high_watermark: int | None = None,
    ) -> list[AbortedTxn]:
        """Apply batches already in the log (recovery, rebuild after truncation).

        ``rows``: ``batch_scan`` rows in log order; rows ending before ``next_offset``
        (covered by the snapshot) are skipped, so the rows of whole segments may be
        passed. Only rows with a producer id matter, so a scan's producer rows suffice.
        ``control_types``: the type of each control row with a producer id, as a
        mapping from its base offset or a callable taking the row; a missing one
        raises ValueError. ``high_watermark``: passed to ``on_high_watermark`` first,
        so transactions ended below it are not kept in ``ended``.
        Returns the AbortedTxn entries in marker order (one per ABORT that ends a
        transaction with data): the txn index entries of the segments replayed.
        """
        if high_watermark is not None:
            self.on_high_watermark(high_watermark)
        out = []
        apply = self._apply
        lookup: Callable[[HeaderRow], int] | None
        if control_types is None or callable(control_types):
            lookup = control_types
        else:
            lookup = _mapping_lookup(control_types)
        for r in rows:
            base = r[R_BASE_OFFSET]
            last = base + r[R_LAST_OFFSET_DELTA]
            if last < self.next_offset:
                continue
            attrs, pid = r[R_ATTRIBUTES], r[R_PRODUCER_ID]
            ctype = None
            if attrs & b.ATTR_CONTROL and pid >= 0:
                if lookup is None:
                    raise ValueError(f"control batch at offset {base} needs its control type")
                ctype = lookup(r)
            e = apply(base, last, attrs, pid, r[R_PRODUCER_EPOCH], ctype)
            if e is not None:
                out.append(e)
        return out

    # -- the LSO ----------------------------------------------------------------------

    def on_high_watermark(self, high_watermark: int) -> None:
        """The HW moved: forget transactions whose marker it passed (they are stable).

        Answers of ``lso(hw)`` stay exact for every hw >= the last value given here.
        """
        self.high_watermark = high_watermark
        ended = self.ended
        while ended and ended[0][0] < high_watermark:
            ended.popleft()

    def first_unstable_offset(self) -> int | None:
        """The first offset of the earliest transaction that is open or whose marker
        is not yet below the last HW given (Kafka's firstUnstableOffset); None if none."""
        first = next(iter(self.ongoing.values()), None)
        for _, _, f in self.ended:
            if first is None or f < first:
                first = f
        return first

    def lso(self, high_watermark: int) -> int:
        """The last stable offset: min(``high_watermark``, first offset of every
        transaction open or ended by a marker at or after ``high_watermark``)."""
        lso = high_watermark
        first = next(iter(self.ongoing.values()), None)
        if first is not None and first < lso:
            lso = first
        for marker, _, f in reversed(self.ended):
            if marker < high_watermark:
                break
            if f < lso:
                lso = f
        return lso

    # -- snapshots --------------------------------------------------------------------

    def to_snapshot(self, offset: int | None = None) -> bytes:
        """msgpack bytes of the state as of ``offset`` (default ``next_offset``; the
        producer snapshot's offset, the log end, when stored beside it)."""
        at = self.next_offset if offset is None else offset
        if at < self.next_offset:
            raise ValueError(f"snapshot offset {at} is below the state's {self.next_offset}")
        return msgpack.packb(
            {
                "v": SNAPSHOT_VERSION,
                "offset": at,
                "hw": self.high_watermark,
                "ongoing": [[p, f] for p, f in self.ongoing.items()],
                "epochs": [[p, e] for p, e in self.epochs.items()],
                "ended": [list(t) for t in self.ended],
            }
        )

    @classmethod
    def from_snapshot(cls, data: bytes) -> TxnPartitionState:
        """The state ``to_snapshot`` saved; ``next_offset`` is the snapshot's offset.
        Raises TxnSnapshotError for anything unreadable."""
        try:
            doc = msgpack.unpackb(data)
            if not isinstance(doc, dict) or doc.get("v") != SNAPSHOT_VERSION:
                version = doc.get("v") if isinstance(doc, dict) else None
                raise TxnSnapshotError(f"unsupported txn snapshot version {version!r}")
            state = cls(_int(doc["offset"]))
            state.high_watermark = _int(doc["hw"])
            ongoing = sorted((_int(f), _int(p)) for p, f in doc["ongoing"])
            state.ongoing = {p: f for f, p in ongoing}
            state.epochs = {_int(p): _int(e) for p, e in doc["epochs"]}
            ended = [(_int(m), _int(p), _int(f)) for m, p, f in doc["ended"]]
            state.ended = deque(sorted(ended))
        except TxnSnapshotError:
            raise
        except (ValueError, KeyError, TypeError, msgpack.UnpackException) as e:
            raise TxnSnapshotError(f"unreadable txn snapshot: {e!r}") from None
        return state

    @classmethod
    def rebuild(
        cls,
        snapshot: bytes | None,
        rows: Iterable[HeaderRow],
        control_types: ControlTypes | None = None,
        *,
        start_offset: int = 0,
        high_watermark: int | None = None,
    ) -> tuple[TxnPartitionState, list[AbortedTxn]]:
        """Recovery and truncation: the snapshot's state (or an empty one at
        ``start_offset``) with ``rows`` replayed; returns it and the aborted entries
        replayed. See ``replay_rows`` for the arguments."""
        state = cls(start_offset) if snapshot is None else cls.from_snapshot(snapshot)
        aborted = state.replay_rows(rows, control_types, high_watermark=high_watermark)
        return state, aborted

    def __repr__(self) -> str:
        return (
            f"TxnPartitionState(next={self.next_offset}, ongoing={self.ongoing}, "
            f"ended={list(self.ended)}, hw={self.high_watermark})"
        )


def _int(v: Any) -> int:
    if type(v) is not int:
        raise TxnSnapshotError(f"expected an integer, got {v!r}")
    return v


def _mapping_lookup(types: Mapping[int, int]) -> Callable[[HeaderRow], int]:
    def lookup(r: HeaderRow) -> int:
        try:
            return types[r[R_BASE_OFFSET]]
        except KeyError:
            raise ValueError(
                f"control batch at offset {r[R_BASE_OFFSET]} has no decoded type"
            ) from None

    return lookup
