"""Shared fixtures: every test must leave /dev/shm as it found it."""

from __future__ import annotations

import os
import time

import pytest

SHM_DIR = "/dev/shm"
SHM_PREFIX = "tensorxfer-"


def tensorxfer_segments() -> set[str]:
    """Names of the tensorxfer segments in /dev/shm now."""
    try:
        return {name for name in os.listdir(SHM_DIR) if name.startswith(SHM_PREFIX)}
    except FileNotFoundError:
        return set()


@pytest.fixture(autouse=True)
def no_leaked_shared_memory():
    """Fails a test that leaves tensorxfer segments in /dev/shm behind.

    Dead peers' segments are reclaimed by the survivors, so a short grace period
    lets a just-killed process's cleanup finish before the check.
    """
    before = tensorxfer_segments()
    yield
    deadline = time.monotonic() + 2.0
    leaked = tensorxfer_segments() - before
    while leaked and time.monotonic() < deadline:
        time.sleep(0.02)
        leaked = tensorxfer_segments() - before
    if leaked:
        for name in leaked:  # clean up so one leak does not fail every later test
            try:
                os.unlink(os.path.join(SHM_DIR, name))
            except FileNotFoundError:
                pass
        pytest.fail(f"test left shared-memory segments in {SHM_DIR}: {sorted(leaked)}")


def torch_or_skip():
    """Import torch, or skip the calling test with the reason."""
    return pytest.importorskip("torch", reason="torch is not installed (pip install .[torch])")
