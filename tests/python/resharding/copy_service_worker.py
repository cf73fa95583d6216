"""One rank of a copy-service test group (started by the tests, not collected).

    copy_service_worker.py BACKEND OUT_DIR SIZE MODE [RANK WORLD INIT_FILE]

BACKEND: local | mpi (rank/world from mpirun) | torch (RANK WORLD INIT_FILE given) | shm, shm-attach
(RANK WORLD GROUP_NAME given; shm-attach: cma_min_bytes=0).
MODE: "conformance" runs every scenario of copy_service_scenarios and writes
OUT_DIR/rank<R>.json = {scenario: "ok" | traceback}; "kill" makes the last rank
SIGKILL itself after one good run while the others run again; "idle" makes the
last rank skip run() (it sleeps, then exits). Both write
OUT_DIR/rank<R>.json = {"error": type, "message": ..., "seconds": ...}.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

TIMEOUT = 60.0
FAILURE_TIMEOUT = 5.0  # for the kill / idle modes


def make_service(backend: str, argv: list, timeout: float):
    from tensorxfer.resharding.copy_services import build_copy_service

    if backend == "local":
        return build_copy_service("local"), None
    if backend == "mpi":
        return build_copy_service("mpi", timeout=timeout), None
    if backend == "torch":
        import datetime

        import torch.distributed as dist

        rank, world, init_file = int(argv[0]), int(argv[1]), argv[2]
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=120))
        return build_copy_service("torch", timeout=timeout), dist
    if backend in ("shm", "shm-attach"):
        from tensorxfer.runtime import LocalGroup

        rank, world, name = int(argv[0]), int(argv[1]), argv[2]
        group = LocalGroup.join(name, rank=rank, world_size=world, timeout=60)
        if backend == "shm":
            return build_copy_service("shm", group=group, timeout=timeout), group
        # Every remote task of any size read from its sender by cross-memory attach.
        service = build_copy_service("shm", group=group, timeout=timeout, cma_min_bytes=0)
        pairs = service.cma_pairs  # [reader, sender]; a rank never reads itself
        assert (pairs | np.eye(world, dtype=bool)).all(), f"cross-memory attach refused between ranks: {pairs}"
        return service, group
    raise SystemExit(f"unknown backend {backend}")


def write(out_dir: str, rank: int, result: dict) -> None:
    path = os.path.join(out_dir, f"rank{rank}.json")
    with open(path + ".tmp", "w") as file:
        json.dump(result, file)
    os.replace(path + ".tmp", path)


def conformance(service, out_dir: str, size: str) -> None:
    import copy_service_scenarios as scenarios

    results = {}
    for name in scenarios.ORDER:
        try:
            scenarios.SCENARIOS[name](service, service.rank, service.world_size, size)
            results[name] = "ok"
        except Exception:  # recorded per scenario; the test reports it
            results[name] = traceback.format_exc()
            service.send_ops.clear()
            service.recv_ops.clear()
            if hasattr(service, "_send_info"):
                service._send_info.clear()
                service._recv_info.clear()
        write(out_dir, service.rank, results)


def leave(service) -> None:
    """Ends a process whose group is broken: skip MPI_Finalize / gloo teardown, but
    leave a LocalGroup (shm backend), so its last member removes the segment."""
    from tensorxfer.runtime import LocalGroup

    if isinstance(service.group, LocalGroup):
        service.group.close()
    os._exit(0)


def failure(service, out_dir: str, mode: str) -> None:
    import numpy as np

    rank, world = service.rank, service.world_size
    last = world - 1
    payload = np.arange(100_000, dtype=np.uint8)
    sink = np.zeros(100_000, np.uint8)
    ring_next, ring_prev = (rank + 1) % world, (rank - 1) % world
    service.submit_send(payload, ring_next, rank)
    service.submit_recv(sink, ring_prev, ring_prev)
    service.run()
    if rank == last:
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(FAILURE_TIMEOUT + 1.5)  # idle: never calls run() again
        write(out_dir, rank, {"error": None, "message": "idle rank", "seconds": 0.0})
        leave(service)
    service.submit_send(payload, ring_next, 100 + rank)
    service.submit_recv(sink, ring_prev, 100 + ring_prev)
    start = time.monotonic()
    try:
        service.run()
        result = {"error": None, "message": "run() returned", "seconds": time.monotonic() - start}
    except Exception as error:
        result = {"error": type(error).__name__, "message": str(error), "seconds": time.monotonic() - start}
        try:
            service.run()
            result["again"] = "run() returned"
        except Exception as again:
            result["again"] = f"{type(again).__name__}: {again}"
    write(out_dir, rank, result)
    time.sleep(1.0)  # let the other survivors see the killed rank before this one exits too
    leave(service)


def main() -> None:
    backend, out_dir, size, mode = sys.argv[1:5]
    timeout = TIMEOUT if mode == "conformance" else FAILURE_TIMEOUT
    service, dist = make_service(backend, sys.argv[5:], timeout)
    if mode == "conformance":
        conformance(service, out_dir, size)
    else:
        failure(service, out_dir, mode)
    service.close()
    if dist is not None and hasattr(dist, "destroy_process_group"):
        dist.destroy_process_group()
    elif dist is not None:
        dist.close()


if __name__ == "__main__":
    main()
