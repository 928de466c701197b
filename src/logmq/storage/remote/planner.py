"""The remote tier's decisions, sans-IO: what to copy, expire and delete locally.

Kafka's RemoteLogManager runs a copy task and an expiration task per led partition;
here one pure function, ``plan_tier``, looks at a ``TierView`` (the local segments,
the image's remote segments, the offsets, the clock reading, the settings) and
returns a ``TierPlan`` the shell carries out. No I/O, no clock, no tasks: the same
view always gives the same plan, so the rules are tested on their own.

The rules keep one promise above all: every offset in [log start, log end) stays
readable from the local log or from a COPY_FINISHED remote segment. So a local
segment goes only once a finished copy covers it (or it fell below the log start),
expiry removes a prefix of the remote tier and moves the log start past it, and a
copy starts at the first offset the remote tier lacks.

The shell's side of the contract: add a segment id to ``in_flight`` before
publishing its COPY_STARTED (or DELETE_STARTED) and keep it there until the image
shows the outcome; publish ``new_log_start_offset`` before deleting the expired
segments' objects (Kafka's order: a follower that takes over then sees them as
below the log start and deletes them itself).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from logmq.errors import StorageError
from logmq.storage.remote.segment_metadata import RemoteSegment, SegmentState

__all__ = [
    "EMPTY_PLAN",
    "InvalidTierViewError",
    "LocalSegment",
    "TierPlan",
    "TierSettings",
    "TierView",
    "diverged",
    "epochs_in_force",
    "follower_delete_local_up_to",
    "follower_recopy",
    "highest_copied_offset",
    "plan_tier",
    "remote_log_start",
    "segment_for_offset",
    "segment_for_timestamp",
]


class InvalidTierViewError(StorageError):
    """The view handed to the planner contradicts itself (a shell bug, never data)."""


@dataclass(frozen=True, slots=True)
class LocalSegment:
    """One local segment as the planner needs it.

    ``end_offset`` is the last offset in it (inclusive; ``base_offset - 1`` when
    empty). The active segment is the one not ``closed``; it is never copied or
    deleted.
    """

    base_offset: int
    end_offset: int
    size_bytes: int
    max_timestamp: int
    closed: bool


@dataclass(frozen=True, slots=True)
class TierSettings:
    """The topic's tiering and retention settings; -1 means unlimited.

    ``local_retention_*`` arrive resolved (the config helper turns -2 into the
    total's value, and with remote.log.copy.disable into the total's value too).
    ``copy_enabled`` is ``not remote.log.copy.disable``; ``remote_enabled`` is
    remote.storage.enable; ``delete_on_disable`` is remote.log.delete.on.disable.
    """

    copy_enabled: bool = True
    remote_enabled: bool = True
    retention_ms: int = -1
    retention_bytes: int = -1
    local_retention_ms: int = -1
    local_retention_bytes: int = -1
    delete_on_disable: bool = False


@dataclass(frozen=True, slots=True)
class TierView:
    """Everything one plan looks at, read by the shell at one moment.

    ``remote`` is the image's list for the partition (every state); ``in_flight``
    the segment ids this shell is copying or deleting right now. ``leader_epochs`` is
    the local log's leader-epoch cache (epoch, start offset), the lineage remote
    segments are checked against (empty: no check).
    """

    broker_id: int
    leader_epoch: int
    is_leader: bool
    local: Sequence[LocalSegment]
    remote: Sequence[RemoteSegment]
    log_start_offset: int
    local_log_start_offset: int
    high_watermark: int
    last_stable_offset: int
    log_end_offset: int
    in_flight: frozenset[str]
    now_ms: int
    settings: TierSettings
    leader_epochs: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class TierPlan:
    """What the shell does next.

    ``copy``: local segments to copy, oldest first. ``delete_local_up_to``: the new
    local log start (delete the local segments wholly below it). ``expire``:
    COPY_FINISHED segments to delete by retention or the log start. ``orphans``:
    COPY_STARTED segments nobody is copying (a dead or deposed copier): delete.
    ``resume_deletes``: DELETE_STARTED segments nobody is deleting: delete again.
    ``replaced``: segments found corrupt whose offsets a new finished copy holds: delete.
    ``diverged``: finished segments not of the local log's leader-epoch lineage (copied
    by a leader whose records an unclean election truncated): delete, and copy those
    offsets from this log.
    ``new_log_start_offset``: the log start after this plan, when it moves.
    ``copy_gap``: (first, last) offsets at the copy point held by neither tier, an
    already-broken log the shell should report; the copy goes on past it, as
    Kafka's does, since refusing would only stop tiering and fill the disk.
    """

    copy: tuple[LocalSegment, ...] = ()
    delete_local_up_to: int | None = None
    expire: tuple[RemoteSegment, ...] = ()
    orphans: tuple[RemoteSegment, ...] = ()
    resume_deletes: tuple[RemoteSegment, ...] = ()
    replaced: tuple[RemoteSegment, ...] = ()
    diverged: tuple[RemoteSegment, ...] = ()
    new_log_start_offset: int | None = None
    copy_gap: tuple[int, int] | None = None

    @property
    def empty(self) -> bool:
        return self == EMPTY_PLAN


EMPTY_PLAN = TierPlan()

# A replica that does not lead copies a corrupt segment's offsets again (the leader no
# longer has them locally): the leader takes such a copy in its own epoch for live while
# it is this young, then as an orphan of a replica that died mid-copy.
REPLACEMENT_COPY_TIMEOUT_MS = 10 * 60 * 1000

_Runs = list[tuple[int, int]]


def _order(seg: RemoteSegment) -> tuple[int, int, str]:
    return (seg.base_offset, seg.end_offset, seg.segment_id)


def _runs(intervals: Iterable[tuple[int, int]]) -> _Runs:
    """Merge inclusive offset intervals into disjoint, non-adjacent runs, ascending."""
    runs: _Runs = []
    for lo, hi in sorted(i for i in intervals if i[1] >= i[0]):
        if runs and lo <= runs[-1][1] + 1:
            if hi > runs[-1][1]:
                runs[-1] = (runs[-1][0], hi)
        else:
            runs.append((lo, hi))
    return runs


def _covered(runs: _Runs, lo: int, hi: int) -> bool:
    """Whether every offset in [lo, hi] lies in ``runs`` (an empty range always does)."""
    if lo > hi:
        return True
    i = bisect_right(runs, (lo, float("inf"))) - 1
    return i >= 0 and runs[i][1] >= hi


def _readable_runs(
    remote: Iterable[RemoteSegment], from_offset: int, *, corrupt_too: bool = False
) -> _Runs:
    return _runs(
        (max(s.base_offset, from_offset), s.end_offset)
        for s in remote
        if (s.finished if corrupt_too else s.readable) and s.end_offset >= from_offset
    )


def epochs_in_force(
    entries: Iterable[tuple[int, int]], lo: int, hi: int
) -> tuple[tuple[int, int], ...]:
    """The leader-epoch entries in force within offsets [lo, hi]: the one in force at
    ``lo`` (whose start may be earlier) and every one that starts inside (what a copy
    records of its segment, and what the lineage check compares)."""
    out: list[tuple[int, int]] = []
    for epoch, start in entries:
        if start <= lo:
            out = [(epoch, start)]
        elif start <= hi:
            out.append((epoch, start))
    return tuple(out)


def _epochs_within(entries: Iterable[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    """``epochs_in_force`` with the first start clamped to ``lo``."""
    out = list(epochs_in_force(entries, lo, hi))
    if out and out[0][1] < lo:
        out[0] = (out[0][0], lo)
    return out


def diverged(seg: RemoteSegment, epochs: Sequence[tuple[int, int]], log_end: int) -> bool:
    """Whether a finished copy contradicts the local log (Kafka's
    isRemoteSegmentWithinLeaderEpochs): over the offsets this log holds from its
    leader-epoch cache's first entry to its end, the copy's leader epochs must be the
    log's. So a copy of records an unclean election lost is found once the new leader
    has written its own records at those offsets; what lies beyond the log end, or
    below the cache, is never a reason to delete a copy (a log that is only behind the
    tier, or restarted empty, has nothing to contradict it with)."""
    if not epochs:
        return False
    lo = max(seg.base_offset, epochs[0][1])
    hi = min(seg.end_offset, log_end - 1)
    if hi < lo:
        return False
    return _epochs_within(seg.leader_epochs, lo, hi) != _epochs_within(epochs, lo, hi)


def _lineage_split(
    view: TierView, segs: Sequence[RemoteSegment]
) -> tuple[list[RemoteSegment], tuple[RemoteSegment, ...]]:
    """(the segments to plan with, the finished ones of another lineage)."""
    if not view.leader_epochs:
        return list(segs), ()
    bad = tuple(
        s
        for s in segs
        if s.finished
        and s.segment_id not in view.in_flight
        and diverged(s, view.leader_epochs, view.log_end_offset)
    )
    if not bad:
        return list(segs), ()
    gone = {s.segment_id for s in bad}
    return [s for s in segs if s.segment_id not in gone], bad


def _replacing(seg: RemoteSegment, view: TierView) -> bool:
    """A live copy of a corrupt segment's offsets by a replica that does not lead."""
    return (
        seg.state is SegmentState.COPY_STARTED
        and seg.broker_id != view.broker_id
        and seg.copier_epoch == view.leader_epoch
        and view.now_ms - seg.event_ms < REPLACEMENT_COPY_TIMEOUT_MS
    )


