"""Copy services vs what a user would write by hand: 2 ranks (or more, in pairs), each way.

Cases (every rank sends to its partner, rank ^ 1, and receives from it):

* (a) 10,000 tensors of 4 KiB,
* (b) 16 tensors of 16 MiB,
* (c) a resharding step: a model of 200 weights of 64 KiB - 32 MiB (log-uniform,
  seed 0), split 2 ways along dim 0; each rank sends its shard to the other
  rank's layout and receives the other's (half of every weight each way).

Variants, in the same run, interleaved repeat by repeat:

* MPI (one ``mpirun -n 2`` job): ``MpiCopyService`` - the first run of a new
  service (plan built, private communicator made) and later runs of the same
  op pattern (plan and staging reused) - against hand-written mpi4py
  ``Isend``/``Irecv`` posted in windows of 16, 128 and all, ``Waitall`` per window.
* shared memory (in the same mpirun job, on a ``LocalGroup.from_mpi`` group):
  ``build_copy_service("shm", ...)`` first and later runs, the same way; also
  with the sources already in the service's shared send buffer
  (``buffer_bytes=``, ``service.buffer(...)``): receivers copy them from the
  mapping (no target: a different input).
* persistent plans (in the same mpirun job, shm): ``build_persistent_plan`` of the step's
  ops, built once outside the clock; a sample is one ``plan.run()`` (from private torch
  tensors, and from views of the send buffer). Targets on (a): >= 0.45x the memcpy floor
  and >= 60x the better gloo window from private tensors, >= 0.8x the floor from the buffer.
* torch.distributed (2 spawned gloo ranks, tcp://127.0.0.1): ``TorchDistributedCopyService``
  (first and later runs) against ``batch_isend_irecv`` in windows of 1024 and all.

A sample is the slower rank's time for one full step, submits included,
between barriers. Targets: MPI backend >= 3x the best mpi4py window on (a) and
>= 1.0x on (b); torch backend >= 10x the better gloo window on (a) and >= 1.0x
on (b); shm backend >= 4x the best mpi4py window and >= 30x the better gloo
window on (a), >= 1.5x the best mpi4py window on (b), >= 1.5x the better of
the mpi and torch backends (later runs) on (c). Against the floors measured in
the same run (each rank copying the bytes it receives as one block, both ranks
at once): shm within 2.5x of the memcpy floor on (a); on (b) >= 0.9x the
cross-memory-read floor from private memory, >= 0.8x the memcpy floor from the
send buffer. On (a) it also reads each of the partner's tensors by cross-memory
attach (an iovec each: the one-copy way to move private bytes), and notes the best
ratio to the memcpy floor that the parts no backend avoids leave (the caller's
calls, torch's reads of the tensors, moving the bytes between private memories).
The shm backend gets torch tensors (views of the numpy arrays the
mpi4py baselines send) when torch is installed. ``--ranks 4`` runs 4 ranks
(two pairs) in both jobs. Prints the table (CPU model in the header), writes JSON + PNG.

    python bench/python/bench_copy_services.py [--repeats 5] [--cases a,b,c] [--ranks 2]
                                               [--backends mpi,shm,torch] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

import numpy as np

HERE = Path(__file__).resolve().parent
DEFAULT_JSON = HERE.parents[1] / "bench" / "results" / "copy_services.json"
TARGETS = {("a", "mpi"): 3.0, ("b", "mpi"): 1.0, ("a", "torch"): 10.0, ("b", "torch"): 1.0}
# shm backend: (case, baseline family) -> target; family "ours" = the best other backend of this project.
SHM_TARGETS = {("a", "mpi4py"): 4.0, ("a", "gloo"): 30.0, ("b", "mpi4py"): 1.5, ("c", "ours"): 1.5}
#: The floors, measured in the same run: each rank copies the bytes it receives as one
#: contiguous block (memcpy), or reads them from its partner in one cross-memory read.
FLOOR_MEMCPY = "floor: one memcpy of the same bytes"
FLOOR_CMA = "floor: one cross-memory read of the same bytes"
#: Case (a): each tensor read from the partner's private memory (an iovec each): the one copy
#: that moves private bytes between processes, against two copies through shared memory.
FLOOR_CMA_PIECES = "floor: a cross-memory read of each tensor"
# (case, candidate, floor) -> target ratio (floor time / candidate time).
FLOOR_TARGETS = {("a", "tensorxfer shm (repeat)", FLOOR_MEMCPY): 0.4,  # within 2.5x of the floor
                 ("b", "tensorxfer shm (repeat)", FLOOR_CMA): 0.9,
                 ("b", "tensorxfer shm, sources in buffer (repeat)", FLOOR_MEMCPY): 0.8}
#: The shm backend with its sources already in its shared send buffer (zero-copy sends).
BUFFERED = "tensorxfer shm, sources in buffer (repeat)"
#: Persistent plans (tensorxfer.resharding.persistent_plan) on the shm backend, built once
#: outside the clock: a run is one native call.
PERSISTENT = "tensorxfer shm persistent plan (run)"
PERSISTENT_BUFFERED = "tensorxfer shm persistent plan, sources in buffer (run)"
FLOOR_TARGETS[("a", PERSISTENT, FLOOR_MEMCPY)] = 0.45
FLOOR_TARGETS[("a", PERSISTENT_BUFFERED, FLOOR_MEMCPY)] = 0.8
#: (case, candidate) -> target against the better gloo window.
GLOO_TARGETS = {("a", PERSISTENT): 60.0}
#: Where a shm step of case (a) goes (printed, no target): its parts and their floors.
PART_SUBMITS = "shm parts: the 20,000 submits alone"
PART_RUN = "shm parts: run() alone (submitted before)"
PART_NO_OP = "floor parts: 20,000 calls to a no-op C function"
PART_BARE_LOOP = "floor parts: a bare loop over the 20,000 tensors"
PART_TORCH_READS = "floor parts: torch's reads of 20,000 tensors (data_ptr, nbytes, is_contiguous, is_cpu)"
CASE_NAMES = {"a": "(a) 10000 x 4 KiB", "b": "(b) 16 x 16 MiB", "c": "(c) reshard 200 weights"}


def case_sizes(case: str) -> List[int]:
    """Bytes of each tensor one rank sends (and receives) in a case."""
    if case == "a":
        return [4096] * 10_000
    if case == "b":
        return [16 << 20] * 16
    rng = np.random.default_rng(0)
    weights = np.exp(rng.uniform(np.log(64 << 10), np.log(32 << 20), 200))
    weights = (weights.astype(np.int64) // 8192) * 8192  # even rows of 4 KiB pages
    return [int(w) // 2 for w in weights]  # one shard of a 2-way split


# ---- workers (one per rank) ------------------------------------------------------------


def submit_and_run(service: Any, sends: List[Any], recvs: List[Any], rank: int, peer: int) -> None:
    """One copy-service step of a case: every send to the partner, every receive from it, run()."""
    for i, tensor in enumerate(sends):
        service.submit_send(tensor, peer, rank * 1_000_000 + i)
    for i, tensor in enumerate(recvs):
        service.submit_recv(tensor, peer, peer * 1_000_000 + i)
    service.run()


def torch_views(arrays: List[np.ndarray]) -> List[Any]:
    """torch tensors sharing the arrays' memory, or the arrays without torch."""
    try:
        import torch
    except ImportError:
        return arrays
    return [torch.from_numpy(array) for array in arrays]


