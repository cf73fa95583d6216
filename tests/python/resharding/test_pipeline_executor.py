"""The public PipelineExecutor on real spawned ranks (LocalGroup + IpcMemory)."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import random
import time
import uuid

import numpy as np
import pytest

from child_process import first_error_raised, on_threads
from tensorxfer.errors import UnsupportedError
from tensorxfer.resharding.pipeline_executor import DoubleBufferManager, HostKernelLauncher, PipelineExecutor
from tensorxfer.resharding.schedule import BatchTask, ReceiveRequest, ScheduledBatch, SendRequest, build_schedule
from tensorxfer.runtime import LocalGroup

pytestmark = pytest.mark.multiprocess


def _tasks(world: int, seed: int):
    rng = random.Random(seed)
    return [(task_id, rng.choice([1, 100, 4096, 5000, 20_000]), rng.randrange(world), rng.randrange(world))
            for task_id in range(60)]


def _content(task_id: int, size: int, round_: int) -> np.ndarray:
    return ((np.arange(size, dtype=np.int64) * 7 + task_id * 131 + round_ * 29) % 251).astype(np.uint8)


def _rank_main(name: str, rank: int, world: int, rounds: int, queue) -> None:
    try:
        group = LocalGroup.join(name, rank=rank, world_size=world, timeout=60)
        tasks = _tasks(world, seed=world)
        sends, receives, inbox = [], [], {}
        for task_id, size, src, dst in tasks:
            if src == rank:
                buffer = np.zeros(size + 16, np.uint8)  # the task starts at byte 8 of its tensor
                sends.append(SendRequest(task_id, buffer, 8, size, dst))
            if dst == rank:
                target = np.zeros(size + 32, np.uint8)
                inbox[task_id] = target
                receives.append(ReceiveRequest(task_id, target, 16, size, src))
        send_rows = [(r.task_id, r.size, rank, r.dest_pe) for r in sends]
        recv_rows = [(r.task_id, r.size, r.src_pe, rank) for r in receives]
        gathered = group.all_gather_bytes(json.dumps([send_rows, recv_rows]).encode(), timeout=60)
        all_sends, all_recvs = [], []
        for data in gathered:
            rank_sends, rank_recvs = json.loads(data.decode())
            all_sends += rank_sends
            all_recvs += rank_recvs
        schedule = build_schedule(all_sends, all_recvs, world, slot_nbytes=8192, max_tasks_per_batch=8)
        digest = hashlib.sha256(repr(schedule).encode()).hexdigest()
        digests = group.all_gather_bytes(digest.encode(), timeout=60)
        buffers = DoubleBufferManager(group, slot_nbytes=8192, timeout=60)
        launcher = HostKernelLauncher(sends, receives)
        executor = PipelineExecutor(launcher, buffers, rank)
        rng = random.Random(rank)
        for round_ in range(rounds):
            for request in sends:
                request.src_tensor[8:8 + request.size] = _content(request.task_id, request.size, round_)
            time.sleep(rng.random() * 0.002)  # ranks drift apart
            executor.process_self_moves(sends, receives)
            executor.execute_pipeline(schedule.iteration_schedules(rank), schedule.num_iterations, timeout=60)
            for task_id, size, src, dst in tasks:
                if dst == rank:
                    got = inbox[task_id][16:16 + size]
                    if not np.array_equal(got, _content(task_id, size, round_)):
                        raise AssertionError(f"round {round_}: task {task_id} from rank {src} differs")
                    if inbox[task_id][:16].any() or inbox[task_id][16 + size:].any():
                        raise AssertionError(f"task {task_id}: bytes outside its range were written")
        buffers.close()
        group.close()
        queue.put((rank, "ok", [d.decode() for d in digests], schedule.num_iterations))
    except BaseException as error:  # reported to the test
        queue.put((rank, f"{type(error).__name__}: {error}", [], 0))


@pytest.mark.parametrize("world", [pytest.param(2, marks=pytest.mark.fast), 3, pytest.param(4, marks=pytest.mark.stress)])
def test_ranks_move_every_byte_with_the_same_schedule(world):
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    name = f"pipeline-test-{uuid.uuid4().hex[:8]}"
    processes = [context.Process(target=_rank_main, args=(name, rank, world, 5, queue)) for rank in range(world)]
    for process in processes:
        process.start()
    results = sorted(queue.get(timeout=120) for _ in processes)
    for process in processes:
        process.join(30)
    for rank, status, digests, iterations in results:
        assert status == "ok", f"rank {rank}: {status}"
        assert len(set(digests)) == 1, "ranks computed different schedules"
        assert iterations >= 2  # small slots: the double buffering is exercised


def _threads_as_ranks(world: int, slot_nbytes: int):
    """``world`` LocalGroups (one per rank, joined from threads of this process) and their DoubleBufferManagers."""
    name = f"pipeline-threads-{uuid.uuid4().hex[:8]}"

    def rank_main(rank: int) -> tuple:
        group = LocalGroup.join(name, rank=rank, world_size=world, timeout=20)
        return group, DoubleBufferManager(group, slot_nbytes=slot_nbytes, timeout=20)

    pairs = first_error_raised(on_threads(world, rank_main))
    return [group for group, _ in pairs], [buffers for _, buffers in pairs]


def test_launch_pack_fills_the_send_slot_and_streams_are_host_only():
    groups, managers = _threads_as_ranks(2, 4096)
    try:
        buffers = managers[0]
        source = np.arange(300, dtype=np.uint8)
        launcher = HostKernelLauncher([SendRequest(5, source, 100, 50, 1)], [])
        executor = PipelineExecutor(launcher, buffers, 0)
        batch = ScheduledBatch(0, 1, 0, 1, [BatchTask(5, 10, 40, 64)], 104)
        executor._launch_pack(1, batch)
        executor.synchronize()
        assert np.array_equal(buffers.send_slot(1)[64:104], source[110:150])
        assert not buffers.send_slot(0).any()
        with pytest.raises(ValueError, match="task_offset 40 \\+ size 20 exceeds the task's 50 bytes"):
            executor._launch_pack(0, ScheduledBatch(0, 1, 0, 0, [BatchTask(5, 40, 20, 0)], 20))
        with pytest.raises(UnsupportedError):
            executor.set_streams(pack_stream=object())
        executor.set_streams()
        with pytest.raises(ValueError, match=r"bytes \[290, 310\) do not lie"):
            HostKernelLauncher([SendRequest(6, source, 290, 20, 0)], [])
        with pytest.raises(ValueError, match="my_pe"):
            PipelineExecutor(launcher, buffers, 3)
    finally:
        for manager in managers:
            manager.close()
        for group in groups:
            group.close()


def test_process_self_moves_copies_matched_requests_and_names_a_missing_send():
    group = LocalGroup.join(f"pipeline-self-{uuid.uuid4().hex[:8]}", rank=0, world_size=1, timeout=10)
    try:
        buffers = DoubleBufferManager(group, slot_nbytes=1024)
        source = np.arange(64, dtype=np.uint8)
        target = np.zeros(64, np.uint8)
        executor = PipelineExecutor(HostKernelLauncher(), buffers, 0)
        executor.process_self_moves([SendRequest(1, source, 0, 32, 0)], [ReceiveRequest(1, target, 32, 32, 0)])
        assert np.array_equal(target[32:], source[:32]) and not target[:32].any()
        with pytest.raises(ValueError, match="missing send for task_id=2"):
            executor.process_self_moves([], [ReceiveRequest(2, target, 0, 8, 0)])
        buffers.close()
    finally:
        group.close()
