"""The CLI's TLS and SASL settings, taken as rpk and Kafka's tools take them.

``-X key=value`` (repeatable, Kafka client property names), ``--command-config FILE`` (a
Java properties file, as kafka-*.sh read; ``sasl.jaas.config`` included), and the
``LOGMQ_SECURITY_PROTOCOL``-style environment variables; -X wins over the file, the file
over the environment. Each layer is read on its own before they are merged, so a file's
``sasl.jaas.config`` login replaces the environment's ``LOGMQ_SASL_USERNAME``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping

import click

from logmq.client.security import JAVA_PROPERTIES, PROPERTIES, ClientSecurity, java_names

KNOWN = (*PROPERTIES, *JAVA_PROPERTIES)
ENV_VARS = tuple("LOGMQ_" + key.upper().replace(".", "_") for key in PROPERTIES)


def parse_property(item: str) -> tuple[str, str]:
    """One ``-X key=value``; click.BadParameter names what is wrong."""
    key, sep, value = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise click.BadParameter(f"expected key=value, got {item!r}", param_hint="-X")
    if key not in KNOWN:
        raise click.BadParameter(
            f"{key!r} is not a client security property; logmq's CLI takes " + ", ".join(KNOWN),
            param_hint="-X",
        )
    return key, value.strip()


def read_properties(path: str) -> dict[str, str]:
    """A Java properties file (java.util.Properties.load): ``key=value``, ``key: value``
    or ``key value``; ``#`` and ``!`` comments; a trailing backslash continues the line;
    backslash escapes (``\\t``, ``\\uXXXX``, ``\\=``...)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise click.BadParameter(f"cannot read {path}: {e}", param_hint="--command-config")
    out: dict[str, str] = {}
    for line in _logical_lines(text.splitlines()):
        key, value = _split(line)
        out[_unescape(key)] = _unescape(value)
    return out


def _logical_lines(lines: Iterable[str]) -> Iterable[str]:
    pending = ""
    continuing = False
    for raw in lines:
        line = raw.lstrip(" \t\f")
        if not continuing and (not line or line[0] in "#!"):
            continue
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2:  # an odd count: the last backslash joins the next line
            pending += line[:-1]
            continuing = True
            continue
        yield pending + line
        pending, continuing = "", False
    if pending:
        yield pending


def _split(line: str) -> tuple[str, str]:
    i = 0
    while i < len(line):
        c = line[i]
        if c == "\\":
            i += 2
            continue
        if c in "=: \t\f":
            break
        i += 1
    key, rest = line[:i], line[i:].lstrip(" \t\f")
    if rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(" \t\f")
    return key, rest


_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    out = []
    i = 0
    while i < len(text):
        c = text[i]
        if c != "\\" or i + 1 == len(text):
            out.append(c)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "u":
            digits = text[i + 2 : i + 6]
            try:
                out.append(chr(int(digits, 16)))
            except ValueError:
                raise click.BadParameter(
                    f"malformed \\u escape {text[i : i + 6]!r}", param_hint="--command-config"
                ) from None
            i += 6
            continue
        out.append(_ESCAPES.get(nxt, nxt))
        i += 2
    return "".join(out)


def environment_properties(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    env = os.environ if environ is None else environ
    return {
        key: env[name]
        for key, name in zip(PROPERTIES, ENV_VARS, strict=True)
        if name in env and env[name] != ""
    }


def client_security(
    x_properties: Iterable[tuple[str, str]],
    command_config: str | None,
    environ: Mapping[str, str] | None = None,
) -> ClientSecurity | None:
    """The settings of -X over --command-config over the environment; None when no
    layer says anything (a PLAINTEXT listener). ValueError names a wrong property.
    Read once per command (a command opens several clients)."""
    env = tuple(environment_properties(environ).items())
    try:
        version = os.stat(command_config).st_mtime_ns if command_config else 0
    except OSError:
        version = -1  # read_properties says what is wrong
    return _client_security(tuple(x_properties), command_config, version, env)


@functools.lru_cache(maxsize=4)
def _client_security(
    x_properties: tuple[tuple[str, str], ...],
    command_config: str | None,
    _file_version: int,
    env: tuple[tuple[str, str], ...],
) -> ClientSecurity | None:
    merged: dict[str, str] = java_names(dict(env))
    if command_config is not None:
        from_file = read_properties(command_config)
        ignored = sorted(k for k in from_file if k not in KNOWN)
        if ignored:
            click.echo(
                f"logmq: {command_config}: ignoring {', '.join(ignored)} (not a security "
                "setting the CLI uses)",
                err=True,
            )
        merged.update(java_names({k: v for k, v in from_file.items() if k in KNOWN}))
    merged.update(java_names(dict(x_properties)))
    return ClientSecurity.from_properties(merged) if merged else None
