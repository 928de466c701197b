"""Record a seed corpus of Kafka request frames from the real clients, for the fuzzers.

A broker is started whose Metadata and FindCoordinator answers advertise a recording
proxy's port, so every connection a client opens goes through the proxy, which keeps each
client->broker frame (its 4-byte size prefix stripped). confluent-kafka, kafka-python,
aiokafka and kcat (when installed) then produce, consume in a committing group and run
admin calls. At most two frames per (client, API key, version) are written as
``<client>-<api_key>-v<version>-<n>.bin``; frames over 64 KB are skipped.

    .venv/bin/python -m tests.kafka.record_corpus [--out tests/kafka/corpus]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import pathlib
import shutil
import struct
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable

from tests.harness import BrokerProcess, free_port

MAX_FRAME = 64 * 1024
STEP_TIMEOUT_S = 30.0
RUN_TIMEOUT_S = 300.0  # a client stuck past every timeout of its own
CLIENT_IDS = {  # the client.id each client is given, and its corpus name
    "corpus-confluent": "confluent",
    "corpus-kafka-python": "kafka-python",
    "corpus-aiokafka": "aiokafka",
    "corpus-kcat": "kcat",
}


def header(frame: bytes) -> tuple[int, int, str | None]:
    """(api key, version, client id) of a request frame; every header version starts so."""
    api_key, version = struct.unpack_from(">hh", frame, 0)
    (n,) = struct.unpack_from(">h", frame, 8)
    client_id = None if n < 0 else frame[10 : 10 + n].decode("utf-8", "replace")
    return api_key, version, client_id


class Recorder:
    """Keeps two frames of each (client, API key, version): the first, and the longest
    other (correlation id aside), which names the most topics and partitions. Frames of
    an unknown client id go to the client whose turn it was when their connection opened."""

    def __init__(self) -> None:
        self.phase = "unknown"
        self.frames: dict[tuple[str, int, int], list[bytes]] = {}
        self.seen = 0
        self.too_big = 0
        self._lock = threading.Lock()

    def record(self, frame: bytes, conn_phase: str) -> None:
        if len(frame) < 10:
            return
        api_key, version, client_id = header(frame)
        client = CLIENT_IDS.get(client_id or "", conn_phase)
        with self._lock:
            self.seen += 1
            if len(frame) > MAX_FRAME:
                self.too_big += 1
                return
            kept = self.frames.setdefault((client, api_key, version), [])
            if not kept:
                kept.append(frame)
            elif frame[8:] != kept[0][8:] and (len(kept) == 1 or len(frame) > len(kept[1])):
                kept[1:] = [frame]

    def write(self, out: pathlib.Path) -> int:
        out.mkdir(parents=True, exist_ok=True)
        for old in out.glob("*.bin"):
            old.unlink()
        n = 0
        for (client, api_key, version), frames in sorted(self.frames.items()):
            for i, frame in enumerate(frames):
                (out / f"{client}-{api_key}-v{version}-{i}.bin").write_bytes(frame)
                n += 1
        return n


class RecordingProxy:
    """A TCP proxy on 127.0.0.1 in its own thread and event loop: bytes pass unchanged
    both ways; the client's side is also cut into frames for the recorder."""

    def __init__(self, port: int, target: Callable[[], int], recorder: Recorder) -> None:
        self.port = port
        self._target = target
        self._recorder = recorder
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="corpus-proxy", daemon=True)

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("recording proxy did not start")

    def stop(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _run(self) -> None:
        try:
            self._loop.run_until_complete(self._serve())
        finally:
            self._loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self._ready.set()
        async with server:
            await self._stop.wait()
        for task in asyncio.all_tasks() - {asyncio.current_task()}:
            task.cancel()

    async def _handle(self, c_reader, c_writer) -> None:
        phase = self._recorder.phase
        try:
            b_reader, b_writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", self._target()), 10
            )
        except (OSError, TimeoutError):
            c_writer.close()
            return
        up = asyncio.ensure_future(self._client_to_broker(c_reader, b_writer, phase))
        down = asyncio.ensure_future(self._pipe(b_reader, c_writer))
        await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
        for task in (up, down):
            task.cancel()
        for w in (c_writer, b_writer):
            w.close()

    async def _client_to_broker(self, reader, writer, phase: str) -> None:
        buf = b""
        while chunk := await reader.read(1 << 16):
            writer.write(chunk)
            buf += chunk
            while len(buf) >= 4:
                (size,) = struct.unpack_from(">i", buf, 0)
                if size < 0 or len(buf) < 4 + size:
                    break
                self._recorder.record(buf[4 : 4 + size], phase)
                buf = buf[4 + size :]
            await writer.drain()

    @staticmethod
    async def _pipe(reader, writer) -> None:
        while chunk := await reader.read(1 << 16):
            writer.write(chunk)
            await writer.drain()


