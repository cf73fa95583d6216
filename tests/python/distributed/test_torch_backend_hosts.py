"""The "tensorxfer" backend across simulated hosts (separate /dev/shm each), against flat gloo."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from conftest import torch_or_skip

torch = torch_or_skip()

import torch_backend_workers as workers  # noqa: E402
from simulated_hosts import SimulatedHosts, unavailable_reason  # noqa: E402

pytestmark = [pytest.mark.multiprocess,
              pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))]


def _out(tmp_path, name):
    path = tmp_path / name
    path.mkdir()
    return str(path)


def _hosts_of(sizes):
    expected_hosts = []
    for size in sizes:
        start = sum(len(h) for h in expected_hosts)
        expected_hosts.append(list(range(start, start + size)))
    return expected_hosts


def _check_against_gloo(reference, results, expected_hosts, transport="gloo"):
    world = len(results)
    for rank in range(world):
        assert results[rank].pop("hosts") == expected_hosts
        local_index = next(ranks.index(rank) for ranks in expected_hosts if rank in ranks)
        equal_hosts = len({len(ranks) for ranks in expected_hosts}) == 1
        assert results[rank].pop("delegated_ops") == 0, f"rank {rank} handed ops to flat gloo"
        cross = results[rank].pop("cross_host", None)
        if equal_hosts or local_index == 0:  # this rank ran the cross-host steps, over `transport`
            assert cross is not None and cross[0] == transport and cross[1] > 0, (rank, cross)
        else:
            assert cross is None, (rank, cross)
        assert reference[rank].keys() == results[rank].keys(), rank
        for key, value in reference[rank].items():
            got = results[rank][key]
            if key.startswith("random/"):  # every rank bitwise the same
                assert torch.equal(got, results[0][key]), (rank, key)
                continue
            assert got.dtype == value.dtype and torch.equal(got, value), (rank, key, got, value)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sizes", [[2, 2], pytest.param([1, 3], marks=pytest.mark.stress),
                                   pytest.param([2, 2, 2], marks=pytest.mark.stress)], ids=["2+2", "1+3", "2+2+2"])
def test_hierarchical_collectives_match_flat_gloo(sizes, tmp_path):
    """Every accelerated op, composed across hosts, gives gloo's results; every host's /dev/shm ends empty."""
    world = sum(sizes)
    expected_hosts = _hosts_of(sizes)
    reference = workers.launch("hosts", world, "gloo", _out(tmp_path, "gloo"), timeout_s=150)
    with SimulatedHosts(sizes) as hosts:
        results = workers.launch("hosts", world, "tensorxfer", _out(tmp_path, "tx"), timeout_s=150,
                                 wrappers=hosts.wrappers)
        for host in range(len(sizes)):
            assert hosts.shm_listing(host) == [], f"host {host}'s /dev/shm not clean"
    _check_against_gloo(reference, results, expected_hosts)


@pytest.mark.stress
@pytest.mark.timeout(300)
def test_hosts_whose_ranks_interleave(tmp_path):
    """Ranks 0 and 2 on one host, 1 and 3 on the other: results still in global rank order."""
    reference = workers.launch("hosts", 4, "gloo", _out(tmp_path, "gloo"), timeout_s=150)
    with SimulatedHosts([2, 2]) as hosts:
        wrappers = [hosts.enter(rank % 2) for rank in range(4)]
        results = workers.launch("hosts", 4, "tensorxfer", _out(tmp_path, "tx"), timeout_s=150, wrappers=wrappers)
        for host in range(2):
            assert hosts.shm_listing(host) == [], f"host {host}'s /dev/shm not clean"
    _check_against_gloo(reference, results, [[0, 2], [1, 3]])


def _mpi_unavailable():
    if not os.path.exists(workers.MPIRUN):
        return f"no mpirun next to the interpreter ({workers.MPIRUN})"
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py is not installed"
    return None


@pytest.mark.skipif(_mpi_unavailable() is not None, reason=str(_mpi_unavailable()))
@pytest.mark.timeout(300)
@pytest.mark.parametrize("sizes", [[2, 2]] + [pytest.param(sizes, marks=pytest.mark.stress) for sizes in ([1, 3], [2, 2, 2])],
                         ids=["2+2", "1+3", "2+2+2"])
def test_cross_host_step_runs_over_mpi_under_mpirun(sizes, tmp_path):
    """Ranks started by mpirun (MPI over TCP) in simulated hosts: the cross-host step goes through MPI
    (the groups' transport and call counts say so), and every op still gives flat gloo's results."""
    world = sum(sizes)
    reference = workers.launch("hosts", world, "gloo", _out(tmp_path, "gloo"), timeout_s=150)
    out = _out(tmp_path, "tx")
    with SimulatedHosts(sizes) as hosts:
        command = workers.mpirun_command("hosts", world, "tensorxfer", out, wrappers=hosts.wrappers)
        done = subprocess.run(command, env=workers.worker_env(), capture_output=True, text=True, timeout=200)
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
        for host in range(len(sizes)):
            assert hosts.shm_listing(host) == [], f"host {host}'s /dev/shm not clean"
    results = [torch.load(os.path.join(out, f"{rank}.pt")) for rank in range(world)]
    _check_against_gloo(reference, results, _hosts_of(sizes), transport="mpi")


#: Every accelerated collective, each killed-rank case runs one; all_reduce also kills a rank of host 0.
_COLLECTIVES = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier"]


@pytest.mark.timeout(200)
@pytest.mark.parametrize("victim,op", [(1, "all_reduce")] + [(3, op) for op in _COLLECTIVES] + [
    pytest.param(2, op, marks=pytest.mark.stress) for op in _COLLECTIVES],
    ids=["host0-non-leader-all_reduce"] + [f"host1-non-leader-{op}" for op in _COLLECTIVES] + [
        f"host1-leader-{op}" for op in _COLLECTIVES])
def test_killed_rank_across_hosts_is_named_within_the_timeout(victim, op, tmp_path):
    """2 hosts x 2 ranks, one rank SIGKILLed while the others run `op`: the survivors on both hosts (the
    store's rank 0 among them: ranks 2 and 3 are on the other host) raise PeerLostError naming it within the
    process group's timeout, and neither host's /dev/shm keeps a segment. A broadcast (from rank 3) whose
    path to a rank does not pass the victim may complete there: that rank raises in the all_reduce after."""
    pg_timeout, world = 20.0, 4
    out = _out(tmp_path, "tx")
    with SimulatedHosts([2, 2]) as hosts:
        processes = workers.start("victim", world, "tensorxfer", out, wrappers=hosts.wrappers,
                                  pg_timeout_s=pg_timeout, extra=f"{victim},{op}")
        outputs, elapsed = workers.kill_and_finish(processes, victim, timeout_s=pg_timeout + 30)
        deadline = time.monotonic() + 5.0  # the survivors' exits unlink what the victim left
        listings = [hosts.shm_listing(host) for host in range(2)]
        while any(listings) and time.monotonic() < deadline:
            time.sleep(0.1)
            listings = [hosts.shm_listing(host) for host in range(2)]
        assert listings == [[], []], listings
    for rank, (code, text) in enumerate(outputs):
        if rank == victim:
            continue
        assert code == 0, text
        result = torch.load(os.path.join(out, f"{rank}.pt"))
        assert result["error"] is not None, (rank, result)
        assert result["error"].startswith("PeerLostError") and f"rank {victim} " in result["error"], (rank, result)
        if op != "broadcast":  # every rank's result needs the victim's data (or its presence, for barrier)
            assert not result["op_completed"], (rank, result)
        assert result["seconds"] < pg_timeout, (rank, result)
    assert elapsed < pg_timeout + 15


@pytest.mark.timeout(200)
def test_every_collective_runs_a_cross_host_step(tmp_path):
    """2 hosts x 2 ranks: each accelerated op, run once, makes its cross-host call on the ranks that carry it
    (every rank; broadcast: the root's local index; barrier: the hosts' first ranks) and none goes to flat
    gloo; a barrier that rank 3 (host 1) enters late holds host 0's ranks until it arrives."""
    late_s, world = 1.5, 4
    with SimulatedHosts([2, 2]) as hosts:
        results = workers.launch("host_steps", world, "tensorxfer", _out(tmp_path, "tx"), timeout_s=150,
                                 wrappers=hosts.wrappers, extra=str(late_s))
    every = ["all_reduce", "all_reduce/small", "reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
             "reduce_scatter_tensor"]
    for rank, result in enumerate(results):
        assert result.pop("delegated_ops") == 0, rank
        waited = result.pop("barrier_wait")
        if rank != world - 1:
            assert waited >= late_s - 0.3, (rank, waited)
        expected = {name: 1 for name in every}
        expected["broadcast"] = 1 if rank % 2 == 1 else 0  # root 3 has local index 1
        expected["barrier"] = 1 if rank % 2 == 0 else 0
        assert result == {f"cross_calls/{name}": calls for name, calls in expected.items()}, rank
