"""Fixtures the unit tests of several packages share."""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def fsynced(monkeypatch, tmp_path):
    """The paths under tmp_path that os.fsync is called on, in order (another test's syncer
    thread may still be at work elsewhere)."""
    paths: list[str] = []
    real_fsync = os.fsync

    def spy(fd):
        path = os.readlink(f"/proc/self/fd/{fd}")
        if path.startswith(f"{tmp_path}/"):
            paths.append(path)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    return paths
