"""CLI pieces that need no broker: parsing, output formats, rate limiting, percentiles."""

from __future__ import annotations

import base64
import json

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from logmq.records import Record
from logmq_cli.common import DEFAULT_BOOTSTRAP
from logmq_cli.consume import IdleTimer
from logmq_cli.main import cli
from logmq_cli.output import decode_bytes, format_record, parse_key_values, record_to_json
from logmq_cli.perf import Progress, TokenBucket, percentile, summarize_latencies, throughput
from logmq_cli.produce import MissingKeyError, acks_value, parse_lines

# -- argument parsing -------------------------------------------------------------------


def test_help_lists_every_command():
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    for name in ("topic", "produce", "consume", "bench"):
        assert name in result.output
    assert DEFAULT_BOOTSTRAP in result.output


@pytest.mark.parametrize(
    "args",
    [
        ["topic", "create", "t", "--partitions", "0"],
        ["topic", "create"],
        ["consume", "t", "--format", "xml"],
        ["consume", "t", "--offset", "-1"],
        ["produce", "t", "--acks", "2"],
        ["bench", "produce", "--records", "0"],
        ["bench", "latency", "--rate", "0"],
    ],
)
def test_bad_arguments_are_usage_errors(args):
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert "Error" in result.output


def test_alter_config_needs_a_change():
    result = CliRunner().invoke(cli, ["topic", "alter-config", "t"])
    assert result.exit_code == 2
    assert "--set" in result.output


def test_bad_config_item_is_a_clear_error_before_any_connection():
    # Port 1 is never a broker: the error must come from parsing, not from connecting.
    result = CliRunner().invoke(
        cli, ["-b", "127.0.0.1:1", "topic", "create", "t", "--config", "novalue"]
    )
    assert result.exit_code == 1
    assert "key=value" in result.output


def test_unreachable_broker_gives_one_line_error_not_traceback():
    result = CliRunner().invoke(
        cli, ["-b", "127.0.0.1:1", "--request-timeout", "0.5", "topic", "list"]
    )
    assert result.exit_code == 1
    assert result.output.startswith("Error:")
    assert "Traceback" not in result.output


def test_bootstrap_comes_from_environment(monkeypatch):
    seen = {}

    @cli.command("show-bootstrap")
    def show(**_):
        import click

        seen["bootstrap"] = click.get_current_context().obj.bootstrap

    try:
        result = CliRunner().invoke(
            cli, ["show-bootstrap"], env={"LOGMQ_BOOTSTRAP": "10.0.0.1:1234"}
        )
        assert result.exit_code == 0, result.output
        assert seen["bootstrap"] == "10.0.0.1:1234"
    finally:
        cli.commands.pop("show-bootstrap")


def test_parse_key_values():
    assert parse_key_values(["a=1", " b = x=y "], "--set") == {"a": "1", "b": "x=y"}
    with pytest.raises(ValueError, match="--set"):
        parse_key_values(["=1"], "--set")


def test_acks_value():
    assert acks_value("all") == acks_value("-1") == "all"
    assert acks_value("0") == 0 and acks_value("1") == 1


# -- produce input ----------------------------------------------------------------------


def test_parse_lines_strips_line_endings_only():
    lines = [b"a\n", b"b\r\n", b" c \n", b"\n", b"last"]
    assert list(parse_lines(lines, None)) == [
        (None, b"a"),
        (None, b"b"),
        (None, b" c "),
        (None, b""),
        (None, b"last"),
    ]


def test_parse_lines_splits_at_first_separator():
    assert list(parse_lines([b"k:v:w\n", b":empty-key\n"], b":")) == [
        (b"k", b"v:w"),
        (b"", b"empty-key"),
    ]


def test_parse_lines_reports_the_line_without_separator():
    with pytest.raises(MissingKeyError, match="line 2"):
        list(parse_lines([b"k:v\n", b"novalue\n"], b":"))


_field = st.binary().filter(lambda b: b"\n" not in b and b"\t" not in b)


@given(st.lists(st.tuples(_field, _field.filter(lambda v: not v.endswith(b"\r"))), max_size=20))
@settings(max_examples=50, deadline=None)
def test_parse_lines_round_trips_keyed_lines(pairs):
    """Any key and value survive, except a value ending in CR: that reads as a CRLF ending."""
    lines = [k + b"\t" + v + b"\n" for k, v in pairs]
    assert list(parse_lines(lines, b"\t")) == pairs


# -- output formats ---------------------------------------------------------------------


