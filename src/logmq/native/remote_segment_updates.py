"""The remote tier's changes on their way to the controller (AlterRemoteSegments, native).

The tier's shell (a partition leader copying and deleting segments) says what changed;
this sends it as one request per batch through the controller forwarder, so it runs
here when this broker is the controller and is forwarded otherwise, retried while the
quorum has no ready leader (NOT_CONTROLLER), and answered once this broker's own image
holds the accepted changes: the tier may read ``image.remote_segments`` right after.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from logmq.cluster.controller_api import RemoteSegmentChange
from logmq.cluster.remote_segments import MAX_REMOTE_CHANGES
from logmq.errors import LogMQError, Outcome
from logmq.native.cluster_api import remote_segment_change_body, remote_segment_results
from logmq.net.codec import ApiKey

log = logging.getLogger("logmq.remote")

RunOnController = Callable[[int, dict[str, Any]], Awaitable[dict[str, Any]]]


class Forwarder(Protocol):
    """What this needs of native/controller_forwarding.ControllerForwarder."""

    def run_on_controller(
        self, api_key: int, body: dict[str, Any]
    ) -> Awaitable[dict[str, Any]]: ...  # pragma: no cover


class RemoteSegmentUpdates:
    """``submit`` a batch of remote-segment changes, get one Outcome per change.

    ``forwarder``: the broker's ControllerForwarder (or its ``run_on_controller``);
    ``broker_epoch``: this broker's current registration epoch (it changes when the
    broker registers again, so it is read per request).
    """

    def __init__(
        self,
        forwarder: Forwarder | RunOnController,
        node_id: int,
        broker_epoch: Callable[[], int],
    ) -> None:
        run = getattr(forwarder, "run_on_controller", forwarder)
        self._run: RunOnController = run  # type: ignore[assignment]
        self.node_id = node_id
        self.broker_epoch = broker_epoch

    async def submit(self, changes: Sequence[RemoteSegmentChange]) -> list[Outcome]:
        """Send ``changes`` (in requests of at most MAX_REMOTE_CHANGES), in order.

        Outcomes: NONE; FENCED_LEADER_EPOCH or NOT_LEADER_OR_FOLLOWER (this broker no
        longer leads at that epoch: stop working on the partition); UNKNOWN_TOPIC_ID;
        INVALID_REQUEST (a bad transition, or a malformed segment); RESOURCE_NOT_FOUND
        (no such segment: a retried DELETE_FINISHED finds it gone); STALE_BROKER_EPOCH
        (this broker is registering again). A request that got no answer (no controller
        within the forwarder's deadline, a broken connection) gives every change of it
        that request's error code, retriable ones included: the caller tries again later.
        """
        out: list[Outcome] = []
        for start in range(0, len(changes), MAX_REMOTE_CHANGES):
            out += await self._send(changes[start : start + MAX_REMOTE_CHANGES])
        return out

    async def _send(self, changes: Sequence[RemoteSegmentChange]) -> list[Outcome]:
        body = {
            "broker_id": self.node_id,
            "broker_epoch": self.broker_epoch(),
            "changes": [remote_segment_change_body(c) for c in changes],
        }
        try:
            answer = await self._run(ApiKey.ALTER_REMOTE_SEGMENTS, body)
            return remote_segment_results(answer, len(changes))
        except asyncio.CancelledError:
            raise
        except LogMQError as err:
            log.info("AlterRemoteSegments of %d changes failed: %s", len(changes), err)
            return [Outcome(err.code, str(err)) for _ in changes]
