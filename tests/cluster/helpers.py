"""Building blocks shared by the cluster tests: a controller with registered brokers."""

from __future__ import annotations

import itertools

from logmq.cluster.controller import Controller
from logmq.cluster.controller_api import ControllerConfig, NewTopic
from logmq.cluster.metadata_image import EMPTY_IMAGE, MetadataImage
from logmq.cluster.metadata_records import Record, decode_records, encode_records

CONFIG = ControllerConfig(session_timeout_ms=1_000, auto_leader_rebalance=False)


def ids():
    counter = itertools.count(1)
    return lambda: f"id-{next(counter)}"


class Recorder:
    """A controller plus the log of every record it produced, replayed like a follower."""

    def __init__(self, brokers: int = 3, now: int = 0, config: ControllerConfig = CONFIG):
        self.controller = Controller(EMPTY_IMAGE, now, config, new_id=ids())
        self.log: list[list[Record]] = []
        self.epochs: dict[int, int] = {}
        self.run(self.controller.bootstrap("cluster-1"))
        for b in range(1, brokers + 1):
            self.start_broker(b, now)

    @property
    def image(self) -> MetadataImage:
        return self.controller.image

    def run(self, result):
        if result.records:
            # Through the codec, as the quorum would carry them.
            self.log.append(decode_records(encode_records(result.records)))
        return result.response

    def start_broker(self, b: int, now: int, incarnation: str | None = None):
        resp = self.run(
            self.controller.register_broker(
                b, incarnation or f"inc-{b}-{now}", "127.0.0.1", 9000 + b, now
            )
        )
        self.epochs[b] = resp.broker_epoch
        return self.run(self.controller.heartbeat(b, resp.broker_epoch, now, caught_up=True))

    def heartbeat(self, b: int, now: int, **kwargs):
        return self.run(self.controller.heartbeat(b, self.epochs[b], now, **kwargs))

    def create(self, name: str, partitions: int = 1, rf: int = 3, **configs: str):
        return self.run(
            self.controller.create_topics(
                [
                    NewTopic(
                        name,
                        partitions,
                        rf,
                        configs={k.replace("_", "."): v for k, v in configs.items()},
                    )
                ]
            )
        )[name]

    def replayed(self) -> MetadataImage:
        image = EMPTY_IMAGE
        for batch in self.log:
            image = image.apply(batch)
        return image
