"""What a consume-transform-produce run did and saw, and the checker that judges it.

Sans-IO and pure, like history.py: every time comes in as a number of milliseconds on
one clock shared by the test and its worker processes (``time.monotonic()`` is the
system-wide CLOCK_MONOTONIC on Linux, so times logged by different processes compare).

The workload (tests/faults/txn_worker.py): an input topic holds N unique values; K
workers, each a read_committed group consumer plus a transactional producer, take a
few input records per transaction, write ``output_value(value, worker, attempt)`` for
each to the output topic, add the consumed positions with send_offsets_to_transaction
and commit. A worker logs every transaction attempt (its inputs; ``commit-called``
just *before* it calls commit_transaction; the outcome), append+flush, so a kill -9
keeps what was logged. The test adds what read_committed consumers of the output
received during the run, periodic samples of each output partition's last stable
offset (LSO) and high watermark (HW) from one sequential poller, the coordinators'
final transaction states, and a final read of the output in both isolation levels.

The final read_uncommitted view holds every record any transaction wrote; the final
read_committed view is the broker's verdict: an attempt's records are committed if
read_committed returns them, aborted if only read_uncommitted does (the run ends with
LSO == HW, checked, so nothing is still open). ``check()`` reports:

- ABORTED_READ: a read_committed consumer got a record of a transaction that did not
  commit (the final views say it aborted, or its worker's abort_transaction returned);
- LOST: an input value with no committed output, or a commit the worker saw
  acknowledged whose records are not visible to read_committed;
- DUPLICATE: an input value with outputs committed by two transactions, or one
  output record at two offsets;
- PARTIAL: a transaction whose records are only partly visible to read_committed;
- EARLY_READ: a record read with read_committed before its worker called
  commit_transaction (the read's time is at or after the record became visible, the
  ``commit-called`` time at or before the call), or committed although its worker
  never called commit. Visible before the commit was *acknowledged* is legal: a
  coordinator answers EndTxn once the outcome is decided and markers may land first.
- LSO_BACKWARDS: a partition's LSO sample lower than an earlier one;
- HANGING: an LSO stuck below the HW at one offset for longer than the hang limit
  (the earliest open transaction there neither committed nor aborted), a transaction
  still open at the end in a coordinator, or an output partition ending with LSO < HW;
- UNEXPECTED: a record nobody could have written, an attempt that is not in any
  worker log, or views that contradict each other.
"""

from __future__ import annotations

import enum
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tests.faults.history import CheckResult

TopicPartition = tuple[str, int]

#: Transaction states in which a coordinator has not finished a transaction yet.
OPEN_STATES = frozenset({"Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence"})
SEPARATOR = "|"


class Outcome(enum.Enum):
    PENDING = "pending"  # begun; the log says nothing more (the worker died, or the run ended)
    COMMITTED = "committed"  # commit_transaction returned
    ABORTED = "aborted"  # abort_transaction returned
    UNKNOWN = "unknown"  # a fatal error after which the worker cannot tell


class Kind(enum.Enum):
    ABORTED_READ = "aborted-read"
    LOST = "lost"
    DUPLICATE = "duplicate"
    PARTIAL = "partial"
    EARLY_READ = "early-read"
    LSO_BACKWARDS = "lso-backwards"
    HANGING = "hanging"
    UNEXPECTED = "unexpected"


def output_value(value: str, worker: str, attempt: str) -> bytes:
    """The output record a worker writes for ``value`` in transaction ``attempt``."""
    for part in (value, worker, attempt):
        if SEPARATOR in part:
            raise ValueError(f"{part!r} contains {SEPARATOR!r}")
    return f"{value}{SEPARATOR}{worker}{SEPARATOR}{attempt}".encode()


def parse_output(raw: bytes) -> tuple[str, str, str] | None:
    """(input value, worker, attempt) of an output record; None if malformed."""
    try:
        parts = raw.decode().split(SEPARATOR)
    except UnicodeDecodeError:
        return None
    return (parts[0], parts[1], parts[2]) if len(parts) == 3 else None


@dataclass(slots=True)
class Attempt:
    """One transaction a worker began."""

    id: str
    worker: str
    inputs: tuple[str, ...]
    begin_ms: int
    commit_called_ms: int | None = None
    outcome: Outcome = Outcome.PENDING
    done_ms: int | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Read:
    """A record a read_committed consumer of the output received during the run."""

    reader: str
    topic: str
    partition: int
    offset: int
    value: bytes
    at_ms: int


