"""Refit across hosts: persistent plans on a simulated cluster with real link limits (issue 37).

Hosts are Linux namespaces joined by veth NICs that ``tc tbf`` limits both ways
(tests/python/simulated_cluster.py), so bytes between hosts are bound by the link, not by
the two cores. Every case runs its variants interleaved, block by block, calls back to back
inside a block (no barrier before each call); a block's time is the slowest rank's. Each
case is set beside its floors, measured in the same run:

* ``NIC floor``: the bytes that cross the busiest NIC divided by the rate of one raw TCP
  stream between two of the cluster's hosts (measured at the start of the case);
* ``engine floor``: one gloo message of the same bytes per pair, every pair at once;
* ``per-op loop``: what a user writes: ``batch_isend_irecv`` of every tensor
  (``.contiguous()`` staging), then the copies into strided destinations;
* ``megatron + gloo``: Megatron's ``execute_reshard_plan`` over its own GlooCopyService
  (built without its ``torch.cuda.Stream()``, which a CPU-only machine cannot make);
* ``floor: engine + the plan's copies``: the engine floor with, while its messages are on
  the wire, every copy the plan makes (gloo sends contiguous buffers only, so a plan packs
  strided or scattered sources and unpacks into such destinations): where the two cores,
  not the link, bind (no rate limit), the least a plan over gloo can take.

Cases (``--cases``, default all):

* ``small``: 10,000 x 4 KiB (bfloat16) each way, 2 hosts x 1 rank, rate-limited and not;
* ``weights``: 32 bfloat16 weights of 2048 x 4096, TP2 row shards -> TP2 column shards,
  2 hosts x 1 rank (half of each rank's bytes cross, strided on the sending side);
* ``mixed``: 2 hosts x 2 ranks, 10,000 x 4 KiB each way per pair: the whole plan, its
  same-host part alone (the shm plan), its cross-host part alone;
* ``megatron``: Megatron's planner on a 302M-parameter bfloat16 stack, TP2 on host A ->
  TP1 on host B, rate-limited, and without a limit against Megatron's executor over gloo;
* ``replicas``: one trainer host -> 1, 2 and 4 replica hosts (the same 128 MiB each),
  the plan (a chain) beside a star of isends;
* ``busy``: TP2 over hosts A and B -> TP1 on host C (C's NIC is the floor);
* ``onehost``: the torch service's plan on one host (no network) beside the shm plan.

Needs root (the cluster), torch, and megatron-core for ``megatron``. Prints the CPU
model, its SIMD flags and the NIC rate in the header.

    python bench/python/bench_refit_hosts.py [--cases small,weights,...] [--runs 3] [--rate 2gbit] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
TESTS = HERE.parents[1] / "tests" / "python"
sys.path.insert(0, str(TESTS))
sys.path.insert(0, str(TESTS / "resharding"))

CASES = ["small", "weights", "mixed", "megatron", "replicas", "busy", "onehost"]


# ---- inside a rank ---------------------------------------------------------------------------

def timed_blocks(variants: Dict[str, Callable[[], None]], blocks: int, calls: int, dist: Any) -> Dict[str, List[float]]:
    """Interleaved: for each block, each variant ``calls`` times back to back; returns the
    slowest rank's seconds per call of every block. One untimed call of each first."""
    import torch

    for step in variants.values():
        step()
    samples: Dict[str, List[float]] = {name: [] for name in variants}
    for _ in range(blocks):
        for name, step in variants.items():
            dist.barrier()
            start = time.perf_counter()
            for _ in range(calls):
                step()
            elapsed = torch.tensor([(time.perf_counter() - start) / calls], dtype=torch.float64)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            samples[name].append(float(elapsed.item()))
    return samples


def engine_floor(dist: Any, pairs: Sequence[Tuple[int, int, int]],
                 meanwhile: Optional[Callable[[], None]] = None) -> Callable[[], None]:
    """One gloo message per (src, dst, nbytes), every pair at once; ``meanwhile`` runs while
    the messages are on the wire."""
    import torch

    rank = dist.get_rank()
    sends = [(torch.ones(n, dtype=torch.uint8), dst) for src, dst, n in pairs if src == rank]
    recvs = [(torch.empty(n, dtype=torch.uint8), src) for src, dst, n in pairs if dst == rank]

    def step() -> None:
        ops = [dist.P2POp(dist.irecv, tensor, src) for tensor, src in recvs]
        ops += [dist.P2POp(dist.isend, tensor, dst) for tensor, dst in sends]
        works = dist.batch_isend_irecv(ops) if ops else []
        if meanwhile is not None:
            meanwhile()
        for work in works:
            work.wait()
    return step


