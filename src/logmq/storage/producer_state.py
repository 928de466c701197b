"""Idempotent-producer sequence tracking for one partition (sans-IO).

Each producer id keeps its epoch and the metadata of its last five batches, which
is enough to recognise a retried batch (answer with the original offsets instead of
writing it twice) and to reject gaps. The state is rebuilt from batch headers only,
starting from the latest snapshot, so recovery never decodes records.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import msgpack

from logmq.errors import (
    InvalidProducerEpochError,
    OutOfOrderSequenceError,
    TransactionCoordinatorFencedError,
)
from logmq.storage.batch import ATTR_CONTROL, NO_SEQUENCE, BatchHeader
from logmq.storage.batch_scan import (
    R_ATTRIBUTES,
    R_BASE_OFFSET,
    R_BASE_SEQUENCE,
    R_LAST_OFFSET_DELTA,
    R_MAX_TIMESTAMP,
    R_PRODUCER_EPOCH,
    R_PRODUCER_ID,
    HeaderRow,
)
from logmq.storage.checkpoint import read_small
from logmq.storage.txn_state import TxnPartitionState

log = logging.getLogger(__name__)

MAX_CACHED_BATCHES = 5
SNAPSHOT_SUFFIX = ".snapshot"
_SEQ_MOD = 1 << 31


@dataclass(slots=True, frozen=True)
class BatchMetadata:
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int


@dataclass(slots=True)
class ProducerEntry:
    producer_id: int
    epoch: int
    batches: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=MAX_CACHED_BATCHES))
    last_timestamp: int = -1
    # the coordinator epoch of the last marker written for this producer: a marker from
    # an older coordinator (one that lost its __transaction_state partition but has not
    # noticed) is refused, as in Kafka
    coordinator_epoch: int = -1

    def copy(self) -> ProducerEntry:
        e = ProducerEntry(
            self.producer_id,
            self.epoch,
            last_timestamp=self.last_timestamp,
            coordinator_epoch=self.coordinator_epoch,
        )
        e.batches.extend(self.batches)
        return e


class ProducerStateManager:
    def __init__(self) -> None:
        self.producers: dict[int, ProducerEntry] = {}
        # the partition's open transactions and its LSO (txn_state.py): snapshotted
        # with the producers, as Kafka's producer snapshot carries each producer's
        # current transaction
        self.txn = TxnPartitionState()
        # KIP-890's verification guards (in memory only: a new leader verifies afresh):
        # producer id -> the token of its verifications in flight, dropped by the
        # producer's next marker, so an append verified before a marker cannot open a
        # transaction after it
        self.verifications: dict[int, object] = {}

    def start_verification(self, producer_id: int) -> object:
        """The guard a verification of ``producer_id``'s batch takes before it asks the
        coordinator (shared by concurrent ones: a producer pipelines its requests)."""
        token = self.verifications.get(producer_id)
        if token is None:
            token = self.verifications[producer_id] = object()
        return token

    def verified(self, producer_id: int, epoch: int, token: object) -> bool:
        """May a transactional batch of ``producer_id`` verified with ``token`` be
        appended now? Yes while its transaction is open here; otherwise only if no
        marker of the producer came since the verification began."""
        txn = self.txn
        if producer_id in txn.ongoing and txn.epochs.get(producer_id) == epoch:
            return True
        return self.verifications.get(producer_id) is token

    def check(
        self, h: BatchHeader, pending: dict[int, ProducerEntry] | None = None
    ) -> BatchMetadata | None:
        """Validate ``h`` against the producer's state (plus ``pending`` staged batches).

        Returns the original metadata if ``h`` is a retry of a cached batch, None if it
        may be appended; raises InvalidProducerEpochError / OutOfOrderSequenceError.
        """
        if h.producer_id < 0:
            return None
        entry = (pending or {}).get(h.producer_id) or self.producers.get(h.producer_id)
        if entry is None:
            return None  # unknown producer (new, or its state expired): accept
        if h.producer_epoch < entry.epoch:
            raise InvalidProducerEpochError(
                f"producer {h.producer_id} epoch {h.producer_epoch} is older than {entry.epoch}"
            )
        if h.attributes & ATTR_CONTROL or h.base_sequence < 0:
            # a transaction marker, or a batch written without a sequence (a coordinator's
            # own): nothing to deduplicate or order it by
            return None
        if h.producer_epoch > entry.epoch:
            if h.base_sequence != 0:
                raise OutOfOrderSequenceError(
                    f"producer {h.producer_id} new epoch {h.producer_epoch} must start at "
                    f"sequence 0, got {h.base_sequence}"
                )
            return None
        for m in entry.batches:
            if m.first_seq == h.base_sequence and m.last_seq == h.last_sequence:
                return m
        if entry.batches:
            expected = (entry.batches[-1].last_seq + 1) % _SEQ_MOD
            if h.base_sequence != expected:
                raise OutOfOrderSequenceError(
                    f"producer {h.producer_id} expected sequence {expected}, got {h.base_sequence}"
                )
        return None

    def stage(self, h: BatchHeader, first_offset: int, pending: dict[int, ProducerEntry]) -> None:
        """Record an accepted batch in ``pending`` (committed after the write succeeds)."""
        if h.producer_id < 0:
            return
        entry = pending.get(h.producer_id)
        if entry is None:
            cur = self.producers.get(h.producer_id)
            entry = cur.copy() if cur else ProducerEntry(h.producer_id, h.producer_epoch)
            pending[h.producer_id] = entry
        if h.producer_epoch != entry.epoch:
            entry.epoch = h.producer_epoch
            entry.batches.clear()
        if h.attributes & ATTR_CONTROL or h.base_sequence < 0:
            return  # a marker moves the epoch (an abort may fence) but has no sequence
        entry.batches.append(
            BatchMetadata(
                h.base_sequence, h.last_sequence, first_offset, first_offset + h.last_offset_delta
            )
        )
        entry.last_timestamp = max(entry.last_timestamp, h.max_timestamp)

    def check_marker(
        self, producer_id: int, coordinator_epoch: int, pending: dict[int, ProducerEntry]
    ) -> None:
        """A leader's marker for ``producer_id`` from a coordinator of
        ``coordinator_epoch``: refuse one older than the last marker's, then stage the
        epoch (call before ``stage``)."""
        entry = pending.get(producer_id) or self.producers.get(producer_id)
        if entry is not None and coordinator_epoch < entry.coordinator_epoch:
            raise TransactionCoordinatorFencedError(
                f"marker for producer {producer_id} from coordinator epoch "
                f"{coordinator_epoch}, older than {entry.coordinator_epoch}"
            )

    def note_marker(
        self, producer_id: int, coordinator_epoch: int, pending: dict[int, ProducerEntry] | None
    ) -> None:
        """A marker for ``producer_id`` was written (leader: staged in ``pending``;
        follower and recovery: ``pending`` None): remember its coordinator epoch."""
        entry = (pending or self.producers).get(producer_id)
        if entry is not None and coordinator_epoch > entry.coordinator_epoch:
            entry.coordinator_epoch = coordinator_epoch

    def commit(self, pending: dict[int, ProducerEntry]) -> None:
        self.producers.update(pending)

    def replay(self, h: BatchHeader) -> None:
        """Apply a batch header already in the log (recovery, follower appends)."""
        if h.producer_id < 0:
            return
        entry = self.producers.get(h.producer_id)
        if entry is not None and h.producer_epoch < entry.epoch:
            return
        pending: dict[int, ProducerEntry] = {}
        self.stage(h, h.base_offset, pending)
        self.commit(pending)

    def replay_rows(self, rows: Iterable[HeaderRow]) -> None:
        """``replay`` for many batches (``batch_scan`` rows, in log order) at once.

        Recovery replays every idempotent batch since the last snapshot; only each
        producer's last five batches of its latest epoch are kept, so only those become
        BatchMetadata.
        """
        recent: dict[int, deque[HeaderRow]] = {}
        producers = self.producers
        for r in rows:
            pid = r[R_PRODUCER_ID]
            if pid < 0:
                continue
            epoch = r[R_PRODUCER_EPOCH]
            entry = producers.get(pid)
            if entry is None:
                entry = producers[pid] = ProducerEntry(pid, epoch)
            elif epoch < entry.epoch:
                continue
            elif epoch != entry.epoch:
                entry.epoch = epoch
                entry.batches.clear()
                recent.pop(pid, None)
            if r[R_ATTRIBUTES] & ATTR_CONTROL or r[R_BASE_SEQUENCE] < 0:
                continue  # a marker, or an unsequenced batch: its epoch counts, no sequence
            q = recent.get(pid)
            if q is None:
                q = recent[pid] = deque(maxlen=MAX_CACHED_BATCHES)
            q.append(r)
            if r[R_MAX_TIMESTAMP] > entry.last_timestamp:
                entry.last_timestamp = r[R_MAX_TIMESTAMP]
        for pid, q in recent.items():
            batches = producers[pid].batches
            for r in q:
                seq, first, delta = r[R_BASE_SEQUENCE], r[R_BASE_OFFSET], r[R_LAST_OFFSET_DELTA]
                last_seq = NO_SEQUENCE if seq < 0 else (seq + delta) % _SEQ_MOD
                batches.append(BatchMetadata(seq, last_seq, first, first + delta))

    def clear(self) -> None:
        self.producers.clear()
        self.txn = TxnPartitionState()
        self.verifications.clear()

    # -- snapshots ------------------------------------------------------------------------

    def to_bytes(self, offset: int) -> bytes:
        rows = [
            [
                e.producer_id,
                e.epoch,
                e.last_timestamp,
                [[m.first_seq, m.last_seq, m.first_offset, m.last_offset] for m in e.batches],
                e.coordinator_epoch,
            ]
            for e in self.producers.values()
        ]
        txn = self.txn.to_snapshot(offset)
        return msgpack.packb({"offset": offset, "producers": rows, "txn": txn})

    def load_bytes(self, data: bytes) -> int:
        doc = msgpack.unpackb(data)
        self.producers.clear()
        for pid, epoch, ts, batches, *more in doc["producers"]:
            # the coordinator epoch is absent from snapshots written before transactions
            e = ProducerEntry(
                pid, epoch, last_timestamp=ts, coordinator_epoch=int(more[0]) if more else -1
            )
            e.batches.extend(BatchMetadata(*m) for m in batches)
            self.producers[pid] = e
        offset = int(doc["offset"])
        txn = doc.get("txn")  # absent from snapshots written before transactions
        if txn is None:
            self.txn = TxnPartitionState(offset)
        else:
            self.txn = TxnPartitionState.from_snapshot(txn)
        return offset


def snapshot_path(directory: Path, offset: int) -> Path:
    return directory / f"{offset:020d}{SNAPSHOT_SUFFIX}"


def list_snapshots(directory: Path, names: Iterable[str] | None = None) -> list[int]:
    """Snapshot offsets, ascending; ``names``: the directory's listing, if already read."""
    out = []
    for name in os.listdir(directory) if names is None else names:
        if name.endswith(SNAPSHOT_SUFFIX) and name[:20].isdigit():
            out.append(int(name[:20]))
    return sorted(out)


def load_latest_snapshot(
    directory: Path,
    state: ProducerStateManager,
    max_offset: int,
    names: Iterable[str] | None = None,
) -> int:
    """Load the newest readable snapshot at or below ``max_offset``; returns its offset or -1."""
    for off in reversed(list_snapshots(directory, names)):
        if off > max_offset:
            continue
        try:
            name = f"{off:020d}{SNAPSHOT_SUFFIX}"
            return state.load_bytes(read_small(os.path.join(directory, name)))
        except (OSError, ValueError, KeyError, TypeError, msgpack.UnpackException) as e:
            log.warning("ignoring unreadable producer snapshot %d: %s", off, e)
    state.clear()
    return -1


def delete_snapshots(
    directory: Path,
    *,
    above: int | None = None,
    below: int | None = None,
    names: Iterable[str] | None = None,
) -> None:
    """Remove snapshots with offset > ``above`` or < ``below``."""
    for off in list_snapshots(directory, names):
        if (above is not None and off > above) or (below is not None and off < below):
            snapshot_path(directory, off).unlink(missing_ok=True)
