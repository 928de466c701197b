"""What a fault run did and saw, and the checker that judges it (sans-IO, pure).

The workload records every produce attempt (who sent which unique value to which
partition, when), its outcome (acknowledged at an offset, definitely failed, or unknown:
a timeout or lost connection after which the record may or may not have been written),
every record a consumer read, the nemesis' faults, and finally a full read of every
partition. ``History.check()`` then looks for the ways a replicated log can break its
promises to Kafka users (see docs/testing.md for the reasoning):

- LOST: an acknowledged value is missing from the final log;
- OFFSET_MISMATCH: an acknowledged value sits at another offset than the ack said;
- DUPLICATE: a value appears at more than one offset (the producer is idempotent);
- ORDER: one producer's acknowledged values in one partition are not in send order;
- DIVERGENT_READ: an offset held two different records during the run: what a consumer
  read there (only ever below the high watermark) differs from another read or from the
  final log, or the final log no longer has it;
- MISPLACED: a value is in another partition than it was sent to;
- UNEXPECTED: a record nobody sent (or a final read that contradicts itself);
- FAILED_PRESENT: a value whose send definitely failed was written anyway.

Nothing here touches a clock, a socket or a thread: times come in as ``now_ms``, so the
checker can be driven by hypothesis with made-up histories as easily as by a real run.
The recorder is not thread-safe; the workload feeds it from one event loop.
"""

from __future__ import annotations

import enum
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

TopicPartition = tuple[str, int]

#: NemesisEvent names: a fault begins / ends.
INJECT = "inject"
HEAL = "heal"

#: Violations listed per kind in a report before the rest are only counted.
REPORT_LIMIT = 10


class Status(enum.Enum):
    PENDING = "pending"  # sent, no outcome yet (unknown if the run ends like that)
    ACKED = "acked"
    FAILED = "failed"  # the client knows it was not written
    UNKNOWN = "unknown"  # timed out or connection lost: written or not, nobody knows


class Kind(enum.Enum):
    LOST = "lost"
    OFFSET_MISMATCH = "offset-mismatch"
    DUPLICATE = "duplicate"
    ORDER = "order"
    DIVERGENT_READ = "divergent-read"
    MISPLACED = "misplaced"
    UNEXPECTED = "unexpected"
    FAILED_PRESENT = "failed-present"


