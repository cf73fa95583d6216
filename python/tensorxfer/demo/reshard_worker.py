"""One rank of the resharding demo (``python -m tensorxfer.demo.reshard_worker``; started by the demo).

A rank generates its source shards, submits one send per task it is the
source of and one receive per task it is the destination of (strided views
into its shards: the copy service stages what it must), times ``run()`` after
a barrier, checks every received byte against the independent recomputation
(:mod:`tensorxfer.demo.reshard_model`) and repeats. The ``local`` backend plays
every rank in one process. Progress and results (mismatches included) go to
stdout as lines ``EVENT_PREFIX + json``; the launcher
(:mod:`tensorxfer.demo.reshard_demo`) reads them and decides the demo's exit
code. A rank exits 0 when it finished every run (even with mismatches, which
its ``finished`` event reports), 3 on a lost peer or another failure, 130 when
interrupted.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import sys
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Sequence

EVENT_PREFIX = "@@tensorxfer-reshard "
EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 3, 130


def emit(event: str, rank: int, **fields: Any) -> None:
    """Writes one event line for the launcher."""
    sys.stdout.write(EVENT_PREFIX + json.dumps({"event": event, "rank": rank, **fields}) + "\n")
    sys.stdout.flush()


def build_parser() -> argparse.ArgumentParser:
    """The worker's options (passed by the launcher, not meant to be typed)."""
    parser = argparse.ArgumentParser(prog="python -m tensorxfer.demo.reshard_worker")
    add = parser.add_argument
    add("--backend", required=True, choices=["local", "mpi", "torch", "shm"])
    add("--ranks", type=int, required=True, help="ranks of the source layout (= processes, except local)")
    add("--target-parts", type=int, required=True)
    add("--total-mib", type=float, required=True)
    add("--repeat", type=int, required=True)
    add("--seed", type=int, required=True)
    add("--timeout", type=float, required=True, help="seconds a rank waits for its peers")
    add("--rank", type=int, default=None, help="this process's rank (torch, shm)")
    add("--rendezvous", default=None, help="file for torch.distributed's file:// rendezvous (torch, shm)")
    add("--test-corrupt-rank", type=int, default=None, help="flip a received byte on this rank in run 1")
    add("--test-kill-rank", type=int, default=None, help="this rank SIGKILLs itself before its first run()")
    return parser


