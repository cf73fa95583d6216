"""The CUDA pipeline executor on one GPU: two spawned ranks exchange tasks through
DoubleBufferManager(device="cuda") with default arguments (4 MiB slots, the
executor's own streams), the plan reused, calls back to back.

Beside it, in the same run and interleaved (rank 0 times every variant; rank 1
takes part in the two collective ones):
- same steps (torch): the executor's GPU work and waits without its planning, both
  ranks: per iteration a slot-sized copy for pack, put and unpack on three torch
  streams, two host waits and a group barrier. Two processes share the one GPU
  here, so this is the floor of the executor's schedule on this machine;
- floor: one process copying the same bytes once, device to device (a flat
  torch copy_ + synchronize);
- torch copies: the per-tensor loop a user writes within one process
  (dst.copy_(src) for every task, then synchronize).
The executor copies each byte three times (pack, put, unpack), so the floor bounds it
from below. Prints the CPU and GPU models, medians of --repeats, the p10-p90 spread,
for --runs whole comparisons; writes JSON to --out.
  python bench/python/bench_cuda_pipeline.py [--runs 2] [--repeats 15] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import time
import uuid

import numpy as np

CASES = [("10000 x 4 KiB", 10_000, 4 << 10), ("1000 x 64 KiB", 1000, 64 << 10), ("16 x 16 MiB", 16, 16 << 20)]


def _quantiles(samples):
    return {"median": float(np.median(samples)), "p10": float(np.percentile(samples, 10)),
            "p90": float(np.percentile(samples, 90))}


def _probe(executor, peer, repeats):
    """Medians (us) of one pack kernel (the plan's first batch), one put of that batch into the
    peer's receive slot 0, and a stream synchronize alone, each waited for on the host."""
    from tensorxfer import _core

    cuda = executor._cuda
    _, entries, table, extents = cuda._plan_table
    stream, nbytes = cuda.streams["pack"], int(entries[0][0][4])

    def pack():
        cuda._copy(table, extents[0], stream)
        stream.synchronize()

    def put():
        _core.cuda_put(cuda._slot(peer, 2), cuda._slot(cuda.my_pe, 0), nbytes, cuda.device.index, stream.cuda_stream)
        stream.synchronize()

    samples = {"pack kernel": [], "put": [], "synchronize": [], "batch bytes": [nbytes]}
    for _ in range(repeats):
        for key, run in (("pack kernel", pack), ("put", put), ("synchronize", stream.synchronize)):
            start = time.perf_counter()
            run()
            samples[key].append((time.perf_counter() - start) * 1e6)
    return {key: float(np.median(values)) for key, values in samples.items()}


def _rank(name, rank, repeats, queue):
    import torch

    from tensorxfer.resharding.pipeline_executor import DoubleBufferManager, PipelineExecutor
    from tensorxfer.resharding.cuda_pipeline import CudaKernelLauncher
    from tensorxfer.resharding.schedule import ReceiveRequest, SendRequest, build_schedule
    from tensorxfer.runtime import LocalGroup

    torch.cuda.set_device(0)
    group = LocalGroup.join(name, rank=rank, world_size=2, timeout=120)
    buffers = DoubleBufferManager(group, timeout=120, device="cuda")
    results = {}
    for label, count, size in CASES:
        peer = 1 - rank
        sources = [torch.randint(0, 255, (size,), dtype=torch.uint8, device="cuda") for _ in range(count)]
        targets = [torch.empty(size, dtype=torch.uint8, device="cuda") for _ in range(count)]
        sends = [SendRequest(rank * count + i, sources[i], 0, size, peer) for i in range(count)]
        receives = [ReceiveRequest(peer * count + i, targets[i], 0, size, peer) for i in range(count)]
        rows = [(r * count + i, size, r, 1 - r) for r in range(2) for i in range(count)]
        schedule = build_schedule(rows, rows, 2, slot_nbytes=buffers.slot_nbytes)
        executor = PipelineExecutor(CudaKernelLauncher(sends, receives), buffers, rank)
        steps = schedule.iteration_schedules(rank)
        flat_source = torch.empty(count * size, dtype=torch.uint8, device="cuda")
        flat_target = torch.empty_like(flat_source)

        def pipeline():
            executor.execute_pipeline(steps, schedule.num_iterations, timeout=120)

        def floor():
            flat_target.copy_(flat_source)
            torch.cuda.synchronize()

        def torch_copies():
            for source, target in zip(sources, targets):
                target.copy_(source)
            torch.cuda.synchronize()

        slot = buffers.slot_nbytes
        scratch = [torch.empty(slot, dtype=torch.uint8, device="cuda") for _ in range(4)]
        side_streams = [torch.cuda.Stream() for _ in range(3)]

        def same_steps():
            # The executor's GPU work and waits with torch and no plan: per iteration one slot-sized
            # copy each for pack, put and unpack on three streams, two host waits and a group barrier.
            for _ in range(schedule.num_iterations):
                for (target, source), stream in zip(((0, 1), (2, 0), (3, 2)), side_streams):
                    with torch.cuda.stream(stream):
                        scratch[target].copy_(scratch[source])
                side_streams[1].synchronize()
                side_streams[2].synchronize()
                group.all_gather_bytes(b"step", 120)

        variants = {"executor": pipeline, "same steps (torch)": same_steps}
        if rank == 0:
            variants.update({"floor": floor, "torch copies": torch_copies})
        samples = {key: [] for key in variants}
        for _ in range(2):
            for run in variants.values():
                run()
        for _ in range(repeats):
            for key, run in variants.items():
                start = time.perf_counter()
                run()
                samples[key].append((time.perf_counter() - start) * 1e3)
        for key, values in samples.items():
            results[f"{label}|{key}"] = _quantiles(values)
        results[f"{label}|iterations"] = schedule.num_iterations
        if rank == 0:  # where an iteration's time goes, while rank 1 waits at the barrier below
            results[f"{label}|probe"] = _probe(executor, peer, repeats)
        group.barrier(timeout=120)
    buffers.close()
    group.close()
    queue.put((rank, results))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    import torch

    from tensorxfer.benchmarks.report import cpu_header, machine_info

    info = machine_info()
    gpu = torch.cuda.get_device_name(0)
    print(f"{cpu_header()}  GPU: {gpu}  torch {torch.__version__}")
    context = multiprocessing.get_context("spawn")
    runs = []
    for run in range(args.runs):
        queue = context.Queue()
        name = f"bench-cuda-pipeline-{uuid.uuid4().hex[:8]}"
        processes = [context.Process(target=_rank, args=(name, rank, args.repeats, queue)) for rank in range(2)]
        for process in processes:
            process.start()
        results = dict(queue.get(timeout=600) for _ in processes)
        for process in processes:
            process.join(60)
        runs.append(results[0])
        print(f"\nrun {run + 1} (rank 0's times, ms: median [p10-p90]; GB/s = one direction's bytes / time)")
        print(f"{'case':16} {'iters':>5} {'executor':>22} {'same steps (torch)':>22} {'floor (1 copy)':>22} "
              f"{'torch copies':>22} {'exec GB/s':>9} {'steps/exec':>10} {'floor/exec':>10} {'torch/exec':>10}")
        for label, count, size in CASES:
            cell = {key: results[0][f"{label}|{key}"]
                    for key in ("executor", "same steps (torch)", "floor", "torch copies")}
            text = {key: f"{c['median']:.3f} [{c['p10']:.3f}-{c['p90']:.3f}]" for key, c in cell.items()}
            executor = cell["executor"]["median"]
            print(f"{label:16} {results[0][f'{label}|iterations']:>5} {text['executor']:>22} "
                  f"{text['same steps (torch)']:>22} {text['floor']:>22} {text['torch copies']:>22} "
                  f"{count * size / executor / 1e6:>9.1f} {cell['same steps (torch)']['median'] / executor:>9.2f}x "
                  f"{cell['floor']['median'] / executor:>9.2f}x {cell['torch copies']['median'] / executor:>9.2f}x")
        print("probe on rank 0 (us, medians): " + "; ".join(
            f"{label}: " + ", ".join(f"{k} {v:.0f}" for k, v in results[0][f"{label}|probe"].items())
            for label, _, _ in CASES))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_cuda_pipeline.json"), "w") as handle:
        json.dump({"machine": info, "gpu": gpu, "cases": CASES, "runs": runs}, handle, indent=1)


if __name__ == "__main__":
    main()
