"""A consumer-group member as its own process, for end-to-end tests.

``python -m tests.e2e.group_worker BOOTSTRAP GROUP TOPIC OUT [options]`` joins GROUP,
and for every record it processes appends ``R <partition> <offset> <value>`` to OUT
(flushed before the next poll, so a kill -9 loses at most what auto-commit has not
taken: at-least-once). Rebalance callbacks append ``ASSIGNED``/``REVOKED``/``LOST``
lines. Commands arrive on stdin, one per line: ``commit`` (commit now, then write
``COMMITTED`` or ``COMMIT-FAILED <error class> <code>``), ``close`` (commit, leave and
exit 0).
"""

from __future__ import annotations

import argparse
import os
import queue
import sys
import threading

from logmq import Consumer
from logmq.errors import LogMQError


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bootstrap")
    ap.add_argument("group")
    ap.add_argument("topic")
    ap.add_argument("out")
    ap.add_argument("--instance-id", default=None)
    ap.add_argument("--session-timeout-ms", type=int, default=2000)
    ap.add_argument("--manual-commit", action="store_true")
    ap.add_argument("--auto-commit-interval-ms", type=int, default=200)
    args = ap.parse_args()

    fd = os.open(args.out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(text: str) -> None:
        os.write(fd, text.encode())

    def listener(kind: str):
        def call(partitions: set) -> None:
            write(f"{kind} {' '.join(str(p) for _, p in sorted(partitions))}\n")

        return call

    commands: queue.Queue[str] = queue.Queue()

    def read_stdin() -> None:
        for line in sys.stdin:
            commands.put(line.strip())
        commands.put("close")  # the parent went away

    threading.Thread(target=read_stdin, daemon=True).start()
    consumer = Consumer(
        args.bootstrap,
        group_id=args.group,
        topics=[args.topic],
        group_instance_id=args.instance_id,
        session_timeout_ms=args.session_timeout_ms,
        auto_offset_reset="earliest",
        enable_auto_commit=not args.manual_commit,
        auto_commit_interval_ms=args.auto_commit_interval_ms,
        fetch_max_wait_ms=100,
        on_assigned=listener("ASSIGNED"),
        on_revoked=listener("REVOKED"),
        on_lost=listener("LOST"),
    )
    write(f"STARTED {os.getpid()}\n")
    while True:
        try:
            command = commands.get_nowait()
        except queue.Empty:
            command = None
        if command == "close":
            consumer.close()
            write("CLOSED\n")
            return
        if command == "commit":
            try:
                consumer.commit()
                write("COMMITTED\n")
            except LogMQError as e:
                write(f"COMMIT-FAILED {type(e).__name__} {e.code.name}\n")
        records = consumer.poll(timeout=0.05)
        if records:
            write(
                "".join(f"R {r.partition} {r.offset} {r.value.decode()}\n" for r in records)
                + f"POLLED {len(records)}\n"
            )


if __name__ == "__main__":
    main()