def cross_memory_floor(comm: Any, peer: int, sources: List[np.ndarray], targets: List[np.ndarray]) -> Any:
    """A step reading the partner's ``sources`` into ``targets`` (one each) by cross-memory
    attach, as many per call as the kernel takes, the calls in parallel as the shm backend
    reads, or None where a rank may not."""
    from mpi4py import MPI

    from tensorxfer import _core
    from tensorxfer.ipc.pack import default_copy_engine
    from tensorxfer.resharding.copy_services import _ptracer

    where = comm.allgather((os.getpid(), [a.ctypes.data for a in sources], sources[0][:16].tobytes()))
    pid, addresses, head = where[peer]
    grant = _ptracer.grant([pid])
    comm.Barrier()
    readable = bool(_core.probe_process_memory(pid, addresses[0], head))
    if not comm.allreduce(readable, op=MPI.LAND):
        _ptracer.release(grant)
        return None
    spans = np.array([(remote, target.ctypes.data, target.nbytes) for remote, target in zip(addresses, targets)],
                     np.uint64)
    engine = default_copy_engine()
    return lambda: _core.read_process_spans(pid, spans, engine)


def shm_parts(group: Any, sends: List[Any], recvs: List[Any], rank: int, peer: int) -> Tuple[Dict[str, Callable[[], None]], Any]:
    """Where a shm step of case (a) goes, and the floors of its parts: the submits alone, run()
    alone (ops submitted before the clock starts), a bare loop of as many calls to a no-op C
    function, and torch's own reads of every tensor's address, size, layout and device.
    Returns the variants and the service they use (the caller closes it)."""
    from tensorxfer.resharding.copy_services import build_copy_service

    service = build_copy_service("shm", group=group, timeout=600)
    submit_and_run(service, sends, recvs, rank, peer)  # the plan, reused below

    def submits_only() -> None:
        for i, tensor in enumerate(sends):
            service.submit_send(tensor, peer, rank * 1_000_000 + i)
        for i, tensor in enumerate(recvs):
            service.submit_recv(tensor, peer, peer * 1_000_000 + i)
        service.send_ops.clear()
        service.recv_ops.clear()

    class RunOnly:
        """A step whose clock starts after the submits (the callable is the timed part)."""

        def __call__(self) -> None:
            service.run()

        def prepare(self) -> None:
            for i, tensor in enumerate(sends):
                service.submit_send(tensor, peer, rank * 1_000_000 + i)
            for i, tensor in enumerate(recvs):
                service.submit_recv(tensor, peer, peer * 1_000_000 + i)

    def no_op_calls() -> None:
        for _i, tensor in enumerate(sends):
            isinstance(tensor, int)
        for _i, tensor in enumerate(recvs):
            isinstance(tensor, int)

    def bare_loop() -> None:
        for tensors in (sends, recvs):
            for _tensor in tensors:
                pass

    def torch_reads() -> None:
        for tensors in (sends, recvs):
            for tensor in tensors:
                tensor.data_ptr(), tensor.nbytes, tensor.is_contiguous(), tensor.is_cpu

    parts: Dict[str, Callable[[], None]] = {PART_SUBMITS: submits_only, PART_RUN: RunOnly()}
    if hasattr(sends[0], "data_ptr"):
        parts[PART_NO_OP] = no_op_calls
        parts[PART_TORCH_READS] = torch_reads
        parts[PART_BARE_LOOP] = bare_loop
    return parts, service