# -- helpers over the image's list ---------------------------------------------------


def highest_copied_offset(remote: Iterable[RemoteSegment], log_start_offset: int = 0) -> int:
    """The last offset of the contiguous COPY_FINISHED coverage, -1 if none.

    The coverage starts at the first readable offset at or above ``log_start_offset``
    (segments wholly below it are dead, whatever their state) and ends at the first
    offset no finished segment holds: a finished segment past a hole (a parallel copy
    that finished while an earlier one failed) does not count, since local segments
    in the hole are still uncopied. A segment found corrupt is such a hole.
    """
    runs = _readable_runs(remote, log_start_offset)
    return runs[0][1] if runs else -1


def remote_log_start(remote: Iterable[RemoteSegment], log_start_offset: int = 0) -> int:
    """The first offset of the finished copies (Kafka's remote log start), -1 if none.

    A segment found corrupt counts: its offsets are the log's still, answered
    KAFKA_STORAGE_ERROR until copied again, never skipped as out of range."""
    runs = _readable_runs(remote, log_start_offset, corrupt_too=True)
    return runs[0][0] if runs else -1


def segment_for_offset(remote: Iterable[RemoteSegment], offset: int) -> RemoteSegment | None:
    """The readable segment to serve ``offset`` from, None if none holds it.

    Copies overlap when a new leader, whose local segments rolled elsewhere, copies
    the segment holding the first uncopied offset. The newest copier epoch wins: its
    copy came from the log of the current lineage (after an unclean election an
    older epoch's copy may hold records the log has since truncated) and carries
    the newest leader-epoch entries. Among one epoch's copies the highest base wins
    (the copy nearest the offset, so the least of it is skipped), then the highest
    end, then the segment id: never the list's order, so every broker picks alike.
    """
    best: RemoteSegment | None = None
    best_key: tuple[int, int, int, str] | None = None
    for seg in remote:
        if seg.readable and seg.base_offset <= offset <= seg.end_offset:
            key = (seg.copier_epoch, seg.base_offset, seg.end_offset, seg.segment_id)
            if best_key is None or key > best_key:
                best, best_key = seg, key
    return best


