"""Shared fixtures: every test must leave /dev/shm as it found it.

Also: the Ctrl-C tests need SIGINT to reach Python. A shell starts background
jobs (``cmd &`` without job control, ``nohup``) with SIGINT ignored, Python
then keeps it ignored, and so would every process the tests spawn: a wait
meant to end on KeyboardInterrupt would never end. The suite restores
Python's handler once, here; spawned processes then start with the default.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

SHM_DIR = "/dev/shm"
SHM_PREFIX = "tensorxfer-"


def _creator_is_ours_or_dead(name: str) -> bool:
    """Segment names are ``tensorxfer-<creator pid>-<random>``. A segment whose creator
    is still alive and is not this process belongs to someone else (another test run
    on the same machine) and is not this test's leak."""
    try:
        pid = int(name[len(SHM_PREFIX):].split("-", 1)[0])
    except ValueError:
        return True
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def tensorxfer_segments() -> set[str]:
    """Names of the tensorxfer segments in /dev/shm now that this process or a dead one made."""
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return set()
    return {name for name in names if name.startswith(SHM_PREFIX) and _creator_is_ours_or_dead(name)}


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
