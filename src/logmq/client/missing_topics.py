"""Why a producer's records for a topic wait, said once per topic.

Two waits were silent until they failed: a send to a topic the producer has no metadata
for waits up to ``max_block_ms`` for it to appear, and a batch a broker answers
UNKNOWN_TOPIC_OR_PARTITION (the topic was deleted after the producer learned it) is
retried until ``delivery_timeout_ms``. The first retry of either logs one line naming the
topic and why (a WARNING, INFO for a topic still being created), then nothing more for
that topic until it is there again.
"""

from __future__ import annotations

import logging

from logmq.errors import ErrorCode

log = logging.getLogger("logmq.client.producer")


class MissingTopics:
    """The topics a producer has said are missing, and the saying."""

    def __init__(
        self, *, allow_auto_create: bool, max_block_s: float, delivery_timeout_s: float
    ) -> None:
        self.allow_auto_create = allow_auto_create
        self.max_block_s = max_block_s
        self.delivery_timeout_s = delivery_timeout_s
        self.warned: set[str] = set()  # said missing, not seen since

    def waiting_for_metadata(self, topic: str, code: ErrorCode | None) -> None:
        """Sends to ``topic`` wait for its metadata (``code``: the metadata's answer for
        it; None: no broker answered)."""
        level = logging.WARNING
        if code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
            if self.allow_auto_create:
                why = "the topic does not exist and the broker did not create it (auto-create off?)"
            else:
                why = (
                    "the topic does not exist, and this producer does not ask brokers to "
                    "create topics (allow_auto_create_topics=False): create it first"
                )
        elif code == ErrorCode.LEADER_NOT_AVAILABLE:
            # what a topic being created answers for a moment: not worth a warning
            level = logging.INFO
            why = "the topic has no leader yet (being created, or its leader is moving)"
        elif code is None:
            why = "no broker answered the metadata request"
        else:
            why = "the metadata request for it failed"
        self._say(level, "sends to", topic, code, why, self.max_block_s, "max_block_ms")

    def batch_refused(self, topic: str, code: ErrorCode) -> None:
        """A broker answered a batch of ``topic`` UNKNOWN_TOPIC_OR_PARTITION: the topic
        this producer had metadata for is gone (deleted) or not there yet."""
        why = "the broker does not know the topic: deleted since this producer learned it?"
        self._say(
            logging.WARNING,
            "batches for",
            topic,
            code,
            why,
            self.delivery_timeout_s,
            "delivery_timeout_ms",
        )

    def found(self, topic: str) -> None:
        """``topic`` is there again: its next absence is said again."""
        self.warned.discard(topic)

    def _say(
        self,
        level: int,
        what: str,
        topic: str,
        code: ErrorCode | None,
        why: str,
        limit_s: float,
        limit_name: str,
    ) -> None:
        if topic in self.warned:
            return
        self.warned.add(topic)
        log.log(
            level,
            "%s topic %r wait: %s (%s); retrying for up to %g s (%s), then they fail",
            what,
            topic,
            code.name if code is not None else "NETWORK_EXCEPTION",
            why,
            limit_s,
            limit_name,
        )
