"""The recorded corpus (tests/kafka/corpus/, see record_corpus.py) holds real clients'
valid requests: each must decode, or the decoder refuses something a client sends."""

from __future__ import annotations

import pathlib
import struct

import pytest

from logmq.kafka.registry import SERVED, kafka_wire

CORPUS = pathlib.Path(__file__).parent / "corpus"
FRAMES = sorted(CORPUS.glob("*.bin"))


def test_corpus_has_every_client() -> None:
    clients = {p.name.rsplit("-", 3)[0] for p in FRAMES}
    assert {"confluent", "kafka-python", "aiokafka"} <= clients


@pytest.mark.parametrize("path", FRAMES, ids=[p.stem for p in FRAMES])
def test_corpus_frame_decodes(path: pathlib.Path) -> None:
    frame = path.read_bytes()
    api_key, version = struct.unpack_from(">hh", frame, 0)
    assert path.name.rsplit("-", 3)[1:3] == [str(api_key), f"v{version}"]  # no size prefix
    lo, hi = SERVED.get(api_key, (0, -1))
    if not lo <= version <= hi:
        pytest.skip(f"API key {api_key} v{version} is not served (a client's probe)")
    request = kafka_wire().decode_request(memoryview(frame))
    assert (request.api_key, request.api_version) == (api_key, version)
