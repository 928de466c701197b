"""The metadata quorum's state machine: committed record batches -> MetadataImage.

``MetadataLoader`` is what RaftService applies entries to. Each entry is one record
batch; it becomes one MetadataDelta and one new image, published to listeners together
with the delta (so a broker learns which partitions it now leads or follows). A batch
that does not apply is rejected whole and the image stays as it was: every member rejects
it alike, so images never diverge. Snapshots are the image's own records.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from logmq.cluster.metadata_image import EMPTY_IMAGE, MetadataDelta, MetadataError, MetadataImage
from logmq.cluster.metadata_records import MetadataCodecError, decode_records

log = logging.getLogger("logmq.cluster")

Listener = Callable[[MetadataImage, MetadataDelta | None], None]


class MetadataLoader:
    def __init__(self) -> None:
        self.image = EMPTY_IMAGE
        self._listeners: list[Listener] = []

    def add_listener(self, listener: Listener) -> None:
        """``listener(image, delta)`` after every change; ``delta`` is None after a restore."""
        self._listeners.append(listener)

    # -- the StateMachine protocol of RaftService ------------------------------------------

    def apply(self, index: int, data: bytes) -> MetadataImage:
        try:
            records = decode_records(data)
            delta = MetadataDelta(self.image)
            for record in records:
                delta.replay(record)
        except (MetadataCodecError, MetadataError) as err:
            log.error("metadata entry %d rejected: %s", index, err)
            self.image = _with_offset(self.image, index)
            raise
        self._publish(delta.apply(index), delta)
        return self.image

    def snapshot(self) -> bytes:
        return self.image.to_bytes()

    def restore(self, index: int, data: bytes) -> None:
        self._publish(MetadataImage.from_bytes(data, index), None)

    def _publish(self, image: MetadataImage, delta: MetadataDelta | None) -> None:
        self.image = image
        for listener in self._listeners:
            try:
                listener(image, delta)
            except Exception:
                log.exception("metadata listener failed")


def _with_offset(image: MetadataImage, offset: int) -> MetadataImage:
    return MetadataDelta(image).apply(offset)
