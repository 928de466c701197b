"""A confluent-kafka group consumer in its own process, for tests that kill it (-9).

Usage: ``python -m tests.kafka.group_consumer BOOTSTRAP GROUP TOPIC STRATEGY``. Prints
``partition offset value`` per record (flushed at once), ``assigned``/``revoked`` lines on
rebalances; auto-commits often and commits its final position when SIGTERM stops it.
"""

from __future__ import annotations

import signal
import sys

import confluent_kafka as ck


def group_config(bootstrap: str, group: str, strategy: str, **extra: object) -> dict:
    """A test group consumer's settings: ``strategy`` is a classic assignor, or
    ``consumer`` for KIP-848 (where the broker assigns and sessions are its own)."""
    conf = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        **extra,
    }
    if strategy == "consumer":
        conf["group.protocol"] = "consumer"
    else:
        conf.update(
            {
                "partition.assignment.strategy": strategy,
                "session.timeout.ms": 6000,
                "heartbeat.interval.ms": 500,
            }
        )
    return conf


def main() -> None:
    bootstrap, group, topic, strategy = sys.argv[1:5]
    conf = group_config(
        bootstrap, group, strategy, **{"enable.auto.commit": True, "auto.commit.interval.ms": 100}
    )
    consumer = ck.Consumer(conf)
    running = True

    def stop(*_):
        nonlocal running
        running = False

    signal.signal(signal.SIGTERM, stop)

    def on_assign(c, partitions):
        print("assigned", " ".join(str(p.partition) for p in partitions), flush=True)

    def on_revoke(c, partitions):
        print("revoked", " ".join(str(p.partition) for p in partitions), flush=True)

    consumer.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
    while running:
        msg = consumer.poll(0.1)
        if msg is None:
            continue
        if msg.error() is not None:
            print("error", msg.error(), flush=True)
            continue
        print(msg.partition(), msg.offset(), msg.value().decode(), flush=True)
    consumer.close()  # commits the final position, leaves the group
    print("closed", flush=True)


if __name__ == "__main__":
    main()
