"""Run these tests on uvloop, the loop the broker uses in production."""

from __future__ import annotations

import pytest
import uvloop


@pytest.fixture(scope="session")
def event_loop_policy():
    return uvloop.EventLoopPolicy()
