"""Write the checked-in seed corpus of each target under fuzz/corpus/.

    python -m fuzz.make_corpus

codec: valid batches of each compression and a few-batch log (flags byte 2: the CRC is
recomputed after a mutation), plus the regression inputs. kafka: request frames of
every API the Kafka door serves at its lowest and highest version, bodies built by
hypothesis from kio's types with a fixed seed, plus the regression inputs. native:
request and response frames of the native door as its client and broker encode them,
plus its regression inputs. Inputs over 4096 bytes stay out (the tests replay the big
regression inputs straight from fuzz/regressions.py).
Files are named by content; the folders are emptied first.
"""

from __future__ import annotations

import hashlib
import io
import random
import warnings
from pathlib import Path

CORPUS = Path(__file__).resolve().parent / "corpus"


def _write(target: str, data: bytes) -> None:
    folder = CORPUS / target
    folder.mkdir(parents=True, exist_ok=True)
    (folder / hashlib.sha1(data).hexdigest()[:16]).write_bytes(data)


def codec_seeds() -> list[bytes]:
    from fuzz import codec_inputs, regressions

    rnd = random.Random(27)
    out = [b"\x02" + codec_inputs.batch(rnd, codec) for codec in codec_inputs.CODECS]
    out += [b"\x02" + codec_inputs.log(rnd) for _ in range(2)]
    out += [b"\x00" + data for data in regressions.CODEC.values()]
    return out


def _examples(cls: type, key: int) -> list:
    """Twenty hypothesis-built bodies of a kio request type, the same every time."""
    from hypothesis import HealthCheck, given, seed, settings
    from hypothesis import strategies as st

    bodies: list = []

    @seed(key)
    @settings(max_examples=20, database=None, suppress_health_check=list(HealthCheck))
    @given(st.from_type(cls))
    def collect(body):
        bodies.append(body)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        collect()
    return bodies


def kafka_seeds() -> list[bytes]:
    from hypothesis import strategies as st
    from kio.index import KioIndexError, load_request_schema
    from kio.serial import entity_writer
    from kio.static.primitive import Records

    from fuzz import codec_inputs, regressions
    from logmq.kafka.registry import SERVED

    rnd = random.Random(9092)
    st.register_type_strategy(Records, st.builds(lambda: codec_inputs.batch(rnd, 0)))
    out: list[bytes] = []
    for api_key, (low, high) in sorted(SERVED.items()):
        for version in sorted({low, high}):
            try:
                cls = load_request_schema(api_key, version)
            except KioIndexError:  # a version kio does not know (so the door neither)
                continue
            bodies = _examples(cls, api_key * 100 + version)
            header = cls.__header_schema__(
                request_api_key=api_key,
                request_api_version=version,
                correlation_id=7,
                client_id="fuzz",
            )
            frames = []
            for body in bodies:
                buf = io.BytesIO()
                entity_writer(type(header))(buf, header)
                entity_writer(cls)(buf, body)
                frames.append(buf.getvalue())
            frames.sort(key=len)  # the smallest and a mid-sized one: small and varied
            out += [frames[0], frames[len(frames) // 2]] if len(frames) > 1 else frames
    out += regressions.KAFKA.values()
    return [f for f in out if len(f) <= 4096]


def native_seeds() -> list[bytes]:
    from fuzz import codec_inputs, regressions
    from logmq.net import codec

    rnd = random.Random(1)
    one = codec_inputs.batch(rnd, 0)
    produce = {
        "acks": -1,
        "timeout_ms": 30000,
        "topics": [{"topic": "t", "partitions": [{"partition": 0, "size": len(one)}]}],
    }
    fetch = {
        "max_wait_ms": 500,
        "min_bytes": 1,
        "max_bytes": 1 << 20,
        "topics": [{"topic": "t", "partitions": [{"partition": 0, "fetch_offset": 0,
                                                   "partition_max_bytes": 1 << 20}]}],
    }  # fmt: skip
    requests = [
        (codec.ApiKey.PRODUCE, produce, [one]),
        (codec.ApiKey.FETCH, fetch, []),
        (codec.ApiKey.METADATA, {"topics": ["t", "u"], "allow_auto_create": False}, []),
        (codec.ApiKey.API_VERSIONS, {}, []),
        (codec.ApiKey.OFFSET_COMMIT, {"group_id": "g", "topics": [{"topic": "t",
                                      "partitions": [{"partition": 0, "offset": 5}]}]}, []),
    ]  # fmt: skip
    out = [b"".join(codec.encode_request(k, 0, 3, "fuzz", body, tail))[4:]
           for k, body, tail in requests]  # fmt: skip
    fetched = {
        "topics": [
            {
                "topic": "t",
                "partitions": [{"partition": 0, "error": 0, "high_watermark": 1, "size": len(one)}],
            }
        ]
    }
    out.append(b"".join(codec.encode_response(3, fetched, [one]))[4:])
    out.append(b"".join(codec.encode_response(4, {"error": 3, "message": "no"}))[4:])
    out += regressions.NATIVE.values()
    return [f for f in out if len(f) <= 4096]


def main() -> None:
    for target, seeds in (("codec", codec_seeds), ("kafka", kafka_seeds),
                          ("native", native_seeds)):  # fmt: skip
        for old in (CORPUS / target).glob("*"):
            old.unlink()
        for data in seeds():
            _write(target, data)
        print(target, len(list((CORPUS / target).iterdir())), "files")


if __name__ == "__main__":
    main()
