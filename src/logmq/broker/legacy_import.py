"""Bringing a pre-quorum single-node data dir into the metadata log, once.

Before the metadata quorum, a single-node broker kept its topics in ``topics.json`` and
its producer id block in a file of its own. When such a node becomes the first
controller of a new quorum, ``import_legacy_topics`` turns them into metadata records;
once the image holds every topic, ``retire_legacy_topics`` renames the file so it is
never imported twice.
"""

from __future__ import annotations

import logging
from pathlib import Path

from logmq.broker.metadata_store import TOPICS_FILE, TopicStore
from logmq.broker.producer_ids import legacy_next_id
from logmq.cluster.controller import Controller
from logmq.cluster.metadata_image import MetadataImage
from logmq.cluster.metadata_records import (
    ConfigRecord,
    PartitionRecord,
    ProducerIdsBlock,
    Record,
    TopicRecord,
)

log = logging.getLogger("logmq.broker")


def import_legacy_topics(data_dir: Path, node_id: int, controller: Controller) -> list[Record]:
    """A single-node data dir's topics.json (and producer ids), as records, once."""
    legacy = data_dir / TOPICS_FILE
    me = node_id
    records: list[Record] = []
    next_pid = legacy_next_id(data_dir)
    if next_pid > controller.image.next_producer_id:
        records += controller._commit([ProducerIdsBlock(me, next_pid)])
    if controller.image.topics or not legacy.exists():
        return records
    imported = len(records)
    for info in TopicStore(data_dir).all():
        records.append(TopicRecord(info.name, info.topic_id))
        for p in range(info.partitions):
            records.append(PartitionRecord(info.name, p, (me,), (me,), me, 0, 0))
        records += [ConfigRecord("topic", info.name, k, v) for k, v in info.configs.items()]
    log.info("importing %s into the metadata log", legacy)
    controller._commit(records[imported:])
    return records


def retire_legacy_topics(data_dir: Path, image: MetadataImage) -> None:
    """Rename an imported topics.json; warn about one the metadata log does not cover."""
    legacy = data_dir / TOPICS_FILE
    if not legacy.exists():
        return
    names = {info.name for info in TopicStore(data_dir).all()}
    if names <= set(image.topics):
        legacy.replace(legacy.with_name(TOPICS_FILE + ".imported"))
        log.info("topics.json imported into the metadata log")
    else:
        log.warning(
            "%s holds topics the metadata log does not: it is imported only when "
            "this node is the first controller of a new quorum",
            legacy,
        )