def timed_step(barrier: Callable[[], None], slowest: Callable[[float], float], step: Callable[[], None]) -> float:
    prepare = getattr(step, "prepare", None)
    if prepare is not None:  # what comes before the clock starts
        prepare()
    barrier()
    start = time.perf_counter()
    step()
    return slowest(time.perf_counter() - start) * 1e3


def mpi_worker(cases: List[str], repeats: int, out: str, with_mpi: bool, with_shm: bool) -> None:
    from mpi4py import MPI

    from tensorxfer.resharding.copy_services import MpiCopyService, build_copy_service
    from tensorxfer.runtime import LocalGroup

    comm = MPI.COMM_WORLD
    rank, peer = comm.Get_rank(), comm.Get_rank() ^ 1
    group = LocalGroup.from_mpi(comm, timeout=600) if with_shm else None
    results: Dict[str, Dict[str, List[float]]] = {}
    barrier = comm.Barrier
    slowest = lambda seconds: comm.allreduce(seconds, op=MPI.MAX)  # noqa: E731

    for case in cases:
        sizes = case_sizes(case)
        sends = [np.full(n, rank + 1, np.uint8) for n in sizes]
        recvs = [np.zeros(n, np.uint8) for n in sizes]
        samples: Dict[str, List[float]] = {}
        # backend name -> (make a new service, the current one or None)
        makers: Dict[str, Callable[[], object]] = {}
        if with_mpi:
            makers["mpi"] = lambda: MpiCopyService(timeout=600)
        if with_shm:
            makers["shm"] = lambda: build_copy_service("shm", group=group, timeout=600)
        services: Dict[str, object] = {}

        shm_sends, shm_recvs = torch_views(sends), torch_views(recvs)

        def copy_service_step(backend: str) -> Callable[[], None]:
            if backend == "shm":
                return lambda: submit_and_run(services[backend], shm_sends, shm_recvs, rank, peer)
            return lambda: submit_and_run(services[backend], sends, recvs, rank, peer)

        def mpi4py_step(window: int) -> Callable[[], None]:
            def step() -> None:
                count = len(sends)
                for start in range(0, count, window):
                    requests = []
                    for i in range(start, min(count, start + window)):
                        requests.append(comm.Irecv(recvs[i], source=peer, tag=i % 32768))
                        requests.append(comm.Isend(sends[i], dest=peer, tag=i % 32768))
                    MPI.Request.Waitall(requests)
            return step

        variants = {f"mpi4py Isend/Irecv w{w}": mpi4py_step(w) for w in (16, 128)}
        variants["mpi4py Isend/Irecv wall"] = mpi4py_step(len(sends))
        floor_source, floor_target = np.full(sum(sizes), rank + 1, np.uint8), np.zeros(sum(sizes), np.uint8)
        variants[FLOOR_MEMCPY] = lambda: np.copyto(floor_target, floor_source)
        cma_floor = cross_memory_floor(comm, peer, [floor_source], [floor_target])
        if cma_floor is not None:
            variants[FLOOR_CMA] = cma_floor
        if case == "a":
            cma_pieces = cross_memory_floor(comm, peer, sends, recvs)
            if cma_pieces is not None:
                variants[FLOOR_CMA_PIECES] = cma_pieces
        parts_service = None
        if with_shm and case == "a":
            parts, parts_service = shm_parts(group, shm_sends, shm_recvs, rank, peer)
            variants.update(parts)
        buffered = None
        if with_shm:
            # The same sends from views of the shm service's shared send buffer.
            buffered = build_copy_service("shm", group=group, timeout=600, buffer_bytes=sum(sizes))
            staged = buffered.buffer(np.uint8, (sum(sizes),))
            offsets = np.concatenate([[0], np.cumsum(sizes)])
            views = [staged[offsets[i]:offsets[i + 1]] for i in range(len(sizes))]
            for view in views:
                view.fill(rank + 1)

            def buffered_step() -> None:
                submit_and_run(buffered, views, recvs, rank, peer)

            buffered_step()  # builds the plan: the variant is timed on repeats
            variants[BUFFERED] = buffered_step
        plans = []
        if with_shm:
            from tensorxfer.resharding.persistent_plan import build_persistent_plan

            plan_service = build_copy_service("shm", group=group, timeout=600)
            plan = build_persistent_plan(plan_service, [(rank * 1_000_000 + i, t, peer) for i, t in enumerate(shm_sends)],
                                         [(peer * 1_000_000 + i, t, peer) for i, t in enumerate(shm_recvs)])
            plan.run()
            assert all(r[0] == peer + 1 and r[-1] == peer + 1 for r in recvs if r.size), "persistent: wrong bytes"
            variants[PERSISTENT] = plan.run
            plans.append((plan, plan_service))
            assert buffered is not None
            buffered_plan = build_persistent_plan(buffered, [(rank * 1_000_000 + i, t, peer) for i, t in enumerate(views)],
                                                  [(peer * 1_000_000 + i, t, peer) for i, t in enumerate(shm_recvs)])
            buffered_plan.run()
            variants[PERSISTENT_BUFFERED] = buffered_plan.run
            plans.append((buffered_plan, None))
        for repeat in range(repeats):
            for backend, make in makers.items():
                if backend in services:
                    services.pop(backend).close()
                services[backend] = make()
                for r in recvs:
                    r.fill(0)
                step = copy_service_step(backend)
                samples.setdefault(f"tensorxfer {backend} (first run)", []).append(timed_step(barrier, slowest, step))
                if repeat == 0:
                    assert all(r[0] == peer + 1 and r[-1] == peer + 1 for r in recvs if r.size), \
                        f"{backend}: wrong bytes received"
                for _ in range(2):
                    samples.setdefault(f"tensorxfer {backend} (repeat)", []).append(timed_step(barrier, slowest, step))
            for name, step in variants.items():
                samples.setdefault(name, []).append(timed_step(barrier, slowest, step))
        for service in services.values():
            service.close()
        for plan, plan_service in plans:
            plan.close()
            if plan_service is not None:
                plan_service.close()
        for extra in (buffered, parts_service):
            if extra is not None:
                extra.close()
        results[case] = samples
        sends.clear()  # the case's memory, before the next case allocates
        recvs.clear()
    if group is not None:
        group.close()
    if rank == 0:
        Path(out).write_text(json.dumps(results))


