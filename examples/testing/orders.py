"""A small application that uses Kafka: orders are published as JSON records keyed by
customer, and a report reads them all back and totals each customer's amounts."""

from __future__ import annotations

import json
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition


def publish_orders(bootstrap_servers: str, topic: str, orders: list[dict]) -> None:
    """Write every order, or raise: idempotent, acks=all, waits for each delivery."""
    producer = Producer({"bootstrap.servers": bootstrap_servers, "enable.idempotence": True})
    failures = []

    def on_delivery(err, _msg):
        if err is not None:
            failures.append(err)

    for order in orders:
        producer.produce(
            topic, key=order["customer"], value=json.dumps(order), on_delivery=on_delivery
        )
    if producer.flush(30) or failures:
        raise KafkaException(failures[0] if failures else "orders not delivered in 30 s")


def totals_by_customer(bootstrap_servers: str, topic: str, timeout: float = 30.0) -> dict:
    """Read the topic from the beginning up to its current end and sum each customer's
    amounts. It assign()s the partitions itself: no consumer group, no commits."""
    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": "orders-report"})
    try:
        partitions = consumer.list_topics(topic, timeout=timeout).topics[topic].partitions
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)[1]
            for p in partitions
        }
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        unread = {p for p, end in ends.items() if end > 0}
        totals: dict[str, int] = {}
        deadline = time.monotonic() + timeout
        while unread and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                raise KafkaException(msg.error())
            order = json.loads(msg.value())
            totals[order["customer"]] = totals.get(order["customer"], 0) + order["amount"]
            if msg.offset() + 1 >= ends[msg.partition()]:
                unread.discard(msg.partition())
        if unread:
            raise TimeoutError(f"partitions {sorted(unread)} of {topic} not read in {timeout} s")
        return totals
    finally:
        consumer.close()
