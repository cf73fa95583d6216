"""Persistent plans whose ranks span hosts (issue 37): the streams every rank plans alike,
and real runs on a simulated cluster (hosts as network, IPC and mount namespaces joined by
rate-limited veth NICs, tests/python/simulated_cluster.py).

The rank processes are cluster_plan_worker.py. On the cluster: a plan mixing same-rank,
same-host (shm) and cross-host (gloo) pairs with strided views, replicas fed by a chain,
Megatron's planner across hosts, and the faults (a host SIGKILLed, a link cut, a rank that
never calls run()): every survivor raises within its timeout naming the lost rank and its
host and the last landed version, and every host's /dev/shm is left empty.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import Dict, List, Tuple

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/python: the cluster fixture

import simulated_cluster  # noqa: E402

sys.path.insert(0, HERE)  # the resharding tests' helpers
import copy_service_launch as launch  # noqa: E402

from tensorxfer.resharding.copy_services import _network_plan as network  # noqa: E402
from tensorxfer.resharding.copy_services.planning import matching  # noqa: E402

WORKER = os.path.join(HERE, "cluster_plan_worker.py")
MEGATRON_WORKER = os.path.join(HERE, "megatron_refit_worker.py")


# ---- planning (in-process) ----------------------------------------------------------------

@st.composite
def cross_host_tasks(draw):
    """Matched rows of tasks between ranks of different hosts, some sharing a source (replicas)."""
    hosts = draw(st.integers(2, 4))
    per_host = draw(st.lists(st.integers(1, 3), min_size=hosts, max_size=hosts))
    host_of = [host for host, count in enumerate(per_host) for _ in range(count)]
    world = len(host_of)
    rows = []
    for _ in range(draw(st.integers(0, 40))):
        src = draw(st.integers(0, world - 1))
        others = [rank for rank in range(world) if host_of[rank] != host_of[src]]
        if not others:
            continue
        nbytes = draw(st.sampled_from([0, 1, 100, 4096, 3 << 20, 9 << 20]))
        receivers = draw(st.lists(st.sampled_from(others), min_size=1, max_size=len(others), unique=True))
        key = len(rows) + 1 if len(receivers) > 1 else 0
        for dst in receivers:
            rows.append((src, dst, nbytes, key))
    table = np.zeros((len(rows), matching.COLUMNS), np.int64)
    for i, (src, dst, nbytes, key) in enumerate(rows):
        table[i, matching.KEY_A] = i
        table[i, matching.SRC], table[i, matching.DST], table[i, matching.NBYTES] = src, dst, nbytes
        table[i, matching.FLAGS] = key
    return table, host_of


@settings(max_examples=150, deadline=None)
@given(cross_host_tasks(), st.sampled_from([1 << 20, 4 << 20]))
def test_every_task_travels_one_stream_and_a_chain_crosses_each_nic_once(case, bucket):
    sends, host_of = case
    streams = network.plan_streams(sends, host_of, bucket)
    seen: List[int] = []
    for index, stream in enumerate(streams):
        assert stream.index == index
        assert stream.src not in stream.receivers and len(set(stream.receivers)) == len(stream.receivers)
        # A chain visits the receivers host by host.
        assert [host_of[r] for r in stream.receivers] == sorted(host_of[r] for r in stream.receivers)
        for column, receiver in enumerate(stream.receivers):
            rows = stream.rows[:, column]
            assert (sends[rows, matching.SRC] == stream.src).all() and (sends[rows, matching.DST] == receiver).all()
            assert (np.diff(rows) > 0).all() or len(stream.receivers) > 1  # task order
            seen.extend(rows.tolist())
        item_bytes = sends[stream.rows[:, 0], matching.NBYTES]
        assert int(stream.sizes.sum()) == int(item_bytes.sum()) and (stream.sizes > 0).all()
        assert (stream.sizes <= bucket).all()
        if len(stream.receivers) > 1:  # the items of a chain are one source sent once
            for column in range(1, len(stream.receivers)):
                assert (sends[stream.rows[:, column], matching.NBYTES] == item_bytes).all()
    assert sorted(seen) == list(range(sends.shape[0]))
    # Replicas cost the sender once: it puts each distinct source on the wire once, whatever
    # the number of receivers (the chain's relays carry the rest).
    first_hops: Dict[int, int] = {}
    for stream in streams:
        first_hops[stream.src] = first_hops.get(stream.src, 0) + stream.nbytes
    distinct: Dict[Tuple[int, int], int] = {}
    for row in range(sends.shape[0]):
        key = int(sends[row, matching.FLAGS]) or -(row + 1)
        distinct[(int(sends[row, matching.SRC]), key)] = int(sends[row, matching.NBYTES])
    for src in set(int(x) for x in sends[:, matching.SRC]):
        assert first_hops.get(src, 0) == sum(n for (rank, _), n in distinct.items() if rank == src)
    load = network.nic_bytes(streams, host_of)
    assert sum(out for out, _ in load.values()) == sum(into for _, into in load.values())


def test_the_same_memory_sent_twice_shares_a_source_key():
    from tensorxfer.resharding.persistent_plan import describe_views

    base = np.zeros((8, 8), np.float32)
    tensors = [base[:4], base[4:], base[:4], base[:, :4], base[:4]]
    meta, dims = describe_views(tensors)
    keys = network.source_keys(meta, dims, np.arange(len(tensors)))
    assert keys.tolist() == [1, 0, 1, 0, 1]


def test_roles_name_each_ranks_own_ops_and_neighbours():
    sends = np.zeros((3, matching.COLUMNS), np.int64)
    # rank 0 sends one source to ranks 1 and 2 (replicas), and task 2 to rank 2 alone.
    for i, (dst, key, local) in enumerate([(1, 5, 0), (2, 5, 0), (2, 0, 1)]):
        sends[i, matching.KEY_A], sends[i, matching.SRC], sends[i, matching.DST] = i, 0, dst
        sends[i, matching.NBYTES], sends[i, matching.FLAGS], sends[i, matching.LOCAL_INDEX] = 64, key, local
    recvs = sends.copy()
    recvs[:, matching.LOCAL_INDEX] = [0, 0, 1]
    streams = network.plan_streams(sends, [0, 1, 2], 1 << 20)
    assert [(s.src, s.receivers) for s in streams] == [(0, (1, 2)), (0, (2,))]
    first = network.roles_of(0, streams, sends, recvs)
    assert [(r.upstream, r.downstream, r.items.tolist()) for r in first] == [(None, 1, [0]), (None, 2, [1])]
    relay = network.roles_of(1, streams, sends, recvs)
    assert [(r.upstream, r.downstream, r.items.tolist()) for r in relay] == [(0, 2, [0])]
    last = network.roles_of(2, streams, sends, recvs)
    assert [(r.upstream, r.downstream, r.items.tolist()) for r in last] == [(1, None, [0]), (0, None, [1])]
    assert network.nic_bytes(streams, [0, 1, 2]) == {0: (128, 0), 1: (64, 64), 2: (0, 128)}


# ---- on the simulated cluster ---------------------------------------------------------------

def _cluster_or_skip() -> None:
    reason = simulated_cluster.unavailable_reason()
    if reason:
        pytest.skip(reason)
    pytest.importorskip("torch", reason="torch is not installed")


def _environment(**extra: str) -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in sys.path if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


class Ranks:
    """The rank processes of one test, their output read as it comes (with arrival times)."""

    def __init__(self, processes: List[subprocess.Popen]) -> None:
        self.processes = processes
        self.lines: Dict[int, List[Tuple[float, str]]] = {i: [] for i in range(len(processes))}
        self._readers = [threading.Thread(target=self._read, args=(i, p), daemon=True)
                         for i, p in enumerate(processes)]
        for reader in self._readers:
            reader.start()

    def _read(self, rank: int, process: subprocess.Popen) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            self.lines[rank].append((time.monotonic(), line.rstrip()))

    def wait_for(self, predicate, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for the ranks:\n{self.text()}")
            if any(p.poll() not in (None, 0) for p in self.processes):
                raise AssertionError(f"a rank failed:\n{self.text()}")
            time.sleep(0.02)

    def said(self, rank: int, prefix: str) -> List[Tuple[float, str]]:
        return [(at, line) for at, line in self.lines[rank] if line.startswith(prefix)]

    def finish(self, timeout: float) -> List[int]:
        deadline = time.monotonic() + timeout
        for process in self.processes:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for reader in self._readers:
            reader.join(5)
        return [p.returncode for p in self.processes]

    def text(self) -> str:
        return "\n".join(f"[rank {rank}] {line}" for rank, lines in self.lines.items() for _, line in lines
                         if "hostname of the client" not in line)[-8000:]


def _start(cluster, ranks_per_host, argv, **env) -> Ranks:
    return Ranks(cluster.start_ranks(ranks_per_host, [sys.executable, *argv], env=_environment(**env),
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))


def _assert_shm_empty(cluster, hosts) -> None:
    for host in hosts:
        assert cluster.shm_listing(host) == [], f"host {host}'s /dev/shm: {cluster.shm_listing(host)}"


@pytest.mark.multiprocess
def test_one_plan_moves_same_rank_same_host_and_cross_host_pairs():
    """2 hosts x 2 ranks, every rank to every rank (itself included), strided sources and
    destinations: shared memory inside a host, gloo between hosts, in one run()."""
    _cluster_or_skip()
    with simulated_cluster.SimulatedCluster(2, nic_rate=None) as cluster:
        ranks = _start(cluster, [2, 2], [WORKER, "torch", "mixed", "24", "4096", "3"])
        codes = ranks.finish(180)
        assert codes == [0] * 4, ranks.text()
        for rank in range(4):
            assert ranks.said(rank, f"RUNS OK rank {rank} hosts=[[0, 1], [2, 3]] routes=8 native=True"), ranks.text()
        _assert_shm_empty(cluster, range(2))


@pytest.mark.multiprocess
@pytest.mark.stress
def test_a_plan_over_mpi_mixes_shared_memory_and_mpi():
    """The same plan on the mpi service, ranks in simulated hosts (own IPC and mount
    namespaces, one network) under mpirun: shared memory inside a host, MPI between."""
    import simulated_hosts

    reason = simulated_hosts.unavailable_reason()
    mpirun = os.path.join(os.path.dirname(sys.executable), "mpirun")
    if reason or not os.path.exists(mpirun):
        pytest.skip(reason or f"no mpirun beside {sys.executable}")
    pytest.importorskip("mpi4py", reason="mpi4py is not installed")
    with simulated_hosts.SimulatedHosts([2, 2]) as hosts:
        command = [mpirun, "--oversubscribe", "--allow-run-as-root", "--mca", "btl", "self,tcp",
                   "--mca", "btl_tcp_if_include", "lo", "-x", "PYTHONPATH"]
        for rank, wrapper in enumerate(hosts.wrappers):
            command += ([":"] if rank else []) + ["-np", "1", *wrapper, sys.executable, WORKER, "mpi", "mixed", "24",
                                                  "4096", "3"]
        done = subprocess.run(command, env=_environment(), capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
        for rank in range(4):
            assert f"RUNS OK rank {rank} hosts=[[0, 1], [2, 3]] routes=8 native=True" in done.stdout, done.stdout
        for host in range(2):
            assert hosts.shm_listing(host) == []


@pytest.mark.multiprocess
@pytest.mark.stress
def test_replicas_are_fed_by_a_chain():
    """One trainer host, three replica hosts at 1 Gbit/s: one route, a chain through the
    three, and every replica gets every byte of every run."""
    _cluster_or_skip()
    with simulated_cluster.SimulatedCluster(4, nic_rate="1gbit") as cluster:
        ranks = _start(cluster, [1, 1, 1, 1], [WORKER, "torch", "replicas", str(8 << 20), "3"])
        codes = ranks.finish(180)
        assert codes == [0] * 4, ranks.text()
        routes = ranks.said(0, "ROUTES")
        assert routes and routes[0][1] == f"ROUTES [(0, (1, 2, 3), {8 << 20})]", ranks.text()
        _assert_shm_empty(cluster, range(4))


MEGATRON_CASES = [
    # TP2 trainer on host A, the TP1 inference model on host B.
    pytest.param([2, 1], "tp2_to_tp1_apart", "persistent", id="tp2-A_to_tp1-B-persistent"),
    pytest.param([2, 1], "tp2_to_tp1_apart", "execute", id="tp2-A_to_tp1-B-execute"),
    # ... and as TP1 x DP2 replicas on hosts B and C.
    pytest.param([2, 1, 1], "tp2_to_tp1_apart", "persistent", id="tp2-A_to_tp1xdp2-BC-persistent"),
    pytest.param([2, 1, 1], "tp2_to_tp1_apart", "execute", id="tp2-A_to_tp1xdp2-BC-execute"),
    # swap_model_weights needs both models on every rank (Megatron reads its parallel state):
    # the TP2 trainer spans hosts A and B, the TP1 model is on both.
    pytest.param([1, 1], "tp2_to_tp1", "swap", id="tp2-AB_to_tp1-AB-swap"),
    pytest.param([1, 1], "tp2_to_tp1", "persistent", id="tp2-AB_to_tp1-AB-persistent"),
]


@pytest.mark.multiprocess
@pytest.mark.stress
@pytest.mark.parametrize("layout,scenario,mode", MEGATRON_CASES)
def test_megatron_refit_across_hosts(layout, scenario, mode):
    """Megatron's planner with its executor, swap_model_weights, or tensorxfer's persistent
    plan of its ReshardPlan, with the models on simulated hosts, over the torch service: the
    weights land as computed from the layouts alone."""
    _cluster_or_skip()
    launch.megatron_or_skip()
    world = sum(layout)
    with simulated_cluster.SimulatedCluster(len(layout), nic_rate="2gbit") as cluster:
        ranks = _start(cluster, layout, [MEGATRON_WORKER, "torch", scenario, str(world), "0", "env", mode])
        codes = ranks.finish(240)
        assert codes == [0] * world, ranks.text()
        for rank in range(world):
            assert ranks.said(rank, f"REFIT OK rank {rank} "), ranks.text()
        if mode == "persistent" and world == 4:  # the replicas: each trainer rank's bytes travel one chain
            for rank in (0, 1):
                assert any("routes=[" in line and f"({rank}, (2, 3)," in line for _, line in ranks.lines[rank]), \
                    ranks.text()
        _assert_shm_empty(cluster, range(len(layout)))


def _fault_run(layout, action: str, victim_host: int, timeout: float = 10.0):
    """Ranks that run a plan until it fails; ``action`` (kill / cut / idle) hits
    ``victim_host`` once every rank landed two versions. Returns (ranks, when the fault
    struck, the cluster's /dev/shm listings after the ranks ended)."""
    with simulated_cluster.SimulatedCluster(len(layout), nic_rate="1gbit") as cluster:
        ranks = _start(cluster, layout, [WORKER, "torch", "faults", "idle" if action == "idle" else "run"],
                       PLAN_TIMEOUT=str(timeout))
        world = sum(layout)
        ranks.wait_for(lambda: all(ranks.said(r, "LANDED") and len(ranks.said(r, "LANDED")) >= 2
                                   for r in range(world)), 120)
        time.sleep(0.1)  # into a run
        struck = time.monotonic()
        if action == "kill":
            cluster.kill_host(victim_host)
        elif action == "cut":
            cluster.cut_link(victim_host)
        codes = ranks.finish(timeout + 60)
        listings = [cluster.shm_listing(host) for host in range(len(layout))]
        if action == "kill":  # a job starting on the restarted host sweeps the dead one's group
            restart = cluster.popen(victim_host, [sys.executable, "-c", "from tensorxfer.runtime import LocalGroup; "
                                                  "LocalGroup.join('restart', rank=0, world_size=1).close()"],
                                    env=cluster.environment(victim_host, _environment()))
            restart.wait(timeout=60)
            listings[victim_host] = cluster.shm_listing(victim_host)
        return ranks, codes, struck, listings


def _victims(layout, host) -> List[int]:
    first = sum(layout[:host])
    return list(range(first, first + layout[host]))


def _check_survivors(ranks, survivors, lost_ranks, struck, timeout, cause) -> None:
    for rank in survivors:
        failed = ranks.said(rank, f"FAILED {rank} ")
        assert failed, f"rank {rank} did not fail:\n{ranks.text()}"
        at, line = failed[0]
        assert f" {cause} " in line, line
        assert any(f"rank {lost} (host " in line for lost in lost_ranks), line
        landed = int(line.split("landed=")[1].split()[0])
        assert landed == int(ranks.said(rank, "LANDED")[-1][1].split()[-1]), line
        assert at - struck < timeout + 3.0, f"rank {rank} raised {at - struck:.1f} s after the fault: {line}\n{ranks.text()}"


@pytest.mark.multiprocess
def test_a_host_sigkilled_during_a_run_is_named_by_every_survivor():
    """2 hosts x 2 ranks; host 1 is SIGKILLed mid-run: both survivors raise PeerLostError
    naming a rank of host 1 and the last landed version, at once; /dev/shm ends empty."""
    _cluster_or_skip()
    layout = [2, 2]
    ranks, codes, struck, listings = _fault_run(layout, "kill", 1)
    _check_survivors(ranks, [0, 1], _victims(layout, 1), struck, 1.0, "PeerLostError")
    assert codes[:2] == [0, 0], ranks.text()
    assert listings == [[], []], listings


@pytest.mark.multiprocess
@pytest.mark.stress
def test_a_cut_link_is_named_within_the_timeout():
    """Host 2's link is cut mid-run (packets vanish, no reset): the ranks of hosts 0 and 1
    name rank 3 (host 2) well within their timeout, and host 2's rank names the others."""
    _cluster_or_skip()
    layout = [2, 1, 1]
    ranks, codes, struck, listings = _fault_run(layout, "cut", 2, timeout=12.0)
    for rank in (0, 1, 2):
        failed = ranks.said(rank, f"FAILED {rank} ")
        assert failed, ranks.text()
        at, line = failed[0]
        assert "rank 3 (host 2)" in line and ("PeerLostError" in line or "TimeoutError" in line), line
        assert at - struck < 12.0 + 3.0, line
    assert ranks.said(3, "FAILED 3 "), ranks.text()
    assert codes == [0] * 4, ranks.text()
    assert listings == [[], [], []], listings


@pytest.mark.multiprocess
@pytest.mark.stress
def test_a_rank_that_never_calls_run_is_named_at_the_timeout():
    _cluster_or_skip()
    layout = [2, 1, 1]
    ranks, codes, struck, listings = _fault_run(layout, "idle", 2, timeout=8.0)
    _check_survivors(ranks, [0, 1, 2], [3], struck, 8.0, "TimeoutError")
    assert all("did not take part in the run within 8 s" in ranks.said(r, "FAILED")[0][1] for r in (0, 1, 2))
    assert codes == [0] * 4, ranks.text()
    assert listings == [[], [], []], listings