def torch_worker(rank: int, world_size: int, init: str, cases: List[str], repeats: int, out: str) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    from tensorxfer.resharding.copy_services import TorchDistributedCopyService

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=600))
    peer = rank ^ 1
    results: Dict[str, Dict[str, List[float]]] = {}

    def slowest(seconds: float) -> float:
        value = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return float(value.item())

    for case in cases:
        sizes = case_sizes(case)
        sends = [torch.full((n,), rank + 1, dtype=torch.uint8) for n in sizes]
        recvs = [torch.zeros(n, dtype=torch.uint8) for n in sizes]
        samples: Dict[str, List[float]] = {}
        service = TorchDistributedCopyService(timeout=600)

        def copy_service_step() -> None:
            submit_and_run(service, sends, recvs, rank, peer)

        def gloo_step(window: int) -> Callable[[], None]:
            def step() -> None:
                count = len(sends)
                for start in range(0, count, window):
                    operations = [dist.P2POp(dist.irecv, recvs[i], peer, tag=i) for i in range(start, min(count, start + window))]
                    operations += [dist.P2POp(dist.isend, sends[i], peer, tag=i) for i in range(start, min(count, start + window))]
                    for work in dist.batch_isend_irecv(operations):
                        work.wait()
            return step

        variants = {"gloo batch_isend_irecv w1024": gloo_step(1024), "gloo batch_isend_irecv wall": gloo_step(len(sends))}
        for repeat in range(repeats):
            service.close()
            service = TorchDistributedCopyService(timeout=600)
            samples.setdefault("tensorxfer torch (first run)", []).append(timed_step(dist.barrier, slowest, copy_service_step))
            if repeat == 0:
                assert all(int(r[0]) == peer + 1 and int(r[-1]) == peer + 1 for r in recvs if r.numel()), "wrong bytes"
            for _ in range(2):
                samples.setdefault("tensorxfer torch (repeat)", []).append(timed_step(dist.barrier, slowest, copy_service_step))
            for name, step in variants.items():
                samples.setdefault(name, []).append(timed_step(dist.barrier, slowest, step))
        service.close()
        results[case] = samples
        sends.clear()  # the case's memory, before the next case allocates
        recvs.clear()
    if rank == 0:
        Path(out).write_text(json.dumps(results))
    dist.destroy_process_group()


