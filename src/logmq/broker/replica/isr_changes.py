"""ISR changes on their way to the controller, batched (Kafka's AlterPartitionManager).

A partition's replica decides an ISR change; this queue sends it with every other change
waiting, one AlterPartition request in flight at a time, so thousands of partitions
changing at once (a cluster coming up) make a few requests and a few metadata batches,
not thousands. Each answer goes back to the replica manager (``answered``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable

from logmq.cluster.controller_api import AlterPartitionRequest, AlterPartitionResponse
from logmq.errors import ErrorCode
from logmq.replication.partition_replica import AlterIsr

log = logging.getLogger("logmq.replication")

TopicPartition = tuple[str, int]
AlterPartitions = Callable[[list[AlterPartitionRequest]], Awaitable[list[AlterPartitionResponse]]]
MAX_ISR_BATCH = 2000  # partitions per AlterPartition request


class IsrChangeQueue:
    """The ISR changes waiting to go, and the one task that sends them."""

    def __init__(
        self,
        broker_id: int,
        broker_epoch: Callable[[], int],
        alter_partitions: AlterPartitions,
        answered: Callable[[TopicPartition, ErrorCode, object], None],
    ) -> None:
        self.broker_id = broker_id
        self.broker_epoch = broker_epoch
        self.alter_partitions = alter_partitions
        self.answered = answered
        self._queue: dict[TopicPartition, AlterIsr] = {}
        self._sender: asyncio.Task | None = None
        self._stopped = False

    def queue(self, key: TopicPartition, action: AlterIsr) -> None:
        """Send ``action`` with every other ISR change waiting."""
        self._queue[key] = action
        if self._stopped or (self._sender is not None and not self._sender.done()):
            return
        self._sender = asyncio.get_running_loop().create_task(self._send())

    async def stop(self) -> None:
        self._stopped = True
        if self._sender is not None:
            self._sender.cancel()
            await asyncio.gather(self._sender, return_exceptions=True)

    async def _send(self) -> None:
        while self._queue and not self._stopped:
            batch = list(itertools.islice(self._queue.items(), MAX_ISR_BATCH))
            for key, _ in batch:
                del self._queue[key]
            requests = [
                AlterPartitionRequest(
                    broker_id=self.broker_id,
                    broker_epoch=self.broker_epoch(),
                    topic=key[0],
                    partition=key[1],
                    leader_epoch=action.leader_epoch,
                    partition_epoch=action.partition_epoch,
                    new_isr=action.isr,
                )
                for key, action in batch
            ]
            try:
                responses = await self.alter_partitions(requests)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("AlterPartition for %d partitions failed: %s", len(batch), e)
                responses = [AlterPartitionResponse(ErrorCode.REQUEST_TIMED_OUT, str(e))] * len(
                    batch
                )
            refused: dict[str, int] = {}
            for (key, action), response in zip(batch, responses, strict=True):
                if response.error is not ErrorCode.NONE:
                    refused[response.error.name] = refused.get(response.error.name, 0) + 1
                    log.debug(
                        "AlterPartition %s-%d isr=%s refused: %s",
                        key[0],
                        key[1],
                        action.isr,
                        response.error.name,
                    )
                self.answered(key, response.error, response.partition)
            if refused:
                log.info(
                    "AlterPartition: %d of %d refused %s",
                    sum(refused.values()),
                    len(batch),
                    refused,
                )
