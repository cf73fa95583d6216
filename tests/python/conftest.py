"""Shared fixtures: every test must leave /dev/shm as it found it. And the test tiers.

Tiers (``--tier``, or ``TENSORXFER_TEST_TIER``; the default is ``fast``):

- ``fast``: every in-process test not marked ``slow``, plus the multi-process cases marked
  ``fast`` (one 2-rank case per subsystem). The README's test command, under 3 minutes warm.
- ``full``: everything that is not ``stress``. CI runs it on every submission.
- ``stress``: the cases marked ``stress`` (10k iterations, large worlds, simulated
  hosts, the benchmark smoke tests). Run before a release: ``scripts/test.sh --tier stress``.
- ``all``: ``full`` and ``stress`` together.

A test's tier comes from its markers alone (``tier_of``): ``stress`` wins; a test
without ``multiprocess`` is in-process and so ``fast`` unless marked ``slow`` (it waits
seconds by design: a timeout it checks, a Sphinx build, a megatron import); a
``multiprocess`` test is ``full`` unless it is also marked ``fast``. Markers that contradict each other are a
collection error, and a test that starts rank processes (``multiprocessing``,
``mpirun``, ``torchrun``) without the ``multiprocess`` marker fails: it would
otherwise be counted in-process and slip into the fast tier.

Also: the Ctrl-C tests need SIGINT to reach Python. A shell starts background
jobs (``cmd &`` without job control, ``nohup``) with SIGINT ignored, Python
then keeps it ignored, and so would every process the tests spawn: a wait
meant to end on KeyboardInterrupt would never end. The suite restores
Python's handler once, here; spawned processes then start with the default.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from multiprocessing.process import BaseProcess

import pytest

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

TIERS = ("fast", "full", "stress", "all")
TIER_CONTENTS = {"fast": {"fast"}, "full": {"fast", "full"}, "stress": {"stress"}, "all": {"fast", "full", "stress"}}
RANK_LAUNCHERS = {"mpirun", "mpiexec", "torchrun"}


def pytest_addoption(parser):
    parser.addoption("--tier", choices=TIERS, default=os.environ.get("TENSORXFER_TEST_TIER", "fast"),
                     help="which tests to run: fast (default), full (all but stress), stress, all "
                          "(see tests/python/conftest.py)")


def tier_of(item) -> str:
    """The one tier a test belongs to, from its markers; contradicting markers raise UsageError."""
    stress = item.get_closest_marker("stress") is not None
    fast = item.get_closest_marker("fast") is not None
    slow = item.get_closest_marker("slow") is not None
    multiprocess = item.get_closest_marker("multiprocess") is not None
    if stress and fast:
        raise pytest.UsageError(f"{item.nodeid}: marked both fast and stress; a test belongs to one tier")
    if slow and (fast or multiprocess):
        raise pytest.UsageError(f"{item.nodeid}: marked slow and {'fast' if fast else 'multiprocess'}; slow moves "
                                "an in-process test to the full tier, where multi-process tests are already")
    if stress:
        return "stress"
    if not multiprocess:
        if fast:
            raise pytest.UsageError(f"{item.nodeid}: marked fast but not multiprocess; in-process tests are "
                                    "fast already (the marker picks multi-process cases for the fast tier)")
        return "full" if slow else "fast"
    return "fast" if fast else "full"


def _give_this_process_its_own_dev_shm() -> None:
    """A mount namespace of this process's own with a fresh tmpfs on /dev/shm (root only).

    pytest-xdist's workers (``scripts/test.sh`` runs the full tier with ``-n 2``) each take
    one: the leak check of :func:`no_leaked_shared_memory` then sees only its own tests'
    segments, and no worker's group names meet another's. The processes a test starts
    inherit the namespace. Called first thing in the worker, on its main thread (a mount
    namespace applies to the thread that unshares it and to what it starts afterwards).
    """
    import ctypes

    clone_newns, ms_rec, ms_private = 0x00020000, 0x4000, 1 << 18
    libc = ctypes.CDLL(None, use_errno=True)
    for call, args in (("unshare", (clone_newns,)), ("mount", (b"none", b"/", None, ms_rec | ms_private, None)),
                       ("mount", (b"tmpfs", SHM_DIR.encode(), b"tmpfs", 0, b"mode=1777"))):
        if getattr(libc, call)(*args) != 0:
            error = ctypes.get_errno()
            raise pytest.UsageError(f"xdist worker: {call}{args} failed: {os.strerror(error)}; the parallel "
                                    "tiers need root for a private /dev/shm per worker (run without -n)")


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        _give_this_process_its_own_dev_shm()


def pytest_collection_modifyitems(config, items):
    wanted = TIER_CONTENTS[config.getoption("--tier")]
    selected, deselected = [], []
    for item in items:
        (selected if tier_of(item) in wanted else deselected).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = selected


def pytest_report_header(config):
    return f"tensorxfer test tier: {config.getoption('--tier')} (scripts/test.sh --tier fast|full|stress|all)"


def _launches_ranks(args) -> bool:
    argv = [args] if isinstance(args, (str, bytes)) else list(args)
    return bool(argv) and os.path.basename(str(argv[0]).split()[0]) in RANK_LAUNCHERS


@pytest.fixture(autouse=True)
def rank_processes_need_the_multiprocess_marker(request, monkeypatch):
    """Fails an unmarked test that starts rank processes: its tier would be wrong."""
    if request.node.get_closest_marker("multiprocess") is not None:
        yield
        return
    nodeid = request.node.nodeid
    popen_init = subprocess.Popen.__init__

    def refuse(what: str):
        pytest.fail(f"{nodeid} starts {what} but is not marked multiprocess: mark it "
                    "(pytest.mark.multiprocess) so that its tier is right", pytrace=False)

    def guarded_start(process, *args, **kwargs):
        refuse(f"a multiprocessing process ({process.name})")

    def guarded_popen_init(popen, args, *rest, **kwargs):
        if _launches_ranks(args):
            refuse(f"ranks ({args if isinstance(args, str) else ' '.join(map(str, args))})")
        popen_init(popen, args, *rest, **kwargs)

    monkeypatch.setattr(BaseProcess, "start", guarded_start)
    monkeypatch.setattr(subprocess.Popen, "__init__", guarded_popen_init)
    yield


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
