"""Topics as the broker's handlers see them: the metadata image's view (the naming rules
and limits are cluster/topic_names.py).

Topics live in the metadata log (cluster/metadata_image.py); :class:`ImageTopics` reads
them from the current image. The data dir's identity file is cluster/meta_properties.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from logmq.cluster.topic_names import is_internal

if TYPE_CHECKING:
    from logmq.cluster.metadata_image import MetadataImage


@dataclass(slots=True)
class TopicInfo:
    name: str
    partitions: int
    configs: dict[str, str] = field(default_factory=dict)
    topic_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def internal(self) -> bool:
        return is_internal(self.name)


class ImageTopics:
    """The topics of the current metadata image, as TopicInfo.

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
