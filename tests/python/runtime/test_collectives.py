"""Communicator across real spawned processes: every dtype and op against
references (exact rank-order and float64), 2/3/4/8 ranks, chunking, odd sizes,
torch and numpy inputs, the zero-copy buffer, bitwise equality across ranks,
jitter, and a rank SIGKILLed mid-collective."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import numpy as np
import pytest

from tensorxfer.runtime import Communicator

import collectives_workers as workers
from child_process import first_error_raised, on_threads
from collectives_workers import FileGroup, run_spawned

MAX_BYTES = 4096  # small: the larger counts below take several chunks


@pytest.mark.multiprocess
@pytest.mark.parametrize("world", [pytest.param(2, marks=pytest.mark.fast), 3, pytest.param(4, marks=pytest.mark.stress),
                                   pytest.param(8, marks=pytest.mark.stress)])
def test_all_reduce_every_dtype_and_op_matches_references_bitwise_on_every_rank(world, tmp_path):
    counts = [1, 7, 1023, 3 * MAX_BYTES // 4 + 5] if world <= 4 else [1, 1023, 2 * MAX_BYTES + 3]
    algorithms = ["one_shot", "two_shot", "auto"] if world <= 4 else ["one_shot", "two_shot"]
    digests = run_spawned(world, workers.all_reduce_matrix, (MAX_BYTES, counts, algorithms, 11), str(tmp_path))
    assert len(set(digests)) == 1, digests


@pytest.mark.multiprocess
def test_torch_tensors_and_the_zero_copy_buffer(tmp_path):
    pytest.importorskip("torch", reason="torch is not installed (pip install .[torch])")
    digests = run_spawned(3, workers.torch_all_reduce, (5,), str(tmp_path))
    assert len(set(digests)) == 1


@pytest.mark.multiprocess
@pytest.mark.parametrize("world", [2, 3])
def test_all_gather_reduce_scatter_broadcast_barrier(world, tmp_path):
    digests = run_spawned(world, workers.other_collectives, (3,), str(tmp_path))
    assert len(set(digests)) == 1


@pytest.mark.multiprocess
def test_back_to_back_all_reduces_with_jitter(tmp_path):
    digests = run_spawned(3, workers.stress, (600, MAX_BYTES, 1), str(tmp_path))
    assert len(set(digests)) == 1


@pytest.mark.multiprocess
@pytest.mark.stress
@pytest.mark.timeout(660)  # above the launch's own 600 s, which reports every rank
def test_ten_thousand_all_reduces_with_jitter(tmp_path):
    digests = run_spawned(4, workers.stress, (10_000, MAX_BYTES, 2), str(tmp_path), timeout=600)
    assert len(set(digests)) == 1


@pytest.mark.multiprocess
def test_sigkilled_rank_makes_the_others_raise_peer_lost_within_their_timeout(tmp_path):
    world, victim, timeout = 3, 1, 20.0
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    ready = tmp_path / "ready"
    ready.mkdir()
    processes = [
        context.Process(
            target=workers._rank_main,
            args=(workers.wait_in_all_reduce_until_peer_dies, str(tmp_path), rank, world, queue,
                  (victim, str(ready), timeout)),
        )
        for rank in range(world)
    ]
    for process in processes:
        process.start()
    try:
        deadline = time.monotonic() + 60
        while len(os.listdir(ready)) < world:
            assert time.monotonic() < deadline, "ranks did not get ready"
            time.sleep(0.01)
        time.sleep(0.2)  # the survivors are inside their all_reduce, waiting for the victim
        os.kill(processes[victim].pid, signal.SIGKILL)
        results = dict(queue.get(timeout=timeout + 10) for _ in range(world - 1))
    finally:
        workers.reap(processes, queue)
    assert processes[victim].exitcode == -signal.SIGKILL
    for rank in range(world):
        if rank == victim:
            continue
        outcome = results[rank]
        assert outcome[0] == "peer lost", outcome
        assert outcome[1] < timeout, outcome
        assert f"rank {victim}" in outcome[2], outcome


# ---- in one process: threads as ranks (the GIL is released while collectives wait) ----


def make_thread_communicators(world: int, directory: str, **kwargs) -> list:
    return first_error_raised(
        on_threads(world, lambda rank: Communicator(FileGroup(directory, rank, world), timeout=30, **kwargs)))


def run_threads(world: int, body) -> list:
    return first_error_raised(on_threads(world, body))


def test_threads_as_ranks_and_the_reference_fields(tmp_path):
    comms = make_thread_communicators(2, str(tmp_path), max_bytes=4096)
    try:
        before = [comm.ipc_memory.barrier_flag for comm in comms]
        results = run_threads(2, lambda rank: comms[rank].all_reduce(np.arange(5, dtype=np.int64) * (rank + 1)))
        for result in results:
            np.testing.assert_array_equal(result, np.arange(5) * 3)
        memory = comms[0].ipc_memory
        assert memory.num_workers == 2 and memory.worker_id == 0
        assert len(memory.remote_data) == len(memory.barrier_in) == len(memory.barrier_out) == 2
        assert memory.barrier_flag > before[0]
        assert comms[1].ipc_memory.barrier_flag == memory.barrier_flag
    finally:
        for comm in comms:
            comm.close()


def test_a_missing_rank_times_out_and_the_communicator_is_then_unusable(tmp_path):
    comms = make_thread_communicators(2, str(tmp_path), max_bytes=4096)
    try:
        start = time.monotonic()
        with pytest.raises(TimeoutError, match="ranks not arrived: 1"):
            comms[0].all_reduce(np.ones(4, np.float32), timeout=0.2)
        assert time.monotonic() - start < 3
        with pytest.raises(ValueError, match="unusable"):
            comms[0].all_reduce(np.ones(4, np.float32), timeout=0.2)
    finally:
        for comm in comms:
            comm.close()


def test_mismatched_calls_fail_on_every_rank(tmp_path):
    comms = make_thread_communicators(2, str(tmp_path), max_bytes=4096)
    try:
        def body(rank: int):
            with pytest.raises(ValueError, match="different operations"):
                comms[rank].all_reduce(np.ones(4 + rank, np.float32), timeout=10)

        run_threads(2, body)
    finally:
        for comm in comms:
            comm.close()


def test_bad_arguments_are_refused_clearly(tmp_path):
    comms = make_thread_communicators(1, str(tmp_path), max_bytes=4096)
    comm = comms[0]
    try:
        with pytest.raises(ValueError, match="op must be one of"):
            comm.all_reduce(np.ones(3), op="prod")
        with pytest.raises(ValueError, match="algorithm must be one of"):
            comm.all_reduce(np.ones(3), algorithm="ring")
        with pytest.raises(TypeError, match="dtype must be one of"):
            comm.all_reduce(np.ones(3, np.uint8))
        with pytest.raises(ValueError, match="contiguous"):
            comm.all_reduce(np.ones((4, 4))[:, 1])
        with pytest.raises(ValueError, match="writable"):
            readonly = np.ones(3)
            readonly.flags.writeable = False
            comm.all_reduce(readonly)
        with pytest.raises(ValueError, match="timeout"):
            comm.barrier(timeout=-1)
        with pytest.raises(ValueError, match="root must be in"):
            comm.broadcast(np.ones(3), src=1)
        with pytest.raises(ValueError, match="max_bytes"):
            Communicator(FileGroup(str(tmp_path), 0, 1), max_bytes=-1)
        # World size 1: every collective is the identity (and works).
        x = np.arange(10, dtype=np.float64)
        np.testing.assert_array_equal(comm.all_reduce(x.copy(), op="avg"), x)
    finally:
        comm.close()


@pytest.mark.multiprocess
def test_ctrl_c_ends_a_wait_without_timeout(tmp_path):
    ready = tmp_path / "ready"
    context = multiprocessing.get_context("spawn")
    process = context.Process(target=workers._exit_with,
                              args=(workers.barrier_until_interrupted, str(tmp_path), str(ready)))
    process.start()
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert time.monotonic() < deadline and process.is_alive(), "the rank did not get ready"
            time.sleep(0.01)
        time.sleep(0.2)  # inside the barrier
        os.kill(process.pid, signal.SIGINT)
        process.join(timeout=10)
    finally:
        if process.is_alive():
            process.kill()
            process.join()
    assert process.exitcode == 42


@pytest.mark.multiprocess
def test_communicator_on_a_joined_local_group(tmp_path):
    world = 3
    name = f"h7-collectives-{os.getpid()}-{tmp_path.name}"
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    processes = [context.Process(target=workers.join_group_and_all_reduce, args=(name, rank, world, queue))
                 for rank in range(world)]
    for process in processes:
        process.start()
    try:
        results = dict(queue.get(timeout=90) for _ in range(world))
    finally:
        workers.reap(processes, queue)
    errors = [value for value in results.values() if isinstance(value, tuple)]
    assert not errors, errors
    assert len(set(results.values())) == 1


def test_spin_budget_is_the_standard_policy_and_settable_between_calls():
    from tensorxfer.runtime import LocalGroup

    group = LocalGroup.join(f"spin-{os.getpid()}", rank=0, world_size=1, timeout=10)
    comm = Communicator(group)
    try:
        # The standard policy for one rank: milliseconds of spinning (a rank fits any CPU count).
        assert comm.spin_us == 2000.0
        comm.spin_us = 0
        assert comm.spin_us == 0.0
        comm.all_reduce(np.ones(4, np.float32))
        comm.spin_us = 150.0
        assert comm.spin_us == 150.0
        comm.spin_us = None
        assert comm.spin_us == 2000.0
        for bad in (-1, 2e6, True, "1", float("nan")):
            with pytest.raises(ValueError, match="spin_us"):
                comm.spin_us = bad
        assert comm.spin_us == 2000.0
    finally:
        comm.close()
        group.close()
