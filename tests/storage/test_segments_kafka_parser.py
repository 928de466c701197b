"""Segment files a real broker wrote are Kafka RecordBatch v2, as an independent parser sees.

A ``logmq-server`` process stores records produced by the native client in every codec;
kafka-python's record-batch parser (pure Python, no code shared with logmq) then reads
the ``.log`` files and checks each batch's CRC-32C and every record's offset, timestamp,
key, value and headers.
"""

from __future__ import annotations

import pytest
from kafka.record.memory_records import MemoryRecords

from logmq import AsyncAdmin, AsyncProducer

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
KAFKA_CODEC = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
PER_CODEC = 200


def expected(codec: str, i: int) -> tuple:
    key = None if i % 5 == 0 else f"{codec}-key-{i % 13}".encode()
    value = None if i % 17 == 0 else (f"{codec}-value-{i}-" * (1 + i % 7)).encode()
    headers = [] if i % 3 else [("n", str(i).encode()), ("empty", None)]
    return key, value, headers, 1_700_000_000_000 + i * 7


async def test_segments_parse_with_kafka_python(broker):
    async with AsyncAdmin(broker.bootstrap) as admin:
        for codec in CODECS:
            await admin.create_topic(f"t-{codec}", partitions=1)
    for codec in CODECS:
        async with AsyncProducer(broker.bootstrap, compression=codec, linger_ms=1) as producer:
            handles = []
            for i in range(PER_CODEC):
                key, value, headers, ts = expected(codec, i)
                handles.append(
                    producer.send(f"t-{codec}", value, key=key, headers=headers, timestamp=ts)
                )
                if i % 50 == 49:  # several batches per codec
                    await producer.flush()
            for h in handles:
                await h
    assert broker.stop() == 0

    for codec in CODECS:
        logs = sorted((broker.data_dir / f"t-{codec}-0").glob("*.log"))
        assert logs
        records, batches = [], 0
        for path in logs:
            data = path.read_bytes()
            parsed = MemoryRecords(data)
            while True:
                batch = parsed.next_batch()
                if batch is None:
                    break
                batches += 1
                assert batch.magic == 2
                assert batch.validate_crc(), f"{path}: CRC-32C mismatch"
                assert batch.compression_type == KAFKA_CODEC[codec]
                records.extend(batch)
            assert parsed.valid_bytes() == len(data)
        assert batches >= PER_CODEC // 50
        assert [r.offset for r in records] == list(range(PER_CODEC))
        for i, r in enumerate(records):
            key, value, headers, ts = expected(codec, i)
            assert (r.key, r.value, r.timestamp) == (key, value, ts), (codec, i)
            assert [tuple(h) for h in r.headers] == headers, (codec, i)


@pytest.mark.parametrize("codec", CODECS)
def test_kafka_python_batches_are_valid_logmq_batches(codec):
    """The reverse: a batch kafka-python builds passes logmq's validation and decodes."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    from logmq.storage import batch as b

    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=KAFKA_CODEC[codec],
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    for i in range(50):
        key, value, headers, ts = expected(codec, i)
        builder.append(i, ts, key, value, headers)
    raw = bytes(builder.build())
    h = b.validate(raw)
    assert h.compression == KAFKA_CODEC[codec]
    want = []
    for i in range(50):
        key, value, headers, ts = expected(codec, i)
        want.append((i, ts, key, value, headers))
    assert b.decode_records(raw) == want