# ---- the driver --------------------------------------------------------------------------


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
    return env


def run_mpi(cases: List[str], repeats: int, work: str, ranks: int, backends: List[str]) -> Dict:
    mpirun = Path(sys.executable).with_name("mpirun")
    out = os.path.join(work, "mpi.json")
    oversubscribe = ["--oversubscribe"] if ranks > (os.cpu_count() or 1) else []
    command = [str(mpirun) if mpirun.exists() else "mpirun", "-n", str(ranks), *oversubscribe, sys.executable,
               __file__, "--worker", "mpi", "--backends", ",".join(backends),
               "--cases", ",".join(cases), "--repeats", str(repeats), "--out", out]
    subprocess.run(command, env=_env(), check=True)
    return json.loads(Path(out).read_text())


def run_torch(cases: List[str], repeats: int, work: str, ranks: int) -> Dict:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = os.path.join(work, "torch.json")
    processes = [subprocess.Popen([sys.executable, __file__, "--worker", "torch", "--rank", str(rank),
                                   "--ranks", str(ranks), "--init", f"tcp://127.0.0.1:{port}", "--cases", ",".join(cases),
                                   "--repeats", str(repeats), "--out", out], env=_env()) for rank in range(ranks)]
    for process in processes:
        if process.wait() != 0:
            raise SystemExit(f"torch worker failed with exit code {process.returncode}")
    return json.loads(Path(out).read_text())


