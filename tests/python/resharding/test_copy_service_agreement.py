"""One-sided failures and agreement between the ranks of a copy service.

Real processes (spawned; the shm backend on a LocalGroup, the torch backend on
gloo): a failure on one rank inside run() leaves every rank raising and the
service unusable; options that shape the plan are compared at construction;
a constructor that fails part-way releases what it made at once; the ptrace
permission cross-memory attach needs is granted only when it is used, and
taken back by close().
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import numpy as np
import pytest

from tensorxfer.resharding.copy_services import ShmCopyService
from tensorxfer.resharding.copy_services import _ptracer
from tensorxfer.resharding.copy_services._shm_mover import ShmMover
from tensorxfer.runtime import LocalGroup

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from copy_service_launch import run_ranks  # noqa: E402

pytestmark = pytest.mark.multiprocess

TIMEOUT = 5.0


def _outcome(call) -> str:
    started = time.monotonic()
    try:
        call()
        return "ok"
    except Exception as error:  # the outcome is what the test asserts
        return f"{type(error).__name__} after {time.monotonic() - started:.1f} s: {error}"


# ---- a failure on one rank inside run() ------------------------------------------------


def _one_sided_read_failure(name, rank, world):
    """Rank 1's direct read fails once; both ranks then retry the same batch."""
    with LocalGroup.join(name, rank=rank, world_size=world, timeout=60) as group, \
            ShmCopyService(group, timeout=TIMEOUT, buffer_bytes=1 << 20, cma_min_bytes=None) as service:
        if rank == 1:
            original = ShmMover._read_directly
            calls = []

            def failing_once(self, *args, **kwargs):
                calls.append(1)
                if len(calls) == 1:
                    raise OSError(14, "Bad address (a failed cross-memory read)")
                return original(self, *args, **kwargs)

            ShmMover._read_directly = failing_once  # type: ignore[method-assign]
        peer = 1 - rank
        source = service.buffer(np.uint8, (4096,))
        outcomes = []
        for attempt in range(2):
            source[:] = 10 * attempt + rank + 1
            target = np.zeros(4096, np.uint8)
            service.submit_send(source, peer, rank)
            service.submit_recv(target, peer, peer)
            result = _outcome(service.run)
            outcomes.append((result, int(target[0])))
        return outcomes


def test_a_failed_read_on_one_rank_fails_the_run_on_every_rank_and_breaks_the_service():
    got = run_ranks(_one_sided_read_failure, 2)
    for rank in range(2):
        (first, _), (again, value) = got[rank]
        assert first != "ok", f"rank {rank}'s run returned although rank 1 failed: {got}"
        assert "rank 1" in first or "Bad address" in first, got
        assert again.startswith("RuntimeError") and "an earlier run failed" in again, got
        assert value == 0, f"rank {rank}: a retried run moved bytes: {got}"
        assert float(first.split(" after ")[1].split(" s")[0]) < TIMEOUT + 2, got


# ---- options that shape the plan, compared at construction -------------------------------


def _mismatched_option(name, rank, world, option, values):
    with LocalGroup.join(name, rank=rank, world_size=world, timeout=60) as group:
        result = _outcome(lambda: ShmCopyService(group, timeout=TIMEOUT, **{option: values[rank]}).close())
        return result


@pytest.mark.parametrize("option, values", [
    ("slot_nbytes", (1 << 20, 4 << 20)),
    ("buffer_bytes", (0, 1 << 20)),
    ("cma_min_bytes", (1 << 20, None)),
    ("max_tasks_per_batch", (100, 10000)),
])
def test_a_plan_shaping_option_that_differs_is_a_value_error_on_every_rank(option, values):
    got = run_ranks(_mismatched_option, 2, option, values)
    shown = ["None" if value is None else str(value) for value in values]
    for rank in range(2):
        assert got[rank].startswith("ValueError"), got
        assert option in got[rank] and shown[0] in got[rank] and shown[1] in got[rank], got


def _torch_mismatch(name, rank, world, init_file):
    import datetime

    import torch.distributed as dist

    from tensorxfer.resharding.copy_services import build_copy_service

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        windows = (64, 128)
        return _outcome(lambda: build_copy_service("torch", timeout=TIMEOUT, max_window_tasks=windows[rank]))
    finally:
        dist.destroy_process_group()


def test_window_limits_that_differ_are_a_value_error_on_every_torch_rank():
    pytest.importorskip("torch")
    with tempfile.TemporaryDirectory() as directory:
        got = run_ranks(_torch_mismatch, 2, os.path.join(directory, "rendezvous"))
    for rank in range(2):
        assert got[rank].startswith("ValueError") and "max_window_tasks" in got[rank], got
        assert "64" in got[rank] and "128" in got[rank], got


# ---- a constructor that fails part-way ---------------------------------------------------


