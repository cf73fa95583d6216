"""Issue 13: the pipeline executor checks every field before anything moves.

Misuse that used to crash runs in a child process. The property test drives
random schedules, with random and partly invalid batch fields, through
build_schedule and PipelineExecutor with 1 to 3 ranks (threads of this
process joined to one LocalGroup by name): every byte lands where the schedule
says, or every rank raises ValueError before anything moved; never a crash.
"""

from __future__ import annotations

import copy
import threading
import uuid
from typing import Any, Callable, List

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from child_process import run_child, run_thread_ranks

from tensorxfer.resharding.pipeline_executor import DoubleBufferManager, HostKernelLauncher, PipelineExecutor
from tensorxfer.resharding.schedule import ReceiveRequest, SendRequest, build_schedule
from tensorxfer.runtime import LocalGroup

SLOT = 1024


def run_ranks(world: int, body: Callable[[LocalGroup, DoubleBufferManager], Any], slot_nbytes: Any = SLOT,
              timeout: float = 60.0) -> List[Any]:
    """``body(group, buffers)`` on ``world`` threads-as-ranks; each result or the exception it raised."""
    def with_buffers(group: LocalGroup) -> Any:
        slot = slot_nbytes[group.rank] if isinstance(slot_nbytes, list) else slot_nbytes
        buffers = DoubleBufferManager(group, slot, timeout=20)
        try:
            return body(group, buffers)
        finally:
            buffers.close()

    return run_thread_ranks(world, with_buffers, timeout, prefix="executor")


def test_a_send_to_a_rank_outside_the_group_is_a_value_error_not_a_crash():
    child = run_child("""
        import uuid
        import numpy as np
        from tensorxfer.runtime import LocalGroup
        from tensorxfer.resharding.pipeline_executor import DoubleBufferManager, HostKernelLauncher, PipelineExecutor
        from tensorxfer.resharding.schedule import BatchTask, ScheduledBatch, SendRequest
        group = LocalGroup.join("outside-" + uuid.uuid4().hex[:8], rank=0, world_size=1)
        source = np.arange(64, dtype=np.uint8)
        executor = PipelineExecutor(HostKernelLauncher([SendRequest(1, source, 0, 64, 5)], []),
                                    DoubleBufferManager(group, 4096), 0)
        batch = ScheduledBatch(0, 5, 0, 0, [BatchTask(1, 0, 64, 0)], 64)
        try:
            executor.execute_pipeline([{"send": batch, "recv": None}], 1, timeout=5)
        except ValueError as error:
            print("REFUSED", error)
        group.close()
    """)
    assert child.returncode == 0, (child.returncode, child.stderr)
    assert "REFUSED" in child.stdout and "dest_pe" in child.stdout and "got 5" in child.stdout


def test_the_executor_refuses_after_the_buffers_are_closed():
    child = run_child("""
        import uuid
        import numpy as np
        from tensorxfer.errors import ClosedError
        from tensorxfer.runtime import LocalGroup
        from tensorxfer.resharding.pipeline_executor import DoubleBufferManager, HostKernelLauncher, PipelineExecutor
        from tensorxfer.resharding.schedule import BatchTask, ScheduledBatch, SendRequest
        group = LocalGroup.join("closed-" + uuid.uuid4().hex[:8], rank=0, world_size=1)
        buffers = DoubleBufferManager(group, 4096)
        executor = PipelineExecutor(HostKernelLauncher([], []), buffers, 0)
        buffers.close()
        for call in (lambda: executor.execute_pipeline([{"send": None, "recv": None}], 1, timeout=5),
                     lambda: executor._native.execute(__import__("tensorxfer")._core.PipelinePlan.from_iterations(
                         [(None, None)]), 5)):
            try:
                call()
            except ClosedError as error:
                print("CLOSED", error)
        group.close()
    """)
    assert child.returncode == 0, (child.returncode, child.stderr)
    assert child.stdout.count("CLOSED") == 2 and "DoubleBufferManager is closed" in child.stdout, child.stdout


