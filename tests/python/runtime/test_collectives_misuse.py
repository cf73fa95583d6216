"""Issue 13: the collectives and groups under the mistakes users make.

Ranks are threads of this process joined to one LocalGroup by name (each
thread its own LocalGroup object), or child processes where a mistake used to
crash or hang the process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from typing import Any, Callable, List

import numpy as np
import pytest

from child_process import child_environment, run_child, run_thread_ranks

from tensorxfer.errors import TensorxferError
from tensorxfer.runtime import Communicator, LocalGroup
from tensorxfer.runtime.collectives import default_max_bytes



def run_ranks(world: int, body: Callable[[LocalGroup], Any], timeout: float = 30.0) -> List[Any]:
    """Runs ``body(group)`` on ``world`` threads-as-ranks; returns each result or the exception it raised."""
    return run_thread_ranks(world, body, timeout, prefix="misuse")


def test_all_reduce_of_a_view_over_the_staging_windows_is_refused_naming_buffer():
    def body(group: LocalGroup) -> Any:
        with Communicator(group, max_bytes=4096) as comm:
            staged = comm.ipc_memory.buffer(group.rank, np.float32, (256,))  # the staging windows
            try:
                comm.all_reduce(staged, algorithm="one_shot", timeout=10)
            except ValueError as error:
                message = str(error)
            else:
                message = ""
            # The zero-copy buffer is accepted and reduces correctly.
            mine = comm.buffer(np.float32, (256,))
            mine[:] = group.rank + 1
            comm.all_reduce(mine, algorithm="one_shot", timeout=10)
            return message, mine.copy()

    for message, total in run_ranks(2, body):
        assert "staging windows" in message and "Communicator.buffer()" in message
        assert np.all(total == 3.0)


def test_communicators_with_different_max_bytes_or_buffer_bytes_fail_on_every_rank_naming_both():
    sizes = [(8192, 0), (4096, 8192)]  # equal totals: accepted before the fix

    def body(group: LocalGroup) -> Any:
        max_bytes, buffer_bytes = sizes[group.rank]
        Communicator(group, max_bytes=max_bytes, buffer_bytes=buffer_bytes, timeout=10).close()

    results = run_ranks(2, body)
    for error in results:
        assert isinstance(error, ValueError), error
        assert "max_bytes" in str(error) and "8192" in str(error) and "4096" in str(error)


def test_default_max_bytes_does_not_follow_a_ranks_cpu_affinity():
    if not hasattr(os, "sched_setaffinity") or (os.cpu_count() or 1) < 2:
        pytest.skip("needs sched_setaffinity and 2 CPUs")
    child = run_child("""
        import os
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        from tensorxfer.runtime.collectives import default_max_bytes
        print(default_max_bytes(2))
    """)
    assert child.returncode == 0, child.stderr
    assert int(child.stdout) == default_max_bytes(2)


def test_a_construction_failing_on_one_rank_fails_every_rank_also_without_timeout():
    def body(group: LocalGroup) -> Any:
        bad = -1 if group.rank == 1 else 4096
        start = time.monotonic()
        try:
            Communicator(group, max_bytes=bad, timeout=None)
        except Exception as error:  # noqa: BLE001
            return error, time.monotonic() - start
        return None, 0.0

    results = run_ranks(2, body, timeout=30)
    own, peer = results[1][0], results[0][0]
    assert isinstance(own, ValueError) and "max_bytes" in str(own)
    assert isinstance(peer, TensorxferError) and "rank 1 failed" in str(peer), peer
    assert results[0][1] < 10


def test_all_gather_bytes_bounds_what_a_peer_announces():
    def body(group: LocalGroup) -> Any:
        data = b"x" * (5000 if group.rank == 1 else 10)
        try:
            group.all_gather_bytes(data, timeout=10, max_nbytes=4096)
        except ValueError as error:
            first = str(error)
        else:
            first = ""
        return first, group.all_gather_bytes(bytes([group.rank]), timeout=10)

    for message, again in run_ranks(2, body):
        assert "rank 1 contributes 5000 bytes, more than max_nbytes 4096" in message
        assert again == [b"\x00", b"\x01"]  # the group stays usable


def test_closing_a_group_while_another_thread_waits_on_it_raises_closed_in_that_thread():
    child = run_child("""
        import threading, time, uuid
        from tensorxfer.errors import ClosedError
        from tensorxfer.runtime import LocalGroup
        outcome = []
        name = "close-wait-" + uuid.uuid4().hex[:8]
        ranks = [None, None]
        def join(rank):
            ranks[rank] = LocalGroup.join(name, rank=rank, world_size=2, timeout=10)
        threads = [threading.Thread(target=join, args=(r,)) for r in range(2)]
        [t.start() for t in threads]; [t.join() for t in threads]
        def wait():
            try:
                ranks[0].barrier(timeout=None)   # rank 1 never comes
            except ClosedError as error:
                outcome.append(str(error))
        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(0.2)
        ranks[0].close()
        waiter.join(10)
        ranks[1].close()
        print("OUTCOME", outcome)
    """)
    assert child.returncode == 0, (child.returncode, child.stderr)
    assert "is closed" in child.stdout, child.stdout


def test_a_second_call_or_close_while_a_collective_runs_on_another_thread_never_blocks():
    child = run_child("""
        import threading, time, uuid
        import numpy as np
        from tensorxfer.errors import ClosedError
        from tensorxfer.runtime import Communicator, LocalGroup
        name = "second-call-" + uuid.uuid4().hex[:8]
        comms = [None, None]
        def make(rank):
            comms[rank] = Communicator(LocalGroup.join(name, rank=rank, world_size=2, timeout=10), timeout=10)
        threads = [threading.Thread(target=make, args=(r,)) for r in range(2)]
        [t.start() for t in threads]; [t.join() for t in threads]
        outcome = []
        def first():
            try:
                comms[0].all_reduce(np.ones(8, np.float32), timeout=None)  # rank 1 does not call it
            except ClosedError as error:
                outcome.append("closed")
        runner = threading.Thread(target=first)
        runner.start()
        time.sleep(0.2)
        start = time.monotonic()
        try:
            comms[0].barrier(timeout=None)
        except ValueError as error:
            outcome.append("refused" if "one operation at a time" in str(error) else str(error))
        comms[0].close()
        runner.join(10)
        outcome.append(time.monotonic() - start < 5 and not runner.is_alive())
        comms[1].close()
        print("OUTCOME", outcome)
    """)
    assert child.returncode == 0, (child.returncode, child.stderr)
    assert "OUTCOME ['refused', 'closed', True]" in child.stdout, child.stdout


def test_a_forked_child_can_close_a_communicator_whose_collective_is_in_flight_and_exit():
    child = run_child("""
        import os, threading, time, uuid, warnings
        import numpy as np
        from tensorxfer.errors import ClosedError
        from tensorxfer.runtime import Communicator, LocalGroup
        warnings.simplefilter("ignore")
        name = "fork-close-" + uuid.uuid4().hex[:8]
        comms = [None, None]
        def make(rank):
            comms[rank] = Communicator(LocalGroup.join(name, rank=rank, world_size=2, timeout=10), timeout=10)
        threads = [threading.Thread(target=make, args=(r,)) for r in range(2)]
        [t.start() for t in threads]; [t.join() for t in threads]
        def first():
            try:
                comms[0].all_reduce(np.ones(8, np.float32), timeout=None)
            except ClosedError:
                pass
        runner = threading.Thread(target=first)
        runner.start()
        time.sleep(0.2)
        pid = os.fork()
        if pid == 0:
            comms[0].close()   # the operation lock is held by a thread that does not exist here
            os._exit(0)
        deadline = time.monotonic() + 10
        status = None
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.01)
        else:
            os.kill(pid, 9); os.waitpid(pid, 0)
        comms[0].close(); runner.join(10); comms[1].close()
        print("CHILD", status)
    """)
    assert child.returncode == 0, (child.returncode, child.stderr)
    assert "CHILD 0" in child.stdout, child.stdout


RANK_SCRIPT = """
import signal, sys, time
from tensorxfer.errors import PeerLostError
from tensorxfer.runtime import Communicator, LocalGroup
name, rank = sys.argv[1], int(sys.argv[2])
group = LocalGroup.join(name, rank=rank, world_size=2, timeout=30)
if rank == 1:
    print("waiting", flush=True)
    try:
        Communicator(group, max_bytes=4096, timeout=None)   # rank 0 is not there yet
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    sys.stdin.readline()   # alive until told: the peer must learn of the give-up, not of an exit
else:
    sys.stdin.readline()   # go: rank 1 was interrupted
    start = time.monotonic()
    try:
        Communicator(group, max_bytes=4096, timeout=None)
        print("constructed", flush=True)
    except PeerLostError as error:
        print("lost", round(time.monotonic() - start, 1), error, flush=True)
group.close()
"""


def test_ctrl_c_in_one_ranks_construction_fails_the_others_without_a_timeout():
    name = f"ctrl-c-{uuid.uuid4().hex[:10]}"
    env = child_environment()
    ranks = [subprocess.Popen([sys.executable, "-c", RANK_SCRIPT, name, str(rank)], env=env, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for rank in range(2)]
    try:
        assert ranks[1].stdout.readline().strip() == "waiting"
        time.sleep(0.5)
        ranks[1].send_signal(2)  # SIGINT: Ctrl-C
        assert ranks[1].stdout.readline().strip() == "interrupted"
        ranks[0].stdin.write("go\n")
        ranks[0].stdin.flush()
        out, err = ranks[0].communicate(timeout=30)
        ranks[1].communicate("exit\n", timeout=30)
        assert out.startswith("lost"), (out, err)
        assert "rank 1" in out and "gave up" in out
        assert float(out.split()[1]) < 10
    finally:
        for process in ranks:
            if process.poll() is None:
                process.kill()
            process.communicate()