def segment_for_timestamp(
    remote: Iterable[RemoteSegment], timestamp: int, start_offset: int = 0
) -> RemoteSegment | None:
    """The first readable segment (by offset) holding a record at or after ``timestamp``.

    Kafka's ListOffsets over the remote tier: the earliest segment whose max
    timestamp reaches ``timestamp`` and which ends at or above ``start_offset`` (the
    log start); the caller then searches its time index. Ties on the base go to the
    newest copier epoch, as in ``segment_for_offset``.
    """
    best: RemoteSegment | None = None
    best_key: tuple[int, int, int, str] | None = None
    for seg in remote:
        if seg.readable and seg.end_offset >= start_offset and seg.max_timestamp >= timestamp:
            key = (seg.base_offset, -seg.copier_epoch, seg.end_offset, seg.segment_id)
            if best_key is None or key < best_key:
                best, best_key = seg, key
    return best


# -- the plan ------------------------------------------------------------------------


def plan_tier(view: TierView, max_copies: int = 1) -> TierPlan:
    """Decide the next copies, expiries and local deletion for a led partition.

    ``max_copies`` bounds ``copy`` (the shell passes its free copy slots). A broker
    that does not lead the partition plans nothing: the leader alone owns the tier.
    """
    if max_copies < 0:
        raise InvalidTierViewError(f"max_copies must be >= 0, got {max_copies}")
    if not view.is_leader:
        return EMPTY_PLAN
    _check(view)
    settings = view.settings
    segs = sorted(view.remote, key=_order)
    in_flight = view.in_flight
    orphans = tuple(
        s
        for s in segs
        if s.state is SegmentState.COPY_STARTED
        and s.segment_id not in in_flight
        and not _replacing(s, view)
    )
    resume = tuple(
        s for s in segs if s.state is SegmentState.DELETE_STARTED and s.segment_id not in in_flight
    )
    log_start = view.log_start_offset

    if not settings.remote_enabled:
        # KIP-950: turning tiering off either drops the remote data with the log start
        # moving to the local one, or keeps it untouched; local retention is then the
        # classic one's (retention.py), not ours.
        if not settings.delete_on_disable:
            return TierPlan(orphans=orphans, resume_deletes=resume)
        expire = tuple(s for s in segs if s.finished and s.segment_id not in in_flight)
        new_start = max(log_start, view.local_log_start_offset)
        return TierPlan(
            expire=expire,
            orphans=orphans,
            resume_deletes=resume,
            new_log_start_offset=new_start if new_start > log_start else None,
        )

    segs, other_lineage = _lineage_split(view, segs)
    expired, new_start = _expire(view, segs)
    gone = {s.segment_id for s in expired}
    kept = [s for s in segs if s.readable and s.segment_id not in gone]
    kept_runs = _runs((s.base_offset, s.end_offset) for s in kept)
    copy_off = not settings.copy_enabled
    up_to, moved = _local_retention(view, kept_runs, new_start, move_start=copy_off)
    if moved > new_start:
        # Copy disabled: the local log lost offsets the remote tier never had, so the
        # log start jumps past them and whatever remote data lies below goes too.
        new_start = moved
        extra = [s for s in kept if s.end_offset < new_start and s.segment_id not in in_flight]
        expired = tuple(sorted((*expired, *extra), key=_order))

    copies: tuple[LocalSegment, ...] = ()
    gap = None
    if settings.copy_enabled and max_copies > 0:
        copies, gap = _copies(view, segs, new_start, max_copies)
    gone = {s.segment_id for s in expired}
    replaced = tuple(
        s
        for s in segs
        if s.corrupt
        and s.finished
        and s.segment_id not in gone
        and s.segment_id not in in_flight
        and _covered(kept_runs, s.base_offset, s.end_offset)
    )
    return TierPlan(
        copy=copies,
        delete_local_up_to=up_to,
        expire=expired,
        orphans=orphans,
        resume_deletes=resume,
        replaced=replaced,
        diverged=other_lineage,
        new_log_start_offset=new_start if new_start > log_start else None,
        copy_gap=gap,
    )