def plan_copies(plan: Any) -> Callable[[], None]:
    """Every copy this rank's part of ``plan`` makes in a run (packs, unpacks, and the
    same-rank pairs of a host of one rank), with no transfer: what the plan adds to the
    engine's work, because gloo sends and receives contiguous buffers only."""
    runner = plan._runner
    network = runner._network
    local = runner._local if runner.layout.shm is None else None

    def step() -> None:
        if network is not None:
            for part in network.parts:
                for k in range(len(part.buffers)):
                    part.messages.copy(k, network.copy_engine)
        if local is not None:
            local(0, 0, None)
    return step


ENGINE_WITH_COPIES = "floor: engine + the plan's copies"


def per_op_loop(dist: Any, sends: List[Tuple[Any, int]], recvs: List[Tuple[Any, int]]) -> Callable[[], None]:
    """What a user writes: every tensor its own isend / irecv (.contiguous() staging), then the copies."""
    import torch

    def step() -> None:
        staged = [torch.empty_like(target, memory_format=torch.contiguous_format) for target, _ in recvs]
        ops = [dist.P2POp(dist.irecv, buffer, src) for buffer, (_, src) in zip(staged, recvs)]
        ops += [dist.P2POp(dist.isend, source.contiguous(), dst) for source, dst in sends]
        for work in dist.batch_isend_irecv(ops) if ops else []:
            work.wait()
        for buffer, (target, _) in zip(staged, recvs):
            target.copy_(buffer)
    return step


def init_rank() -> Tuple[int, int, Any]:
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
                            rank=rank, world_size=world)
    return rank, world, dist


def service(**options: Any) -> Any:
    from tensorxfer.resharding.copy_services import build_copy_service

    return build_copy_service("torch", timeout=600, **options)


def small_case(args: argparse.Namespace, dist: Any, rank: int, world: int) -> Dict[str, Any]:
    """10,000 x 4 KiB each way between the two ranks (bfloat16)."""
    import torch

    from tensorxfer.resharding.persistent_plan import build_persistent_plan

    count, elements = args.small_count, 2048
    peer = 1 - rank
    sources = [torch.full((elements,), float(rank + 1), dtype=torch.bfloat16) for _ in range(count)]
    targets = [torch.zeros(elements, dtype=torch.bfloat16) for _ in range(count)]
    with service(bucket_nbytes=args.bucket) as copies:
        plan = build_persistent_plan(copies, [(rank * count + i, s, peer) for i, s in enumerate(sources)],
                                     [(peer * count + i, t, peer) for i, t in enumerate(targets)])
        nbytes = count * elements * 2
        pairs = [(0, 1, nbytes), (1, 0, nbytes)]
        variants = {"plan": plan.run, "engine floor": engine_floor(dist, pairs),
                    ENGINE_WITH_COPIES: engine_floor(dist, pairs, plan_copies(plan))}
        if args.loops:
            variants["per-op loop"] = per_op_loop(dist, [(s, peer) for s in sources], [(t, peer) for t in targets])
        samples = timed_blocks(variants, args.blocks, args.calls, dist)
        correct = all(bool((t == float(peer + 1)).all()) for t in targets)
        plan.close()
    return {"samples": samples, "nic_bytes": nbytes, "correct": correct}


