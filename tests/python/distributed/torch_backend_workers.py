"""Rank programs for the torch.distributed backend tests, run as real processes.

``python torch_backend_workers.py SCENARIO RANK WORLD BACKEND INIT_METHOD OUT_DIR TIMEOUT_S``
initializes torch.distributed with BACKEND, runs SCENARIO and saves what it
returns to OUT_DIR/RANK.pt (torch.save). torch_backend_launch starts them (:func:`launch`;
:func:`mpirun_command` under ``mpirun``, RANK ``mpi``: the MPI rank).
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from datetime import timedelta
from typing import Any, Callable, Dict, List

# The tests reach the launcher through this module (``workers.launch`` etc.).
from torch_backend_launch import (MPIRUN, finish, free_port, kill_and_finish, launch,  # noqa: F401
                                  mpirun_command, start, worker_env)


# ---- scenarios -------------------------------------------------------------------------


def _ints(shape: Any, rank: int, dtype: Any, salt: int = 0) -> Any:
    import torch

    numel = int(torch.Size(shape).numel()) if isinstance(shape, tuple) else int(shape)
    values = (torch.arange(numel, dtype=torch.int64) * 7 + rank * 13 + salt) % 11 - 5
    return values.to(dtype).reshape(shape)


def _copies(rank: int, world: int, numel: int, out: Dict[str, Any]) -> None:
    """all_gather, all_gather_into_tensor and broadcast from every root, of ``numel`` elements, 3 dtypes."""
    import torch
    import torch.distributed as dist

    for dtype in (torch.float32, torch.bfloat16, torch.uint8):
        mine = _ints(numel, rank, dtype).abs()
        parts = [torch.empty(numel, dtype=dtype) for _ in range(world)]
        dist.all_gather(parts, mine)
        out[f"all_gather/{dtype}/{numel}"] = torch.stack(parts)
        whole = torch.empty(world * numel, dtype=dtype)
        dist.all_gather_into_tensor(whole, mine)
        out[f"all_gather_into_tensor/{dtype}/{numel}"] = whole
        for root in range(world):
            t = _ints(numel, rank, dtype).abs()
            dist.broadcast(t, root)
            out[f"broadcast/{root}/{dtype}/{numel}"] = t


def scenario_ops(rank: int, world: int, extra: str) -> Dict[str, Any]:
    """Every op, on integer-valued inputs (exact in every summation order) so gloo's results are the reference."""
    import torch
    import torch.distributed as dist

    R = dist.ReduceOp
    out: Dict[str, Any] = {}
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.float64, torch.int32, torch.uint8):
        for numel in (1, 1000, 100_003):
            for name, op in (("sum", R.SUM), ("min", R.MIN), ("max", R.MAX), ("product", R.PRODUCT)):
                if dtype == torch.uint8 and name in ("sum", "product"):
                    continue
                t = _ints(numel, rank, dtype) if name != "product" else (_ints(numel, rank, torch.int64) % 2 + 1).to(dtype)
                dist.all_reduce(t, op=op)
                out[f"all_reduce/{name}/{dtype}/{numel}"] = t
    strided = _ints((64, 8), rank, torch.float32)[:, ::2]
    dist.all_reduce(strided)
    out["all_reduce/non_contiguous"] = strided.clone()
    work = dist.all_reduce(_ints(4096, rank, torch.float32), async_op=True)
    out["all_reduce/async_future"] = work.get_future().wait()[0]
    work.wait()
    out["all_reduce/async_completed"] = torch.tensor(work.is_completed())
    coalesced = [_ints(n, rank, torch.float32, salt=n) for n in (3, 1000, 17)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dist.all_reduce_coalesced(coalesced)
    for i, t in enumerate(coalesced):
        out[f"all_reduce_coalesced/{i}"] = t
    for numel in (5, 70_000):
        _copies(rank, world, numel, out)
        for name, op in (("sum", R.SUM), ("max", R.MAX)):
            chunk = torch.empty(numel, dtype=torch.float32)
            dist.reduce_scatter(chunk, [_ints(numel, rank, torch.float32, salt=i) for i in range(world)], op=op)
            out[f"reduce_scatter/{name}/{numel}"] = chunk
            chunk = torch.empty(numel, dtype=torch.float32)
            dist.reduce_scatter_tensor(chunk, _ints(world * numel, rank, torch.float32), op=op)
            out[f"reduce_scatter_tensor/{name}/{numel}"] = chunk
            for root in range(world):
                t = _ints(numel, rank, torch.float32)
                dist.reduce(t, root, op=op)
                if rank == root:
                    out[f"reduce/{name}/{root}/{numel}"] = t
    for root in range(world):
        mine = _ints(10, rank, torch.float32)
        gathered = [torch.empty(10) for _ in range(world)] if rank == root else None
        dist.gather(mine, gathered, dst=root)
        if rank == root:
            out[f"gather/{root}"] = torch.stack(gathered)
        received = torch.empty(10)
        dist.scatter(received, [_ints(10, r, torch.float32, salt=root) for r in range(world)] if rank == root else None,
                     src=root)
        out[f"scatter/{root}"] = received
    outputs = [torch.empty(3) for _ in range(world)]
    dist.all_to_all(outputs, [_ints(3, rank, torch.float32, salt=r) for r in range(world)])
    out["all_to_all"] = torch.stack(outputs)
    single = torch.empty(2 * world)
    dist.all_to_all_single(single, _ints(2 * world, rank, torch.float32))
    out["all_to_all_single/equal"] = single
    in_splits = [r + 1 for r in range(world)]            # rank sends r+1 elements to rank r
    out_splits = [rank + 1] * world                      # and receives rank+1 from everyone
    single = torch.empty(sum(out_splits))
    dist.all_to_all_single(single, _ints(sum(in_splits), rank, torch.float32), out_splits, in_splits)
    out["all_to_all_single/unequal"] = single
    dist.barrier()
    # async ops in flight together, waited for in reverse: they still run in submission order
    a, b = _ints(5000, rank, torch.float32), _ints(300, rank, torch.float32)
    parts = [torch.empty(300) for _ in range(world)]
    works = [dist.all_reduce(a, async_op=True), dist.broadcast(b, world - 1, async_op=True),
             dist.all_gather(parts, b, async_op=True), dist.all_reduce(b, async_op=True)]
    for work in reversed(works):
        work.wait()
    out["async_in_order/a"], out["async_in_order/b"], out["async_in_order/parts"] = a, b, torch.stack(parts)
    if world > 1:
        right, left = (rank + 1) % world, (rank - 1) % world
        received = torch.empty(7)
        if rank % 2 == 0:
            dist.send(_ints(7, rank, torch.float32), right)
            dist.recv(received, left)
        else:
            dist.recv(received, left)
            dist.send(_ints(7, rank, torch.float32), right)
        out["send_recv"] = received
        received = torch.empty(7)
        requests = [dist.isend(_ints(7, rank, torch.float32, salt=1), right), dist.irecv(received, left)]
        for request in requests:
            request.wait()
        out["isend_irecv"] = received
        received = torch.empty(7)
        ops = [dist.P2POp(dist.isend, _ints(7, rank, torch.float32, salt=2), right),
               dist.P2POp(dist.irecv, received, left)]
        for request in dist.batch_isend_irecv(ops):
            request.wait()
        out["batch_isend_irecv"] = received
    return out


def scenario_avg(rank: int, world: int, extra: str) -> Dict[str, Any]:
    """all_reduce with AVG (gloo has none: compared with the sum / world_size)."""
    import torch
    import torch.distributed as dist

    out: Dict[str, Any] = {}
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        t = _ints(1000, rank, dtype)
        op = dist.ReduceOp.AVG if extra == "avg" else dist.ReduceOp.SUM
        dist.all_reduce(t, op=op)
        out[str(dtype)] = t
    return out


def scenario_random_sum(rank: int, world: int, extra: str) -> Dict[str, Any]:
    """Random float inputs: every rank must get bitwise the same sum."""
    import torch
    import torch.distributed as dist

    out: Dict[str, Any] = {}
    generator = torch.Generator().manual_seed(rank)
    for numel in (1000, 300_000):
        for dtype in (torch.float32, torch.bfloat16):
            t = torch.randn(numel, generator=generator).to(dtype)
            dist.all_reduce(t)
            out[f"{dtype}/{numel}"] = t
    return out


def _train(model: Any, rank: int, steps: int, batch: tuple, momentum: float = 0.0) -> None:
    """``steps`` of SGD on the mean square of ``model``'s output, on random batches of shape ``batch`` seeded by rank."""
    import torch

    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=momentum)
    data = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        loss = model(torch.randn(*batch, generator=data)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def scenario_ddp(rank: int, world: int, extra: str) -> Dict[str, Any]:
    """20 DDP steps on a small MLP; returns the final parameters."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                torch.nn.ReLU(), torch.nn.Linear(64, 4))
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.01)   # several buckets: overlap with backward
    _train(ddp, rank, steps=20, batch=(16, 32), momentum=0.9)
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def scenario_fsdp(rank: int, world: int, extra: str) -> Dict[str, Any]:
    """fully_shard (FSDP2) on the CPU for 5 steps; returns the full parameters."""
    import torch
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    _train(model, rank, steps=5, batch=(8, 16))
    return {name: p.full_tensor().detach().clone() for name, p in model.named_parameters()}


def scenario_victim(rank: int, world: int, extra: str) -> Dict[str, Any]:
    """``extra`` "VICTIM,OP": rank VICTIM blocks forever after a first all_reduce (the test kills it); the
    others run OP (all_reduce, all_gather, reduce_scatter, broadcast from the last rank, barrier, delegated),
    then an all_reduce if OP completed."""
    import torch
    import torch.distributed as dist

    victim, op = int(extra.split(",")[0]), extra.split(",")[1]
    run = {"all_reduce": lambda: dist.all_reduce(torch.ones(1 << 16)),
           "all_gather": lambda: dist.all_gather_into_tensor(torch.empty(world << 14), torch.ones(1 << 14)),
           "reduce_scatter": lambda: dist.reduce_scatter_tensor(torch.empty(1 << 14), torch.ones(world << 14)),
           "broadcast": lambda: dist.broadcast(torch.ones(1 << 16), world - 1),
           "barrier": dist.barrier,
           "delegated": lambda: dist.all_to_all_single(torch.empty(world), torch.ones(world))}[op]
    dist.all_reduce(torch.ones(8))
    if rank == victim:
        print("READY", flush=True)
        time.sleep(3600)
    started = time.monotonic()
    completed = False  # OP did not need the victim on this rank (a broadcast's path may not pass it)
    try:
        run()
        completed = True
        dist.all_reduce(torch.ones(8))
    except Exception as error:  # noqa: BLE001 - what the test checks
        return {"error": f"{type(error).__name__}: {error}", "seconds": time.monotonic() - started,
                "op_completed": completed}
    return {"error": None, "seconds": time.monotonic() - started, "op_completed": completed}


def scenario_mismatch(rank: int, world: int, extra: str) -> Dict[str, Any]:
    """Rank 0 reduces 1000 elements, the others 2000."""
    import torch
    import torch.distributed as dist

    try:
        dist.all_reduce(torch.ones(1000 if rank == 0 else 2000))
    except Exception as error:  # noqa: BLE001
        return {"error": f"{type(error).__name__}: {error}"}
    return {"error": None}


def scenario_interrupt(rank: int, world: int, extra: str) -> Dict[str, Any]:
    """Rank 0 blocks in all_reduce that rank 1 never joins; the test sends rank 0 SIGINT.
    Rank 1 stays away until rank 0 has saved its result in ``extra`` (the output folder), 30 s at most."""
    import torch
    import torch.distributed as dist

    dist.barrier()
    if rank == 1:
        deadline = time.monotonic() + 30
        while not os.path.exists(os.path.join(extra, "0.pt")) and time.monotonic() < deadline:
            time.sleep(0.05)
        return {}
    print("BLOCKING", flush=True)
    started = time.monotonic()
    try:
        dist.all_reduce(torch.ones(16))
    except KeyboardInterrupt:
        return {"interrupted_after": time.monotonic() - started}
    return {"interrupted_after": None}


def scenario_hosts(rank: int, world: int, extra: str) -> Dict[str, Any]:
    """Every accelerated op (hierarchical across simulated hosts) on exact inputs, plus random sums."""
    import torch
    import torch.distributed as dist

    R = dist.ReduceOp
    out: Dict[str, Any] = {}
    group = dist.group.WORLD
    if hasattr(group, "topology"):
        out["hosts"] = group.topology.hosts
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        for numel in (1, 7, 1000, 300_001):
            for name, op in (("sum", R.SUM), ("min", R.MIN), ("max", R.MAX)):
                t = _ints(numel, rank, dtype)
                dist.all_reduce(t, op=op)
                out[f"all_reduce/{name}/{dtype}/{numel}"] = t
    for root in range(world):
        for name, op in (("sum", R.SUM), ("max", R.MAX)):
            t = _ints(999, rank, torch.float32)
            dist.reduce(t, root, op=op)
            if rank == root:
                out[f"reduce/{name}/{root}"] = t
    coalesced = [_ints(n, rank, torch.float32, salt=n) for n in (3, 1000, 17)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dist.all_reduce_coalesced(coalesced)
    out["all_reduce_coalesced"] = torch.cat(coalesced)
    for numel in (1, 5, 70_001):
        _copies(rank, world, numel, out)
        for dtype in (torch.float32, torch.bfloat16, torch.int64):
            for name, op in (("sum", R.SUM), ("min", R.MIN), ("max", R.MAX)):
                chunk = torch.empty(numel, dtype=dtype)
                dist.reduce_scatter(chunk, [_ints(numel, rank, dtype, salt=i) for i in range(world)], op=op)
                out[f"reduce_scatter/{name}/{dtype}/{numel}"] = chunk
                chunk = torch.empty(numel, dtype=dtype)
                dist.reduce_scatter_tensor(chunk, _ints(world * numel, rank, dtype), op=op)
                out[f"reduce_scatter_tensor/{name}/{dtype}/{numel}"] = chunk
    grid = _ints((4, 6), rank, torch.float32)
    dist.broadcast(grid, 0)
    out["broadcast/2d"] = grid
    for _ in range(3):
        dist.barrier()
    generator = torch.Generator().manual_seed(rank)
    for numel in (1001, 300_000):
        t = torch.randn(numel, generator=generator)
        dist.all_reduce(t)
        out[f"random/{numel}"] = t
    cross = getattr(group, "cross_host", None)
    if cross is not None:
        out["cross_host"] = (cross.transport, cross.calls)
    if hasattr(group, "delegated_ops"):
        out["delegated_ops"] = group.delegated_ops
    return out


def scenario_host_steps(rank: int, world: int, extra: str) -> Dict[str, Any]:
    """Each accelerated op once (broadcast from the last rank): the cross-host calls it made on this rank;
    then a barrier that the last rank enters ``extra`` seconds late, and how long this rank waited in it."""
    import torch
    import torch.distributed as dist

    group = dist.group.WORLD
    cross = group.cross_host
    big, small = 1 << 18, 10  # all_reduce: the sharded and the replicated path
    ops = {
        "all_reduce": lambda: dist.all_reduce(torch.ones(big)),
        "all_reduce/small": lambda: dist.all_reduce(torch.ones(small)),
        "reduce": lambda: dist.reduce(torch.ones(big), world - 1),
        "all_gather": lambda: dist.all_gather([torch.empty(small) for _ in range(world)], torch.ones(small)),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(torch.empty(world * big), torch.ones(big)),
        "reduce_scatter": lambda: dist.reduce_scatter(torch.empty(small), [torch.ones(small)] * world),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(torch.empty(big), torch.ones(world * big)),
        "broadcast": lambda: dist.broadcast(torch.ones(big), world - 1),
        "barrier": dist.barrier,
    }
    out: Dict[str, Any] = {"delegated_ops": group.delegated_ops}
    for name, op in ops.items():
        before = cross.calls if cross is not None else 0
        op()
        out[f"cross_calls/{name}"] = (cross.calls if cross is not None else 0) - before
    out["delegated_ops"] = group.delegated_ops - out["delegated_ops"]
    dist.all_reduce(torch.ones(1))  # everyone here before the late barrier
    if rank == world - 1:
        time.sleep(float(extra))
    started = time.monotonic()
    dist.barrier()
    out["barrier_wait"] = time.monotonic() - started
    return out


def scenario_no_destroy(rank: int, world: int, extra: str) -> Dict[str, Any]:
    """One all_reduce; then the program ends without destroy_process_group()."""
    import torch
    import torch.distributed as dist

    t = torch.ones(4)
    dist.all_reduce(t)
    return {"sum": t}


def scenario_mixed_async(rank: int, world: int, extra: str) -> Dict[str, Any]:
    """The same collectives with async_op=True on even ranks and False on odd ones (torch allows it)."""
    import torch
    import torch.distributed as dist

    out: Dict[str, Any] = {}
    asynchronous = rank % 2 == 0
    for step, numel in enumerate((1000, 300_000, 1000)):
        t = _ints(numel, rank, torch.float32, salt=step)
        work = dist.all_reduce(t, async_op=asynchronous)
        if work is not None:
            work.wait()
        out[f"all_reduce/{step}"] = t
    gathered = torch.empty(world * 10)
    work = dist.all_gather_into_tensor(gathered, _ints(10, rank, torch.float32), async_op=asynchronous)
    if work is not None:
        work.wait()
    out["all_gather_into_tensor"] = gathered
    return out


def scenario_barrier_and_objects(rank: int, world: int, extra: str) -> Dict[str, Any]:
    """barrier() and the object collectives: the device torch picks, and which of the group's ops ran them.

    Every op the group is handed is logged with its options' device; the shared-memory collectives
    (``_host``) log what they ran, so a fallback to the group's gloo shows as a delegated op."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    group = dist.group.WORLD
    out: Dict[str, Any] = {"device_capability": c10d._device_capability(group),
                           "object_device": c10d._get_object_coll_device(group)}
    try:
        out["default_device"] = str(c10d._get_pg_default_device(group))
    except RuntimeError as error:
        out["default_device"] = f"RuntimeError: {error}"
    calls: List[str] = []

    def logged(target: Any, name: str, device_of: Callable[[Any, Any], str]) -> None:
        real = getattr(target, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            calls.append(f"{name}:{device_of(args, kwargs)}")
            return real(*args, **kwargs)

        setattr(target, name, call)

    def opts_device(args: Any, kwargs: Any) -> str:
        opts = kwargs.get("opts", args[-1] if args else None)
        return str(getattr(opts, "device", "-"))

    def tensor_device(args: Any, kwargs: Any) -> str:
        tensors = args[0] if isinstance(args[0], list) else [args[0]]
        flat = [t for item in tensors for t in (item if isinstance(item, list) else [item])]
        return ",".join(sorted({str(t.device) for t in flat}))

    logged(group, "barrier", opts_device)
    for name in ("allgather", "_allgather_base", "broadcast"):
        logged(group, name, tensor_device)
    for name in ("barrier", "all_gather", "broadcast"):
        logged(group._host, name, lambda args, kwargs: "host")
    delegated_before = group.delegated_ops
    dist.barrier()
    gathered: List[Any] = [None] * world
    dist.all_gather_object(gathered, {"rank": rank, "payload": list(range(rank + 3))})
    objects = [{"from": "root", "size": 7}, "text"] if rank == 0 else [None, None]
    dist.broadcast_object_list(objects, src=0)
    out.update(calls=calls, gathered=gathered, objects=objects, delegated=group.delegated_ops - delegated_before)
    return out


def scenario_future_hooks(rank: int, world: int, extra: str) -> Dict[str, Any]:
    """Futures of async ops: what a ``then`` callback sees, and DDP comm hooks whose callbacks run a
    second collective and wait for it (PowerSGD's pattern, and PowerSGD itself); returns the results."""
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
    from torch.nn.parallel import DistributedDataParallel

    out: Dict[str, Any] = {}
    t = _ints(300_000, rank, torch.float32)
    seen: List[Any] = []
    chained = dist.all_reduce(t, async_op=True).get_future().then(lambda f: seen.append(f.value()[0].clone()))
    chained.wait()
    out["seen_in_then"] = seen[0]

    def mean_then_sum(state, bucket):  # no annotations: DDP refuses any but its own
        def second(fut: Any) -> Any:
            mean = fut.value()[0].div_(world)
            return dist.all_reduce(mean, async_op=True).get_future().wait()[0].div_(world)

        return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(second)

    for name, hook, make_state in (("mean_then_sum", mean_then_sum, lambda: None),
                                   ("powersgd", powersgd.powerSGD_hook,
                                    lambda: powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                                                   start_powerSGD_iter=2, random_seed=0))):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
        ddp = DistributedDataParallel(model, bucket_cap_mb=0.01)
        ddp.register_comm_hook(make_state(), hook)
        _train(ddp, rank, steps=5, batch=(16, 32))
        for key, p in model.named_parameters():
            out[f"{name}/{key}"] = p.detach().clone()
    return out


def scenario_dropped_works(rank: int, world: int, extra: str) -> Dict[str, Any]:
    """Async ops whose works the caller drops at once (or keeps only the future of): they still run, in order."""
    import gc

    import torch
    import torch.distributed as dist

    out: Dict[str, Any] = {}
    tensors = [_ints(50_000, rank, torch.float32, salt=i) for i in range(4)]
    futures = []
    for i, t in enumerate(tensors):
        work = dist.all_reduce(t, async_op=True)
        if i % 2:
            futures.append(work.get_future())
        del work
    gc.collect()
    received = torch.empty(10)
    if world > 1:  # a receive whose work is dropped (its future kept), completed by the send that follows
        futures.append(dist.irecv(received, (rank - 1) % world).get_future())
        gc.collect()
        dist.send(_ints(10, rank, torch.float32), (rank + 1) % world)
    for future in futures:
        future.wait()
    dist.barrier()  # in order: every dropped op finished before it
    out.update({f"all_reduce/{i}": t for i, t in enumerate(tensors)})
    out["irecv"] = received
    return out


SCENARIOS: Dict[str, Callable[[int, int, str], Dict[str, Any]]] = {
    "barrier_and_objects": scenario_barrier_and_objects, "future_hooks": scenario_future_hooks,
    "dropped_works": scenario_dropped_works,
    "mixed_async": scenario_mixed_async,
    "ops": scenario_ops, "avg": scenario_avg, "random_sum": scenario_random_sum, "ddp": scenario_ddp,
    "fsdp": scenario_fsdp, "victim": scenario_victim, "mismatch": scenario_mismatch,
    "interrupt": scenario_interrupt, "hosts": scenario_hosts, "no_destroy": scenario_no_destroy,
    "host_steps": scenario_host_steps,
}


def main(argv: List[str]) -> int:
    scenario, rank, world, backend, init, out_dir, pg_timeout = argv[:7]
    extra = argv[7] if len(argv) > 7 else ""
    warnings.simplefilter("ignore", FutureWarning)
    import torch
    import torch.distributed as dist

    import tensorxfer  # noqa: F401 - registers the backend

    rank_i = int(os.environ["OMPI_COMM_WORLD_RANK"]) if rank == "mpi" else int(rank)
    world_i = int(world)
    dist.init_process_group(backend, init_method=init, rank=rank_i, world_size=world_i,
                            timeout=timedelta(seconds=float(pg_timeout)))
    result = SCENARIOS[scenario](rank_i, world_i, extra)
    torch.save(result, os.path.join(out_dir, f"{rank_i}.pt"))
    if scenario == "no_destroy":
        return 0  # an ordinary interpreter exit, process group still registered
    dist.destroy_process_group()
    # Leave without interpreter teardown: gloo's threads sometimes abort it
    # ("terminate called without an active exception"), with gloo as with us.
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()  # mpirun fails a job whose ranks exit without it
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
