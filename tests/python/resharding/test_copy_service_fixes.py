"""Defects of the copy services found by reading them (issue 32, part 3), each with the test
that failed before its fix; and the package's one argument-check module."""

from __future__ import annotations

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
            service._executor = _SlowExecutor(service._executor, 1.2)
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
