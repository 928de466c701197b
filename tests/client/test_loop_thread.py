"""The blocking clients' loop thread leaves no call running unowned: one interrupted by
Ctrl-C is cancelled, and calls still running when the thread stops are finished, not
destroyed pending (``Task was destroyed but it is pending!``)."""

from __future__ import annotations

import asyncio
import signal
import sys
import threading

import pytest

from logmq.client.sync import LoopThread


@pytest.mark.timeout(60)
def test_stopping_the_loop_thread_finishes_calls_still_running():
    lt = LoopThread()
    started, cleaned_up = threading.Event(), threading.Event()

    async def forever() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            cleaned_up.set()

    lt.submit(forever())
    assert started.wait(10)
    lt.stop()
    assert cleaned_up.is_set()


@pytest.mark.timeout(60)
def test_a_call_interrupted_by_ctrl_c_is_cancelled():
    lt = LoopThread()
    main = threading.main_thread().ident
    assert main == threading.get_ident()
    cancelled = threading.Event()

    async def interrupted() -> None:
        # Ctrl-C once the caller waits for this call (the waiting is a condition poll).
        # A SIGINT that lands after the interpreter's last signal check but before the
        # lock wait blocks is only seen once the wait ends (a CPython race): send it
        # again until the caller's KeyboardInterrupt cancels this call.
        while sys._current_frames()[main].f_code.co_name != "wait":
            await asyncio.sleep(0.001)
        try:
            while True:
                signal.pthread_kill(main, signal.SIGINT)
                await asyncio.sleep(0.5)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    # A background job (``cmd &``, CI without a terminal) starts with SIGINT ignored:
    # then no KeyboardInterrupt ever comes. Ctrl-C's Python handler, for this test only.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            lt.run(interrupted())
        assert cancelled.wait(10)
    finally:
        signal.signal(signal.SIGINT, previous)
        lt.stop()