def weights_case(args: argparse.Namespace, dist: Any, rank: int, world: int) -> Dict[str, Any]:
    """32 bf16 weights 2048 x 4096: rank r holds rows r of TP2 and receives columns r of TP2."""
    import torch

    from tensorxfer.resharding.persistent_plan import build_persistent_plan

    count, rows, cols = args.weights, 2048, 4096
    half_r, half_c = rows // 2, cols // 2
    sources = [torch.full((half_r, cols), float(rank + 1), dtype=torch.bfloat16) for _ in range(count)]
    targets = [torch.zeros((rows, half_c), dtype=torch.bfloat16) for _ in range(count)]
    sends, recvs, loop_sends, loop_recvs = [], [], [], []
    for w in range(count):
        for other in range(2):
            # rank -> other: my row block, other's column half (strided: half of every row)
            sends.append(((w * 2 + rank) * 2 + other, sources[w][:, other * half_c:(other + 1) * half_c], other))
            recvs.append(((w * 2 + other) * 2 + rank, targets[w][other * half_r:(other + 1) * half_r], other))
            if other != rank:
                loop_sends.append((sends[-1][1], other))
                loop_recvs.append((recvs[-1][1], other))
    with service(bucket_nbytes=args.bucket) as copies:
        plan = build_persistent_plan(copies, sends, recvs)
        nbytes = count * half_r * half_c * 2
        pairs = [(0, 1, nbytes), (1, 0, nbytes)]
        variants = {"plan": plan.run, "engine floor": engine_floor(dist, pairs),
                    ENGINE_WITH_COPIES: engine_floor(dist, pairs, plan_copies(plan))}
        if args.loops:
            local = [(sources[w][:, rank * half_c:(rank + 1) * half_c], targets[w][rank * half_r:(rank + 1) * half_r])
                     for w in range(count)]
            remote = per_op_loop(dist, loop_sends, loop_recvs)

            def loop() -> None:
                remote()
                for source, target in local:
                    target.copy_(source)
            variants["per-op loop"] = loop
        samples = timed_blocks(variants, args.blocks, args.calls, dist)
        correct = all(bool((t[o * half_r:(o + 1) * half_r] == float(o + 1)).all()) for t in targets for o in range(2))
        plan.close()
    return {"samples": samples, "nic_bytes": nbytes, "correct": correct}


def mixed_case(args: argparse.Namespace, dist: Any, rank: int, world: int) -> Dict[str, Any]:
    """2 hosts x 2 ranks, 10,000 x 4 KiB each way per pair of ranks."""
    import torch

    from tensorxfer.resharding.copy_services import build_copy_service
    from tensorxfer.resharding.persistent_plan import build_persistent_plan

    count, elements = args.small_count, 2048
    host = rank // 2
    peers = [peer for peer in range(world) if peer != rank]

    def ops(wanted: Callable[[int], bool]) -> Tuple[List[Any], List[Any]]:
        sends, recvs = [], []
        for peer in peers:
            if not wanted(peer):
                continue
            for i in range(count):
                sends.append(((rank * world + peer) * count + i, sources[peer][i], peer))
                recvs.append(((peer * world + rank) * count + i, targets[peer][i], peer))
        return sends, recvs

    sources = {peer: [torch.full((elements,), float(rank + 1), dtype=torch.bfloat16) for _ in range(count)]
               for peer in peers}
    targets = {peer: [torch.zeros(elements, dtype=torch.bfloat16) for _ in range(count)] for peer in peers}
    host_groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    same = lambda peer: peer // 2 == host  # noqa: E731
    with service(bucket_nbytes=args.bucket) as copies, build_copy_service("shm", host_groups[host],
                                                                           timeout=600) as shm:
        whole = build_persistent_plan(copies, *ops(lambda peer: True))
        cross = build_persistent_plan(copies, *ops(lambda peer: not same(peer)))
        local_sends, local_recvs = ops(same)
        local_rank = {0: 0, 1: 1, 2: 0, 3: 1}
        shm_plan = build_persistent_plan(shm, [(t, s, local_rank[p]) for t, s, p in local_sends],
                                         [(t, d, local_rank[p]) for t, d, p in local_recvs])
        variants = {"plan": whole.run, "cross-host part alone": cross.run, "shm plan alone": shm_plan.run}
        samples = timed_blocks(variants, args.blocks, args.calls, dist)
        local_seconds = whole._runner.local_seconds  # type: ignore[attr-defined]
        correct = all(bool((t == float(peer + 1)).all()) for peer in peers for t in targets[peer])
        for plan in (whole, cross, shm_plan):
            plan.close()
    nbytes = 2 * count * elements * 2  # each rank's NIC: to 2 ranks of the other host
    part = torch.tensor([statistics.median(local_seconds)], dtype=torch.float64)
    dist.all_reduce(part, op=dist.ReduceOp.MAX)
    return {"samples": samples, "nic_bytes": nbytes * 2, "correct": correct,
            "same-host part inside the plan": float(part.item())}


