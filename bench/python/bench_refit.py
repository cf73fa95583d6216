"""A Megatron-shaped refit: seconds per refit, from the second refit on (issue 32).

Megatron's own planner (``build_centralized_reshard_plan``) on a stack of its own
``ColumnParallelLinear`` / ``RowParallelLinear`` layers (tests/python/resharding/megatron_models:
``layers`` blocks of fc1 (hidden -> ffn) and fc2 (ffn -> hidden); the defaults, 6 x
(2048 -> 12288 -> 2048) in bfloat16, hold 302M parameters), TP2 -> TP1, 2 ranks, colocated:
the destination (TP1) on both ranks, so half of each rank's bytes are same-rank copies and
half cross processes. Variants, interleaved refit by refit in each run:

* ``megatron + gloo``: Megatron's ``execute_reshard_plan`` over its own ``GlooCopyService``
  (its ``run()`` unchanged; built without ``__init__``'s ``torch.cuda.Stream()``, which a
  CPU-only machine cannot make);
* ``megatron + tensorxfer shm``: the same executor over ``build_copy_service("shm")``;
* ``tensorxfer persistent plan``: ``tensorxfer.resharding.megatron.build_refit_plan`` of the
  same ReshardPlan, built once; a refit is ``plan.run()``;
* floors, in the same run: ``floor: one memcpy`` (each rank copies the bytes it receives per
  refit as one contiguous block) and ``floor: megatron's own copies`` (its per-op
  ``.contiguous()`` of each source slice, ``torch.empty_like`` receive buffers and write-back,
  with no transfer at all), and ``floor: megatron's copies + one memcpy`` (both, back to back:
  the least Megatron's executor can take over any copy service, which must still write every
  received byte into its receive buffers once).

A sample is the slower rank's time for one refit, between barriers. Targets: the persistent
plan within 1.6x of the memcpy floor; megatron + shm within 1.6x of megatron's own copies and
>= 2.5x megatron + gloo. Prints the CPU model and one table per run.

    python bench/python/bench_refit.py [--runs 3] [--refits 10] [--layers 6] [--hidden 2048] [--ffn 12288]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List

HERE = Path(__file__).resolve().parent
MODELS = HERE.parents[1] / "tests" / "python" / "resharding"

GLOO = "megatron + gloo"
SHM = "megatron + tensorxfer shm"
PERSISTENT = "tensorxfer persistent plan"
FLOOR_MEMCPY = "floor: one memcpy"
FLOOR_MEGATRON = "floor: megatron's own copies"
FLOOR_EXECUTOR = "floor: megatron's copies + one memcpy"
VARIANTS = [GLOO, SHM, PERSISTENT, FLOOR_MEMCPY, FLOOR_MEGATRON, FLOOR_EXECUTOR]
# (candidate, reference, target): reference time / candidate time >= target (a speed-up), or,
# with a negative target, candidate time / reference time <= -target (within that factor).
TARGETS = [(PERSISTENT, FLOOR_MEMCPY, -1.6), (SHM, FLOOR_MEGATRON, -1.6), (SHM, GLOO, 2.5)]
# Printed beside the targets: how far megatron + shm is from what any service could reach, and
# the caps that floor puts on its two targets (own copies + one memcpy against own copies alone,
# and gloo against own copies + one memcpy: the most any service under megatron's executor could
# show against its gloo service in that run).
BOUNDS = [(SHM, FLOOR_EXECUTOR), (FLOOR_EXECUTOR, FLOOR_MEGATRON), (GLOO, FLOOR_EXECUTOR)]


def megatron_gloo_service() -> Any:
    """Megatron's GlooCopyService as its __init__ makes it, minus the CUDA stream."""
    import torch.distributed as dist
    from megatron.core.resharding.copy_services.gloo_copy_service import GlooCopyService

    service = GlooCopyService.__new__(GlooCopyService)
    service.rank = dist.get_rank()
    service.world_size = dist.get_world_size()
    service.gloo_pg = dist.new_group(backend="gloo")
    service.send_ops = []
    service.recv_ops = []
    service._copy_stream = None  # run() skips the stream wait when None
    return service


def megatron_copies(plan: Any, src: Any, dst: Any) -> Callable[[], None]:
    """Megatron's executor's own copies per op, without any transfer."""
    import torch

    src_params = dict(src.named_parameters())
    dst_params = dict(dst.named_parameters())

    def step() -> None:
        for op in plan.send_ops:
            src_params[op.param_name].data[op.my_slice].contiguous()
        for op in plan.recv_ops:
            view = dst_params[op.param_name].data[op.my_slice]
            buffer = torch.empty_like(view.contiguous())
            with torch.no_grad():
                view.copy_(buffer)
    return step


