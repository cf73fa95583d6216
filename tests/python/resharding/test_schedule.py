"""The transfer schedule: identical on every rank, valid, errors before anything moves."""

import random

import numpy as np
import pytest

from tensorxfer.resharding.schedule import (ReceiveRequest, SendRequest, build_schedule,
                                             request_rows)


def _all_to_all(world_size, count, seed):
    rng = random.Random(seed)
    rows = []
    for task_id in range(count):
        nbytes = rng.choice([0, 1, 63, 4096, 70_000, 300_000])
        rows.append((task_id * 3 + 1, nbytes, rng.randrange(world_size), rng.randrange(world_size)))
    return rows


def _check_valid(schedule, rows, slot_nbytes):
    covered = {}
    busy_send, busy_recv = set(), set()
    for batch in schedule.batches:
        assert (batch.iteration, batch.src_pe) not in busy_send
        assert (batch.iteration, batch.dest_pe) not in busy_recv
        busy_send.add((batch.iteration, batch.src_pe))
        busy_recv.add((batch.iteration, batch.dest_pe))
        assert batch.total_size <= slot_nbytes
        for task in batch.tasks:
            assert task.slot_offset % 64 == 0
            covered.setdefault(task.task_id, []).append((task.task_offset, task.size))
    for task_id, nbytes, src, dest in rows:
        if src == dest or nbytes == 0:
            assert task_id not in covered
            continue
        pieces = sorted(covered[task_id])
        position = 0
        for offset, size in pieces:
            assert offset == position
            position += size
        assert position == nbytes


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8])
def test_every_rank_computes_the_same_valid_schedule(world_size):
    rows = _all_to_all(world_size, 300, seed=world_size)
    slot = 128 << 10
    first = build_schedule(rows, rows, world_size, slot_nbytes=slot, max_tasks_per_batch=50)
    _check_valid(first, rows, slot)
    shuffled = list(rows)
    random.Random(7).shuffle(shuffled)  # another rank gathered in another order
    second = build_schedule(shuffled, list(reversed(rows)), world_size, slot_nbytes=slot,
                            max_tasks_per_batch=50)
    assert second == first


def test_iteration_schedules_give_each_rank_at_most_one_send_and_receive():
    rows = [(1, 4096, 0, 1), (2, 4096, 1, 0), (3, 4096, 2, 0), (4, 200_000, 0, 2)]
    schedule = build_schedule(rows, rows, 3, slot_nbytes=64 << 10)
    for pe in range(3):
        per_iteration = schedule.iteration_schedules(pe)
        assert len(per_iteration) == schedule.num_iterations
        sent = [b for step in per_iteration if (b := step["send"]) is not None]
        received = [b for step in per_iteration if (b := step["recv"]) is not None]
        assert all(b.src_pe == pe for b in sent) and all(b.dest_pe == pe for b in received)
    # Task 4 (200,000 bytes) needs four 64 KiB segments, so rank 0 sends to rank 2 four times.
    assert sum(1 for b in schedule.batches if (b.src_pe, b.dest_pe) == (0, 2)) == 4


def test_many_small_tasks_are_packed_into_few_batches():
    rows = [(i, 4096, 0, 1) for i in range(10_000)]
    schedule = build_schedule(rows, rows, 2, slot_nbytes=8 << 20)
    assert len(schedule.batches) == 5  # 40,960,000 bytes in 8 MiB slots
    assert sum(len(b.tasks) for b in schedule.batches) == 10_000


def test_mismatches_are_refused_naming_the_task():
    with pytest.raises(ValueError, match=r"missing send for task_id=5 \(rank 1 receives it from rank 0\)"):
        build_schedule([], [(5, 8, 0, 1)], 2, slot_nbytes=1024)
    with pytest.raises(ValueError, match=r"missing receive for task_id=6"):
        build_schedule([(6, 8, 0, 1)], [], 2, slot_nbytes=1024)
    with pytest.raises(ValueError, match=r"task_id=4: rank 0 sends 8 bytes but rank 1 receives 16 bytes"):
        build_schedule([(4, 8, 0, 1)], [(4, 16, 0, 1)], 2, slot_nbytes=1024)
    with pytest.raises(ValueError, match=r"task_id=2 has two receives"):
        build_schedule([(2, 8, 0, 1)], [(2, 8, 0, 1), (2, 8, 0, 1)], 2, slot_nbytes=1024)
    with pytest.raises(ValueError, match=r"slot_nbytes must be a positive multiple of 64"):
        build_schedule([], [], 2, slot_nbytes=1000)
    with pytest.raises(ValueError, match=r"must be rows of \(task_id, nbytes, src_rank, dest_rank\)"):
        build_schedule([(1, 2, 3)], [], 2, slot_nbytes=1024)
    with pytest.raises(ValueError, match=r"task_id and nbytes must be >= 0"):
        build_schedule([(-1, 8, 0, 1)], [], 2, slot_nbytes=1024)


def test_request_rows_describe_this_ranks_side():
    src = np.zeros(100, dtype=np.uint8)
    sends = [SendRequest(task_id=9, src_tensor=src, src_pos=10, size=50, dest_pe=2)]
    receives = [ReceiveRequest(task_id=11, dest_tensor=src, dest_pos=0, size=20, src_pe=0)]
    send_rows, receive_rows = request_rows(sends, receives, my_pe=1)
    assert send_rows.tolist() == [[9, 50, 1, 2]]
    assert receive_rows.tolist() == [[11, 20, 0, 1]]
