"""A real Broker on its own event-loop thread, for tests that must act on its storage.

Retention runs on a five-minute timer in the broker; a test that needs old segments
deleted *now* calls ``run_retention()`` here, on the broker's own loop, instead of
waiting. Clients, including Spark's Python workers, reach it over 127.0.0.1 like any
``logmq-server``.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import uvloop

from tests.harness import inprocess_broker

START_TIMEOUT = 30.0


class ThreadedBroker:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir)
        self.broker: Any = None
        self._loop = uvloop.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="threaded-broker", daemon=True)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.broker.port}"

    def start(self) -> ThreadedBroker:
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT):
            raise RuntimeError("threaded broker did not start")
        if self._error is not None:
            raise RuntimeError("threaded broker failed to start") from self._error
        return self

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        except BaseException as e:  # reported by start()
            self._error = e
            self._ready.set()
        finally:
            self._loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with inprocess_broker(self.data_dir) as broker:
            self.broker = broker
            self._ready.set()
            await self._stop.wait()

    def call(self, fn: Any, *args: Any, timeout: float = 30.0) -> Any:
        """Run ``fn(*args)`` on the broker's loop thread and return its result."""

        async def run() -> Any:
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)

    def run_retention(self) -> int:
        """One retention pass over every log now; returns the number of segments deleted."""
        return self.call(self.broker.logs.run_retention)

    def stop(self) -> None:
        if self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(START_TIMEOUT)