def follower_delete_local_up_to(view: TierView) -> int | None:
    """Local retention on a follower: the new local log start, None to keep all.

    Kafka's followers delete copied local segments too (they learn the highest
    copied offset from the image), but never move the log start: only segments a
    finished copy covers, or wholly below the leader's log start, go, whatever
    remote.log.copy.disable says. None when tiering is off (classic retention's).
    """
    if not view.settings.remote_enabled:
        return None
    _check(view)
    live, _ = _lineage_split(view, view.remote)
    runs = _runs((s.base_offset, s.end_offset) for s in live if s.readable)
    up_to, _ = _local_retention(view, runs, view.log_start_offset, move_start=False)
    return up_to


def follower_recopy(view: TierView, grace_ms: int) -> tuple[LocalSegment, ...]:
    """The local segments a follower copies again for segments found corrupt.

    A corrupt segment no finished copy replaces is a hole the leader fills from its
    own log if it still has the offsets; ``grace_ms`` after the segment was marked
    (its ``event_ms``) with neither a replacement in progress nor a finished one, the
    leader has not, and a follower whose closed local segments hold all of its
    offsets below its high watermark (so they are committed, the leader's own) copies
    them. The controller lets the first replica to start do it (remote_segments.py).
    """
    if view.is_leader or not view.settings.remote_enabled:
        return ()
    _check(view)
    readable = _runs((s.base_offset, s.end_offset) for s in view.remote if s.readable)
    busy = [s for s in view.remote if s.state is SegmentState.COPY_STARTED]
    closed = [
        seg
        for seg in view.local[:-1]
        if seg.closed and seg.end_offset >= seg.base_offset and seg.end_offset < view.high_watermark
    ]
    held = _runs((seg.base_offset, seg.end_offset) for seg in closed)
    out: dict[int, LocalSegment] = {}
    for bad in view.remote:
        if not (bad.corrupt and bad.finished) or view.now_ms - bad.event_ms < grace_ms:
            continue
        lo, hi = bad.base_offset, bad.end_offset
        if hi < view.log_start_offset or _covered(readable, lo, hi):
            continue
        if any(s.base_offset <= hi and s.end_offset >= lo for s in busy):
            continue  # being copied again (by us: in flight; by another: the first wins)
        if not _covered(held, lo, hi):
            continue
        for seg in closed:
            if seg.base_offset <= hi and seg.end_offset >= lo:
                out[seg.base_offset] = seg
    return tuple(out[k] for k in sorted(out))