class _Group:
    """The process group of one backend: rank, size, a barrier with a deadline, the service."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.backend = args.backend
        self.timeout = args.timeout
        self.comm: Any = None
        self.dist: Any = None
        if self.backend == "local":
            self.rank, self.size = 0, 1
        elif self.backend == "mpi":
            from mpi4py import MPI

            self.comm = MPI.COMM_WORLD
            self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        else:
            import torch.distributed as dist

            self.dist = dist
            dist.init_process_group("gloo", init_method=f"file://{args.rendezvous}", rank=args.rank,
                                    world_size=args.ranks, timeout=datetime.timedelta(seconds=args.timeout))
            self.rank, self.size = dist.get_rank(), dist.get_world_size()
        if self.backend != "local" and self.size != args.ranks:
            raise RuntimeError(f"started with {self.size} ranks, expected --ranks {args.ranks}")

    def barrier(self) -> None:
        """Waits until every rank arrived; TimeoutError after ``timeout`` seconds."""
        if self.comm is not None:
            request = self.comm.Ibarrier()
            deadline = time.monotonic() + self.timeout
            while not request.Test():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"rank {self.rank}: the barrier waited {self.timeout:g} s for its peers")
                time.sleep(0.001)
        elif self.dist is not None:
            self.dist.barrier()  # bounded by the process group's timeout

    def service(self) -> Any:
        """The copy service of this backend on this group."""
        from tensorxfer.resharding.copy_services import build_copy_service

        if self.backend == "local":
            return build_copy_service("local")
        return build_copy_service(self.backend, timeout=self.timeout)

    def close(self) -> None:
        """Leaves the process group."""
        if self.dist is not None and self.dist.is_initialized():
            self.dist.destroy_process_group()


def _flip_first_received_byte(targets: Dict[Any, Any], task: Any) -> None:
    import numpy as np

    shard = targets[(task.tensor, task.dst_rank)]
    first = tuple(s.start for s in task.dst_slices)
    offset = int(np.ravel_multi_index(first, shard.shape)) * shard.dtype.itemsize
    shard.reshape(-1).view(np.uint8)[offset] ^= 0xFF


def run_rank(args: argparse.Namespace, group: _Group, report: Callable[..., None]) -> List[str]:
    """Prepares, moves and verifies ``args.repeat`` times; returns the mismatch messages (empty: all good)."""
    import numpy as np

    from tensorxfer.demo import reshard_model as model_lib

    local = args.backend == "local"
    my_ranks = list(range(args.ranks)) if local else [group.rank]
    begin = time.perf_counter()
    model = model_lib.build_model(args.total_mib)
    tasks = model_lib.plan_tasks(model, args.ranks, args.target_parts)
    sources = {(t, p): model_lib.generate_region(spec, t, args.seed,
                                                 model_lib.shard_region(spec, spec.source_dim, args.ranks, p))
               for p in my_ranks for t, spec in enumerate(model)}
    targets = {(t, q): np.zeros(model_lib.region_shape(model_lib.shard_region(spec, spec.target_dim,
                                                                              args.target_parts, q)), spec.dtype)
               for q in my_ranks if q < args.target_parts for t, spec in enumerate(model)}
    sends = [task for task in tasks if task.src_rank in my_ranks]
    recvs = [task for task in tasks if task.dst_rank in my_ranks]
    report("prepared", seconds=time.perf_counter() - begin, tensors=len(model), tasks=len(tasks),
           sends=len(sends), recvs=len(recvs), send_bytes=sum(t.nbytes for t in sends),
           recv_bytes=sum(t.nbytes for t in recvs), total_bytes=sum(t.nbytes for t in tasks))
    expected: Optional[Dict[Any, Any]] = None
    mismatches: List[str] = []
    with group.service() as service:
        for run in range(1, args.repeat + 1):
            for shard in targets.values():
                shard.fill(0)
            for task in sends:
                service.submit_send(sources[(task.tensor, task.src_rank)][task.src_slices],
                                    0 if local else task.dst_rank, task.task_id)
            for task in recvs:
                service.submit_recv(targets[(task.tensor, task.dst_rank)][task.dst_slices],
                                    0 if local else task.src_rank, task.task_id)
            group.barrier()
            if run == 1 and args.test_kill_rank == group.rank and not local:
                os.kill(os.getpid(), signal.SIGKILL)  # test hook: a rank lost while its peers run
            start = time.perf_counter()
            service.run()
            seconds = time.perf_counter() - start
            report("moved", run=run, seconds=seconds, plans_built=getattr(service, "plans_built", None))
            if run == 1 and args.test_corrupt_rank in my_ranks and recvs:
                _flip_first_received_byte(targets, next(t for t in recvs if t.dst_rank == args.test_corrupt_rank))
            begin = time.perf_counter()
            if expected is None:
                expected = {(t, q): shard
                            for q in my_ranks if q < args.target_parts
                            for t, shard in model_lib.expected_target_shards(model, args.seed, args.target_parts,
                                                                             q).items()}
            bad = []
            for (t, q), shard in targets.items():
                message = model_lib.first_mismatch(model[t], q, args.target_parts, shard, expected[(t, q)])
                if message is not None:
                    bad.append(f"run {run}, rank {q}: {message}")
            mismatches.extend(bad)
            report("verified", run=run, seconds=time.perf_counter() - begin, ok=not bad,
                   bytes=sum(shard.nbytes for shard in targets.values()))
    return mismatches


def _summarize(mismatches: List[str]) -> str:
    more = f" (and {len(mismatches) - 3} more)" if len(mismatches) > 3 else ""
    return "; ".join(mismatches[:3]) + more


def _raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs one rank; returns its exit code."""
    args = build_parser().parse_args(argv)
    rank = args.rank if args.rank is not None else 0
    # The launcher stops ranks with SIGTERM: unwind like Ctrl-C, so the service and the group are closed.
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    group: Optional[_Group] = None
    try:
        group = _Group(args)
        rank = group.rank
        emit("ready", rank, pid=os.getpid())
        mismatches = run_rank(args, group, lambda event, **fields: emit(event, rank, **fields))
        # Reported before the last barrier: under mpirun, a rank that exits early may take
        # the others down before they could say they finished.
        emit("finished", rank, mismatches=len(mismatches), message=_summarize(mismatches) if mismatches else "")
        group.barrier()
        return EXIT_OK
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BaseException as error:  # reported to the launcher, which decides the demo's exit code
        from tensorxfer.errors import PeerLostError

        kind = "lost" if isinstance(error, (PeerLostError, TimeoutError)) else "failed"
        emit("error", rank, kind=kind, message=f"{type(error).__name__}: {error}")
        traceback.print_exc(file=sys.stderr)
        return EXIT_FAILED
    finally:
        if group is not None:
            try:
                group.close()
            except Exception:  # a broken group cannot be left cleanly; the process exits anyway
                pass


if __name__ == "__main__":
    sys.exit(main())