@dataclass(slots=True)
class Attempt:
    """One produce call. ``seq`` orders one client's attempts as they were sent."""

    id: int
    client: str
    seq: int
    topic: str
    partition: int
    value: bytes
    sent_ms: int
    status: Status = Status.PENDING
    offset: int | None = None  # the acknowledged offset (None: acked without one, acks=0)
    done_ms: int | None = None
    error: str | None = None

    @property
    def tp(self) -> TopicPartition:
        return (self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class Read:
    """A record a consumer received during the run."""

    reader: str
    topic: str
    partition: int
    offset: int
    value: bytes
    at_ms: int


@dataclass(frozen=True, slots=True)
class NemesisEvent:
    at_ms: int
    name: str
    detail: str


@dataclass(slots=True)
class FinalLog:
    """The full read of one partition after the run: offset -> value, plus its bounds."""

    start_offset: int
    end_offset: int
    records: dict[int, bytes]
    conflicts: list[tuple[int, bytes, bytes]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Violation:
    kind: Kind
    topic: str
    partition: int
    offset: int | None
    value: bytes | None
    detail: str

    def __str__(self) -> str:
        where = f"{self.topic}-{self.partition}"
        if self.offset is not None:
            where += f"@{self.offset}"
        shown = "" if self.value is None else f" {show(self.value)}"
        return f"{self.kind.value}: {where}{shown}: {self.detail}"


@dataclass(slots=True)
class CheckResult:
    """A checker's verdict (this module's, and txn_history's with its own kinds)."""

    violations: list[Any]  # Violation, or txn_history's
    stats: dict[str, int]
    label: str = "history"

    @property
    def ok(self) -> bool:
        return not self.violations

    def kinds(self) -> set[Any]:
        return {v.kind for v in self.violations}

    def of_kind(self, kind: Any) -> list[Any]:
        return [v for v in self.violations if v.kind is kind]

    def report(self, limit: int = REPORT_LIMIT) -> str:
        lines = [f"{self.label}: " + ", ".join(f"{k}={v}" for k, v in self.stats.items())]
        if self.ok:
            lines.append("no violations")
            return "\n".join(lines)
        by_kind: dict[Kind, list[Violation]] = defaultdict(list)
        for v in self.violations:
            by_kind[v.kind].append(v)
        lines.append(f"{len(self.violations)} violation(s):")
        for kind in type(self.violations[0].kind):  # in the kinds' declared order
            found = by_kind.get(kind)
            if not found:
                continue
            lines.append(f"  {kind.value}: {len(found)}")
            lines.extend(f"    {v}" for v in found[:limit])
            if len(found) > limit:
                lines.append(f"    ... and {len(found) - limit} more")
        return "\n".join(lines)

    def assert_ok(self) -> None:
        if not self.ok:
            raise AssertionError(self.report())


def show(value: bytes) -> str:
    text = value.decode("utf-8", errors="backslashreplace")
    return repr(text if len(text) <= 40 else text[:37] + "...")


class History:
    """The recorder: append events as they happen, then ``check()``."""

    def __init__(self) -> None:
        self.attempts: list[Attempt] = []
        self.reads: list[Read] = []
        self.nemesis_events: list[NemesisEvent] = []
        self.final: dict[TopicPartition, FinalLog] = {}
        self._by_value: dict[bytes, Attempt] = {}
        self._next_seq: dict[str, int] = defaultdict(int)

    # -- recording ------------------------------------------------------------------
    def attempt(self, client: str, topic: str, partition: int, value: bytes, now_ms: int) -> int:
        """Record a send about to happen; returns its id for the outcome."""
        if value in self._by_value:
            raise ValueError(f"value {show(value)} was already sent: values must be unique")
        seq = self._next_seq[client]
        self._next_seq[client] = seq + 1
        a = Attempt(len(self.attempts), client, seq, topic, partition, value, now_ms)
        self.attempts.append(a)
        self._by_value[value] = a
        return a.id

    def acked(self, attempt_id: int, offset: int | None, now_ms: int) -> None:
        a = self._settle(attempt_id, Status.ACKED, now_ms)
        a.offset = offset if offset is not None and offset >= 0 else None

    def failed(self, attempt_id: int, error: str, now_ms: int) -> None:
        """The send definitely did not write the record (e.g. rejected as invalid)."""
        self._settle(attempt_id, Status.FAILED, now_ms).error = error

    def unknown(self, attempt_id: int, error: str, now_ms: int) -> None:
        """The send may or may not have written the record."""
        self._settle(attempt_id, Status.UNKNOWN, now_ms).error = error

    def _settle(self, attempt_id: int, status: Status, now_ms: int) -> Attempt:
        a = self.attempts[attempt_id]
        if a.status is not Status.PENDING:
            raise ValueError(f"attempt {attempt_id} already has outcome {a.status.value}")
        a.status = status
        a.done_ms = now_ms
        return a

    def read(
        self, reader: str, topic: str, partition: int, offset: int, value: bytes, now_ms: int
    ) -> None:
        self.reads.append(Read(reader, topic, partition, offset, value, now_ms))

    def read_many(
        self,
        reader: str,
        topic: str,
        partition: int,
        records: Iterable[tuple[int, bytes]],
        now_ms: int,
    ) -> None:
        """Record a fetched batch's worth of ``(offset, value)`` pairs at once."""
        self.reads.extend(Read(reader, topic, partition, o, v, now_ms) for o, v in records)

    def nemesis(self, name: str, detail: str, now_ms: int) -> None:
        self.nemesis_events.append(NemesisEvent(now_ms, name, detail))

    def final_read(
        self,
        topic: str,
        partition: int,
        records: Iterable[tuple[int, bytes]],
        *,
        start_offset: int = 0,
        end_offset: int | None = None,
    ) -> None:
        """The full read of one partition after the run, from its start to its end offset."""
        log = FinalLog(start_offset, start_offset, {})
        for offset, value in records:
            seen = log.records.get(offset)
            if seen is None:
                log.records[offset] = value
            elif seen != value:
                log.conflicts.append((offset, seen, value))
        top = max(log.records, default=start_offset - 1) + 1
        log.end_offset = max(top, start_offset) if end_offset is None else end_offset
        self.final[(topic, partition)] = log

    def attempt_of(self, value: bytes) -> Attempt | None:
        return self._by_value.get(value)

    def outstanding(self) -> Iterator[Attempt]:
        return (a for a in self.attempts if a.status is Status.PENDING)

    # -- checking -------------------------------------------------------------------
    def check(self) -> CheckResult:
        """Judge the history; call after every partition had its final read."""
        out: list[Violation] = []
        located = self._locate(out)
        self._check_attempts(located, out)
        self._check_order(located, out)
        self._check_reads(out)
        return CheckResult(out, self._stats(located))

    def _locate(self, out: list[Violation]) -> dict[bytes, list[tuple[TopicPartition, int]]]:
        """Where each value of the final logs is; reports phantoms and self-contradictions."""
        located: dict[bytes, list[tuple[TopicPartition, int]]] = defaultdict(list)
        for tp, log in sorted(self.final.items()):
            for offset, first, second in log.conflicts:
                out.append(
                    Violation(
                        Kind.UNEXPECTED,
                        *tp,
                        offset,
                        second,
                        f"the final read returned two records here ({show(first)} first)",
                    )
                )
            for offset in sorted(log.records):
                value = log.records[offset]
                if offset < log.start_offset or offset >= log.end_offset:
                    out.append(
                        Violation(
                            Kind.UNEXPECTED,
                            *tp,
                            offset,
                            value,
                            f"outside the partition's range [{log.start_offset}, {log.end_offset})",
                        )
                    )
                located[value].append((tp, offset))
                if value not in self._by_value:
                    out.append(Violation(Kind.UNEXPECTED, *tp, offset, value, "nobody sent it"))
        return located

    def _check_attempts(
        self, located: dict[bytes, list[tuple[TopicPartition, int]]], out: list[Violation]
    ) -> None:
        for a in self.attempts:
            log = self.final.get(a.tp)
            where = located.get(a.value, ())
            mine = [o for tp, o in where if tp == a.tp]
            for tp, o in where:
                if tp != a.tp:
                    out.append(
                        Violation(
                            Kind.MISPLACED, *tp, o, a.value, f"{a.client} sent it to {a.partition}"
                        )
                    )
            if len(mine) > 1:
                out.append(
                    Violation(
                        Kind.DUPLICATE,
                        *a.tp,
                        mine[1],
                        a.value,
                        f"also at offset(s) {mine[:1] + mine[2:]}; sent once by {a.client}",
                    )
                )
            if a.status is Status.FAILED and where:
                out.append(
                    Violation(
                        Kind.FAILED_PRESENT,
                        *where[0][0],
                        where[0][1],
                        a.value,
                        f"{a.client}'s send failed ({a.error}) but the record was written",
                    )
                )
            if a.status is not Status.ACKED:
                continue
            if log is None:
                out.append(
                    Violation(
                        Kind.LOST, *a.tp, a.offset, a.value, "acked, but the partition was not read"
                    )
                )
                continue
            if a.offset is not None and a.offset < log.start_offset:
                continue  # deleted by retention: nothing left to compare
            if not mine:
                at = "" if a.offset is None else f" at {a.offset}"
                now = "" if a.offset is None else f"; final log there: {self._final_at(a)}"
                out.append(
                    Violation(
                        Kind.LOST,
                        *a.tp,
                        a.offset,
                        a.value,
                        f"acked{at} to {a.client} at {a.done_ms} ms, missing from the final "
                        f"log{now}",
                    )
                )
            elif a.offset is not None and a.offset not in mine:
                out.append(
                    Violation(
                        Kind.OFFSET_MISMATCH,
                        *a.tp,
                        a.offset,
                        a.value,
                        f"acked at {a.offset} but found at {mine}; final log at {a.offset}: "
                        f"{self._final_at(a)}",
                    )
                )

    def _final_at(self, a: Attempt) -> str:
        value = self.final[a.tp].records.get(a.offset)  # type: ignore[arg-type]
        return "nothing" if value is None else show(value)

    def _check_order(
        self, located: dict[bytes, list[tuple[TopicPartition, int]]], out: list[Violation]
    ) -> None:
        """One producer's acknowledged values of a partition must sit in send order."""
        lanes: dict[tuple[str, TopicPartition], list[Attempt]] = defaultdict(list)
        for a in self.attempts:
            if a.status is Status.ACKED:
                lanes[(a.client, a.tp)].append(a)
        for (client, tp), acked in sorted(lanes.items()):
            prev: tuple[Attempt, int] | None = None
            for a in sorted(acked, key=lambda x: x.seq):
                offsets = [o for t, o in located.get(a.value, ()) if t == tp]
                if not offsets:
                    continue  # lost: reported already
                offset = offsets[0]
                if prev is not None and offset <= prev[1]:
                    out.append(
                        Violation(
                            Kind.ORDER,
                            *tp,
                            offset,
                            a.value,
                            f"{client} sent it after {show(prev[0].value)} "
                            f"(at offset {prev[1]}), but it sits before",
                        )
                    )
                if prev is None or offset > prev[1]:
                    prev = (a, offset)

    def _check_reads(self, out: list[Violation]) -> None:
        """An offset a consumer read (below the HW) never changes, nor disappears."""
        seen: dict[tuple[TopicPartition, int], dict[bytes, Read]] = defaultdict(dict)
        for r in self.reads:
            seen[((r.topic, r.partition), r.offset)].setdefault(r.value, r)
        for (tp, offset), values in sorted(seen.items()):
            log = self.final.get(tp)
            for value, r in values.items():
                if value not in self._by_value:
                    out.append(
                        Violation(
                            Kind.UNEXPECTED,
                            *tp,
                            offset,
                            value,
                            f"{r.reader} read it at {r.at_ms} ms; nobody sent it",
                        )
                    )
            if log is not None and offset < log.start_offset:
                if len(values) > 1:
                    out.append(self._divergent(tp, offset, values, "(deleted since)"))
                continue
            final = None if log is None else log.records.get(offset)
            if final is None:
                out.append(self._divergent(tp, offset, values, "the final log has nothing there"))
            elif len(values) > 1 or final not in values:
                out.append(self._divergent(tp, offset, values, f"final log: {show(final)}"))

    @staticmethod
    def _divergent(
        tp: TopicPartition, offset: int, values: dict[bytes, Read], final: str
    ) -> Violation:
        reads = "; ".join(f"{r.reader} read {show(v)} at {r.at_ms} ms" for v, r in values.items())
        return Violation(Kind.DIVERGENT_READ, *tp, offset, next(iter(values)), f"{reads}; {final}")

    def _stats(self, located: dict[bytes, list[tuple[TopicPartition, int]]]) -> dict[str, int]:
        counts = {s: 0 for s in Status}
        for a in self.attempts:
            counts[a.status] += 1
        unknown_written = sum(
            1 for a in self.attempts if a.status is Status.UNKNOWN and a.value in located
        )
        return {
            "attempts": len(self.attempts),
            "acked": counts[Status.ACKED],
            "failed": counts[Status.FAILED],
            "unknown": counts[Status.UNKNOWN] + counts[Status.PENDING],
            "unknown_written": unknown_written,
            "reads": len(self.reads),
            "final_records": sum(len(log.records) for log in self.final.values()),
            "faults": sum(1 for e in self.nemesis_events if e.name == INJECT),
        }
