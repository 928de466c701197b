"""How a native answer carries a quota's throttle (KIP-219 on the native door).

A client over a quota gets ``throttle_ms`` in its answer's body and its connection muted
for that long (``Reply.throttle_ms``), as on the Kafka door. The request-time quota
(security/quota_enforcer.RequestTimeQuota) writes it with ``throttled``; brokers' own
requests are exempt (native/authorization.from_broker), as Kafka exempts CLUSTER_ACTION.
"""

from __future__ import annotations

from logmq.net.reply import Reply


def throttled(reply: Reply, throttle_ms: int) -> Reply:
    """``reply`` carrying a throttle (the longer of the one it has and this one)."""
    if throttle_ms > reply.throttle_ms:
        reply.throttle_ms = throttle_ms
        if isinstance(reply.body, dict):
            reply.body["throttle_ms"] = throttle_ms
    return reply