@dataclass(frozen=True, slots=True)
class LsoSample:
    topic: str
    partition: int
    lso: int
    hw: int
    at_ms: int


@dataclass(frozen=True, slots=True)
class Violation:
    kind: Kind
    detail: str
    attempt: str | None = None
    where: str | None = None  # "topic-partition@offset"

    def __str__(self) -> str:
        at = "".join(f" {x}" for x in (self.where, self.attempt) if x)
        return f"{self.kind.value}:{at}: {self.detail}"


@dataclass(slots=True)
class _Final:
    committed: dict[TopicPartition, dict[int, bytes]] = field(default_factory=dict)
    uncommitted: dict[TopicPartition, dict[int, bytes]] = field(default_factory=dict)
    states: dict[str, str] | None = None  # transactional id -> coordinator state
    offsets: dict[TopicPartition, tuple[int, int]] = field(default_factory=dict)  # (lso, hw)


def _where(tp: TopicPartition, offset: int) -> str:
    return f"{tp[0]}-{tp[1]}@{offset}"


class TxnHistory:
    """The recorder: feed it events (or worker log lines), then ``check()``."""

    def __init__(self, inputs: Iterable[str] = ()) -> None:
        self.inputs: set[str] = set(inputs)
        self.attempts: dict[str, Attempt] = {}
        self.reads: list[Read] = []
        self.lso_samples: list[LsoSample] = []
        self.nemesis_events: list[tuple[int, str]] = []
        self.final = _Final()
        self.problems: list[Violation] = []  # found while recording (bad log lines ...)

    # -- recording ------------------------------------------------------------------
    def begin(self, attempt: str, worker: str, inputs: Iterable[str], now_ms: int) -> None:
        if attempt in self.attempts:
            raise ValueError(f"attempt {attempt!r} began twice")
        self.attempts[attempt] = Attempt(attempt, worker, tuple(inputs), now_ms)

    def commit_called(self, attempt: str, now_ms: int) -> None:
        self.attempts[attempt].commit_called_ms = now_ms

    def committed(self, attempt: str, now_ms: int) -> None:
        self._settle(attempt, Outcome.COMMITTED, now_ms, None)

    def aborted(self, attempt: str, now_ms: int, error: str | None = None) -> None:
        self._settle(attempt, Outcome.ABORTED, now_ms, error)

    def unknown(self, attempt: str, now_ms: int, error: str | None = None) -> None:
        self._settle(attempt, Outcome.UNKNOWN, now_ms, error)

    def _settle(self, attempt: str, outcome: Outcome, now_ms: int, error: str | None) -> None:
        a = self.attempts[attempt]
        if a.outcome is not Outcome.PENDING:
            raise ValueError(f"attempt {attempt!r} already {a.outcome.value}")
        a.outcome, a.done_ms, a.error = outcome, now_ms, error

    def read(
        self, reader: str, topic: str, partition: int, offset: int, value: bytes, now_ms: int
    ) -> None:
        """A read_committed consumer of the output received this record at ``now_ms``."""
        self.reads.append(Read(reader, topic, partition, offset, value, now_ms))

    def lso(self, topic: str, partition: int, lso: int, hw: int, now_ms: int) -> None:
        """One sample from the (single, sequential) poller: samples of a partition must
        be fed in the order their requests were made, each after the previous answer."""
        self.lso_samples.append(LsoSample(topic, partition, lso, hw, now_ms))

    def nemesis(self, detail: str, now_ms: int) -> None:
        self.nemesis_events.append((now_ms, detail))

    def final_read(
        self,
        topic: str,
        partition: int,
        committed: Iterable[tuple[int, bytes]],
        uncommitted: Iterable[tuple[int, bytes]],
    ) -> None:
        """The output partition read whole after the run, in both isolation levels."""
        tp = (topic, partition)
        for view, records in (
            (self.final.committed, committed),
            (self.final.uncommitted, uncommitted),
        ):
            got = view.setdefault(tp, {})
            for offset, value in records:
                seen = got.setdefault(offset, value)
                if seen != value:
                    self.problems.append(
                        Violation(
                            Kind.UNEXPECTED,
                            f"one read returned {seen!r} and {value!r} at one offset",
                            where=_where(tp, offset),
                        )
                    )

    def final_state(
        self,
        states: Mapping[str, str],
        offsets: Mapping[TopicPartition, tuple[int, int]],
    ) -> None:
        """The coordinators' states of the run's transactional ids, and each output
        partition's (LSO, HW), once the workers stopped."""
        self.final.states = dict(states)
        self.final.offsets = dict(offsets)

    def apply_log(self, lines: Iterable[str]) -> None:
        """Feed one worker's JSON-lines log (txn_worker.py). A last line cut short by a
        kill -9 is ignored; a bad line anywhere else is reported."""
        lines = list(lines)
        for n, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                ev = json.loads(line)
                self._apply(ev)
            except (ValueError, KeyError, TypeError) as e:
                if n == len(lines) - 1 and not line.endswith("\n"):
                    continue  # the write a kill -9 interrupted
                self.problems.append(Violation(Kind.UNEXPECTED, f"bad log line {line!r}: {e}"))

    def _apply(self, ev: dict) -> None:
        kind, t = ev["ev"], int(ev["t"])
        if kind == "begin":
            self.begin(ev["txn"], str(ev["worker"]), [str(v) for v in ev["inputs"]], t)
        elif kind == "commit-called":
            self.commit_called(ev["txn"], t)
        elif kind == "committed":
            self.committed(ev["txn"], t)
        elif kind == "aborted":
            self.aborted(ev["txn"], t, ev.get("error"))
        elif kind == "unknown":
            self.unknown(ev["txn"], t, ev.get("error"))
        # other events (start, init, error, exit) are for people reading the log

    # -- checking -------------------------------------------------------------------
    def check(self, hang_limit_ms: int) -> CheckResult:
        """Judge the run; ``hang_limit_ms``: the longest an LSO may stay stuck below the
        HW (transaction.timeout.ms, plus the coordinator's timeout check interval, plus
        the longest fault that can stop a transaction from ending)."""
        out = list(self.problems)
        by_attempt = self._locate(out)
        verdict = self._verdicts(by_attempt, out)
        self._check_inputs(by_attempt, verdict, out)
        self._check_reads(verdict, out)
        self._check_lso(hang_limit_ms, out)
        self._check_final_state(out)
        return CheckResult(out, self._stats(verdict), "txn history")

    def _locate(self, out: list[Violation]) -> dict[str, dict[str, list]]:
        """attempt -> {"all": [(tp, offset, value)], "committed": [...]} from the final
        views; reports records that cannot be, and views that disagree."""
        found: dict[str, dict[str, list]] = defaultdict(lambda: {"all": [], "committed": []})
        for tp, records in sorted(self.final.uncommitted.items()):
            for offset, value in sorted(records.items()):
                parsed = self._parse(value, tp, offset, out)
                if parsed is not None:
                    found[parsed[2]]["all"].append((tp, offset, value))
        for tp, records in sorted(self.final.committed.items()):
            every = self.final.uncommitted.get(tp, {})
            for offset, value in sorted(records.items()):
                if every.get(offset) != value:
                    out.append(
                        Violation(
                            Kind.UNEXPECTED,
                            f"read_committed returned {value!r}, read_uncommitted "
                            f"{every.get(offset)!r}",
                            where=_where(tp, offset),
                        )
                    )
                    continue
                parsed = self._parse(value, tp, offset, [])
                if parsed is not None:
                    found[parsed[2]]["committed"].append((tp, offset, value))
        return found

    def _parse(
        self, value: bytes, tp: TopicPartition, offset: int, out: list[Violation]
    ) -> tuple[str, str, str] | None:
        parsed = parse_output(value)
        if parsed is None:
            out.append(Violation(Kind.UNEXPECTED, f"malformed {value!r}", where=_where(tp, offset)))
            return None
        value_in, worker, attempt = parsed
        a = self.attempts.get(attempt)
        if a is None:
            out.append(
                Violation(
                    Kind.UNEXPECTED, "no worker logged this attempt", attempt, _where(tp, offset)
                )
            )
        elif a.worker != worker or value_in not in a.inputs:
            out.append(
                Violation(
                    Kind.UNEXPECTED,
                    f"{value!r} is not an output of {a.worker}'s attempt (inputs {a.inputs})",
                    attempt,
                    _where(tp, offset),
                )
            )
        return parsed

    def _verdicts(self, by_attempt: dict[str, dict[str, list]], out: list[Violation]) -> dict:
        """attempt -> True (committed), False (aborted) or None (wrote nothing), as the
        final views say; checked against what each worker was told."""
        verdict: dict[str, bool | None] = {}
        for attempt_id, a in sorted(self.attempts.items()):
            got = by_attempt.get(attempt_id, {"all": [], "committed": []})
            every, visible = got["all"], got["committed"]
            if visible and len(visible) < len(every):
                shown = {(tp, o) for tp, o, _ in visible}
                hidden = [_where(tp, o) for tp, o, _ in every if (tp, o) not in shown]
                out.append(
                    Violation(
                        Kind.PARTIAL,
                        f"{len(visible)} of its {len(every)} records visible to read_committed"
                        f"; hidden: {hidden[:5]}",
                        attempt_id,
                    )
                )
            verdict[attempt_id] = bool(visible) if every else None
            if a.outcome is Outcome.COMMITTED and not visible:
                out.append(
                    Violation(
                        Kind.LOST,
                        f"{a.worker}'s commit was acknowledged at {a.done_ms} ms, but none of "
                        f"its records is visible to read_committed ({len(every)} written)",
                        attempt_id,
                    )
                )
            if a.outcome is Outcome.ABORTED and visible:
                out.append(
                    Violation(
                        Kind.ABORTED_READ,
                        f"{a.worker}'s abort was acknowledged at {a.done_ms} ms, but "
                        f"{len(visible)} of its records are visible to read_committed",
                        attempt_id,
                        _where(visible[0][0], visible[0][1]),
                    )
                )
            if visible and a.commit_called_ms is None:
                out.append(
                    Violation(
                        Kind.EARLY_READ,
                        f"committed, but {a.worker} never called commit_transaction for it",
                        attempt_id,
                        _where(visible[0][0], visible[0][1]),
                    )
                )
        for attempt_id in by_attempt.keys() - self.attempts.keys():
            verdict[attempt_id] = bool(by_attempt[attempt_id]["committed"])
        return verdict

    def _check_inputs(
        self, by_attempt: dict[str, dict[str, list]], verdict: dict, out: list[Violation]
    ) -> None:
        committed_by: dict[str, list[str]] = defaultdict(list)
        for attempt_id, got in sorted(by_attempt.items()):
            seen: dict[bytes, str] = {}
            for tp, offset, value in got["committed"]:
                if value in seen:
                    out.append(
                        Violation(
                            Kind.DUPLICATE,
                            f"{value!r} is also at {seen[value]}",
                            attempt_id,
                            _where(tp, offset),
                        )
                    )
                    continue
                seen[value] = _where(tp, offset)
                committed_by[value.decode().split(SEPARATOR)[0]].append(attempt_id)
        for value in sorted(self.inputs):
            attempts = sorted(set(committed_by.get(value, ())))
            if not attempts:
                tried = [a.id for a in self.attempts.values() if value in a.inputs]
                out.append(
                    Violation(
                        Kind.LOST,
                        f"input {value!r} has no committed output (attempts: {tried[:6]}, "
                        f"outcomes: {[self.attempts[t].outcome.value for t in tried[:6]]})",
                    )
                )
            elif len(attempts) > 1:
                out.append(
                    Violation(
                        Kind.DUPLICATE,
                        f"input {value!r} was output by committed transactions {attempts}",
                        attempts[1],
                    )
                )
        for value in sorted(committed_by.keys() - self.inputs):
            out.append(Violation(Kind.UNEXPECTED, f"{value!r} is no input value"))

    def _check_reads(self, verdict: dict, out: list[Violation]) -> None:
        """Each record a read_committed consumer received during the run: the final views
        must have it there, committed, and its commit must have been called before."""
        reported: set[tuple[Kind, str]] = set()
        for r in self.reads:
            tp = (r.topic, r.partition)
            where = _where(tp, r.offset)
            parsed = parse_output(r.value)
            attempt_id = parsed[2] if parsed is not None else None
            final_all = self.final.uncommitted.get(tp, {}).get(r.offset)
            final_visible = self.final.committed.get(tp, {}).get(r.offset)
            if final_all != r.value:
                out.append(
                    Violation(
                        Kind.UNEXPECTED,
                        f"{r.reader} read {r.value!r} at {r.at_ms} ms; the final log has "
                        f"{final_all!r} there",
                        attempt_id,
                        where,
                    )
                )
                continue
            if attempt_id is None:
                continue  # malformed: reported by _locate
            lso = self.final.offsets.get(tp, (None, None))[0]
            if lso is not None and r.offset >= lso:
                continue  # the final read_committed could not judge it (reported as hanging)
            a = self.attempts.get(attempt_id)
            if final_visible is None and (attempt_id, "aborted") not in reported:
                reported.add((attempt_id, "aborted"))
                told = "" if a is None else f" (its worker was told: {a.outcome.value})"
                out.append(
                    Violation(
                        Kind.ABORTED_READ,
                        f"{r.reader} read it at {r.at_ms} ms with read_committed, but the "
                        f"transaction aborted{told}",
                        attempt_id,
                        where,
                    )
                )
            if (
                a is not None
                and a.commit_called_ms is not None
                and r.at_ms < a.commit_called_ms
                and (attempt_id, "early") not in reported
            ):
                reported.add((attempt_id, "early"))
                out.append(
                    Violation(
                        Kind.EARLY_READ,
                        f"{r.reader} read it at {r.at_ms} ms; {a.worker} called "
                        f"commit_transaction at {a.commit_called_ms} ms",
                        attempt_id,
                        where,
                    )
                )

    def _check_lso(self, hang_limit_ms: int, out: list[Violation]) -> None:
        by_tp: dict[TopicPartition, list[LsoSample]] = defaultdict(list)
        for s in self.lso_samples:
            by_tp[(s.topic, s.partition)].append(s)
        for tp, samples in sorted(by_tp.items()):
            highest: LsoSample | None = None
            stuck: LsoSample | None = None  # first sample of the current stuck LSO
            reported_stuck = False
            for s in samples:
                if highest is not None and s.lso < highest.lso:
                    out.append(
                        Violation(
                            Kind.LSO_BACKWARDS,
                            f"LSO {s.lso} at {s.at_ms} ms after {highest.lso} at "
                            f"{highest.at_ms} ms",
                            where=_where(tp, s.lso),
                        )
                    )
                if highest is None or s.lso > highest.lso:
                    highest = s
                if s.lso >= s.hw or (stuck is not None and s.lso != stuck.lso):
                    stuck, reported_stuck = (None if s.lso >= s.hw else s), False
                    continue
                if stuck is None:
                    stuck = s
                elif s.at_ms - stuck.at_ms > hang_limit_ms and not reported_stuck:
                    reported_stuck = True
                    out.append(
                        Violation(
                            Kind.HANGING,
                            f"LSO stuck at {s.lso} below the HW from {stuck.at_ms} ms to "
                            f"{s.at_ms} ms (HW now {s.hw}; limit {hang_limit_ms} ms)",
                            where=_where(tp, s.lso),
                        )
                    )

    def _check_final_state(self, out: list[Violation]) -> None:
        for txn_id, state in sorted((self.final.states or {}).items()):
            if state in OPEN_STATES:
                out.append(
                    Violation(
                        Kind.HANGING, f"transactional id {txn_id!r} is still {state} at the end"
                    )
                )
        for tp, (lso, hw) in sorted(self.final.offsets.items()):
            if lso != hw:
                out.append(
                    Violation(
                        Kind.HANGING,
                        f"the output ends with LSO {lso} != HW {hw}",
                        where=_where(tp, lso),
                    )
                )

    def _stats(self, verdict: dict) -> dict[str, int]:
        outcomes = {o: 0 for o in Outcome}
        for a in self.attempts.values():
            outcomes[a.outcome] += 1
        return {
            "inputs": len(self.inputs),
            "attempts": len(self.attempts),
            "committed": outcomes[Outcome.COMMITTED],
            "aborted": outcomes[Outcome.ABORTED],
            "unknown": outcomes[Outcome.UNKNOWN],
            "pending": outcomes[Outcome.PENDING],
            "committed_by_broker": sum(1 for v in verdict.values() if v),
            "aborted_by_broker": sum(1 for v in verdict.values() if v is False),
            "output_records": sum(len(r) for r in self.final.uncommitted.values()),
            "visible_records": sum(len(r) for r in self.final.committed.values()),
            "live_reads": len(self.reads),
            "lso_samples": len(self.lso_samples),
            "faults": len(self.nemesis_events),
        }
