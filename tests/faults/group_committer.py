"""A confluent-kafka group consumer that commits synchronously and says which commits held.

Usage: ``python -m tests.faults.group_committer BOOTSTRAP GROUP TOPIC STRATEGY EVERY``.
``STRATEGY`` is a classic ``partition.assignment.strategy`` (``range``,
``cooperative-sticky``, ...) or ``consumer`` for KIP-848 (``group.protocol=consumer``).

Auto-commit is off. The consumer commits its position synchronously (``commit(offsets,
asynchronous=False)``) after every ``EVERY`` records, whenever a poll comes back empty
with something uncommitted, before it gives up partitions in a rebalance, and when
SIGTERM stops it. One line per event, flushed at once:

* ``rec P OFFSET VALUE``: a record consumed;
* ``committed P OFFSET``: the broker acknowledged this commit: ``commit()`` returned
  without raising and with no error on the partition (the only way the test knows
  which commits were acknowledged);
* ``commit-failed ERROR``: a commit that raised (not acknowledged; retried later);
* ``assigned P...``, ``revoked P...``, ``lost P...``: rebalance callbacks;
* ``error ERROR``: an error event from ``poll``; ``closed`` after ``close()``.
"""

from __future__ import annotations

import signal
import sys

import confluent_kafka as ck

from tests.kafka.group_consumer import group_config


def main() -> None:
    bootstrap, group, topic, strategy, every_arg = sys.argv[1:6]
    every = int(every_arg)
    conf = group_config(
        bootstrap,
        group,
        strategy,
        **{
            "enable.auto.commit": False,
            "reconnect.backoff.ms": 50,
            "reconnect.backoff.max.ms": 500,
            "retry.backoff.ms": 50,
            "retry.backoff.max.ms": 500,
        },
    )
    consumer = ck.Consumer(conf)
    running = True
    pending: dict[int, int] = {}  # partition -> next offset, consumed but not committed
    since_commit = 0

    def say(*parts: object) -> None:
        print(*parts, flush=True)

    def commit(partitions: list[int]) -> None:
        nonlocal since_commit
        offsets = [ck.TopicPartition(topic, p, pending[p]) for p in partitions if p in pending]
        if not offsets:
            return
        since_commit = 0
        try:
            result = consumer.commit(offsets=offsets, asynchronous=False)
        except ck.KafkaException as e:
            say("commit-failed", e.args[0] if e.args else e)
            return
        for tp in result or ():
            if tp.error is None:
                say("committed", tp.partition, tp.offset)
                if pending.get(tp.partition) == tp.offset:
                    del pending[tp.partition]
            else:
                say("commit-failed", tp.partition, tp.error)

    def stop(*_: object) -> None:
        nonlocal running
        running = False

    signal.signal(signal.SIGTERM, stop)

    def on_assign(c: ck.Consumer, partitions: list[ck.TopicPartition]) -> None:
        say("assigned", *(p.partition for p in partitions))

    def on_revoke(c: ck.Consumer, partitions: list[ck.TopicPartition]) -> None:
        gone = [p.partition for p in partitions]
        commit(gone)  # hand the partitions over at the position reached
        for p in gone:
            pending.pop(p, None)
        say("revoked", *gone)

    def on_lost(c: ck.Consumer, partitions: list[ck.TopicPartition]) -> None:
        gone = [p.partition for p in partitions]
        for p in gone:  # no longer ours: a commit would be refused
            pending.pop(p, None)
        say("lost", *gone)

    consumer.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)
    while running:
        msg = consumer.poll(0.1)
        if msg is None:
            commit(sorted(pending))  # idle: commit what was read
            continue
        if msg.error() is not None:
            say("error", msg.error())
            continue
        say("rec", msg.partition(), msg.offset(), msg.value().decode())
        pending[msg.partition()] = msg.offset() + 1
        since_commit += 1
        if since_commit >= every:
            commit(sorted(pending))
    commit(sorted(pending))
    consumer.close()  # leaves the group
    say("closed")


if __name__ == "__main__":
    main()