def _fastest(report, name: str, variants: List[str]) -> str:
    """The variant of ``variants`` with the lowest median time (case ``name``)."""
    return min(variants, key=lambda v: report.find(name, v, "time").value)


def build_report(cases: List[str], repeats: int, mpi: Dict, torch_results: Dict, ranks: int = 2):
    sys.path.insert(0, str(HERE))
    from _report import Report

    report = Report(f"copy services: {ranks} ranks in pairs, each way (ms per step, slowest rank)",
                    {"cases": {c: CASE_NAMES[c] for c in cases}, "repeats": repeats, "ranks": ranks,
                     "bytes_each_way": {c: sum(case_sizes(c)) for c in cases}})
    for results in (mpi, torch_results):
        for case in cases:
            for variant, samples in results.get(case, {}).items():
                report.add(CASE_NAMES[case], variant, "time", samples, "ms", lower_is_better=True)
    for case in cases:
        name = CASE_NAMES[case]
        variants = list(mpi.get(case, {})) + list(torch_results.get(case, {}))
        families = {prefix: [v for v in variants if v.startswith(prefix)] for prefix in ("mpi4py", "gloo")}
        for backend, prefix in (("mpi", "mpi4py"), ("torch", "gloo")):
            ours = f"tensorxfer {backend}"
            if f"{ours} (repeat)" not in variants or not families[prefix]:
                continue
            best = _fastest(report, name, families[prefix])
            report.compare(name, "time", f"{ours} (repeat)", best, TARGETS.get((case, backend)))
            report.compare(name, "time", f"{ours} (first run)", best)
        for (gloo_case, candidate), target in GLOO_TARGETS.items():
            if gloo_case == case and candidate in variants and families["gloo"]:
                report.compare(name, "time", candidate, _fastest(report, name, families["gloo"]), target)
        if "tensorxfer shm (repeat)" not in variants:
            continue
        families["ours"] = [f"tensorxfer {b} (repeat)" for b in ("mpi", "torch") if f"tensorxfer {b} (repeat)" in variants]
        for family in ("mpi4py", "gloo", "ours"):
            if not families[family]:
                continue
            best = _fastest(report, name, families[family])
            report.compare(name, "time", "tensorxfer shm (repeat)", best, SHM_TARGETS.get((case, family)))
            report.compare(name, "time", "tensorxfer shm (first run)", best)
            if BUFFERED in variants:
                report.compare(name, "time", BUFFERED, best)
    for (case, candidate, floor), target in FLOOR_TARGETS.items():
        variants = list(mpi.get(case, {}))
        if case in cases and candidate in variants and floor in variants:
            report.compare(CASE_NAMES[case], "time", candidate, floor, target)
    note_reachable(report, cases, mpi)
    return report