def wait_until(condition: Callable[[], object], what: str) -> object:
    deadline = time.monotonic() + STEP_TIMEOUT_S
    while not (got := condition()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
    return got


# -- the clients ----------------------------------------------------------------------


def drive_confluent(bootstrap: str) -> None:
    import confluent_kafka as ck
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        NewTopic,
        OffsetSpec,
    )

    base = {"bootstrap.servers": bootstrap, "client.id": "corpus-confluent"}
    topic, scratch, group = "corpus-ck", "corpus-ck-scratch", "corpus-ck-group"
    admin = AdminClient(base)
    for f in admin.create_topics([NewTopic(topic, 2, 1), NewTopic(scratch, 1, 1)]).values():
        f.result(STEP_TIMEOUT_S)
    admin.describe_topics(ck.TopicCollection([topic])).get(topic).result(STEP_TIMEOUT_S)
    admin.describe_cluster().result(STEP_TIMEOUT_S)
    res = ConfigResource(ConfigResource.Type.TOPIC, scratch)
    for f in admin.describe_configs([res]).values():
        f.result(STEP_TIMEOUT_S)
    alter = ConfigResource(
        ConfigResource.Type.TOPIC,
        scratch,
        incremental_configs=[
            ConfigEntry("retention.ms", "60000", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    for f in admin.incremental_alter_configs([alter]).values():
        f.result(STEP_TIMEOUT_S)
    res.set_config("retention.ms", "120000")
    with warnings.catch_warnings():  # deprecated in favour of the incremental one, still sent
        warnings.simplefilter("ignore", DeprecationWarning)
        for f in admin.alter_configs([res]).values():
            f.result(STEP_TIMEOUT_S)

    producer = ck.Producer({**base, "enable.idempotence": True})
    for i in range(4):
        producer.produce(topic, key=b"key-%d" % i, value=b"value-%d" % i)
    assert producer.flush(STEP_TIMEOUT_S) == 0, "confluent-kafka produce not delivered"
    del producer

    consumer = ck.Consumer(
        {**base, "group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False}
    )
    try:
        consumer.subscribe([topic])
        got = wait_until(lambda: (m := consumer.poll(0.5)) and not m.error() and m, "a record")
        consumer.commit(message=got, asynchronous=False)
        tps = [ck.TopicPartition(topic, p, 0) for p in range(2)]
        consumer.offsets_for_times(tps, timeout=STEP_TIMEOUT_S)
        consumer.committed([ck.TopicPartition(topic, p) for p in range(2)], STEP_TIMEOUT_S)
        admin.list_consumer_groups().result(STEP_TIMEOUT_S)
        for f in admin.describe_consumer_groups([group]).values():
            f.result(STEP_TIMEOUT_S)
    finally:
        consumer.close()
    consumer = ck.Consumer(  # the KIP-848 group protocol: ConsumerGroupHeartbeat
        {
            **base,
            "group.id": f"{group}-848",
            "group.protocol": "consumer",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.subscribe([topic])
        got = wait_until(lambda: (m := consumer.poll(0.5)) and not m.error() and m, "a record")
        consumer.commit(message=got, asynchronous=False)
    finally:
        consumer.close()
    specs = {ck.TopicPartition(topic, 0): OffsetSpec.latest()}
    specs[ck.TopicPartition(topic, 1)] = OffsetSpec.earliest()
    for f in admin.list_offsets(specs).values():
        f.result(STEP_TIMEOUT_S)
    for f in admin.delete_topics([scratch], operation_timeout=10).values():
        f.result(STEP_TIMEOUT_S)


def drive_kafka_python(bootstrap: str) -> None:
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewTopic

    import kafka

    cid = "corpus-kafka-python"
    topic, scratch, group = "corpus-kp", "corpus-kp-scratch", "corpus-kp-group"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id=cid)
    try:
        admin.create_topics([NewTopic(topic, 2, 1), NewTopic(scratch, 1, 1)])
        admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, scratch)])
        admin.delete_topics([scratch])
        producer = kafka.KafkaProducer(bootstrap_servers=bootstrap, client_id=cid, acks="all")
        try:
            for i in range(4):
                producer.send(topic, key=b"key-%d" % i, value=b"v").get(STEP_TIMEOUT_S)
        finally:
            producer.close(STEP_TIMEOUT_S)
        consumer = kafka.KafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            client_id=cid,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        try:
            wait_until(lambda: consumer.poll(500), "a record")
            consumer.commit()
        finally:
            consumer.close()
        admin.list_groups()
        admin.describe_groups([group])
        admin.list_group_offsets({group: None})
        admin.describe_cluster()
    finally:
        admin.close()


async def drive_aiokafka(bootstrap: str) -> None:
    import aiokafka

    cid = "corpus-aiokafka"
    topic, group = "corpus-ck", "corpus-aio-group"
    producer = aiokafka.AIOKafkaProducer(bootstrap_servers=bootstrap, client_id=cid, acks="all")
    await producer.start()
    try:
        await asyncio.wait_for(producer.send_and_wait(topic, b"v", key=b"k"), STEP_TIMEOUT_S)
    finally:
        await producer.stop()
    consumer = aiokafka.AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        client_id=cid,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        await asyncio.wait_for(consumer.getone(), STEP_TIMEOUT_S)
        await consumer.commit()
    finally:
        await consumer.stop()


def drive_kcat(bootstrap: str) -> None:
    base = ["kcat", "-b", bootstrap, "-X", "client.id=corpus-kcat"]
    topic = "corpus-ck"

    def run(*args: str, stdin: bytes | None = None) -> None:
        subprocess.run([*base, *args], input=stdin, capture_output=True, timeout=60, check=True)

    run("-L")
    run("-P", "-t", topic, "-K", ":", stdin=b"k1:v1\nk2:v2\n")
    run("-C", "-t", topic, "-o", "beginning", "-e")


# -- main -----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path(__file__).parent / "corpus")
    args = ap.parse_args(argv)

    recorder = Recorder()
    proxy_port = free_port()
    broker = BrokerProcess(
        extra_args=[
            "--advertised-kafka-port", str(proxy_port),
            "--group-initial-rebalance-delay-ms", "0",
        ],
    )  # fmt: skip
    proxy = RecordingProxy(proxy_port, lambda: broker.kafka_port, recorder)
    bootstrap = f"127.0.0.1:{proxy_port}"
    steps: list[tuple[str, Callable[[], object]]] = [
        ("confluent", lambda: drive_confluent(bootstrap)),
        ("kafka-python", lambda: drive_kafka_python(bootstrap)),
        ("aiokafka", lambda: asyncio.run(drive_aiokafka(bootstrap))),
    ]
    if shutil.which("kcat"):
        steps.append(("kcat", lambda: drive_kcat(bootstrap)))
    else:
        print("kcat not installed: skipped", file=sys.stderr)
    failed = []

    def abort() -> None:
        print(f"record_corpus: not done after {RUN_TIMEOUT_S:.0f} s, giving up", file=sys.stderr)
        with contextlib.suppress(Exception):
            broker.kill()
        os._exit(2)

    watchdog = threading.Timer(RUN_TIMEOUT_S, abort)
    watchdog.daemon = True
    watchdog.start()
    broker.start()
    try:
        proxy.start()
        for name, step in steps:
            recorder.phase = name
            try:
                step()
            except Exception as e:  # report it, record the others all the same
                failed.append(name)
                print(f"{name}: {type(e).__name__}: {e}", file=sys.stderr)
    finally:
        proxy.stop()
        with contextlib.suppress(Exception):
            broker.stop()
        watchdog.cancel()
    written = recorder.write(args.out)
    per_client: dict[str, int] = {}
    for (client, _, _), frames in recorder.frames.items():
        per_client[client] = per_client.get(client, 0) + len(frames)
    print(
        f"{recorder.seen} frames seen, {recorder.too_big} over {MAX_FRAME} bytes skipped, "
        f"{written} written to {args.out}: "
        + ", ".join(f"{c} {n}" for c, n in sorted(per_client.items()))
    )
    if failed:
        print(f"steps failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
