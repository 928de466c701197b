"""The two doors' registries: every entry complete, every handler bound in a real broker,
the served versions ones kio can read, and the docs' tables saying what the registries say."""

from __future__ import annotations

import pathlib
import re

import pytest
from kio.index import KioIndexError, load_request_schema

from logmq.kafka.codec import _request_class
from logmq.kafka.registry import KAFKA_APIS
from logmq.native.registry import NATIVE_APIS
from logmq.net.api_registry import ApiRegistry, ApiSpec
from logmq.net.codec import ApiKey
from tests.harness import inprocess_broker

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"
REGISTRIES = [KAFKA_APIS, NATIVE_APIS]


@pytest.mark.parametrize("registry", REGISTRIES, ids=lambda r: r.door)
def test_every_entry_is_complete(registry: ApiRegistry) -> None:
    assert registry.problems() == []
    assert len(registry) > 40


def test_the_kafka_registry_serves_only_versions_kio_or_legacy_can_read() -> None:
    for spec in KAFKA_APIS:
        lo, hi = spec.served
        for version in range(lo, hi + 1):
            assert _request_class(int(spec.key), version) is not None, (spec.name, version)
        with pytest.raises(KioIndexError):  # a version past the range is not one we skipped
            load_request_schema(int(spec.key), hi + 50)


def test_the_native_registry_serves_version_zero_of_each_api() -> None:
    assert {spec.versions for spec in NATIVE_APIS} == {(0, 0)}


async def test_bind_refuses_a_handler_without_its_object() -> None:
    class Api:
        async def one(self, req):
            return None

    class Other:
        async def two(self, req):
            return None

    registry = ApiRegistry("test", [ApiSpec(ApiKey.METADATA, (0, 0), Api.one, _Rule())])
    assert set(registry.bind(Api(), Other())) == {int(ApiKey.METADATA)}
    with pytest.raises(ValueError, match=r"0 objects of .*Api given"):
        registry.bind(Other())
    with pytest.raises(ValueError, match=r"2 objects of .*Api given"):
        registry.bind(Api(), Api())
    with pytest.raises(ValueError, match="declared twice"):
        ApiRegistry("test", [registry.get(3), registry.get(3)])  # type: ignore[list-item]


class _Rule:
    def describe(self) -> str:
        return "a rule"


async def test_a_real_broker_binds_every_entry_of_both_doors(tmp_path) -> None:
    async with inprocess_broker(tmp_path / "data", kafka_port=0) as broker:
        for pipeline, registry in (
            (broker.native_pipeline, NATIVE_APIS),
            (broker.kafka_pipeline, KAFKA_APIS),
        ):
            door = pipeline.door
            assert set(door.handlers) == set(registry.by_key), registry.door
            assert door.versions == registry.served_versions()
            for key, handler in door.handlers.items():
                assert handler.__name__ == registry.by_key[key].handler.__name__


def _range(text: str) -> tuple[int, int]:
    lo, _, hi = text.replace("\u2013", "-").partition("-")
    return int(lo), int(hi or lo)


def _doc_rows(heading: str) -> dict[int, list[str]]:
    """api key -> the cells of its row in the first table under ``heading``."""
    text = (DOCS / "kafka-compatibility.md").read_text()
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[int, list[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[1].isdigit():
            assert int(cells[1]) not in rows, f"{heading}: key {cells[1]} listed twice"
            rows[int(cells[1])] = cells
    return rows


def test_the_version_matrix_is_the_kafka_registry() -> None:
    rows = _doc_rows("Version matrix")
    assert set(rows) == set(KAFKA_APIS.by_key)
    for key, cells in rows.items():
        spec = KAFKA_APIS.by_key[key]
        served, _, advertised = cells[2].partition(" (advertised ")
        assert _range(served) == spec.served, cells
        if spec.oldest_served is not None:
            assert _range(advertised.rstrip(")")) == spec.versions, cells


def test_the_api_table_is_the_kafka_registry() -> None:
    rows = _doc_rows("APIs and versions")
    assert set(rows) == set(KAFKA_APIS.by_key)
    for key, cells in rows.items():
        assert _range(cells[2]) == KAFKA_APIS.by_key[key].versions, cells


def test_the_native_protocol_doc_names_every_native_api() -> None:
    text = (DOCS / "protocol.md").read_text()
    named = {int(n) for n in re.findall(r"\((\d+)\)", text)}
    missing = sorted(spec.name for spec in NATIVE_APIS if int(spec.key) not in named)
    assert missing == []