def note_reachable(report: Any, cases: List[str], mpi: Dict) -> None:
    """Case (a) with torch tensors: the parts of a step no backend avoids, each measured alone in
    this run -- the caller's loop of 20,000 calls (to a no-op C function), torch's reads of the
    tensors' fields (their loop's own time taken off: the calls already hold a loop), and moving
    bytes from one process's private memory to another's (two copies through shared memory, or
    one cross-memory read per tensor, whichever is faster) -- and the best ratio to the floor
    they leave."""
    variants = mpi.get("a", {})
    needed = (PART_NO_OP, PART_TORCH_READS, PART_BARE_LOOP, FLOOR_MEMCPY)
    if "a" not in cases or not all(v in variants for v in needed):
        return
    name = CASE_NAMES["a"]
    calls, reads_loop, loop, floor = (report.find(name, v, "time").value for v in needed)
    reads = max(reads_loop - loop, 0.0)
    moves = {"two copies": 2 * floor}
    if FLOOR_CMA_PIECES in variants:
        moves["a cross-memory read per tensor"] = report.find(name, FLOOR_CMA_PIECES, "time").value
    how, move = min(moves.items(), key=lambda item: item[1])
    total = calls + reads + move
    target = FLOOR_TARGETS[("a", "tensorxfer shm (repeat)", FLOOR_MEMCPY)]
    report.note(f"{name}: unavoidable parts, each alone: {calls:.1f} ms of calls + {reads:.1f} ms of torch reads "
                f"+ {move:.1f} ms moving private bytes ({how}) = {total:.1f} ms: the best reachable ratio to the "
                f"memcpy floor ({floor:.1f} ms) is {floor / total:.2f}x (target {target}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cases", default="a,b,c")
    parser.add_argument("--backends", default="mpi,shm,torch",
                        help="comma-separated: mpi and shm run in one mpirun job, torch in spawned gloo ranks")
    parser.add_argument("--ranks", type=int, default=2, help="ranks per job, an even number (partners are rank ^ 1)")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    parser.add_argument("--worker", choices=["mpi", "torch"], help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--init", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    cases = [c for c in args.cases.split(",") if c]
    for case in cases:
        if case not in CASE_NAMES:
            parser.error(f"--cases: expected letters from {sorted(CASE_NAMES)}, got {case!r}")
    if args.ranks < 2 or args.ranks % 2:
        parser.error(f"--ranks: expected an even number >= 2, got {args.ranks}")
    backends = [b for b in args.backends.split(",") if b]
    for backend in backends:
        if backend not in ("mpi", "shm", "torch"):
            parser.error(f"--backends: expected names from ['mpi', 'shm', 'torch'], got {backend!r}")
    if args.worker == "mpi":
        return mpi_worker(cases, args.repeats, args.out, "mpi" in backends, "shm" in backends)
    if args.worker == "torch":
        return torch_worker(args.rank, args.ranks, args.init, cases, args.repeats, args.out)
    in_mpi_job = [b for b in backends if b in ("mpi", "shm")]
    with tempfile.TemporaryDirectory(prefix="bench-copy-services-") as work:
        mpi = run_mpi(cases, args.repeats, work, args.ranks, in_mpi_job) if in_mpi_job else {}
        torch_results = run_torch(cases, args.repeats, work, args.ranks) if "torch" in backends else {}
    report = build_report(cases, args.repeats, mpi, torch_results, args.ranks)
    print(report.table())
    json_path, png_path = report.write(args.json.parent, args.json.stem)
    print(f"wrote {json_path}" + (f" and {png_path}" if png_path else ""))


if __name__ == "__main__":
    main()