def worker(rank: int, world: int, init_file: str, args: argparse.Namespace, out: str) -> None:
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    sys.path.insert(0, str(MODELS))
    import megatron_models as models
    from megatron.core.resharding import build_centralized_reshard_plan, execute_reshard_plan

    from tensorxfer.resharding.copy_services import build_copy_service
    from tensorxfer.resharding.megatron import build_refit_plan

    src_layout, dst_layout = models.Layout((0, 1), tp=2), models.Layout((0, 1), tp=1)
    groups = models.build_groups([src_layout, dst_layout])
    dtype = torch.bfloat16
    src = models.build_model(src_layout, groups[0], args.layers, args.hidden, args.ffn, dtype, fill=1.0)
    dst = models.build_model(dst_layout, groups[1], args.layers, args.hidden, args.ffn, dtype, fill=0.0)
    parameters = sum(p.numel() for p in dst.parameters())
    reshard_plan = build_centralized_reshard_plan(src, dst)
    gloo = megatron_gloo_service()
    shm = build_copy_service("shm", None, timeout=600)
    plan_service = build_copy_service("shm", None, timeout=600)
    persistent = build_refit_plan(reshard_plan, src, dst, plan_service)
    received = persistent.bytes_per_run
    floor_source = torch.ones(received // 2, dtype=dtype)
    floor_target = torch.empty_like(floor_source)
    own_copies = megatron_copies(reshard_plan, src, dst)

    def own_copies_and_memcpy() -> None:
        own_copies()
        floor_target.copy_(floor_source)

    steps: Dict[str, Callable[[], None]] = {
        GLOO: lambda: execute_reshard_plan(reshard_plan, src, dst, gloo),
        SHM: lambda: execute_reshard_plan(reshard_plan, src, dst, shm),
        PERSISTENT: persistent.run,
        FLOOR_MEMCPY: lambda: floor_target.copy_(floor_source),
        FLOOR_MEGATRON: own_copies,
        FLOOR_EXECUTOR: own_copies_and_memcpy,
    }

    def slowest(seconds: float) -> float:
        value = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return float(value.item())

    # The first refit of each (plans, buffers, first touch) is not counted.
    ok = True
    for name, step in steps.items():
        if name in (GLOO, SHM, PERSISTENT):
            for param in dst.parameters():
                param.data.zero_()
        step()
        if name in (GLOO, SHM, PERSISTENT):  # the source is all ones
            ok = ok and all(bool(torch.all(param.data == 1.0)) for param in dst.parameters())
    runs: List[Dict[str, List[float]]] = []
    for _ in range(args.runs):
        samples: Dict[str, List[float]] = {name: [] for name in steps}
        for _ in range(args.refits):
            for name, step in steps.items():
                dist.barrier()
                start = time.perf_counter()
                step()
                samples[name].append(slowest(time.perf_counter() - start))
        runs.append(samples)
    persistent.close()
    for service in (shm, plan_service):
        service.close()
    if rank == 0:
        Path(out).write_text(json.dumps({"runs": runs, "parameters": parameters, "received_bytes": received,
                                         "ops": len(reshard_plan.recv_ops), "correct": ok}))
    dist.barrier()
    dist.destroy_process_group()


def report(result: Dict[str, Any], args: argparse.Namespace) -> None:
    from tensorxfer.benchmarks.report import cpu_header

    print(cpu_header())
    print(f"refit TP2 -> TP1, 2 ranks, colocated: {result['parameters'] / 1e6:.0f}M parameters (bfloat16), "
          f"{result['received_bytes'] / 1e6:.0f} MB received per rank per refit, {result['ops']} receive ops per "
          f"rank; {args.refits} refits per run after one untimed; medians (s per refit, slower rank); "
          f"every variant's destination correct on its untimed refit: {result['correct']}")
    for index, samples in enumerate(result["runs"]):
        medians = {name: statistics.median(values) for name, values in samples.items()}
        print(f"\nrun {index + 1}:")
        for name in VARIANTS:
            print(f"  {name:<32} {medians[name]:8.3f} s   (min {min(samples[name]):.3f}, max {max(samples[name]):.3f})")
        for candidate, reference, target in TARGETS:
            ratio = medians[reference] / medians[candidate]
            if target < 0:
                factor = medians[candidate] / medians[reference]
                verdict = "met" if factor <= -target else "MISSED"
                print(f"  {candidate} / {reference}: {factor:.2f}x the time (target <= {-target}x: {verdict})")
            else:
                verdict = "met" if ratio >= target else "MISSED"
                print(f"  {candidate} vs {reference}: {ratio:.2f}x faster (target >= {target}x: {verdict})")
        for candidate, reference in BOUNDS:
            print(f"  {candidate} / {reference}: {medians[candidate] / medians[reference]:.2f}x the time")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--refits", type=int, default=10)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--ffn", type=int, default=12288)
    parser.add_argument("--json", type=Path, help="also write the samples here")
    parser.add_argument("--worker", nargs=4, metavar=("RANK", "WORLD", "INIT", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        rank, world, init_file, out = args.worker
        return worker(int(rank), int(world), init_file, args, out)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    with tempfile.TemporaryDirectory(prefix="bench-refit-") as work:
        init_file, out = os.path.join(work, "rendezvous"), os.path.join(work, "result.json")
        options = ["--runs", str(args.runs), "--refits", str(args.refits), "--layers", str(args.layers),
                   "--hidden", str(args.hidden), "--ffn", str(args.ffn)]
        processes = [subprocess.Popen([sys.executable, __file__, *options, "--worker", str(rank), "2", init_file, out],
                                      env=env) for rank in range(2)]
        for process in processes:
            if process.wait() != 0:
                raise SystemExit(f"a refit worker failed with exit code {process.returncode}")
        result = json.loads(Path(out).read_text())
    report(result, args)
    if args.json:
        args.json.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
