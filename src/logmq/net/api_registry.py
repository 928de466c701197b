"""One entry per API a front door serves: the registry each door declares and the pipeline reads.

An ``ApiSpec`` says everything the broker needs to know about one API key on one door:
its versions, the handler method that answers it, what the authorizer checks before the
handler, and how the request is scheduled (concurrent with the connection's earlier
requests, skipped once its client has gone, preceded by the offsets topic, run on the
controller, admitted before authentication, metered by the request-time quota). The
pipeline, the connection, ApiVersions and the docs' version tables all read the registry,
so adding an API is one entry beside its handler's class, never a set of integers in
several files (the layout Redpanda's ``kafka/server/handlers/`` has, one declaration per
handler).

Handlers are named unbound (``KafkaTopicApis.create_topics``); ``bind`` resolves each to
the one object among those the composition root passes in whose class has that method,
and refuses a registry whose handler has no object or two, so a half-wired door cannot
start.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, fields
from enum import IntEnum
from typing import Any, Protocol

from logmq.net.codec import Request
from logmq.net.reply import Reply

Handler = Callable[[Request], Awaitable[Reply | None]]


class Access(Protocol):
    """What the door's authorizer checks before the handler runs (each door has its own
    rule types, since its bodies differ); ``describe`` is the rule in words, for docs."""

    def describe(self) -> str: ...


@dataclass(frozen=True, slots=True)
class ApiSpec:
    key: IntEnum
    versions: tuple[int, int]  # advertised (min, max)
    handler: Callable[..., Awaitable[Reply | None]]  # an unbound method: Class.method
    access: Access  # checked by the pipeline's authorization step
    # versions inside the advertised range that are refused anyway (Produce 0-2: the
    # message formats before RecordBatch v2); None: every advertised version is served
    oldest_served: int | None = None
    concurrent: bool = False  # may start while the connection's earlier requests run
    read_only: bool = False  # no effect: skipped once its client has gone away
    offsets_topic: bool = False  # needs __consumer_offsets: the first one creates it
    controller: bool = False  # a metadata change: runs on the controller
    before_auth: bool = False  # admitted on a SASL listener before the login
    throttled: bool = True  # metered by the request-time quota (brokers' own are not)
    note: str = ""

    @property
    def name(self) -> str:
        return self.key.name.lower()

    @property
    def served(self) -> tuple[int, int]:
        """The versions actually answered (the advertised ones less the refused)."""
        lo, hi = self.versions
        return (max(lo, self.oldest_served), hi) if self.oldest_served is not None else (lo, hi)


def _is_method(handler: Callable[..., Any]) -> bool:
    """Is ``handler`` a function defined in a class body (an unbound method)?"""
    qualname = getattr(handler, "__qualname__", "")
    owner, _, name = qualname.rpartition(".")
    return bool(owner) and not owner.endswith("<locals>") and name == handler.__name__


class ApiRegistry:
    """A door's specs by key, and the views of them each consumer needs."""

    __slots__ = ("by_key", "door")

    def __init__(self, door: str, specs: Iterable[ApiSpec]) -> None:
        self.door = door
        self.by_key: dict[int, ApiSpec] = {}
        for spec in specs:
            if int(spec.key) in self.by_key:
                raise ValueError(f"{door}: {spec.name} is declared twice")
            self.by_key[int(spec.key)] = spec

    def __iter__(self):
        return iter(sorted(self.by_key.values(), key=lambda s: int(s.key)))

    def __len__(self) -> int:
        return len(self.by_key)

    def get(self, key: int) -> ApiSpec | None:
        return self.by_key.get(key)

    def versions(self) -> dict[int, tuple[int, int]]:
        """api key -> advertised (min, max): what ApiVersions answers."""
        return {k: s.versions for k, s in sorted(self.by_key.items())}

    def served_versions(self) -> dict[int, tuple[int, int]]:
        """api key -> the versions the pipeline lets through to the handler."""
        return {k: s.served for k, s in sorted(self.by_key.items())}

    def keys(self, flag: str) -> frozenset[int]:
        """The keys whose spec has boolean ``flag`` set (``"offsets_topic"``, ...)."""
        return frozenset(k for k, s in self.by_key.items() if getattr(s, flag))

    def predicate(self, flag: str) -> Callable[[Request], bool]:
        """``request -> bool`` for ``flag``: what the connection asks of each request."""
        keys = self.keys(flag)
        return lambda req: req.api_key in keys

    def bind(self, *services: object) -> dict[int, Handler]:
        """api key -> the handler bound to the one service object of its class."""
        table: dict[int, Handler] = {}
        for key, spec in self.by_key.items():
            name = spec.handler.__name__
            matches = [s for s in services if getattr(type(s), name, None) is spec.handler]
            if len(matches) != 1:
                owner = spec.handler.__qualname__.rpartition(".")[0]
                raise ValueError(
                    f"{self.door} {spec.name}: {len(matches)} objects of "
                    f"{owner} given to answer it (one is needed)"
                )
            table[key] = getattr(matches[0], name)
        return table

    def problems(self) -> list[str]:
        """What makes an entry incomplete (a test asserts there is nothing)."""
        out = []
        for spec in self:
            lo, hi = spec.versions
            if not 0 <= lo <= hi:
                out.append(f"{spec.name}: versions {spec.versions}")
            if spec.oldest_served is not None and not lo < spec.oldest_served <= hi:
                out.append(f"{spec.name}: oldest_served {spec.oldest_served} outside {lo}..{hi}")
            if not _is_method(spec.handler):
                out.append(f"{spec.name}: handler {spec.handler!r} is not a class's method")
            describe = getattr(spec.access, "describe", None)
            if describe is None or not describe():
                out.append(f"{spec.name}: no access rule")
            if spec.before_auth and spec.controller:
                out.append(f"{spec.name}: admitted before login yet a metadata change")
            for f in fields(spec):
                if getattr(spec, f.name) is None and f.name != "oldest_served":
                    out.append(f"{spec.name}: {f.name} unset")
        return out