def test_double_buffer_managers_with_different_slot_sizes_fail_on_every_rank_naming_both():
    for error in run_ranks(2, lambda group, buffers: None, slot_nbytes=[4096, 8192]):
        assert isinstance(error, ValueError), error
        assert "slot_nbytes" in str(error) and "4096" in str(error) and "8192" in str(error)


def test_bad_field_types_are_value_errors_naming_the_field():
    def body(group: LocalGroup, buffers: DoubleBufferManager) -> Any:
        source = np.zeros(64, np.uint8)
        executor = PipelineExecutor(HostKernelLauncher([SendRequest(1, source, 0, 64, 0)], []), buffers, 0)
        schedule = build_schedule([(1, 64, 0, 1)], [(1, 64, 0, 1)], 2, slot_nbytes=SLOT)
        batch = copy.deepcopy(schedule.batches[0])
        batch.batch_index = -1
        with pytest.raises(ValueError, match=r"batch_index must be in \[0, 4294967296\), got -1"):
            executor.execute_pipeline([{"send": batch, "recv": None}], 1, agree=False)
        batch.batch_index, batch.tasks[0] = 0, type(batch.tasks[0])(1, 0, "64", 0)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"tasks\[0\].size must be an int"):
            executor.execute_pipeline([{"send": batch, "recv": None}], 1, agree=False)
        return True

    assert run_ranks(1, body) == [True]


# ---- the property test -------------------------------------------------------------

MUTATIONS = ["src_pe", "dest_pe", "batch_index", "iteration", "total_size", "task_offset", "size",
             "slot_offset", "task_id", "num_iterations"]


def _content(task_id: int, size: int) -> np.ndarray:
    return ((np.arange(size, dtype=np.uint64) * 7 + task_id * 131) % 251).astype(np.uint8)


def _mutate(plan: List[dict], what: str, value: int, world: int) -> bool:
    """Makes one field of the first batch of ``plan`` invalid; False if the plan has no batch."""
    batch = next((step[role] for step in plan for role in ("send", "recv") if step[role] is not None), None)
    if batch is None:
        return False
    task = batch.tasks[0] if batch.tasks else None
    if what == "src_pe":
        batch.src_pe = world + value  # outside the group
    elif what == "dest_pe":
        batch.dest_pe = -1 - value
    elif what == "batch_index":
        batch.batch_index = -1 - value
    elif what == "iteration":
        batch.iteration += 1 + value
    elif what == "total_size":
        batch.total_size = SLOT + 1 + value
    elif what == "task_offset" and task is not None:
        batch.tasks[0] = type(task)(task.task_id, task.task_offset + 10**6 + value, task.size, task.slot_offset)
    elif what == "size" and task is not None:
        batch.tasks[0] = type(task)(task.task_id, task.task_offset, task.size + SLOT + value, task.slot_offset)
    elif what == "slot_offset" and task is not None:
        batch.tasks[0] = type(task)(task.task_id, task.task_offset, task.size, batch.total_size + 1 + value)
    elif what == "task_id" and task is not None:
        batch.tasks[0] = type(task)(10**9 + value, task.task_offset, task.size, task.slot_offset)
    else:
        return False
    return True


def _check_random_schedule(world: int, tasks: List[tuple], mutation: Any) -> None:
    schedule = build_schedule(tasks, tasks, world, slot_nbytes=SLOT, max_tasks_per_batch=4)
    mutated_rank = None if mutation is None else mutation[0] % world
    invalid = [False]

    def body(group: LocalGroup, buffers: DoubleBufferManager) -> Any:
        rank = group.rank
        sends = [SendRequest(t, _content(t, n), 0, n, d) for t, n, s, d in tasks if s == rank]
        receives = [ReceiveRequest(t, np.zeros(n, np.uint8), 0, n, s) for t, n, s, d in tasks if d == rank]
        executor = PipelineExecutor(HostKernelLauncher(sends, receives), buffers, rank)
        plan = copy.deepcopy(schedule.iteration_schedules(rank))
        iterations = schedule.num_iterations
        if rank == mutated_rank:
            if mutation[1] != "num_iterations" and _mutate(plan, mutation[1], mutation[2], world):
                invalid[0] = True
            else:  # another iteration count than the peers'
                plan.append({"send": None, "recv": None})
                iterations += 1
                invalid[0] = invalid[0] or world > 1
        executor.process_self_moves(sends, receives)
        try:
            executor.execute_pipeline(plan, iterations, timeout=30)
        except ValueError as error:
            remote = [r.dest_tensor for r in receives if r.src_pe != rank]
            return "refused", str(error), all(not tensor.any() for tensor in remote)
        return "ran", {r.task_id: r.dest_tensor for r in receives}

    results = run_ranks(world, body)
    for rank, result in enumerate(results):
        assert isinstance(result, tuple), (rank, result)  # never another exception, never a crash
        if invalid[0]:
            assert result[0] == "refused", (rank, result)
            assert result[2], f"rank {rank}: bytes moved before the refusal ({result[1]})"
        else:
            assert result[0] == "ran", (rank, result)
            for task_id, tensor in result[1].items():
                assert np.array_equal(tensor, _content(task_id, tensor.size)), (rank, task_id)


