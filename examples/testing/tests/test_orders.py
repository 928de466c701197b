"""The application's tests, against a real Kafka-compatible broker: logmq's pytest
fixtures, which pytest finds by itself once logmq is installed."""

from orders import publish_orders, totals_by_customer

ORDERS = [
    {"customer": "alice", "amount": 30},
    {"customer": "bob", "amount": 5},
    {"customer": "alice", "amount": 12},
]


def test_totals_per_customer(logmq_broker):
    topic = logmq_broker.create_topic("orders", partitions=3)
    publish_orders(logmq_broker.bootstrap_servers, topic, ORDERS)
    assert totals_by_customer(logmq_broker.bootstrap_servers, topic) == {"alice": 42, "bob": 5}


def test_no_orders_no_totals(logmq_broker, logmq_topic):
    # logmq_topic: a fresh topic for this test alone, on the session's logmq_broker
    assert totals_by_customer(logmq_broker.bootstrap_servers, logmq_topic) == {}


def test_replicated_orders(logmq_cluster):
    # three brokers; every partition on all three, and a write needs two of them
    topic = logmq_cluster.create_topic(
        "orders", partitions=3, replication_factor=3, min_insync_replicas=2
    )
    publish_orders(logmq_cluster.bootstrap_servers, topic, ORDERS)
    assert totals_by_customer(logmq_cluster.bootstrap_servers, topic) == {"alice": 42, "bob": 5}