def _check(view: TierView) -> None:
    prev: LocalSegment | None = None
    for seg in view.local:
        if seg.end_offset < seg.base_offset - 1 or seg.size_bytes < 0:
            raise InvalidTierViewError(f"bad local segment {seg}")
        if prev is not None:
            if not prev.closed:
                raise InvalidTierViewError("only the last local segment may be active")
            if seg.base_offset <= prev.end_offset:
                raise InvalidTierViewError(f"local segments overlap or disorder: {prev}, {seg}")
        prev = seg


def _expire(view: TierView, segs: list[RemoteSegment]) -> tuple[tuple[RemoteSegment, ...], int]:
    """Remote retention (Kafka's cleanupExpiredRemoteLogSegments): (expired, new start).

    Walks finished segments oldest first and stops at the first it keeps, so what
    remains stays contiguous. A segment wholly below the log start (DeleteRecords)
    goes whatever the settings; one whose max timestamp is at least retention.ms old
    goes; otherwise one goes while the bytes of both tiers (remote finished bytes
    plus local bytes not yet copied) minus it stay >= retention.bytes. A segment in
    flight stops the walk: its fate is being decided right now.
    """
    settings = view.settings
    log_start = view.log_start_offset
    in_flight = view.in_flight
    finished = [s for s in segs if s.readable]
    breach = 0
    if settings.retention_bytes >= 0:
        copied = highest_copied_offset(finished, log_start)
        total = sum(s.size_bytes for s in finished)
        total += sum(seg.size_bytes for seg in view.local if seg.end_offset > copied)
        breach = max(0, total - settings.retention_bytes)
    cutoff = view.now_ms - settings.retention_ms
    by_time = settings.retention_ms >= 0 and cutoff >= 0
    expired: list[RemoteSegment] = []
    new_start = log_start
    for seg in segs:
        if seg.state is not SegmentState.COPY_FINISHED:
            if seg.state is SegmentState.COPY_STARTED and seg.segment_id in in_flight:
                break
            continue
        if seg.segment_id in in_flight:
            break
        if seg.end_offset < log_start:
            expired.append(seg)
            continue
        if by_time and seg.max_timestamp <= cutoff:
            breach = max(0, breach - seg.size_bytes)
        elif breach > 0 and breach - seg.size_bytes >= 0:
            breach -= seg.size_bytes
        else:
            break
        expired.append(seg)
        new_start = max(new_start, seg.end_offset + 1)
    # A kept segment nested below the new start (an overlapping copy) is dead too.
    gone = {s.segment_id for s in expired}
    expired += [
        s
        for s in segs
        if s.finished
        and s.end_offset < new_start
        and s.segment_id not in gone
        and s.segment_id not in in_flight
    ]
    return tuple(sorted(expired, key=_order)), new_start