task_lists = st.integers(1, 3).flatmap(lambda world: st.tuples(
    st.just(world),
    st.lists(st.tuples(st.integers(1, 3 * SLOT), st.integers(0, world - 1), st.integers(0, world - 1)),
             min_size=0, max_size=12)))
mutations = st.one_of(st.none(), st.tuples(st.integers(0, 2), st.sampled_from(MUTATIONS), st.integers(0, 100)))


def _tasks_of(raw: List[tuple]) -> List[tuple]:
    return [(task_id, size, src, dest) for task_id, (size, src, dest) in enumerate(raw)]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(task_lists, mutations)
def test_random_schedules_move_every_byte_or_fail_every_rank_before_anything_moves(world_tasks, mutation):
    world, raw = world_tasks
    _check_random_schedule(world, _tasks_of(raw), mutation)


@pytest.mark.stress
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(task_lists, mutations)
def test_random_schedules_long(world_tasks, mutation):
    world, raw = world_tasks
    _check_random_schedule(world, _tasks_of(raw), mutation)


def test_a_system_error_in_one_ranks_construction_fails_every_rank_without_a_timeout():
    # Rank 1 asks for slots no /dev/shm can hold: reserving its segment fails with ENOSPC.
    # Rank 0 waits with no deadline and must still fail (before: it waited forever).
    name = f"executor-oserror-{uuid.uuid4().hex[:10]}"
    results: List[Any] = [None, None]

    def main(rank: int) -> None:
        group = LocalGroup.join(name, rank=rank, world_size=2, timeout=20)
        try:
            DoubleBufferManager(group, 4096 if rank == 0 else 1 << 43, timeout=None).close()  # 32 TiB
        except BaseException as error:  # noqa: BLE001 - returned to the test
            results[rank] = error
        finally:
            group.close()

    threads = [threading.Thread(target=main, args=(rank,), daemon=True) for rank in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not any(thread.is_alive() for thread in threads), "a rank hung"
    assert isinstance(results[1], OSError), results[1]  # ENOSPC from posix_fallocate
    assert isinstance(results[0], Exception) and "rank 1 failed" in str(results[0]), results[0]
    assert "OSError" in str(results[0])


def test_a_barrier_of_one_run_never_completes_another_runs():
    """The executor's barriers carry the operation they belong to: two ranks whose
    runs differ (a rank out of step) both raise instead of passing each other's barrier."""
    from tensorxfer import _core
    from tensorxfer.errors import TensorxferError

    def body(group: LocalGroup, buffers: DoubleBufferManager) -> Any:
        executor = PipelineExecutor(HostKernelLauncher([], []), buffers, group.rank)
        empty = _core.PipelinePlan.from_iterations([])
        executor._native.execute(empty, 20, 7)  # the same operation on both ranks: passes
        executor._native.execute(empty, 20, 8 + group.rank)
        return "returned"

    results = run_ranks(2, body)
    for rank, result in enumerate(results):
        assert isinstance(result, TensorxferError) and "ranks out of step" in str(result), (rank, result)
    assert "rank 0 left barrier 0 of 1 of operation 8, which rank 1 entered as barrier 0 of 1 of operation 9" \
        in str(results[0])
