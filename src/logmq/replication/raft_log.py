"""The in-memory Raft log and the bookkeeping of what the shell still has to persist/apply.

The metadata log is small and kept bounded by snapshots, so the whole suffix after the
latest snapshot lives in memory. RaftLog remembers which part of it the shell has not yet
been told to persist (``unstable``), which persisted entries a follower had to throw away
(``truncate_from``), a snapshot received from the leader that still has to be installed,
and which committed entries have not yet been handed out for applying.

Index ``i`` of the log lives at ``_entries[i - snapshot.index - 1]``.
"""

from __future__ import annotations

from collections.abc import Sequence

from logmq.replication.raft_messages import Entry, Snapshot, check_entries


class RaftLog:
    def __init__(self, snapshot: Snapshot, entries: Sequence[Entry], commit: int) -> None:
        check_entries(snapshot.index, snapshot.term, entries)
        self.snapshot = snapshot
        self._entries: list[Entry] = list(entries)
        # A persisted commit beyond the persisted log would be a torn write: clamp it.
        self.commit = min(max(commit, snapshot.index), self.last_index)
        self.applied = snapshot.index
        self._unstable_from = self.last_index + 1
        self._truncate_from: int | None = None
        self._snapshot_to_install: Snapshot | None = None

    # -- reading -------------------------------------------------------------------------

    @property
    def first_index(self) -> int:
        return self.snapshot.index + 1

    @property
    def last_index(self) -> int:
        return self.snapshot.index + len(self._entries)

    @property
    def last_term(self) -> int:
        return self._entries[-1].term if self._entries else self.snapshot.term

    def term_at(self, index: int) -> int | None:
        """The term of entry ``index``; None if compacted away or beyond the end."""
        if index == self.snapshot.index:
            return self.snapshot.term
        if index < self.snapshot.index or index > self.last_index:
            return None
        return self._entries[index - self.snapshot.index - 1].term

    def matches(self, index: int, term: int) -> bool:
        return self.term_at(index) == term

    def is_up_to_date(self, last_index: int, last_term: int) -> bool:
        """Raft's voting rule: a candidate's log must be at least as complete as ours."""
        return (last_term, last_index) >= (self.last_term, self.last_index)

    def slice(self, lo: int, hi: int) -> list[Entry]:
        """Entries ``lo..hi`` inclusive; ``lo`` must not be compacted."""
        if lo < self.first_index:
            raise IndexError(f"entry {lo} is compacted (first index {self.first_index})")
        base = self.snapshot.index + 1
        return self._entries[lo - base : min(hi, self.last_index) - base + 1]

    def entry_at(self, index: int) -> Entry:
        return self.slice(index, index)[0]

    def first_index_of_term(self, index: int) -> int:
        """The first index at or before ``index`` holding the same term, not below commit+1.

        A follower returns this on a mismatch so the leader skips a whole conflicting term
        per round trip instead of one entry.
        """
        term = self.term_at(index)
        floor = max(self.commit + 1, self.first_index)
        while index > floor and self.term_at(index - 1) == term:
            index -= 1
        return index

    # -- writing -------------------------------------------------------------------------

    def append(self, entry: Entry) -> None:
        if entry.index != self.last_index + 1:
            raise ValueError(f"entry {entry.index} does not follow {self.last_index}")
        self._entries.append(entry)

    def merge(self, prev_index: int, entries: Sequence[Entry]) -> int:
        """Follower side of AppendRequest once ``prev_index`` is known to match.

        Entries we already hold are skipped (so duplicated or reordered requests never
        truncate anything); the first conflicting one truncates our suffix. Returns the
        last index now known to match the leader.
        """
        for pos, entry in enumerate(entries):
            ours = self.term_at(entry.index)
            if ours == entry.term:
                continue
            if ours is not None:
                self._truncate(entry.index)
            for new in entries[pos:]:
                self.append(new)
            break
        return prev_index + len(entries)

    def _truncate(self, index: int) -> None:
        """Drop entries ``index..`` (a conflicting, never committed suffix)."""
        if index <= self.commit:
            raise RuntimeError(
                f"refusing to truncate committed entry {index} (commit {self.commit})"
            )
        del self._entries[index - self.snapshot.index - 1 :]
        if index < self._unstable_from:
            # Part of what we drop was already handed to the shell: it must delete it too.
            self._truncate_from = (
                index if self._truncate_from is None else min(self._truncate_from, index)
            )
            self._unstable_from = index

    def commit_to(self, index: int) -> bool:
        if index <= self.commit:
            return False
        if index > self.last_index:
            raise ValueError(f"commit {index} beyond last index {self.last_index}")
        self.commit = index
        return True

    def install(self, snapshot: Snapshot) -> None:
        """Replace the whole log by a snapshot received from the leader."""
        self.snapshot = snapshot
        self._entries = []
        self.commit = self.applied = snapshot.index
        self._unstable_from = snapshot.index + 1
        self._truncate_from = None  # installing a snapshot discards the whole persisted log
        self._snapshot_to_install = snapshot

    def compact(self, index: int, data: bytes) -> Snapshot:
        """The state machine took a snapshot at ``index``: forget the entries it covers."""
        if index <= self.snapshot.index:
            raise ValueError(f"snapshot {index} is not newer than {self.snapshot.index}")
        if index > self.applied or index >= self._unstable_from:
            raise ValueError(f"snapshot {index} beyond applied entry {self.applied}")
        term = self.term_at(index)
        assert term is not None
        del self._entries[: index - self.snapshot.index]
        self.snapshot = Snapshot(index=index, term=term, data=data)
        return self.snapshot

    # -- handing work to the shell ---------------------------------------------------------

    def has_work(self) -> bool:
        """Whether anything waits to be persisted or applied."""
        return (
            self.commit > self.applied
            or self.last_index >= self._unstable_from
            or self._truncate_from is not None
            or self._snapshot_to_install is not None
        )

    def take_unstable(self) -> tuple[Snapshot | None, int | None, list[Entry]]:
        """(snapshot to install, truncate persisted entries from, entries to append)."""
        snapshot, truncate_from = self._snapshot_to_install, self._truncate_from
        entries = self.slice(self._unstable_from, self.last_index)
        self._snapshot_to_install = self._truncate_from = None
        self._unstable_from = self.last_index + 1
        return snapshot, truncate_from, entries

    def take_committed(self) -> list[Entry]:
        """Committed entries not yet handed out for applying, in index order."""
        if self.commit <= self.applied:
            return []
        entries = self.slice(self.applied + 1, self.commit)
        self.applied = self.commit
        return entries