def _rec(key=b"k", value=b"v", headers=()):
    return Record("t", 2, 7, 1700000000000, key, value, list(headers))


def test_json_record_has_documented_fields():
    doc = json.loads(format_record(_rec(headers=[("h", b"x")]), "json"))
    assert doc == {
        "topic": "t",
        "partition": 2,
        "offset": 7,
        "timestamp": 1700000000000,
        "key": "k",
        "value": "v",
        "headers": [["h", "x"]],
    }


def test_invalid_utf8_is_escaped_not_lost():
    assert decode_bytes(b"ok\xff", "utf8") == "ok\\xff"
    assert decode_bytes(None) is None


@given(st.binary(max_size=200))
@settings(max_examples=100, deadline=None)
def test_base64_is_exact(data):
    doc = record_to_json(_rec(value=data), "base64")
    assert base64.b64decode(doc["value"]) == data


def test_text_format_with_and_without_key():
    assert format_record(_rec(), "text") == "v"
    assert format_record(_rec(), "text", print_key=True, key_separator="=") == "k=v"
    assert format_record(_rec(key=None, value=None), "text", print_key=True) == "\t"


# -- idle timeout -----------------------------------------------------------------------


def test_idle_timer_counts_from_last_arrival():
    t = IdleTimer(2.0, now=100.0)
    assert t.remaining(101.0) == pytest.approx(1.0)
    t.arrived(101.5)
    assert t.remaining(103.0) == pytest.approx(0.5)
    assert t.remaining(110.0) == 0.0
    assert IdleTimer(None, 0.0).remaining(1e9) is None


# -- rate limiter -----------------------------------------------------------------------


def test_token_bucket_allows_burst_then_paces():
    b = TokenBucket(rate=100, burst=10, now=0.0)
    assert b.reserve(10, 0.0) == 0.0
    assert b.reserve(1, 0.0) == pytest.approx(0.01)
    # After the wait the debt is repaid and the next token is due one interval later.
    assert b.reserve(1, 0.01) == pytest.approx(0.01)


def test_token_bucket_never_saves_more_than_burst():
    b = TokenBucket(rate=1000, burst=5, now=0.0)
    assert b.available(100.0) == 5


def test_token_bucket_rejects_nonpositive_rate():
    with pytest.raises(ValueError):
        TokenBucket(0)


@given(
    rate=st.floats(10, 1e6),
    sizes=st.lists(st.integers(1, 5000), min_size=1, max_size=50),
)
@settings(max_examples=100, deadline=None)
def test_token_bucket_long_run_rate_is_capped(rate, sizes):
    """Acting when told, the total taken never exceeds burst + rate * elapsed."""
    b = TokenBucket(rate, burst=10, now=0.0)
    now = 0.0
    taken = 0
    for n in sizes:
        now += b.reserve(n, now)
        taken += n
        assert taken <= 10 + rate * now + 1e-6 * taken


# -- statistics -------------------------------------------------------------------------


def test_percentile_nearest_rank():
    values = list(range(1, 101))
    assert percentile(values, 50) == 50
    assert percentile(values, 99) == 99
    assert percentile(values, 99.9) == 100
    assert percentile(values, 100) == 100
    assert percentile(values, 0) == 1
    assert percentile([7], 99.9) == 7
    with pytest.raises(ValueError):
        percentile([], 50)


@given(st.lists(st.integers(0, 10**9), min_size=1, max_size=300), st.floats(0, 100))
@settings(max_examples=100, deadline=None)
def test_percentile_is_a_measured_value_with_enough_below(values, q):
    s = sorted(values)
    p = percentile(s, q)
    assert p in s
    assert sum(v <= p for v in s) >= q / 100 * len(s)


def test_summarize_latencies_in_ms():
    summary = summarize_latencies([3_000_000, 1_000_000, 2_000_000])
    assert summary.count == 3
    assert summary.p50_ms == 2.0
    assert summary.max_ms == 3.0
    assert summary.mean_ms == pytest.approx(2.0)


def test_throughput_fields():
    doc = throughput(1000, 100_000, 0.5)
    assert doc == {"records": 1000, "seconds": 0.5, "records_per_sec": 2000.0, "mb_per_sec": 0.2}


def test_progress_line_and_schedule():
    p = Progress("produce", 1000, now=0.0, interval=0.5)
    assert not p.due(0.4)
    assert p.due(0.5)
    assert not p.due(0.6)
    assert p.line(500, 50_000, 1.0) == "produce: 500/1,000 records, 500 rec/s, 0.1 MB/s, 1.0 s"
