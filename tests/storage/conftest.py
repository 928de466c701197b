from __future__ import annotations

import pytest

from logmq.storage import checkpoint


@pytest.fixture
def no_fsync(monkeypatch):
    """Skip real fsyncs and syncfs in tests that simulate crashes by editing files."""
    monkeypatch.setattr(checkpoint, "fsync", lambda fd: None)
    monkeypatch.setattr(checkpoint, "fdatasync", lambda fd: None)
    monkeypatch.setattr(checkpoint, "syncfs", lambda fd: None)
