"""One rank of a persistent plan across simulated hosts (run by test_plan_across_hosts.py; not collected).

    python cluster_plan_worker.py BACKEND SCENARIO [ARGS...]

The rank, world size and rendezvous come from the environment (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT: ``SimulatedCluster.start_ranks``); BACKEND is ``torch`` (gloo)
or ``mpi`` (then the MPI rank and size are used and the rendezvous is mpirun's).
Scenarios:

* ``mixed TASKS SIZE RUNS``: every rank sends TASKS tasks of SIZE bytes to every rank,
  itself included (same-rank, same-host and cross-host pairs in one plan); every third
  source is a column slice (strided) and every fifth destination a transposed view. Each
  run writes new values into the sources and checks every byte received. Prints
  ``RUNS OK rank R hosts=H routes=N``.
* ``replicas NBYTES RUNS``: rank 0 sends the same 16 tensors to every other rank (the
  replicas). Prints ``RUNS OK ...`` and, for rank 0, ``ROUTES`` (src, receivers, bytes).
* ``faults MODE``: 8 MiB (FAULT_MIB) each way between every pair, runs until one fails; prints
  ``LANDED R V`` after each run, then ``FAILED R <error type> landed=L after=S <message>``
  (S: seconds from the failing run's start). MODE ``idle``: the last rank builds the plan
  and then never calls run().
"""

from __future__ import annotations

import os
import sys
import time
import warnings

import numpy as np

warnings.filterwarnings("ignore", message=".*hostname of the client socket.*")


def init(backend: str):
    import torch.distributed as dist

    if backend == "mpi":
        from mpi4py import MPI

        from tensorxfer.resharding.copy_services import build_copy_service

        return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size(), build_copy_service("mpi", MPI.COMM_WORLD,
                                                                                          timeout=TIMEOUT)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
                            rank=rank, world_size=world)
    from tensorxfer.resharding.copy_services import build_copy_service

    return rank, world, build_copy_service("torch", timeout=TIMEOUT)


TIMEOUT = float(os.environ.get("PLAN_TIMEOUT", "20"))


def value(src: int, dst: int, task: int, run: int) -> int:
    return (src * 31 + dst * 7 + task * 3 + run * 11) % 251


def mixed(rank: int, world: int, service, tasks: int, size: int, runs: int) -> None:
    import torch

    from tensorxfer.resharding.persistent_plan import build_persistent_plan

    sends, recvs, expected = [], [], []
    for peer in range(world):
        for task in range(tasks):
            task_id = (rank * world + peer) * tasks + task
            if task % 3 == 0:  # a column slice: SIZE bytes, strided
                whole = torch.zeros((16, 2 * size // 16), dtype=torch.uint8)
                source = whole[:, : size // 16]
            else:
                source = torch.zeros(size, dtype=torch.uint8)
            sends.append((task_id, source, peer))
            back_id = (peer * world + rank) * tasks + task
            if task % 5 == 0:  # a transposed view
                target = torch.zeros((size // 16, 16), dtype=torch.uint8).t()
            else:
                target = torch.zeros(size, dtype=torch.uint8)
            recvs.append((back_id, target, peer))
            expected.append((peer, task, target))
    plan = build_persistent_plan(service, sends, recvs)
    for run in range(runs):
        for task_id, source, peer in sends:
            source.fill_(value(rank, peer, task_id % tasks, run))
        assert plan.run() == run
        for peer, task, target in expected:
            want = value(peer, rank, task, run)
            if not bool((target == want).all()):
                raise AssertionError(f"rank {rank} run {run}: task {task} from rank {peer} has "
                                     f"{sorted(set(target.reshape(-1).tolist()))[:5]}, expected {want}")
    hosts = plan.hosts
    print(f"RUNS OK rank {rank} hosts={hosts} routes={len(plan.routes)} native={plan.native}", flush=True)


def replicas(rank: int, world: int, service, nbytes: int, runs: int) -> None:
    import torch

    from tensorxfer.resharding.persistent_plan import build_persistent_plan

    count = 16
    size = nbytes // count
    if rank == 0:
        sources = [torch.zeros(size, dtype=torch.uint8) for _ in range(count)]
        sends = [(peer * count + i, source, peer) for peer in range(1, world) for i, source in enumerate(sources)]
        recvs = []
    else:
        targets = [torch.zeros(size, dtype=torch.uint8) for _ in range(count)]
        sends, recvs = [], [(rank * count + i, target, 0) for i, target in enumerate(targets)]
    plan = build_persistent_plan(service, sends, recvs)
    for run in range(runs):
        if rank == 0:
            for i, source in enumerate(sources):
                source.fill_(value(0, 0, i, run))
        plan.run()
        if rank:
            for i, target in enumerate(targets):
                assert bool((target == value(0, 0, i, run)).all()), f"rank {rank} run {run} tensor {i}"
    if rank == 0:
        print(f"ROUTES {plan.routes}", flush=True)
    print(f"RUNS OK rank {rank} hosts={plan.hosts} routes={len(plan.routes)}", flush=True)


def faults(rank: int, world: int, service, mode: str) -> None:
    from tensorxfer.resharding.persistent_plan import PersistentPlanError, build_persistent_plan

    size = int(os.environ.get("FAULT_MIB", "8")) << 20  # 8 MiB to each peer: a run lasts ~0.2 s at 1 Gbit/s
    sends = [(rank * world + peer, np.full(size, rank, np.uint8), peer) for peer in range(world) if peer != rank]
    recvs = [(peer * world + rank, np.zeros(size, np.uint8), peer) for peer in range(world) if peer != rank]
    plan = build_persistent_plan(service, sends, recvs)
    version = 0
    while True:
        if mode == "idle" and rank == world - 1 and version == 2:
            print(f"IDLE {rank}", flush=True)
            time.sleep(TIMEOUT * 2)
            return
        started = time.monotonic()
        try:
            plan.run(version=version)
        except PersistentPlanError as error:
            cause = type(error.__cause__).__name__
            print(f"FAILED {rank} {cause} landed={error.landed_version} after={time.monotonic() - started:.2f} "
                  f"{error}", flush=True)
            return
        print(f"LANDED {rank} {version}", flush=True)
        version += 1
        time.sleep(0.05)


def main() -> None:
    backend, scenario, *args = sys.argv[1:]
    rank, world, service = init(backend)
    if scenario == "mixed":
        mixed(rank, world, service, int(args[0]), int(args[1]), int(args[2]))
    elif scenario == "replicas":
        replicas(rank, world, service, int(args[0]), int(args[1]))
    elif scenario == "faults":
        faults(rank, world, service, args[0])
        return  # the service is broken: what a user's process does then is exit
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    service.close()


if __name__ == "__main__":
    main()
