"""What a single-node broker knows about itself and its topics, persisted in the data dir.

Two files: ``meta.properties`` (node id, cluster id, format version; written once, checked
on every start so a data dir is never served under the wrong identity) and
``topics.json`` (topic name -> partition count and config overrides; read once, to
import a single-node data dir into the metadata log: topics now live there, seen
through :class:`ImageTopics`). Every write goes
through :func:`atomic_write`: temp file, fsync, rename, fsync the directory, so a crash
leaves either the old or the new file, never a torn one.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from logmq.errors import ErrorCode, LogMQError

if TYPE_CHECKING:
    from logmq.cluster.metadata_image import MetadataImage

META_PROPERTIES = "meta.properties"
TOPICS_FILE = "topics.json"
FORMAT_VERSION = 1
MAX_TOPIC_NAME = 249
# Every partition is a directory with open files: a client asking for millions must get
# an error, not a broker busy creating them.
MAX_PARTITIONS_PER_TOPIC = 10_000
INTERNAL_PREFIX = "__"
_TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]+$")


def atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class NodeIdMismatchError(Exception):
    """The data dir belongs to another node id: serving it would corrupt a cluster."""


@dataclass(frozen=True, slots=True)
class MetaProperties:
    node_id: int
    cluster_id: str
    format_version: int = FORMAT_VERSION

    def encode(self) -> bytes:
        return (
            "# logmq broker identity; do not edit\n"
            f"node.id={self.node_id}\n"
            f"cluster.id={self.cluster_id}\n"
            f"format.version={self.format_version}\n"
        ).encode()

    @classmethod
    def parse(cls, text: str) -> MetaProperties:
        values: dict[str, str] = {}
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith("#") or "=" not in line:
                continue
            k, v = line.split("=", 1)
            values[k.strip()] = v.strip()
        try:
            return cls(int(values["node.id"]), values["cluster.id"], int(values["format.version"]))
        except (KeyError, ValueError) as e:
            raise ValueError(f"malformed {META_PROPERTIES}: {e}") from None


def load_or_create_meta(data_dir: Path, node_id: int) -> MetaProperties:
    """Read meta.properties, creating it on first start; refuse a different node id."""
    path = data_dir / META_PROPERTIES
    if path.exists():
        meta = MetaProperties.parse(path.read_text())
        if meta.node_id != node_id:
            raise NodeIdMismatchError(
                f"{path} says node.id={meta.node_id} but the broker was started with "
                f"--node-id {node_id}; use the matching node id or another data dir"
            )
        if meta.format_version > FORMAT_VERSION:
            raise NodeIdMismatchError(
                f"{path} has format.version={meta.format_version}; this broker reads "
                f"up to {FORMAT_VERSION}"
            )
        return meta
    meta = MetaProperties(node_id, uuid.uuid4().hex)
    atomic_write(path, meta.encode())
    return meta


def check_node_id(data_dir: Path, node_id: int) -> None:
    """Refuse a data dir whose meta.properties names another node (or a newer format)."""
    path = data_dir / META_PROPERTIES
    if not path.exists():
        return
    meta = MetaProperties.parse(path.read_text())
    if meta.node_id != node_id:
        raise NodeIdMismatchError(
            f"{path} says node.id={meta.node_id} but the broker was started with "
            f"--node-id {node_id}; use the matching node id or another data dir"
        )
    if meta.format_version > FORMAT_VERSION:
        raise NodeIdMismatchError(
            f"{path} has format.version={meta.format_version}; this broker reads "
            f"up to {FORMAT_VERSION}"
        )


def topic_name_error(name: object) -> str | None:
    """Why ``name`` is not a valid topic name, or None."""
    if not isinstance(name, str) or not name:
        return "topic name must be a non-empty string"
    if len(name) > MAX_TOPIC_NAME:
        return f"topic name longer than {MAX_TOPIC_NAME} characters"
    if name in (".", ".."):
        return "topic name cannot be '.' or '..'"
    if not _TOPIC_NAME.match(name):
        return "topic name may only contain ASCII letters, digits, '.', '_' and '-'"
    return None


def is_internal(name: str) -> bool:
    return name.startswith(INTERNAL_PREFIX)


@dataclass(slots=True)
class TopicInfo:
    name: str
    partitions: int
    configs: dict[str, str] = field(default_factory=dict)
    topic_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def internal(self) -> bool:
        return is_internal(self.name)


class TopicStore:
    """Topic registry backed by ``topics.json``; every mutation is persisted before it returns."""

    def __init__(self, data_dir: Path):
        self._path = data_dir / TOPICS_FILE
        self._topics: dict[str, TopicInfo] = {}
        if self._path.exists():
            raw = json.loads(self._path.read_text())
            for t in raw.get("topics", []):
                info = TopicInfo(t["name"], int(t["partitions"]), dict(t["configs"]), t["id"])
                self._topics[info.name] = info

    def __contains__(self, name: object) -> bool:
        return name in self._topics

    def get(self, name: str) -> TopicInfo | None:
        return self._topics.get(name)

    def names(self) -> list[str]:
        return sorted(self._topics)

    def all(self) -> list[TopicInfo]:
        return [self._topics[n] for n in self.names()]

    def add(self, info: TopicInfo) -> None:
        if info.name in self._topics:
            raise LogMQError(f"topic {info.name!r} already exists", ErrorCode.TOPIC_ALREADY_EXISTS)
        self._topics[info.name] = info
        self._save()

    def remove(self, name: str) -> TopicInfo:
        info = self._topics.pop(name)
        self._save()
        return info

    def set_configs(self, name: str, configs: dict[str, str]) -> None:
        self._topics[name].configs = dict(configs)
        self._save()

    def set_partitions(self, name: str, count: int) -> None:
        """Change a topic's partition count; memory keeps the old count if the write fails."""
        info = self._topics[name]
        old, info.partitions = info.partitions, count
        try:
            self._save()
        except BaseException:
            info.partitions = old
            raise

    def _save(self) -> None:
        doc = {
            "version": 1,
            "topics": [
                {"name": t.name, "id": t.topic_id, "partitions": t.partitions, "configs": t.configs}
                for t in self.all()
            ],
        }
        atomic_write(self._path, json.dumps(doc, indent=1, sort_keys=True).encode())


class ImageTopics:
    """The topics of the current metadata image, read through the TopicStore interface.

    Topics live in the metadata log (cluster/metadata_image.py); this view lets the
    request handlers and the group coordinator ask "which topics, how many partitions,
    which configs" without knowing about images. Read-only: changes go to the controller.
    """

    def __init__(self, image: Callable[[], MetadataImage]):
        self._image = image

    def __contains__(self, name: object) -> bool:
        return name in self._image().topics

    def get(self, name: str) -> TopicInfo | None:
        image = self._image()
        t = image.topics.get(name)
        if t is None:
            return None
        return TopicInfo(name, len(t.partitions), dict(image.topic_config(name)), t.topic_id)

    def names(self) -> list[str]:
        return sorted(self._image().topics)

    def all(self) -> list[TopicInfo]:
        out = []
        for name in self.names():
            info = self.get(name)
            if info is not None:
                out.append(info)
        return out
