"""Persistent plans (tensorxfer.resharding.persistent_plan): built once, run many times, in place.

In-process: the local backend. Multi-process (spawned ranks on a LocalGroup): the shm
backend's native plan -- strided sources and destinations, same-rank and remote tasks,
sources in the shared send buffer, versions, a rank running another version, a rank
killed mid-way (the survivor reports the last landed version within its timeout).
"""

from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np
import pytest

from tensorxfer.errors import ClosedError
from tensorxfer.resharding.copy_services import TaskMismatchError, build_copy_service
from tensorxfer.resharding.persistent_plan import PersistentPlanError, build_persistent_plan

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from copy_service_launch import run_ranks  # noqa: E402


def _strided_pair(rng: np.random.Generator):
    source_base = rng.standard_normal((12, 10)).astype(np.float32)
    target_base = np.zeros((10, 16), np.float32)
    return source_base, source_base[::2, 2:8], target_base, target_base[2:8, 3:8].T  # (6, 6) vs (5, 6)->T (6,5)


def test_local_plan_moves_strided_views_in_place_every_run():
    rng = np.random.default_rng(0)
    big = rng.standard_normal((64, 32)).astype(np.float32)
    source = big[::2, 4:20]            # (32, 16), every other row, a column slice
    target_base = np.full((40, 24), -1, np.float32)
    target = target_base[4:36, 8:24]   # (32, 16), a column slice
    transposed_source = np.arange(24, dtype=np.float64).reshape(4, 6).T  # (6, 4) non-contiguous
    transposed_target = np.zeros((6, 4), np.float64)
    with build_copy_service("local") as service:
        plan = build_persistent_plan(service, [(1, source, 0), (2, transposed_source, 0)],
                                     [(2, transposed_target, 0), (1, target, 0)])
        assert plan.native and plan.bytes_per_run == source.nbytes + transposed_source.nbytes
        for step in range(3):
            big *= 2  # in place: the plan reads the new values
            assert plan.run() == step
            np.testing.assert_array_equal(target, source)
            np.testing.assert_array_equal(transposed_target, transposed_source)
            assert (target_base[:4] == -1).all() and (target_base[:, :8] == -1).all()  # nothing outside the view
        assert plan.landed_version == 2 and plan.runs == 3
        assert plan.run(version=10) == 10 and plan.run() == 11
        plan.verify()
        plan.close()
        with pytest.raises(ClosedError):
            plan.run()


def test_local_plan_takes_torch_views():
    torch = pytest.importorskip("torch")
    weight = torch.arange(64, dtype=torch.bfloat16).reshape(8, 8)
    full = torch.zeros(8, 16, dtype=torch.bfloat16)
    with build_copy_service("local") as service:
        right = full[:, 12:]
        plan = build_persistent_plan(service, [(0, weight[:, :4], 0), (1, weight[:, 4:], 0)],
                                     [(0, full[:, :4], 0), (1, right, 0)])
        address = full.data_ptr()
        plan.run()
        assert full.data_ptr() == address
        assert torch.equal(full[:, :4], weight[:, :4]) and torch.equal(full[:, 12:], weight[:, 4:])
        assert torch.count_nonzero(full[:, 4:12]) == 0
        weight.add_(1)
        plan.run()
        assert torch.equal(full[:, 12:], weight[:, 4:])
        plan.verify()
        right.set_(torch.zeros(8, 4, dtype=torch.bfloat16))  # re-pointed: breaks the contract, verify() says so
        with pytest.raises(ValueError, match="moved or changed layout"):
            plan.verify()


def test_local_plan_refuses_what_run_refuses():
    with build_copy_service("local") as service:
        a, b = np.zeros(4, np.float32), np.zeros(5, np.float32)
        with pytest.raises(TaskMismatchError, match="size mismatch for task_id=3"):
            build_persistent_plan(service, [(3, a, 0)], [(3, b, 0)])
        with pytest.raises(RuntimeError, match="requires a task_id"):
            build_persistent_plan(service, [(None, a, 0)], [(None, a.copy(), 0)])
        with pytest.raises(RuntimeError, match="missing local send for task_id=4"):
            build_persistent_plan(service, [(3, a, 0)], [(4, a.copy(), 0)])
        with pytest.raises(TypeError, match="version"):
            build_persistent_plan(service, [(3, a, 0)], [(3, a.copy(), 0)]).run(version=-1)


# ---- shm: spawned ranks on a LocalGroup ------------------------------------------------

def _values(rank: int, peer: int, step: int, shape) -> np.ndarray:
    count = int(np.prod(shape))
    return (np.arange(count, dtype=np.float32) + 1000 * rank + 100 * peer + 7 * step).reshape(shape)


