"""Connections from this broker to the others' native ports, for requests between brokers
that are not replication or Raft (transaction markers, KIP-890 verification).

One connection per broker, opened on first use with the inter-broker security settings
and dropped when a request on it fails (the next request dials again). Addresses come
from the metadata image, as the controller's do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from logmq.client.connection import BrokerConnection
from logmq.errors import ErrorCode, LogMQError

Address = tuple[str, int]


class BrokerClients:
    """Requests to other brokers by node id."""

    def __init__(
        self,
        node_id: int,
        broker_address: Callable[[int], Address | None],
        *,
        security: Any = None,
        connect_timeout: float = 10.0,
    ) -> None:
        self.node_id = node_id
        self._address = broker_address
        self._security = security
        self._connect_timeout = connect_timeout
        self._conns: dict[int, tuple[Address, BrokerConnection]] = {}
        self._dialing: dict[int, asyncio.Lock] = {}
        self._closed = False

    async def call(
        self, node_id: int, api_key: int, body: dict[str, Any], timeout: float = 30.0
    ) -> dict[str, Any]:
        """Send ``body`` to broker ``node_id``; its answer's body. A LogMQError when the
        broker is unknown or unreachable (retriable: NETWORK_EXCEPTION and the like)."""
        conn = await self._connection(node_id)
        try:
            resp = await conn.request(api_key, body, timeout=timeout)
        except LogMQError:
            self._drop(node_id, conn)
            raise
        return resp.body

    async def _connection(self, node_id: int) -> BrokerConnection:
        if self._closed:
            raise LogMQError("the broker is stopping", ErrorCode.NETWORK_EXCEPTION)
        address = self._address(node_id)
        if address is None:
            raise LogMQError(f"broker {node_id} is not registered", ErrorCode.BROKER_NOT_AVAILABLE)
        known = self._conns.get(node_id)
        if known is not None and known[0] == address and known[1].is_open:
            return known[1]
        lock = self._dialing.setdefault(node_id, asyncio.Lock())
        async with lock:
            known = self._conns.get(node_id)
            if known is not None and known[0] == address and known[1].is_open:
                return known[1]
            if known is not None:
                known[1].close()
            conn = await BrokerConnection.open(
                *address,
                connect_timeout=self._connect_timeout,
                client_id=f"broker-{self.node_id}",
                security=self._security,
            )
            self._conns[node_id] = (address, conn)
            return conn

    def _drop(self, node_id: int, conn: BrokerConnection) -> None:
        conn.close()
        known = self._conns.get(node_id)
        if known is not None and known[1] is conn:
            del self._conns[node_id]

    def close(self) -> None:
        """Close every connection; later calls fail at once."""
        self._closed = True
        for _, conn in self._conns.values():
            conn.close()
        self._conns.clear()