def _failing_constructor(name, rank, world):
    from tensorxfer.runtime import ipc_memory

    made = []
    create = ipc_memory.IpcMemory.create

    def recording(*args, **kwargs):
        memory = create(*args, **kwargs)
        made.append(memory)
        return memory

    ipc_memory.IpcMemory.create = recording  # type: ignore[method-assign]
    import tensorxfer.resharding.copy_services._shm_mover as shm_module

    shm_module.IpcMemory.create = recording  # type: ignore[method-assign]
    if rank == 1:
        def broken_executor(*args, **kwargs):
            raise RuntimeError("the executor could not start")

        shm_module._core = _CoreWithout(shm_module._core, "PipelineExecutor", broken_executor)
    with LocalGroup.join(name, rank=rank, world_size=world, timeout=60) as group:
        import gc

        gc.disable()  # released at once, not by the collector
        result = _outcome(lambda: ShmCopyService(group, timeout=TIMEOUT, cma_min_bytes=1 << 20))
        closed = [memory.closed for memory in made]
        gc.enable()
        return result, closed


class _CoreWithout:
    """tensorxfer._core with one attribute replaced."""

    def __init__(self, core, attribute, replacement):
        self._core, self._attribute, self._replacement = core, attribute, replacement

    def __getattr__(self, name):
        return self._replacement if name == self._attribute else getattr(self._core, name)


def test_a_constructor_failing_part_way_releases_its_memory_at_once_and_its_peers_fail():
    got = run_ranks(_failing_constructor, 2)
    failed, closed = got[1]
    assert failed.startswith("RuntimeError") and "could not start" in failed, got
    assert closed == [True], f"rank 1's IpcMemory was left for the collector: {got}"
    peer, _ = got[0]
    assert peer != "ok" and float(peer.split(" after ")[1].split(" s")[0]) < TIMEOUT + 2, got


# ---- the ptrace permission of cross-memory attach ------------------------------------------


def _ptracer_calls(name, rank, world, cma_min_bytes):
    calls = []
    _ptracer.set_ptracer = lambda value: calls.append(value)  # type: ignore[assignment]
    _ptracer.yama_scope = lambda: 1  # type: ignore[assignment]
    from tensorxfer import _core

    native_calls = []
    _core_allow = _core.allow_memory_readers
    import tensorxfer.resharding.copy_services.shm as shm_module

    shm_module._core = _CoreWithout(_core, "allow_memory_readers",
                                    lambda: native_calls.append("ANY") or _core_allow())
    with LocalGroup.join(name, rank=rank, world_size=world, timeout=60) as group:
        service = ShmCopyService(group, timeout=TIMEOUT, cma_min_bytes=cma_min_bytes)
        during = list(calls)
        pids = [int(pid) for pid in getattr(service, "_pids", [])]
        service.close()
        return {"during": during, "after": calls[len(during):], "native": native_calls, "pids": pids}


def test_no_ptrace_permission_is_granted_when_cross_memory_attach_is_off():
    got = run_ranks(_ptracer_calls, 2, None)
    for rank in range(2):
        assert got[rank]["native"] == [] and got[rank]["during"] == [] and got[rank]["after"] == [], got


def test_the_ptrace_permission_names_the_peer_and_is_taken_back_by_close():
    got = run_ranks(_ptracer_calls, 2, 1 << 20)
    for rank in range(2):
        peer_pid = got[rank]["pids"][1 - rank]
        assert got[rank]["native"] == [], got  # never PR_SET_PTRACER_ANY
        assert got[rank]["during"] == [peer_pid], got
        assert got[rank]["after"] == [0], got


def _one_sided_bad_tensor(name, rank, world):
    """Rank 1 cannot describe its tensors in the first run (before any byte moves)."""
    from tensorxfer.resharding.copy_services import _tensors

    with LocalGroup.join(name, rank=rank, world_size=world, timeout=60) as group, \
            ShmCopyService(group, timeout=TIMEOUT, cma_min_bytes=None) as service:
        if rank == 1:
            original = _tensors.describe_many
            calls = []

            def failing_once(objects, rows=None):
                calls.append(1)
                if len(calls) == 1:
                    raise ValueError("a tensor this rank cannot read")
                return original(objects, rows)

            _tensors.describe_many = failing_once  # type: ignore[assignment]
        peer = 1 - rank
        outcomes = []
        for attempt in range(2):
            target = np.zeros(64, np.uint8)
            service.submit_send(np.full(64, 10 * attempt + rank + 1, np.uint8), peer, rank)
            service.submit_recv(target, peer, peer)
            outcomes.append((_outcome(service.run), int(target[0])))
        return outcomes


def test_a_bad_tensor_on_one_rank_is_agreed_before_any_byte_moves_and_the_service_stays_usable():
    got = run_ranks(_one_sided_bad_tensor, 2)
    for rank in range(2):
        (first, moved), (again, value) = got[rank]
        assert first.startswith("ValueError" if rank == 1 else "TaskMismatchError"), got
        assert "cannot read" in first and moved == 0, got
        assert again == "ok" and value == 10 + (1 - rank) + 1, got
