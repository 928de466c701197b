"""Output for the CLI: rich tables for people, ``--json`` for scripts, record encodings.

Record keys and values are bytes. Text and JSON output must be str, so every byte field
goes through ``decode_bytes``: ``utf8`` decodes with ``errors="backslashreplace"`` (readable,
but lossy for binary data: ``\\xff`` cannot be told from the four characters it prints),
``base64`` is exact and reversible.
"""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Iterable, Sequence
from typing import IO, Any

from rich.console import Console
from rich.table import Table

from logmq.records import Record

BYTE_ENCODINGS = ("utf8", "base64")


def decode_bytes(data: bytes | None, encoding: str = "utf8") -> str | None:
    """Bytes as a str for output; None stays None (JSON null)."""
    if data is None:
        return None
    if encoding == "base64":
        return base64.b64encode(data).decode("ascii")
    if encoding == "utf8":
        return data.decode("utf-8", errors="backslashreplace")
    raise ValueError(f"unknown byte encoding {encoding!r}; use one of {BYTE_ENCODINGS}")


def record_to_json(record: Record, encoding: str = "utf8") -> dict[str, Any]:
    """The JSON object ``logmq consume --format json`` prints for one record."""
    return {
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "timestamp": record.timestamp,
        "key": decode_bytes(record.key, encoding),
        "value": decode_bytes(record.value, encoding),
        "headers": [[name, decode_bytes(v, encoding)] for name, v in record.headers or ()],
    }


def format_record(
    record: Record,
    fmt: str = "text",
    *,
    encoding: str = "utf8",
    print_key: bool = False,
    key_separator: str = "\t",
) -> str:
    """One output line (without the newline) for a consumed record."""
    if fmt == "json":
        return json.dumps(record_to_json(record, encoding), ensure_ascii=False)
    value = decode_bytes(record.value, encoding)
    text = "" if value is None else value
    if print_key:
        key = decode_bytes(record.key, encoding)
        text = ("" if key is None else key) + key_separator + text
    return text


def emit_json(obj: Any, out: IO[str] | None = None) -> None:
    """One JSON document on one line."""
    out = out or sys.stdout
    out.write(json.dumps(obj, ensure_ascii=False) + "\n")
    out.flush()


def print_table(
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    title: str | None = None,
    out: IO[str] | None = None,
) -> None:
    """A readable table; lists are shown comma-separated and None as an empty cell."""
    table = Table(title=title, title_justify="left", header_style="bold")
    for name in columns:
        table.add_column(name, overflow="fold")
    for row in rows:
        table.add_row(*(_cell(v) for v in row))
    Console(file=out or sys.stdout, soft_wrap=False).print(table)


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, (list, tuple, set)):
        return ",".join(str(x) for x in v)
    return str(v)


def parse_key_values(items: Iterable[str], option: str) -> dict[str, str]:
    """``["a=1", "b=2"]`` -> ``{"a": "1", "b": "2"}``; a clear error names the bad item."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{option} expects key=value, got {item!r}")
        out[key.strip()] = value.strip()
    return out