def _megatron_models(args: argparse.Namespace, src_ranks: Tuple[int, ...], dst_ranks: Tuple[int, ...]) -> Any:
    import torch
    import megatron_models as models

    src_layout, dst_layout = models.Layout(src_ranks, tp=2), models.Layout(dst_ranks, tp=1)
    groups = models.build_groups([src_layout, dst_layout])
    src = models.build_model(src_layout, groups[0], args.layers, args.hidden, args.ffn, torch.bfloat16, fill=1.0)
    dst = models.build_model(dst_layout, groups[1], args.layers, args.hidden, args.ffn, torch.bfloat16, fill=0.0)
    return src, dst


def megatron_case(args: argparse.Namespace, dist: Any, rank: int, world: int) -> Dict[str, Any]:
    """TP2 (ranks 0, 1: host A) -> TP1 (rank 2: host B), Megatron's planner."""
    import torch
    from bench_refit import megatron_gloo_service
    from megatron.core.resharding import build_centralized_reshard_plan, execute_reshard_plan

    from tensorxfer.resharding.megatron import build_refit_plan

    src, dst = _megatron_models(args, (0, 1), (2,))
    reshard_plan = build_centralized_reshard_plan(src, dst)
    parameters = torch.tensor([sum(p.numel() for p in dst.parameters())], dtype=torch.int64)
    dist.all_reduce(parameters, op=dist.ReduceOp.MAX)
    with service(bucket_nbytes=args.bucket) as copies:
        plan = build_refit_plan(reshard_plan, src, dst, copies)
        received = torch.tensor([plan.bytes_per_run], dtype=torch.int64)
        dist.all_reduce(received, op=dist.ReduceOp.MAX)
        nbytes = int(received.item())
        half = nbytes // 2
        pairs = [(0, 2, half), (1, 2, nbytes - half)]
        variants = {"plan": plan.run, "engine floor": engine_floor(dist, pairs),
                    ENGINE_WITH_COPIES: engine_floor(dist, pairs, plan_copies(plan))}
        if args.loops:
            gloo = megatron_gloo_service()
            variants["megatron + gloo"] = lambda: execute_reshard_plan(reshard_plan, src, dst, gloo)
        samples = timed_blocks(variants, args.blocks, args.calls, dist)
        correct = all(bool(torch.all(p.data == 1.0)) for p in dst.parameters())
        plan.close()
    return {"samples": samples, "nic_bytes": nbytes, "correct": correct, "parameters": int(parameters.item())}


def replicas_case(args: argparse.Namespace, dist: Any, rank: int, world: int) -> Dict[str, Any]:
    """Rank 0 (the trainer host) sends the same tensors to every other rank (a replica host each)."""
    import torch

    from tensorxfer.resharding.persistent_plan import build_persistent_plan

    count = 32
    size = args.replica_mib * (1 << 20) // count // 2
    if rank == 0:
        sources = [torch.ones(size, dtype=torch.bfloat16) for _ in range(count)]
        sends = [(peer * count + i, source, peer) for peer in range(1, world) for i, source in enumerate(sources)]
        recvs: List[Any] = []
    else:
        targets = [torch.zeros(size, dtype=torch.bfloat16) for _ in range(count)]
        sends, recvs = [], [(rank * count + i, target, 0) for i, target in enumerate(targets)]

    def star() -> None:
        works = []
        if rank == 0:
            works = [dist.isend(source, peer) for peer in range(1, world) for source in sources]
        else:
            works = [dist.irecv(target, 0) for target in targets]
        for work in works:
            work.wait()

    with service(bucket_nbytes=args.bucket) as copies:
        plan = build_persistent_plan(copies, sends, recvs)
        samples = timed_blocks({"plan": plan.run, "star of isends": star}, args.blocks, args.calls, dist)
        correct = rank == 0 or all(bool((t == 1.0).all()) for t in targets)
        routes = plan.routes
        plan.close()
    flag = torch.tensor([int(correct)])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return {"samples": samples, "nic_bytes": size * 2 * count, "correct": bool(flag.item()), "routes": str(routes)}