def _shm_plan(name, rank, world, buffer_bytes, small_count):
    """Each rank sends a strided (16, 24) view to every rank (itself included) into a column
    slice of the receiver's (16, 40) matrix, plus `small_count` 4 KiB tensors to the next
    rank, taken from its shared send buffer when buffer_bytes > 0. Runs 4 versions."""
    from tensorxfer.runtime import LocalGroup

    group = LocalGroup.join(name, rank=rank, world_size=world, timeout=60)
    service = build_copy_service("shm", group, timeout=30, buffer_bytes=buffer_bytes)
    try:
        sources = {peer: np.zeros((32, 30), np.float32) for peer in range(world)}
        targets = {peer: np.full((16, 40), -1, np.float32) for peer in range(world)}
        sends = [(rank * world + peer, sources[peer][::2, 3:27], peer) for peer in range(world)]
        recvs = [(peer * world + rank, targets[peer][:, 8:32], peer) for peer in range(world)]
        nxt, prev = (rank + 1) % world, (rank - 1) % world
        if buffer_bytes:
            small_sources = service.buffer(np.float32, (small_count, 1024))
        else:
            small_sources = np.zeros((small_count, 1024), np.float32)
        small_targets = np.zeros((small_count, 1024), np.float32)
        sends += [(10_000 + rank * small_count + i, small_sources[i], nxt) for i in range(small_count)]
        recvs += [(10_000 + prev * small_count + i, small_targets[i], prev) for i in range(small_count)]
        plan = build_persistent_plan(service, sends, recvs)
        addresses = [targets[peer].ctypes.data for peer in range(world)]
        for step in range(4):
            for peer in range(world):
                sources[peer][::2, 3:27] = _values(rank, peer, step, (16, 24))
            small_sources[:] = _values(rank, nxt, step, (small_count, 1024))
            assert plan.run(version=100 + step) == 100 + step
            for peer in range(world):
                np.testing.assert_array_equal(targets[peer][:, 8:32], _values(peer, rank, step, (16, 24)))
                assert (targets[peer][:, :8] == -1).all() and (targets[peer][:, 32:] == -1).all()
            np.testing.assert_array_equal(small_targets, _values(prev, rank, step, (small_count, 1024)))
        assert [targets[peer].ctypes.data for peer in range(world)] == addresses
        return plan.landed_version, plan.bytes_per_run, service.plans_built
    finally:
        service.close()
        group.close()


@pytest.mark.multiprocess
@pytest.mark.parametrize("buffer_bytes", [0, 1 << 20], ids=["private", "send_buffer"])
def test_shm_plan_moves_strided_views_in_place(buffer_bytes):
    got = run_ranks(_shm_plan, 2, buffer_bytes, 64)
    for rank in range(2):
        landed, nbytes, _ = got[rank]
        assert landed == 103
        assert nbytes == 2 * 16 * 24 * 4 + 64 * 4096


def _versions_differ(name, rank, world):
    from tensorxfer.runtime import LocalGroup

    group = LocalGroup.join(name, rank=rank, world_size=world, timeout=60)
    service = build_copy_service("shm", group, timeout=20)
    try:
        source, target = np.ones(256, np.float32) * rank, np.zeros(256, np.float32)
        plan = build_persistent_plan(service, [(rank, source, 1 - rank)], [(1 - rank, target, 1 - rank)])
        plan.run(version=5)
        try:
            plan.run(version=6 + rank)
        except PersistentPlanError as error:
            return str(error), error.landed_version, error.version
        return "no error", None, None
    finally:
        service.close()
        group.close()


@pytest.mark.multiprocess
def test_shm_plan_refuses_ranks_at_different_versions():
    got = run_ranks(_versions_differ, 2)
    for rank in range(2):
        message, landed, version = got[rank]
        assert "runs version" in message and "last version that landed is 5" in message, message
        assert landed == 5 and version == 6 + rank


def _killed_mid_way(name, rank, world):
    from tensorxfer.runtime import LocalGroup

    group = LocalGroup.join(name, rank=rank, world_size=world, timeout=60)
    service = build_copy_service("shm", group, timeout=5)
    try:
        source, target = np.ones(1 << 16, np.float32), np.zeros(1 << 16, np.float32)
        plan = build_persistent_plan(service, [(rank, source, 1 - rank)], [(1 - rank, target, 1 - rank)])
        plan.run(version=1)
        plan.run(version=2)
        if rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        start = time.monotonic()
        try:
            plan.run(version=3)
        except PersistentPlanError as error:
            seconds = time.monotonic() - start
            try:
                plan.run(version=4)
            except PersistentPlanError as again:
                return type(error.__cause__).__name__, error.landed_version, seconds, str(again)
        return "no error", None, None, None
    finally:
        service.close()
        group.close()


def _report(target, name, rank, world, results):
    import traceback

    try:
        results.put((rank, target(name, rank, world)))
    except BaseException:
        results.put((rank, ("traceback", traceback.format_exc())))


@pytest.mark.multiprocess
def test_shm_plan_survivor_reports_the_last_landed_version_when_a_peer_is_killed():
    import multiprocessing
    import uuid

    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    name = f"killed-{uuid.uuid4().hex[:10]}"
    processes = [context.Process(target=_report, args=(_killed_mid_way, name, rank, 2, results)) for rank in range(2)]
    for process in processes:
        process.start()
    try:
        rank, value = results.get(timeout=60)  # only the survivor reports
    finally:
        for process in processes:
            process.join(timeout=20)
            if process.is_alive():
                process.kill()
    assert rank == 0, value
    assert processes[1].exitcode == -signal.SIGKILL
    cause, landed, seconds, again = value
    assert cause in ("PeerLostError", "TimeoutError"), value
    assert landed == 2 and seconds < 5.0 + 2.0, value
    assert "an earlier run failed" in again and "landed is 2" in again, again


def test_shm_plan_of_one_rank_and_its_closed_service():
    """A plan outlives nothing it runs on: after its service closed, run() raises (the
    native executor's check, before any slot is touched) and names the last landed version."""
    import uuid

    from tensorxfer.runtime import LocalGroup

    with LocalGroup.join(f"one-{uuid.uuid4().hex[:10]}", rank=0, world_size=1, timeout=10) as group:
        service = build_copy_service("shm", group, timeout=10)
        source = np.arange(64, dtype=np.float64).reshape(8, 8)
        target = np.zeros((8, 8))
        plan = build_persistent_plan(service, [(0, source.T, 0)], [(0, target, 0)])
        assert plan.run() == 0
        np.testing.assert_array_equal(target, source.T)
        service.close()
        with pytest.raises(PersistentPlanError, match="last version that landed is 0") as raised:
            plan.run()
        assert isinstance(raised.value.__cause__, ClosedError)
