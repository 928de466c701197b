"""A consume-transform-produce worker for the transactional fault tests, in its own process.

Usage: ``python -m tests.faults.txn_worker BOOTSTRAP GROUP INPUT OUTPUT SLOT LOG TXN_SIZE
TXN_TIMEOUT_MS [PACE_MS]``.

A confluent-kafka group consumer (read_committed, no auto-commit) and a transactional
producer whose ``transactional.id`` is ``txn-worker-SLOT``: a worker started again in
the same slot fences its predecessor (a zombie, or a process killed mid-transaction)
and has the coordinator abort what it left open. Per transaction it takes up to
TXN_SIZE input records, writes ``output_value(value, SLOT, attempt)`` for each (keyed
by the input value), adds the consumed positions with send_offsets_to_transaction and
commits; after an abort it seeks back to the transaction's first offsets so the
records are transformed again. PACE_MS (default 0) spaces transactions out so a short
input lasts long enough for the faults; SIGUSR1 ends the pacing (to drain the rest).

It logs to LOG as JSON lines (one ``os.write`` on an O_APPEND descriptor each, so a
kill -9 keeps every line written; see txn_history.TxnHistory.apply_log), with ``t`` in
``time.monotonic()`` milliseconds (the test's clock too):

* ``start`` (pid, incarnation), ``init`` (init_transactions returned);
* ``begin`` (txn, worker, inputs) before begin_transaction;
* ``commit-called`` immediately before the first commit_transaction call;
* ``committed`` / ``aborted`` when commit_transaction / abort_transaction returned;
* ``unknown`` after an error that leaves the outcome open (fatal, or the retries ran
  out); the worker then starts over with a new producer and consumer;
* ``error`` (anything else worth knowing), ``exit`` on SIGTERM.

librdkafka's ``send_offsets_to_transaction`` can block forever, past its timeout, when
the group coordinator it has cached is killed and leaves the metadata (librdkafka
issues #5456 and #5511, open in 2.16: the coordinator request's timeout is never
checked, and it waits for a state change of a broker whose thread is gone). A
watchdog then logs an ``error`` (step ``hung``) and exits with HUNG_EXIT, as if killed
mid-transaction; the test harness starts the slot again, which fences the hung one.

The attempt id is ``SLOT.INCARNATION.N``; INCARNATION counts the ``start`` lines
already in LOG, so ids stay unique across restarts of the slot.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import confluent_kafka as ck

from tests.faults.txn_history import output_value

CALL_TIMEOUT_S = 10.0  # one commit/abort/send_offsets call
GIVE_UP_S = 60.0  # retriable errors of one commit or abort, before the outcome is unknown
HANG_S = 3 * CALL_TIMEOUT_S  # awake seconds a call with CALL_TIMEOUT_S may take at most
HUNG_EXIT = 75  # the exit status of a worker whose librdkafka call hung (see above)


class Abortable(Exception):
    """The transaction must be aborted (an abortable or a retriable mid-transaction error)."""


class Fatal(Exception):
    """The producer is unusable (fenced, or a fatal error): start over."""


def now_ms() -> int:
    return int(time.monotonic() * 1000)


class Log:
    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def __call__(self, ev: str, **fields: Any) -> None:
        line = json.dumps({"ev": ev, "t": now_ms(), **fields}) + "\n"
        os.write(self.fd, line.encode())


def starts_in(path: str) -> int:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return sum(1 for line in f if '"ev": "start"' in line)
    except FileNotFoundError:
        return 0


class Worker:
    def __init__(self, argv: list[str]) -> None:
        (self.bootstrap, self.group, self.input, self.output, self.slot, self.path) = argv[:6]
        self.txn_size = int(argv[6])
        self.txn_timeout_ms = int(argv[7])
        self.pace_s = int(argv[8]) / 1000 if len(argv) > 8 else 0.0
        self.log = Log(self.path)
        self.running = True
        self.consumer: Any = None
        self.producer: Any = None

    def stop(self, *_: object) -> None:
        self.running = False

    def unpace(self, *_: object) -> None:
        self.pace_s = 0.0

    # -- clients --------------------------------------------------------------------
    def open(self) -> None:
        backoff = {
            # a request to a SIGSTOPped broker fails after 10 s, not librdkafka's 60 s
            # (a consumer fetching from a frozen leader would starve that long)
            "socket.timeout.ms": 10_000,
            "reconnect.backoff.ms": 50,
            "reconnect.backoff.max.ms": 500,
            "retry.backoff.ms": 50,
            "retry.backoff.max.ms": 500,
        }
        self.consumer = ck.Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": self.group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "session.timeout.ms": 6000,
                "heartbeat.interval.ms": 500,
                "max.poll.interval.ms": 120_000,
                **backoff,
            }
        )
        self.producer = ck.Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "transactional.id": f"txn-worker-{self.slot}",
                "transaction.timeout.ms": self.txn_timeout_ms,
                "message.timeout.ms": self.txn_timeout_ms,
                "request.timeout.ms": 5_000,
                "linger.ms": 5,
                **backoff,
                # librdkafka's transaction state machine on stderr, for investigations
                **({"debug": "eos"} if os.environ.get("LOGMQ_TXN_WORKER_DEBUG") else {}),
            }
        )
        deadline = time.monotonic() + GIVE_UP_S
        while True:
            try:
                self.producer.init_transactions(CALL_TIMEOUT_S)
                break
            except ck.KafkaException as e:
                err = e.args[0]
                self.log("error", step="init", error=str(err))
                if not err.retriable() or time.monotonic() > deadline:
                    raise
        self.log("init")
        self.consumer.subscribe([self.input])

    def close(self) -> None:
        for client in (self.consumer, self.producer):
            if client is None:
                continue
            try:
                if client is self.consumer:
                    client.close()
                else:
                    client.flush(1)
            except Exception as e:  # a fatal producer or a consumer kicked out
                self.log("error", step="close", error=repr(e))
        self.consumer = self.producer = None

    # -- one transaction -------------------------------------------------------------
    def transact(self, attempt: str, msgs: list[Any]) -> None:
        log = self.log
        inputs = [m.value().decode() for m in msgs]
        log("begin", txn=attempt, worker=self.slot, inputs=inputs)
        first: dict[int, int] = {}
        nxt: dict[int, int] = {}
        for m in msgs:
            first.setdefault(m.partition(), m.offset())
            nxt[m.partition()] = m.offset() + 1
        try:
            self.call(self.producer.begin_transaction)
            for m, value in zip(msgs, inputs, strict=True):
                self.producer.produce(
                    self.output, key=m.value(), value=output_value(value, self.slot, attempt)
                )
            positions = [ck.TopicPartition(self.input, p, o) for p, o in sorted(nxt.items())]
            with self.watchdog(attempt, "send_offsets"):
                self.call(
                    self.producer.send_offsets_to_transaction,
                    positions,
                    self.consumer.consumer_group_metadata(),
                    CALL_TIMEOUT_S,
                )
            log("commit-called", txn=attempt)
            self.retrying(self.producer.commit_transaction, attempt, "commit")
            log("committed", txn=attempt)
        except Abortable as e:
            log("error", txn=attempt, step="transaction", error=str(e))
            self.retrying(self.producer.abort_transaction, attempt, "abort")
            log("aborted", txn=attempt, error=str(e))
            self.rewind(first)

    @contextlib.contextmanager
    def watchdog(self, attempt: str, step: str) -> Iterator[None]:
        """Exit with HUNG_EXIT if the body runs for HANG_S seconds awake. Only awake
        time counts: a SIGSTOP of this process (a nemesis' pause) is not a hang."""
        done = threading.Event()

        def watch() -> None:
            awake, last = 0.0, time.monotonic()
            while not done.wait(0.5):
                now = time.monotonic()
                awake += min(now - last, 1.0)  # a longer gap: the process was stopped
                last = now
                if awake >= HANG_S:
                    self.log("error", txn=attempt, step="hung", error=f"{step} hung")
                    os._exit(HUNG_EXIT)

        thread = threading.Thread(target=watch, name="watchdog", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()

    @staticmethod
    def call(fn: Any, *args: Any) -> Any:
        """A transactional call; errors sorted into Abortable and Fatal."""
        try:
            return fn(*args)
        except ck.KafkaException as e:
            err = e.args[0]
            if err.fatal():
                raise Fatal(str(err)) from e
            raise Abortable(str(err)) from e

    def retrying(self, fn: Any, attempt: str, step: str) -> None:
        """commit_transaction / abort_transaction, again after each retriable error (the
        outcome is not known until one returns)."""
        deadline = time.monotonic() + GIVE_UP_S
        while True:
            try:
                fn(CALL_TIMEOUT_S)
                return
            except ck.KafkaException as e:
                err = e.args[0]
                self.log("error", txn=attempt, step=step, error=str(err))
                if err.fatal() or time.monotonic() > deadline:
                    raise Fatal(str(err)) from e
                if err.txn_requires_abort() and step == "commit":
                    raise Abortable(str(err)) from e
                if not err.retriable() and not err.txn_requires_abort():
                    raise Fatal(str(err)) from e

    def rewind(self, first: dict[int, int]) -> None:
        """Read the aborted transaction's records again (they were not committed)."""
        for p, offset in sorted(first.items()):
            try:
                self.consumer.seek(ck.TopicPartition(self.input, p, offset))
            except ck.KafkaException as e:  # no longer ours: its new owner reads it
                self.log("error", step="rewind", partition=p, error=str(e))

    # -- the loop -------------------------------------------------------------------
    def run(self) -> None:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGUSR1, self.unpace)
        while self.running:
            incarnation = starts_in(self.path)
            self.log("start", pid=os.getpid(), incarnation=incarnation, worker=self.slot)
            n = 0
            attempt = None
            try:
                self.open()
                while self.running:
                    msgs = self.consumer.consume(self.txn_size, 0.2)
                    good = [m for m in msgs if m.error() is None]
                    for m in msgs:
                        if m.error() is not None:
                            self.log("error", step="consume", error=str(m.error()))
                    if not good:
                        continue
                    attempt = f"{self.slot}.{incarnation}.{n}"
                    n += 1
                    self.transact(attempt, good)
                    attempt = None
                    if self.pace_s:
                        time.sleep(self.pace_s)  # workload pacing, see the module doc
            except (Fatal, Abortable, ck.KafkaException) as e:
                if attempt is not None:
                    self.log("unknown", txn=attempt, error=repr(e))
                else:
                    self.log("error", step="run", error=repr(e))
            finally:
                self.close()
        self.log("exit")


def main() -> None:
    Worker(sys.argv[1:]).run()


if __name__ == "__main__":
    main()
