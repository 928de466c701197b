"""Who a request runs for when a broker carries it to the controller.

A client may send a metadata change to any broker; the controller runs it, either for a
broker that forwarded it (``forwarded_by``, on a connection authenticated as a broker)
or for its own broker's front door (a request with no connection). The broker that took
the request sends its client's identity along as ``on_behalf_of``, the role of the
principal and client address in Kafka's forwarding Envelope (KIP-590), so what the
controller records (the audit log) names the client, not the broker. It is read only
from brokers: a client's own request is its connection's.
"""

from __future__ import annotations

from typing import Any

from logmq.errors import ErrorCode, LogMQError
from logmq.net.pipeline import ConnectionContext

ON_BEHALF_OF = "on_behalf_of"
_FIELDS = ("principal", "peer", "host", "listener")


def on_behalf_of(context: ConnectionContext) -> dict[str, str]:
    """The body field a broker adds to a client's request it sends to the controller."""
    return {
        "principal": context.principal,
        "peer": context.peer,
        "host": context.host,
        "listener": context.listener,
    }


def requester(context: ConnectionContext | None, body: Any) -> ConnectionContext | None:
    """Whose request this is: the client's connection, or for one a broker sent (run
    here with no connection, or forwarded) the client it names; None is the broker
    itself (its own change, such as ``--add-scram``), and a forwarded request naming no
    client is the forwarding broker's."""
    forwarded = isinstance(body, dict) and body.get("forwarded_by") is not None
    if context is not None and not forwarded:
        return context
    raw = body.get(ON_BEHALF_OF) if isinstance(body, dict) else None
    if raw is None:
        return context
    if not isinstance(raw, dict) or not all(isinstance(raw.get(f), str) for f in _FIELDS):
        raise LogMQError(
            f"{ON_BEHALF_OF} names a principal, peer, host and listener",
            ErrorCode.INVALID_REQUEST,
        )
    return ConnectionContext(
        peer=raw["peer"], host=raw["host"], listener=raw["listener"], principal=raw["principal"]
    )
