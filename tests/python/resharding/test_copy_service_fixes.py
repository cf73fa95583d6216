"""Defects of the copy services found by reading them (issue 32, part 3), each with the test
that failed before its fix; and the package's one argument-check module."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tensorxfer import _arguments


@pytest.mark.parametrize("option,value", [("slot_nbytes", "4096"), ("slot_nbytes", 4096.0), ("max_tasks_per_batch", None),
                                          ("buffer_bytes", True), ("cma_min_bytes", 1.5)])
def test_shm_options_of_the_wrong_type_raise_type_error(option, value):
    """The README promises TypeError for an argument of the wrong type; shm raised ValueError."""
    from tensorxfer.resharding.copy_services.shm import ShmCopyService

    with pytest.raises(TypeError, match=f"^{option}: expected an integer"):
        ShmCopyService(None, **{option: value})


@pytest.mark.parametrize("option,value,message", [("slot_nbytes", 100, "a multiple of 64, got 100"),
                                                  ("max_tasks_per_batch", 0, ">= 1, got 0"),
                                                  ("buffer_bytes", -1, ">= 0, got -1"),
                                                  ("cma_min_bytes", -5, ">= 0, got -5")])
def test_shm_options_out_of_range_raise_value_error(option, value, message):
    from tensorxfer.resharding.copy_services.shm import ShmCopyService

    with pytest.raises(ValueError, match=message):
        ShmCopyService(None, **{option: value})


def test_torch_transport_reports_a_timeout_without_a_deadline():
    """timeout=None: gloo's own timeout ends the wait; the message formatted None with :g
    and raised TypeError instead of the TimeoutError."""
    pytest.importorskip("torch")
    from tensorxfer.resharding.copy_services.torch_distributed import _TorchTransport

    class Work:
        def wait(self, *args):
            raise RuntimeError("[gloo] Timed out waiting 1800000ms for recv operation to complete")

    transport = _TorchTransport.__new__(_TorchTransport)
    transport.backend_name, transport.rank, transport.world_size, transport.watch = "Torch", 0, 2, None
    with pytest.raises(TimeoutError, match="without a deadline"):
        transport.wait([Work()], None, None, "the batch", None)


def test_check_int_names_the_argument_and_splits_type_from_range():
    assert _arguments.check_int(np.int32(5), "n", minimum=1) == 5
    for bad in (True, 1.0, "1", None):
        with pytest.raises(TypeError, match=r"^n: expected an integer >= 1, got "):
            _arguments.check_int(bad, "n", minimum=1)
    with pytest.raises(ValueError, match=r"^n: expected an integer in \[1, 3\], got 4$"):
        _arguments.check_int(4, "n", 1, 3)
    with pytest.raises(ValueError, match=r"^n: expected an integer >= 64 and a multiple of 64, got 65$"):
        _arguments.check_int(65, "n", minimum=64, multiple_of=64)
    assert _arguments.check_optional_int(None, "n", 0) is None
    with pytest.raises(TypeError, match=r"\(or None\)$"):
        _arguments.check_optional_int("x", "n", 0)
    assert _arguments.check_task_id(None) is None and _arguments.check_task_id(-3) == -3
    with pytest.raises(ValueError, match="64-bit"):
        _arguments.check_task_id(1 << 63)
    with pytest.raises(ValueError, match=r"^r: expected a rank in \[0, 2\), got 2$"):
        _arguments.check_rank(2, 2, "r")


class _SlowExecutor:
    """The native executor, entering execute() only after a delay."""

    def __init__(self, executor, delay):
        self._executor, self._delay = executor, delay

    def execute(self, *args):
        import time

        time.sleep(self._delay)
        return self._executor.execute(*args)

    def __getattr__(self, name):
        return getattr(self._executor, name)


def _stalls_twice(name, rank, world):
    """Rank 1 reaches run() 1.2 s late and its pipeline 1.2 s later still; rank 0's run has
    a 2 s timeout. One deadline per call: rank 0 raises TimeoutError at about 2 s (before the
    fix the pipeline restarted the full timeout, and the run succeeded after 2.4 s)."""
    import time

    from tensorxfer.resharding.copy_services import build_copy_service
    from tensorxfer.runtime import LocalGroup

    group = LocalGroup.join(name, rank=rank, world_size=world, timeout=60)
    service = build_copy_service("shm", group, timeout=2.0 if rank == 0 else 10.0, cma_min_bytes=None)
    try:
        source, target = np.ones(1024, np.float32), np.zeros(1024, np.float32)
        service.submit_send(source, 1 - rank, rank)
        service.submit_recv(target, 1 - rank, 1 - rank)
        if rank == 1:
            service._mover.executor = _SlowExecutor(service._mover.executor, 1.2)
            time.sleep(1.2)
        start = time.monotonic()
        try:
            service.run()
        except Exception as error:  # noqa: BLE001
            return type(error).__name__, time.monotonic() - start
        return "no error", time.monotonic() - start
    finally:
        service.close()
        group.close()


@pytest.mark.multiprocess
def test_shm_run_keeps_one_deadline():
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from copy_service_launch import run_ranks

    got = run_ranks(_stalls_twice, 2)
    error, seconds = got[0]
    assert error == "TimeoutError", got
    assert 1.8 <= seconds < 3.0, got


def test_send_ops_assigned_before_the_base_init_are_queued():
    """A subclass that assigns its queued ops before calling the base ``__init__`` (as the
    reference's own services keep their lists): the QueueAttribute descriptor dropped every
    assignment made before the queue existed, and run() copied nothing."""
    from tensorxfer.resharding.copy_services import LocalCopyService, RecvOp, SendOp

    source, target = np.arange(8, dtype=np.float32), np.zeros(8, np.float32)

    class Prefilled(LocalCopyService):
        def __init__(self) -> None:
            self.send_ops = [SendOp(7, source, 0)]
            self.recv_ops = [RecvOp(7, target, 0)]
            super().__init__()

    service = Prefilled()
    assert [op.task_id for op in service.send_ops] == [7]
    service.run()
    np.testing.assert_array_equal(target, source)


@pytest.mark.parametrize("send_ids,recv_ids,message", [
    ([None], [1], "requires a task_id to match sends with recvs"),
    ([1, 2], [1], "unmatched local ops on rank 0: 2 local sends vs 1 local recvs"),
    ([1, 1], [1, 2], "unmatched local ops on rank 0: 2 local sends vs 2 local recvs"),
    ([1, 3], [3, 2], "missing local send for task_id=2 on rank 0"),
])
def test_same_rank_mismatches_are_task_mismatch_errors(send_ids, recv_ids, message):
    """Same-rank pairs go through the one matcher and raise its one error type (they raised
    a plain RuntimeError from a second, Python matcher); the messages are DESIGN.md's."""
    from tensorxfer.resharding.copy_services import LocalCopyService, TaskMismatchError, match_local_ops_by_task_id
    from tensorxfer.resharding.copy_services.base import RecvOp, SendOp

    with pytest.raises(TaskMismatchError, match=message):
        match_local_ops_by_task_id([SendOp(i, None, 0) for i in send_ids], [RecvOp(i, None, 0) for i in recv_ids],
                                   "Backend", 0)
    service = LocalCopyService()
    for task_id in send_ids:
        service.submit_send(np.zeros(2, np.float32), 0, task_id)
    for task_id in recv_ids:
        service.submit_recv(np.zeros(2, np.float32), 0, task_id)
    with pytest.raises(TaskMismatchError, match=message):
        service.run()


def test_same_rank_pairs_come_back_in_receive_order():
    from tensorxfer.resharding.copy_services import match_local_ops_by_task_id
    from tensorxfer.resharding.copy_services.base import RecvOp, SendOp

    sends = [SendOp(task_id, None, 0) for task_id in (5, -2, 9, 1 << 40)]
    recvs = [RecvOp(task_id, None, 0) for task_id in (9, 1 << 40, 5, -2)]
    pairs = match_local_ops_by_task_id(sends, recvs, "Backend", 0)
    assert [(send.task_id, recv.task_id) for send, recv in pairs] == [(9, 9), (1 << 40, 1 << 40), (5, 5), (-2, -2)]
    assert all(recv is recvs[i] for i, (_, recv) in enumerate(pairs))


@pytest.mark.multiprocess
def test_the_local_backend_imports_no_message_executor():
    """LocalCopyService imported the mpi / torch backends' message executor through the
    forwarding chain; a backend holds only its own steps."""
    import subprocess
    import sys

    code = ("import sys, tensorxfer.resharding.copy_services.local as local; local.LocalCopyService(); "
            "print(sorted(m for m in sys.modules if m.endswith(('_messages', '_shm_mover', '_forwarding'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_runtime_integer_arguments_follow_the_package_rules(tmp_path):
    """runtime/ reads its integers with _arguments: a value that is not an integer is a
    TypeError (Communicator and IpcMemory raised ValueError), one out of range a ValueError,
    both naming the argument."""
    from tensorxfer.runtime import Communicator, IpcMemory, LocalGroup

    with LocalGroup.join(f"arguments-{os.getpid()}", rank=0, world_size=1) as group:
        with pytest.raises(TypeError, match=r"^nbytes: expected an integer >= 0, got float$"):
            IpcMemory.create(group, 64.0)
        with pytest.raises(TypeError, match=r"^max_bytes: expected an integer >= 0, got str$"):
            Communicator(group, max_bytes="64")
        with pytest.raises(ValueError, match=r"^buffer_bytes: expected an integer >= 0, got -1$"):
            Communicator(group, buffer_bytes=-1)
        with pytest.raises(TypeError, match=r"^max_nbytes: expected an integer >= 0, got float$"):
            group.all_gather_bytes(b"x", max_nbytes=1.0)
