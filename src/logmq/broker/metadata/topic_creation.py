"""Topics the broker creates by itself: auto-created on first use, and internal ``__`` ones.

A Kafka user expects producing to (or asking metadata for) an unknown topic to create it
when ``auto_create_topics`` is on, and the group coordinator needs ``__consumer_offsets``.
Creation is a metadata change, so it runs on the controller (forwarded if need be).
Synchronous callers cannot wait for that: ``*_soon`` starts it in a background task this
class owns (at most one per topic name) and ``stop`` cancels what is still running.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from logmq.broker.metadata.image_topics import TopicInfo
from logmq.cluster.topic_names import topic_name_error
from logmq.errors import ErrorCode, LogMQError
from logmq.net.codec import ApiKey
from logmq.storage.config import LogConfig

if TYPE_CHECKING:
    from logmq.broker.metadata.image_topics import ImageTopics
    from logmq.broker.metadata.quorum_service import MetadataQuorum

log = logging.getLogger("logmq.broker")

CREATE_WAIT_S = 10.0  # how long an auto-created topic may take to reach this broker's image


class PendingTopics:
    """Produces to a topic that is being auto-created wait here, and go on in arrival order.

    Per-partition order must hold even for the first records of a topic: pipelined
    produces arrive while the creation runs on the controller, and any of them going
    ahead of an earlier one would append out of order. The first waiter starts the
    creation; when it ends, waiters are let go one at a time: each is released only
    after the previous one has resumed and taken its first step (its append is written
    synchronously in that step), and a produce that arrives meanwhile queues behind
    them even though the topic already exists.
    """

    def __init__(self, create: Callable[[str], Awaitable[Any]]) -> None:
        self._create = create
        self._queues: dict[str, collections.deque[asyncio.Future[None]]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()

    def waiting(self, topic: str) -> bool:
        return topic in self._queues

    async def wait(self, topic: str) -> None:
        """Return once ``topic`` exists (or its creation failed), after earlier waiters."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        queue = self._queues.get(topic)
        if queue is None:
            queue = self._queues[topic] = collections.deque()
            task = loop.create_task(self._run_create(topic), name=f"auto-create-{topic}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        queue.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.cancelled():
                if fut in queue:
                    queue.remove(fut)  # never released: the others keep their turn
            else:
                loop.call_soon(self._release, topic)  # released: pass the turn on
            raise
        # Our first step runs before the callback below, so the next one goes after us.
        loop.call_soon(self._release, topic)

    async def _run_create(self, topic: str) -> None:
        try:
            await self._create(topic)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the waiters then report the topic as unknown
            log.warning("auto-creating topic %s failed: %s", topic, exc)
        finally:
            self._release(topic)

    def _release(self, topic: str) -> None:
        """Let the next waiter go; forget the topic once nobody waits."""
        queue = self._queues.get(topic)
        while queue:
            fut = queue.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self._queues.pop(topic, None)

    def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()


class TopicCreator:
    """Creates topics the broker itself needs (auto-created, internal) on the controller."""

    def __init__(
        self,
        quorum: MetadataQuorum,
        topics: ImageTopics,
        run_on_controller: Callable[[int, dict[str, Any]], Awaitable[dict[str, Any]]],
        *,
        auto_create_topics: bool,
    ) -> None:
        self.quorum = quorum
        self.topics = topics
        self.run_on_controller = run_on_controller
        self.auto_create_topics = auto_create_topics
        self._background: set[asyncio.Task[Any]] = set()
        self._creating: set[str] = set()

    def stop(self) -> None:
        """Cancel the creations still running (the broker is shutting down)."""
        for task in list(self._background):
            task.cancel()

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def create_topic_soon(self, name: str, body: dict[str, Any]) -> None:
        """Ask the controller for a topic in the background (from synchronous paths)."""
        if name in self._creating:
            return
        self._creating.add(name)

        async def create() -> None:
            try:
                out = await self.run_on_controller(ApiKey.CREATE_TOPICS, {"topics": [body]})
                for entry in out.get("topics", []):
                    if entry.get("error") not in (0, int(ErrorCode.TOPIC_ALREADY_EXISTS)):
                        log.warning("cannot create topic %s: %s", name, entry.get("message"))
            except LogMQError as e:
                log.warning("cannot create topic %s: %s", name, e)
            finally:
                self._creating.discard(name)

        self._spawn(create(), f"create-{name}")

    def create_internal_topic_soon(
        self, name: str, partitions: int, configs: dict[str, str] | None = None
    ) -> None:
        """For broker subsystems (group coordinator): create a ``__`` topic if missing."""
        problem = topic_name_error(name)
        if problem:
            raise LogMQError(problem, ErrorCode.INVALID_TOPIC_EXCEPTION)
        cfg = dict(configs or {})
        LogConfig.from_dict(cfg)
        rf = max(1, min(3, len(self.quorum.image.active_brokers())))
        body = {
            "topic": name,
            "partitions": partitions,
            "replication_factor": rf,
            "configs": cfg,
            "internal": True,
        }
        self.create_topic_soon(name, body)

    def maybe_auto_create(self, topic: str) -> TopicInfo | None:
        """Start auto-creating ``topic`` when allowed; None: it does not exist yet."""
        if not self.auto_create_topics or topic_name_error(topic):
            return None
        if topic.startswith("__"):
            return None
        log.info("auto-creating topic %s", topic)
        self.create_topic_soon(topic, {"topic": topic, "partitions": -1})
        return None

    async def auto_create(self, topic: str) -> TopicInfo | None:
        """Auto-create ``topic`` (Metadata with allow_auto_create) and wait for it."""
        topics = self.topics
        if not self.auto_create_topics or topic_name_error(topic):
            return None
        if topic.startswith("__"):
            return None
        log.info("auto-creating topic %s", topic)
        await self.run_on_controller(ApiKey.CREATE_TOPICS, {"topics": [{"topic": topic}]})
        # Another creator (a Metadata request, another broker) may have won the race and
        # our answer was TOPIC_ALREADY_EXISTS: either way, wait until our image has it.
        await self.quorum.wait_for(lambda image: topic in image.topics, CREATE_WAIT_S)
        return topics.get(topic)