def _local_retention(
    view: TierView, runs: _Runs, log_start: int, *, move_start: bool
) -> tuple[int | None, int]:
    """Local retention over the tiered log: (new local log start or None, log start).

    Kafka's deleteOldSegments with local.retention.ms / local.retention.bytes: each
    rule deletes a prefix of the closed segments, the result is the longest. With
    copying on, a segment is eligible only when finished copies cover it or it lies
    wholly below the log start, so an uncopied segment never goes however full the
    disk. With ``move_start`` (copy disabled, on the leader) any committed segment is
    eligible, and the log start moves past offsets no remote segment holds.
    """
    settings = view.settings
    local = view.local
    closed = 0
    while closed < len(local) - 1 and local[closed].closed:
        closed += 1  # the last segment is the active one even if the view says closed

    def eligible(seg: LocalSegment) -> bool:
        if seg.end_offset < log_start:
            return True
        if move_start:
            return seg.end_offset < view.high_watermark
        return _covered(runs, max(seg.base_offset, log_start), seg.end_offset)

    def prefix(keep_going) -> int:
        n = 0
        while n < closed and eligible(local[n]) and keep_going(n):
            n += 1
        return n

    n = prefix(lambda i: local[i].end_offset < log_start)
    if settings.local_retention_ms >= 0:
        limit_ms = settings.local_retention_ms
        n = max(n, prefix(lambda i: view.now_ms - local[i].max_timestamp > limit_ms))
    if settings.local_retention_bytes >= 0:
        limit = settings.local_retention_bytes
        sizes = [seg.size_bytes for seg in local]
        left = sum(sizes)
        after = []  # local bytes left once segments 0..i are gone
        for size in sizes[:closed]:
            left -= size
            after.append(left)
        n = max(n, prefix(lambda i: after[i] >= limit))
    if n == 0:
        return None, log_start
    up_to = local[n].base_offset
    if move_start:
        first = max(local[0].base_offset, log_start)
        if not _covered(runs, first, local[n - 1].end_offset):
            return up_to, max(log_start, up_to)
    return up_to, log_start


def _copies(
    view: TierView, segs: list[RemoteSegment], log_start: int, max_copies: int
) -> tuple[tuple[LocalSegment, ...], tuple[int, int] | None]:
    """The next segments to copy (Kafka's candidateLogSegments), and any hole met.

    Copying starts at the first offset at or above the log start that neither a
    finished copy nor one of ours in flight holds, from the local segment holding
    it (which may overlap the remote tier: a new leader's segments roll elsewhere).
    Only closed segments wholly below min(high watermark, last stable offset) go, so
    no record of an undecided transaction reaches the tier; a segment those copies
    already cover wholly is skipped rather than copied twice.
    """
    limit = min(view.high_watermark, view.last_stable_offset)
    held = _runs(
        (s.base_offset, s.end_offset)
        for s in segs
        if s.readable
        or (
            s.state is SegmentState.COPY_STARTED
            and (s.segment_id in view.in_flight or _replacing(s, view))
        )
    )
    start = log_start
    i = bisect_right(held, (start, float("inf"))) - 1
    if i >= 0 and held[i][1] >= start:
        start = held[i][1] + 1
    out: list[LocalSegment] = []
    gap = None
    first = True
    for seg in view.local:
        if seg.end_offset < start:
            continue
        if first and seg.base_offset > start:
            gap = (start, seg.base_offset - 1)
        first = False
        if not seg.closed or seg.end_offset >= limit:
            break
        if seg.end_offset < seg.base_offset:
            continue  # an empty segment: nothing to copy
        if _covered(held, max(seg.base_offset, log_start), seg.end_offset):
            continue
        out.append(seg)
        if len(out) >= max_copies:
            break
    return tuple(out), gap