def busy_case(args: argparse.Namespace, dist: Any, rank: int, world: int) -> Dict[str, Any]:
    """TP2 on ranks 0 (host A) and 1 (host B) -> TP1 on rank 2 (host C): every sender busy."""
    import torch

    from tensorxfer.resharding.persistent_plan import build_persistent_plan

    count, rows, cols = args.weights, 2048, 4096
    half = rows // 2
    if rank < 2:
        sources = [torch.full((half, cols), float(rank + 1), dtype=torch.bfloat16) for _ in range(count)]
        sends, recvs = [(w * 2 + rank, s, 2) for w, s in enumerate(sources)], []
    else:
        targets = [torch.zeros((rows, cols), dtype=torch.bfloat16) for _ in range(count)]
        sends = []
        recvs = [(w * 2 + src, t[src * half:(src + 1) * half], src) for w, t in enumerate(targets) for src in range(2)]
    nbytes = count * rows * cols * 2
    with service(bucket_nbytes=args.bucket) as copies:
        plan = build_persistent_plan(copies, sends, recvs)
        variants = {"plan": plan.run, "engine floor": engine_floor(dist, [(0, 2, nbytes // 2), (1, 2, nbytes // 2)])}
        samples = timed_blocks(variants, args.blocks, args.calls, dist)
        correct = rank < 2 or all(bool((t[s * half:(s + 1) * half] == float(s + 1)).all()) for t in targets
                                  for s in range(2))
        plan.close()
    flag = torch.tensor([int(correct)])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return {"samples": samples, "nic_bytes": nbytes, "correct": bool(flag.item())}


def onehost_case(args: argparse.Namespace, dist: Any, rank: int, world: int) -> Dict[str, Any]:
    """Two ranks of one host: the torch service's plan (no network step) beside the shm plan."""
    import torch

    from tensorxfer.resharding.copy_services import build_copy_service
    from tensorxfer.resharding.persistent_plan import build_persistent_plan

    count, elements = args.small_count, 2048
    peer = 1 - rank
    sources = [torch.full((elements,), float(rank + 1), dtype=torch.bfloat16) for _ in range(count)]
    targets = [torch.zeros(elements, dtype=torch.bfloat16) for _ in range(count)]
    sends = [(rank * count + i, s, peer) for i, s in enumerate(sources)]
    recvs = [(peer * count + i, t, peer) for i, t in enumerate(targets)]
    with service() as copies, build_copy_service("shm", None, timeout=600) as shm:
        torch_plan = build_persistent_plan(copies, sends, recvs)
        shm_plan = build_persistent_plan(shm, sends, recvs)
        samples = timed_blocks({"torch service plan": torch_plan.run, "shm plan": shm_plan.run}, args.blocks,
                               args.calls, dist)
        correct = all(bool((t == float(peer + 1)).all()) for t in targets)
        for plan in (torch_plan, shm_plan):
            plan.close()
    return {"samples": samples, "nic_bytes": 0, "correct": correct}


WORKERS = {"small": small_case, "weights": weights_case, "mixed": mixed_case, "megatron": megatron_case,
           "replicas": replicas_case, "busy": busy_case, "onehost": onehost_case}


def worker(case: str, args: argparse.Namespace, out: str) -> None:
    rank, world, dist = init_rank()
    result = WORKERS[case](args, dist, rank, world)
    if rank == 0:
        Path(out).write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


# ---- the driver --------------------------------------------------------------------------------

def launch(case: str, layout: Sequence[int], rate: Optional[str], args: argparse.Namespace,
           extra: Sequence[str] = ()) -> Dict[str, Any]:
    """Runs ``case`` on a fresh cluster of ``layout`` (ranks per host); adds the NIC's measured rate."""
    import simulated_cluster

    options = [f"--{name}={getattr(args, name.replace('-', '_'))}"
               for name in ("blocks", "calls", "bucket", "small-count", "weights", "layers", "hidden", "ffn",
                            "replica-mib")] + ["--loops" if args.loops else "--no-loops", *extra]
    with tempfile.TemporaryDirectory(prefix="bench-refit-hosts-") as work, \
            simulated_cluster.SimulatedCluster(len(layout), nic_rate=rate) as cluster:
        rate_measured = cluster.tcp_rate(0, 1, args.rate_probe_mib << 20) if rate and len(layout) > 1 else None
        out = os.path.join(work, "result.json")
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        processes = cluster.start_ranks(layout, [sys.executable, __file__, *options, "--worker", case, out], env=env)
        for process in processes:
            if process.wait(timeout=3600) != 0:
                raise SystemExit(f"case {case}: a rank failed with exit code {process.returncode}")
        result = json.loads(Path(out).read_text())
    result["rate"] = rate_measured
    return result


def medians(result: Dict[str, Any]) -> Dict[str, float]:
    return {name: statistics.median(values) for name, values in result["samples"].items()}


def line(name: str, seconds: float, note: str = "") -> None:
    print(f"    {name:<34} {seconds * 1e3:10.1f} ms  {note}")


def verdict(ratio: float, target: float) -> str:
    return f"{ratio:.2f}x (target >= {target}x: {'met' if ratio >= target else 'MISSED'})"


def report_floors(result: Dict[str, Any], nic_note: str = "") -> Dict[str, float]:
    times = medians(result)
    for name, seconds in times.items():
        line(name, seconds)
    if result.get("rate"):
        floor = result["nic_bytes"] / result["rate"]
        line("NIC floor", floor, f"{result['nic_bytes'] / 1e6:.1f} MB over {result['rate'] / 1e9:.3f} GB/s {nic_note}")
        times["NIC floor"] = floor
    print(f"    every destination correct: {result['correct']}")
    return times


def run_case(case: str, args: argparse.Namespace, run: int) -> List[Tuple[str, float, float]]:
    """Runs one case (rate-limited and, where the targets ask, not) and prints its table; returns
    (target, ratio, goal) rows."""
    rows: List[Tuple[str, float, float]] = []
    print(f"\n== {case} (run {run}) ==")
    if case in ("small", "weights"):
        for rate in (args.rate, None):
            result = launch(case, [1, 1], rate, args)
            print(f"  {'NIC ' + rate if rate else 'no rate limit'}:")
            times = report_floors(result)
            if rate:
                rows.append((f"{case}: NIC floor / plan", times["NIC floor"] / times["plan"], 0.9))
            else:
                rows.append((f"{case}: engine floor / plan", times["engine floor"] / times["plan"], 0.9))
                rows.append((f"{case} (no limit): cap, engine floor / (engine + the plan's copies)",
                             times["engine floor"] / times[ENGINE_WITH_COPIES], 0.0))
                rows.append((f"{case} (no limit): (engine + the plan's copies) / plan",
                             times[ENGINE_WITH_COPIES] / times["plan"], 0.0))
            if "per-op loop" in times:
                goal = 20.0 if case == "small" else 0.0
                rows.append((f"{case} ({'limited' if rate else 'no limit'}): per-op loop / plan",
                             times["per-op loop"] / times["plan"], goal))
    elif case == "mixed":
        result = launch(case, [2, 2], args.rate, args)
        print(f"  NIC {args.rate}:")
        times = report_floors(result)
        inside = result["same-host part inside the plan"]
        line("same-host part inside the plan", inside)
        rows.append(("mixed: shm plan alone / same-host part inside the plan", times["shm plan alone"] / inside, 1.0))
        slower = max(times["shm plan alone"], times["cross-host part alone"])
        rows.append(("mixed: slower part alone x 1.2 / whole plan", 1.2 * slower / times["plan"], 1.0))
    elif case == "megatron":
        for rate in (args.rate, None):
            result = launch(case, [2, 1], rate, args, ["--no-loops"] if rate else [])
            print(f"  {result['parameters'] / 1e6:.0f}M parameters (bfloat16), "
                  f"{'NIC ' + rate if rate else 'no rate limit'}:")
            times = report_floors(result, "(host B's NIC)")
            if rate:
                rows.append(("megatron: NIC floor / plan", times["NIC floor"] / times["plan"], 0.85))
            else:
                rows.append(("megatron (no limit): megatron + gloo / plan", times["megatron + gloo"] / times["plan"],
                             3.0))
                rows.append(("megatron (no limit): engine floor / plan", times["engine floor"] / times["plan"], 0.8))
                rows.append(("megatron (no limit): cap, megatron + gloo / engine floor",
                             times["megatron + gloo"] / times["engine floor"], 0.0))
                rows.append(("megatron (no limit): cap, engine floor / (engine + the plan's copies)",
                             times["engine floor"] / times[ENGINE_WITH_COPIES], 0.0))
    elif case == "replicas":
        per_count = {}
        for replicas in (1, 2, 4):
            result = launch(case, [1] * (replicas + 1), args.rate, args)
            times = medians(result)
            per_count[replicas] = times
            print(f"  {replicas} replica host(s), NIC {args.rate}: plan {times['plan'] * 1e3:.1f} ms, star of isends "
                  f"{times['star of isends'] * 1e3:.1f} ms, NIC floor "
                  f"{result['nic_bytes'] / result['rate'] * 1e3:.1f} ms; correct: {result['correct']}; "
                  f"routes {result['routes']}")
        one = per_count[1]["plan"]
        for replicas in (2, 4):
            print(f"    {replicas} replicas: plan {per_count[replicas]['plan'] / one:.2f}x one replica's time, star "
                  f"{per_count[replicas]['star of isends'] / per_count[1]['star of isends']:.2f}x")
        rows.append(("replicas: 1.3 x one replica / four replicas", 1.3 * one / per_count[4]["plan"], 1.0))
    elif case == "busy":
        result = launch(case, [1, 1, 1], args.rate, args)
        print(f"  NIC {args.rate}:")
        times = report_floors(result, "(host C's NIC)")
        rows.append(("busy: C's NIC floor / plan", times["NIC floor"] / times["plan"], 0.8))
    elif case == "onehost":
        result = launch(case, [2], None, args)
        print("  one host, 2 ranks (no network):")
        times = report_floors(result)
        rows.append(("onehost: shm plan / torch service plan", times["shm plan"] / times["torch service plan"],
                     0.95))
    for name, ratio, goal in rows:
        print(f"  {name}: " + (verdict(ratio, goal) if goal else f"{ratio:.2f}x"))
    return rows


def main() -> None:
    from tensorxfer.resharding.copy_services._network_plan import DEFAULT_BUCKET_NBYTES

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--runs", type=int, default=3, help="repeat every case this many times (spread)")
    parser.add_argument("--rate", default="2gbit", help="the NICs' rate (tc tbf syntax)")
    parser.add_argument("--blocks", type=int, default=5, help="timed blocks per variant (interleaved)")
    parser.add_argument("--calls", type=int, default=3, help="back-to-back calls per block")
    parser.add_argument("--bucket", type=int, default=DEFAULT_BUCKET_NBYTES, help="the plans' bucket_nbytes")
    parser.add_argument("--small-count", type=int, default=10_000)
    parser.add_argument("--weights", type=int, default=32)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--ffn", type=int, default=12288)
    parser.add_argument("--replica-mib", type=int, default=128)
    parser.add_argument("--rate-probe-mib", type=int, default=128)
    parser.add_argument("--loops", action=argparse.BooleanOptionalAction, default=True,
                        help="also time the per-op loops and Megatron's executor (slow)")
    parser.add_argument("--quick", action="store_true", help="small sizes, one block: a smoke test")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--worker", nargs=2, metavar=("CASE", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker[0], args, args.worker[1])
    if args.quick:
        args.blocks, args.calls, args.small_count, args.weights, args.layers = 1, 1, 500, 2, 1
        args.hidden, args.ffn, args.replica_mib, args.rate_probe_mib, args.runs = 256, 1024, 8, 16, 1
    import simulated_cluster

    reason = simulated_cluster.unavailable_reason()
    if reason:
        raise SystemExit(f"bench_refit_hosts: {reason}")
    from tensorxfer.benchmarks.report import cpu_header

    print(cpu_header())
    print(f"simulated cluster: NICs limited to {args.rate} each way (tc tbf) where a case says so; bucket "
          f"{args.bucket >> 20} MiB; {args.blocks} blocks x {args.calls} back-to-back calls per variant, interleaved;"
          f" medians of the slowest rank's seconds per call")
    results: Dict[str, List[List[Tuple[str, float, float]]]] = {}
    for run in range(1, args.runs + 1):
        for case in args.cases.split(","):
            results.setdefault(case, []).append(run_case(case, args, run))
    print("\n== targets, every run ==")
    for runs in results.values():
        for index, (name, _, goal) in enumerate(runs[0]):
            ratios = [rows[index][1] for rows in runs]
            met = sum(ratio >= goal for ratio in ratios) if goal else None
            spread = ", ".join(f"{ratio:.2f}" for ratio in ratios)
            print(f"  {name}: {spread}" + (f"  (target >= {goal}: met in {met} of {len(ratios)})" if goal else ""))
    if args.json:
        args.json.write_text(json.dumps(results))


if __name__ == "__main__":
    main()
