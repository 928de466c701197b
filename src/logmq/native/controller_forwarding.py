"""Running metadata-changing requests on the controller, from whichever broker gets them.

Clients may send CreateTopics and the other metadata changes to any broker, and the
broker itself needs the controller for producer id blocks and ISR changes. On the
controller the request runs here; elsewhere it is forwarded over the controller's client
port. Either way the answer waits until this broker's own image holds the change, so a
client that reads metadata next sees it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from logmq.broker.metadata.quorum_service import MetadataQuorum
from logmq.cluster.controller_api import AlterPartitionRequest, AlterPartitionResponse
from logmq.errors import ErrorCode, LogMQError
from logmq.native.cluster_api import alter_partition_response
from logmq.net.api_registry import Handler
from logmq.net.codec import ApiKey, Request
from logmq.net.reply import Reply
from logmq.net.requester import ON_BEHALF_OF, on_behalf_of, requester
from logmq.security.quota_enforcer import quota_caller

log = logging.getLogger("logmq.broker")

# the topic mutations metered by controller_mutation_rate (KIP-599)
MUTATIONS = frozenset({ApiKey.CREATE_TOPICS, ApiKey.DELETE_TOPICS, ApiKey.CREATE_PARTITIONS})

FORWARD_TIMEOUT_S = 15.0


class ControllerForwarder:
    """Runs requests on the controller; ``handlers`` answer them when that is this node."""

    def __init__(
        self, node_id: int, quorum: MetadataQuorum, handlers: Mapping[int, Handler]
    ) -> None:
        self.node_id = node_id
        self.quorum = quorum
        self._handlers = handlers

    async def run_on_controller(self, api_key: int, body: dict[str, Any]) -> dict[str, Any]:
        """Run a metadata-changing request on the controller, here or forwarded.

        Retries while the quorum has no ready leader; the answer comes once this broker's
        own image holds the change, so a client that reads metadata next sees it.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + FORWARD_TIMEOUT_S
        while True:
            try:
                if self.quorum.is_controller:
                    handler = self._handlers[api_key]
                    req = Request(api_key, 0, 0, "forwarded", body, memoryview(b""))
                    reply = await handler(req)
                    assert reply is not None
                    return dict(reply.body)
                if self.quorum.controller_address() is None:
                    raise LogMQError("no controller yet", ErrorCode.NOT_CONTROLLER)
                forwarded = {**body, "forwarded_by": self.node_id}
                out = await self.quorum.call_controller(
                    api_key, forwarded, timeout=FORWARD_TIMEOUT_S
                )
            except LogMQError as e:
                if not e.code.retriable and e.code is not ErrorCode.NETWORK_EXCEPTION:
                    raise
                if loop.time() >= deadline:
                    raise LogMQError(
                        f"no controller answered within {FORWARD_TIMEOUT_S:.0f}s: {e}",
                        ErrorCode.NOT_CONTROLLER,
                    ) from None
                await self.quorum.wait_for(lambda _img: False, 0.2)  # until a change, or soon
                continue
            offset = out.pop("metadata_offset", None)
            if isinstance(offset, int):
                try:
                    await self.quorum.wait_for_offset(offset, FORWARD_TIMEOUT_S)
                except TimeoutError:
                    log.warning("metadata offset %d not applied here in time", offset)
            return out

    async def forward_guard(self, request: Request) -> Reply | None:
        """The native pipeline's step before a metadata change (the registry's
        ``controller``): on another broker than the controller, forward it there."""
        if self.quorum.is_controller:
            return None
        return await self.controller_request(request)

    async def controller_request(self, request: Request) -> Reply:
        """A client's metadata change: run here on the controller, else forwarded.

        The request names its client (``on_behalf_of``: net/requester.py), whom the
        controller audits a security change for. A topic mutation also carries its
        client's quota identity (the controller meters controller_mutation_rate for the
        cluster); its throttle mutes the client here."""
        if self.quorum.is_controller:
            handler = self._handlers[request.api_key]
            reply = await handler(request)
            assert reply is not None
            return reply
        body = request.body
        client = requester(request.context, body)  # a request forwarded twice keeps it
        if isinstance(body, dict) and client is not None:
            body = {**body, ON_BEHALF_OF: on_behalf_of(client)}
        if request.api_key in MUTATIONS and isinstance(body, dict):
            body = {**body, "quota": quota_caller(request.context, request.client_id, True)}
        answer = await self.run_on_controller(request.api_key, body)
        throttle = answer.get("throttle_ms", 0)
        return Reply(answer, throttle_ms=throttle if isinstance(throttle, int) else 0)

    async def allocate_producer_ids(self, count: int) -> int:
        """A fresh block of ``count`` producer ids from the controller; its first id."""
        body = {
            "broker_id": self.node_id,
            "broker_epoch": self.quorum.broker_epoch,
            "count": count,
        }
        out = await self.run_on_controller(ApiKey.ALLOCATE_PRODUCER_IDS, body)
        if out.get("error", 0) != 0:
            raise LogMQError(out.get("message") or "no producer ids", ErrorCode(out["error"]))
        return int(out["start"])

    async def alter_partitions(
        self, requests: list[AlterPartitionRequest]
    ) -> list[AlterPartitionResponse]:
        """Ask the controller for ISR changes of this broker's partitions, in one request
        (for the replica manager); the answers come in the same order."""
        first = requests[0]
        body = {
            "broker_id": first.broker_id,
            "broker_epoch": first.broker_epoch,
            "partitions": [
                {
                    "topic": r.topic,
                    "partition": r.partition,
                    "leader_epoch": r.leader_epoch,
                    "partition_epoch": r.partition_epoch,
                    "new_isr": list(r.new_isr),
                }
                for r in requests
            ],
        }
        out = await self.run_on_controller(ApiKey.ALTER_PARTITION, body)
        answers = out.get("partitions")
        if not isinstance(answers, list) or len(answers) != len(requests):
            code = ErrorCode(out.get("error") or ErrorCode.UNKNOWN_SERVER_ERROR)
            raise LogMQError(out.get("message") or "AlterPartition refused", code)
        return [alter_partition_response(a) for a in answers]
