"""Produce synthetic click events to logmq: the first step of the clickstream example.

Each event is a JSON object ``{"user", "page", "ts", "referrer"}`` keyed by user (so a
user's clicks stay in order in one partition) and stamped with its event time. Event
times spread evenly over the last ``--span`` seconds, with a little disorder (up to
``--disorder`` seconds late), as real click streams have. Page popularity is skewed:
a few pages get most clicks. Creates the topic if it does not exist.

    python spark/examples/clickstream_producer.py --events 100000

See docs/spark.md for the whole pipeline.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from collections.abc import Iterator

from logmq import Admin, Producer

PAGES = [
    "/",
    "/search",
    "/cart",
    "/checkout",
    "/account",
    *(f"/products/{i}" for i in range(1, 16)),
]
REFERRERS = ["direct", "search", "social", "email", "ads"]


def click_events(
    count: int, *, span_s: float, disorder_s: float, users: int, seed: int, now_ms: int
) -> Iterator[dict]:
    """``count`` events with event times in ``[now - span, now]``, deterministic per seed."""
    rng = random.Random(seed)
    weights = [1 / (rank + 1) for rank in range(len(PAGES))]  # Zipf-like popularity
    start = now_ms - int(span_s * 1000)
    step = span_s * 1000 / max(1, count)
    for i in range(count):
        ts = start + int(i * step) - int(rng.random() * disorder_s * 1000)
        yield {
            "user": f"user-{rng.randrange(users)}",
            "page": rng.choices(PAGES, weights)[0],
            "ts": ts,
            "referrer": rng.choice(REFERRERS),
        }


def ensure_topic(bootstrap: str, topic: str, partitions: int) -> None:
    with Admin(bootstrap) as admin:
        if topic not in admin.list_topics():
            admin.create_topic(topic, partitions=partitions)


def produce(bootstrap: str, topic: str, events: Iterator[dict], rate: float = 0) -> int:
    """Send the events (at most ``rate`` per second when rate > 0); returns how many."""
    sent = 0
    began = time.monotonic()
    with Producer(bootstrap, acks="all", linger_ms=10) as producer:
        for event in events:
            producer.send(
                topic,
                json.dumps(event, separators=(",", ":")).encode(),
                key=event["user"].encode(),
                timestamp=event["ts"],
            )
            sent += 1
            if rate > 0:
                ahead = sent / rate - (time.monotonic() - began)
                if ahead > 0:
                    time.sleep(ahead)  # pacing the generator, not synchronising anything
        producer.flush()
    return sent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--bootstrap",
        default=os.environ.get("LOGMQ_BOOTSTRAP", "127.0.0.1:9192"),
        help="native port(s), as for the logmq CLI (default: $LOGMQ_BOOTSTRAP or 127.0.0.1:9192)",
    )
    parser.add_argument("--topic", default="clicks")
    parser.add_argument("--partitions", type=int, default=4, help="when creating the topic")
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--span", type=float, default=600.0, help="event-time span, seconds")
    parser.add_argument("--disorder", type=float, default=5.0, help="max lateness, seconds")
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=0, help="events/s; 0 = as fast as possible")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    ensure_topic(args.bootstrap, args.topic, args.partitions)
    events = click_events(
        args.events,
        span_s=args.span,
        disorder_s=args.disorder,
        users=args.users,
        seed=args.seed,
        now_ms=int(time.time() * 1000),
    )
    t0 = time.monotonic()
    n = produce(args.bootstrap, args.topic, events, args.rate)
    print(f"produced {n} click events to {args.topic!r} in {time.monotonic() - t0:.1f} s")


if __name__ == "__main__":
    main()
