"""All-reduce on one host, measured the way users call it: tensorxfer vs DeepSpeed's shm op, gloo and MPI.

Every tensorxfer number comes from ``Communicator(group)`` with default arguments and calls
made back to back (no barrier between them), in ranks started the way ``mp.spawn`` and
``torchrun`` start them (multiprocessing spawn, no core binding). Two launches per rank count:

* spawn launch: ranks started with multiprocessing (spawn). For float32, bfloat16 and float16
  and every size, interleaved repeat by repeat (the order rotates each repeat):
  ``tensorxfer numpy`` (numpy input; float32 and float16, numpy has no bfloat16),
  ``tensorxfer torch`` (torch input), ``deepspeed shm`` (DeepSpeed's CPU shared-memory
  all-reduce built from its PyPI sdist, see ``_deepspeed_shm.py``; skipped with the reason
  when it cannot be built), ``gloo`` (``torch.distributed.all_reduce``) and ``copy floor``:
  every rank at once copies its tensor into a 256 KiB scratch and back, piece by piece, the bytes any
  shared-memory all-reduce of a private tensor moves at least (its ratio, floor time /
  tensorxfer time, says how close to that floor the all-reduce runs; below ~64 KiB the two
  torch calls themselves dominate it). A separate row,
  ``tensorxfer numpy, barrier first``, times each call after a ``Communicator.barrier()``
  (the latency of one call when every rank arrives together; not what back-to-back calls see).
* mpirun launch (``mpirun --bind-to none``): float32 ``mpi`` (mpi4py ``Allreduce(IN_PLACE)``)
  interleaved with ``tensorxfer numpy (mpirun)``, so the MPI ratio compares loops of one run.

One thread per rank everywhere (``OMP_NUM_THREADS=1``, ``torch.set_num_threads(1)``). Each
sample is rank 0's time per call over a loop sized to take ~20 ms (the same count on every
rank); the table shows the median over ``--repeats`` samples and the spread (min-max), and the
ratios (baseline time / tensorxfer time) against the issue's targets. Writes
``<out>/collectives.json`` and ``.png``.

    python bench/python/bench_collectives.py [--ranks 2 4] [--sizes 1K 64K 1M 16M 64M]
        [--dtypes float32 bfloat16 float16] [--deepspeed-cache DIR] [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _deepspeed_shm  # noqa: E402

DEFAULT_OUT = HERE.parent / "results"
DEFAULT_SIZES = ["1K", "64K", "1M", "16M", "64M"]
DTYPES = ["float32", "bfloat16", "float16"]
SPAWN_VARIANTS = ["tensorxfer numpy", "tensorxfer torch", "deepspeed shm", "gloo", "copy floor"]
BARRIER_VARIANT = "tensorxfer numpy, barrier first"
MPI_VARIANTS = ["mpi", "tensorxfer numpy (mpirun)"]
VARIANT_KEYS = {"numpy": "tensorxfer numpy", "torch": "tensorxfer torch", "deepspeed": "deepspeed shm",
                "gloo": "gloo", "floor": "copy floor", "barrier": BARRIER_VARIANT, "mpi": "mpi"}
TX_NUMPY, TX_TORCH, DEEPSPEED, GLOO, FLOOR = SPAWN_VARIANTS
# The copy floor goes through a cache-sized scratch piece by piece: the tensor's bytes cross
# memory once each way, as they do through an all-reduce's cache-sized staging windows.
FLOOR_PIECE_BYTES = 256 << 10


def parse_size(text: str) -> int:
    """'1K', '64M', '4096' -> bytes (binary units); a multiple of 4."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(i?B)?\s*", text, flags=re.IGNORECASE)
    if match is None:
        raise argparse.ArgumentTypeError(f"size must look like 1K, 64M, 4096; got {text!r}")
    value = int(match.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[match.group(2).upper()]
    if value < 4 or value % 4:
        raise argparse.ArgumentTypeError(f"size must be a positive multiple of 4 bytes, got {text!r}")
    return value


def size_name(nbytes: int) -> str:
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


# ---- rank side -----------------------------------------------------------------------------


def measure_case(ops: dict[str, Callable[[], Any]], barrier: Callable[[], None], agree: Callable[[int], int],
                 repeats: int, loop_seconds: float, synced: Optional[Callable[[], float]]) -> dict[str, list[float]]:
    """Interleaved samples (seconds per call) of every op; ``synced`` times one barrier-first call."""
    names = list(ops)
    counts: dict[str, int] = {}
    for name in names:  # warm up (page faults, connections), then size the loop from rank 0's time
        barrier()
        ops[name]()
        begin = time.perf_counter()
        ops[name]()
        ops[name]()
        per_call = (time.perf_counter() - begin) / 2
        counts[name] = agree(max(3, min(5000, int(loop_seconds / max(per_call, 1e-7)))))
    if synced is not None:
        names.append(BARRIER_VARIANT)
        counts[BARRIER_VARIANT] = max(3, counts[names[0]] // 4)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for repeat in range(repeats):
        shift = repeat % len(names)
        for name in names[shift:] + names[:shift]:
            barrier()
            if name == BARRIER_VARIANT:
                assert synced is not None
                total = sum(synced() for _ in range(counts[name]))
                samples[name].append(total / counts[name])
                continue
            op, count = ops[name], counts[name]
            begin = time.perf_counter()
            for _ in range(count):
                op()
            samples[name].append((time.perf_counter() - begin) / count)
    return samples


def spawn_rank(rank: int, world: int, config: dict, queue: Any) -> None:
    try:
        queue.put((rank, "ok", spawn_rank_body(rank, world, config)))
    except BaseException as error:  # reported by the launcher
        import traceback

        queue.put((rank, "error", f"rank {rank}: {error!r}\n{traceback.format_exc()}"))


def spawn_rank_body(rank: int, world: int, config: dict) -> Optional[dict]:
    import numpy as np
    import torch

    from tensorxfer.runtime import Communicator, LocalGroup

    torch.set_num_threads(1)
    group = LocalGroup.join(config["group"], rank=rank, world_size=world, timeout=120)
    variants = config["variants"]
    dist = None
    if GLOO in variants:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{config['port']}", rank=rank,
                                world_size=world)
    deepspeed_ok = False
    if DEEPSPEED in variants:
        module, _ = _deepspeed_shm.build(Path(config["deepspeed_cache"]), download=False)
        module.initialize(world, rank)
        deepspeed_ok = True
    comm = Communicator(group)
    # --max-bytes: the same numpy calls through communicators with other chunk sizes, to choose the default.
    chunked = {size: Communicator(group, max_bytes=size) for size in config["max_bytes"]}

    def agree(value: int) -> int:
        return int(group.all_gather_bytes(str(value).encode(), timeout=120)[0])

    results: dict[str, dict[str, list[float]]] = {}
    if config["interleave_dtypes"]:  # half vs float32 bytes per second, in the same loops
        for nbytes in config["sizes"]:
            mixed: dict[str, Callable[[], Any]] = {}
            for dtype_name in config["dtypes"]:
                tensor = torch.zeros(nbytes // torch.empty((), dtype=getattr(torch, dtype_name)).element_size(),
                                     dtype=getattr(torch, dtype_name))
                mixed[f"{TX_TORCH} {dtype_name}"] = lambda t=tensor: comm.all_reduce(t)
            results[f"mixed/{nbytes}"] = measure_case(mixed, group.barrier, agree, config["repeats"],
                                                      config["loop_seconds"], None)
    for dtype_name in config["dtypes"] if not config["interleave_dtypes"] else []:
        torch_dtype = getattr(torch, dtype_name)
        numpy_dtype = None if dtype_name == "bfloat16" else np.dtype(dtype_name)
        for nbytes in config["sizes"]:
            count = nbytes // torch.empty((), dtype=torch_dtype).element_size()
            tensors = {name: torch.zeros(count, dtype=torch_dtype) for name in (TX_TORCH, DEEPSPEED, GLOO, FLOOR)}
            array = np.zeros(count, numpy_dtype) if numpy_dtype is not None else None
            ops: dict[str, Callable[[], Any]] = {}
            if TX_NUMPY in variants and array is not None:
                ops[TX_NUMPY] = lambda a=array: comm.all_reduce(a)
            for size, other in chunked.items():
                if array is not None:
                    ops[f"{TX_NUMPY}, max_bytes {size_name(size)}"] = lambda a=array, c=other: c.all_reduce(a)
            if TX_TORCH in variants:
                ops[TX_TORCH] = lambda t=tensors[TX_TORCH]: comm.all_reduce(t)
            if deepspeed_ok:
                ops[DEEPSPEED] = lambda t=tensors[DEEPSPEED]: torch.ops.deepspeed.inference_all_reduce_(t)
            if dist is not None:
                ops[GLOO] = lambda t=tensors[GLOO]: dist.all_reduce(t)
            if FLOOR in variants:  # the bytes any shared-memory all-reduce moves at least: in, and back out
                pieces = tensors[FLOOR].split(FLOOR_PIECE_BYTES // tensors[FLOOR].element_size())
                scratch = torch.empty_like(pieces[0])

                def floor_copy(pieces: Any = pieces, scratch: Any = scratch) -> None:
                    for piece in pieces:
                        part = scratch[:piece.numel()]
                        part.copy_(piece)
                        piece.copy_(part)
                ops[FLOOR] = floor_copy
            for name, op in ops.items():  # every op really sums: rank+1 everywhere
                if name == FLOOR:
                    continue
                target = array if name.startswith(TX_NUMPY) else tensors[name]
                target[:] = rank + 1
                op()
                got, expected = float(target[count - 1]), world * (world + 1) / 2
                if got != expected:
                    raise AssertionError(f"{name} {dtype_name} {nbytes} B: got {got}, expected {expected}")
                target[:] = 0
            synced = None
            if BARRIER_VARIANT in config["extra"] and array is not None and dtype_name == "float32":
                def synced(a: Any = array) -> float:
                    comm.barrier()
                    begin = time.perf_counter()
                    comm.all_reduce(a)
                    return time.perf_counter() - begin
            samples = measure_case(ops, group.barrier, agree, config["repeats"], config["loop_seconds"], synced)
            results[f"{dtype_name}/{nbytes}"] = samples
    group.barrier(timeout=120)
    comm.close()
    for other in chunked.values():
        other.close()
    if dist is not None:
        dist.destroy_process_group()
    return results if rank == 0 else None


def mpi_rank_main(args: argparse.Namespace) -> None:
    import numpy as np
    from mpi4py import MPI

    from tensorxfer.runtime import Communicator, LocalGroup

    world_comm = MPI.COMM_WORLD
    rank = world_comm.Get_rank()
    comm = Communicator(LocalGroup.from_mpi(world_comm))
    results: dict[str, dict[str, list[float]]] = {}
    for nbytes in (parse_size(s) for s in args.sizes):
        mine, theirs = np.zeros(nbytes // 4, np.float32), np.zeros(nbytes // 4, np.float32)
        ops = {"mpi": lambda a=theirs: world_comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM),
               "tensorxfer numpy (mpirun)": lambda a=mine: comm.all_reduce(a)}
        samples = measure_case(ops, world_comm.Barrier, lambda v: int(world_comm.bcast(v, root=0)), args.repeats,
                               loop_seconds(args), None)
        results[f"float32/{nbytes}"] = samples
    comm.close()
    if rank == 0:
        Path(args.result).write_text(json.dumps(results))


def loop_seconds(args: argparse.Namespace) -> float:
    return 0.003 if args.quick else 0.02


# ---- launcher side -------------------------------------------------------------------------


def spawn_launch(world: int, args: argparse.Namespace, deepspeed_cache: Optional[Path]) -> dict:
    import multiprocessing

    variants = [VARIANT_KEYS[v] for v in args.variants if VARIANT_KEYS[v] in SPAWN_VARIANTS]
    if deepspeed_cache is None and DEEPSPEED in variants:
        variants.remove(DEEPSPEED)
    port = free_port()
    config = {"group": f"bench-coll-{os.getpid()}-{world}", "port": port, "variants": variants,
              "extra": [BARRIER_VARIANT] if "barrier" in args.variants else [],
              "dtypes": args.dtypes, "sizes": [parse_size(s) for s in args.sizes], "repeats": args.repeats,
              "loop_seconds": loop_seconds(args), "deepspeed_cache": str(deepspeed_cache),
              "max_bytes": [parse_size(m) for m in args.max_bytes], "interleave_dtypes": args.interleave_dtypes}
    # What mp.spawn / torchrun give each rank, and DeepSpeed's op reads (it maps only when
    # LOCAL_SIZE == world size; its segment names come from MASTER_ADDR/MASTER_PORT).
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "LOCAL_SIZE": str(world),
                       "WORLD_SIZE": str(world), "OMP_NUM_THREADS": "1"})
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    processes = [context.Process(target=spawn_rank, args=(rank, world, config, queue)) for rank in range(world)]
    for process in processes:
        process.start()
    try:
        outcome: dict[int, Any] = {}
        deadline = time.monotonic() + args.launch_timeout
        while len(outcome) < world:
            rank, status, payload = queue.get(timeout=max(1.0, deadline - time.monotonic()))
            if status != "ok":
                raise RuntimeError(payload)
            outcome[rank] = payload
    finally:
        for process in processes:
            process.join(timeout=20)
            if process.is_alive():
                process.kill()
                process.join()
        for name in _deepspeed_shm.shm_names(os.getuid(), "127.0.0.1", str(port), world):
            try:
                os.unlink(f"/dev/shm/{name}")
            except FileNotFoundError:
                pass
    return outcome[0]


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def mpirun_path() -> str:
    candidate = Path(sys.executable).parent / "mpirun"
    return str(candidate) if candidate.exists() else "mpirun"


def mpi_launch(world: int, args: argparse.Namespace, result: Path) -> dict:
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
    command = [mpirun_path(), "--allow-run-as-root", "--bind-to", "none", "--oversubscribe", "-n", str(world),
               sys.executable, str(Path(__file__).resolve()), "--mpi-worker", "--result", str(result),
               "--repeats", str(args.repeats), "--sizes", *args.sizes]
    if args.quick:
        command.append("--quick")
    subprocess.run(command, env=env, check=True, timeout=args.launch_timeout)
    return json.loads(result.read_text())


def targets(world: int, dtype: str, nbytes: int, baseline: str) -> Optional[float]:
    """The issue's targets: tensorxfer time ratio against ``baseline``."""
    if baseline == DEEPSPEED:
        if world >= 4:
            return 2.0
        return 1.3 if dtype == "float32" and nbytes >= 16 << 20 else 1.0
    if baseline == "mpi":
        return 1.0 if world >= 4 or nbytes <= 1 << 10 else None
    return None


def build_report(results: dict[tuple[int, str], dict], args: argparse.Namespace, notes: list[str]) -> Any:
    from _report import Report

    report = Report("all-reduce (sum) on one host, back to back, default Communicator: tensorxfer vs "
                    "DeepSpeed shm, gloo, MPI",
                    {"ranks": args.ranks, "sizes": args.sizes, "dtypes": args.dtypes, "repeats": args.repeats,
                     "quick": args.quick})
    for line in notes:
        report.note(line)
    spreads: list[tuple[str, ...]] = [("case", "variant", "median us", "min-max us", "GB/s")]
    for (world, _launch), per_case in results.items():
        for key, per_variant in per_case.items():
            dtype, nbytes = key.split("/")[0], int(key.split("/")[1])
            case = f"{world} ranks, {dtype}, {size_name(nbytes)}"
            for variant, seconds in per_variant.items():
                m = report.add(case, variant, "time per all-reduce", [s * 1e6 for s in seconds], "us",
                               lower_is_better=True)
                spreads.append((case, variant, f"{m.value:.1f}", f"{min(m.samples):.1f}-{max(m.samples):.1f}",
                                f"{nbytes / m.value / 1e3:.2f}"))
            pairs = [(TX_NUMPY, DEEPSPEED), (TX_TORCH, DEEPSPEED), (TX_TORCH, GLOO), ("tensorxfer numpy (mpirun)",
                                                                                    "mpi"), (TX_TORCH, FLOOR)]
            pairs += [(variant, DEEPSPEED) for variant in per_variant if variant.startswith(f"{TX_NUMPY}, max_bytes")]
            if dtype == "mixed" and f"{TX_TORCH} float32" in per_variant:
                for half in ("bfloat16", "float16"):  # same bytes: the time ratio is the bandwidth ratio
                    if f"{TX_TORCH} {half}" in per_variant:
                        report.compare(case, "time per all-reduce", f"{TX_TORCH} {half}", f"{TX_TORCH} float32",
                                       target=0.8)
            for candidate, baseline in pairs:
                if candidate in per_variant and baseline in per_variant:
                    report.compare(case, "time per all-reduce", candidate, baseline,
                                   target=targets(world, dtype, nbytes, baseline))
    return report, spreads


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--sizes", nargs="+", default=DEFAULT_SIZES, help="message sizes (1K, 64M, ...)")
    parser.add_argument("--dtypes", nargs="+", default=DTYPES, choices=DTYPES)
    parser.add_argument("--variants", nargs="+", default=list(VARIANT_KEYS), choices=list(VARIANT_KEYS))
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--deepspeed-cache", type=Path, default=None,
                        help=f"DeepSpeed sdist cache (default ${_deepspeed_shm.CACHE_ENV} or "
                             "~/.cache/tensorxfer/bench-deepspeed); downloaded there when missing")
    parser.add_argument("--no-download", action="store_true", help="never download the DeepSpeed sdist")
    parser.add_argument("--max-bytes", nargs="*", default=[],
                        help="also time numpy calls through Communicators with these chunk sizes (1M, 64M, ...) "
                             "beside the default one (to choose the default)")
    parser.add_argument("--interleave-dtypes", action="store_true",
                        help="instead of the comparison: torch calls of every --dtypes interleaved per size "
                             "(half-precision bytes per second against float32's)")
    parser.add_argument("--quick", action="store_true", help="short loops (smoke test)")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="directory for collectives.json / .png")
    parser.add_argument("--launch-timeout", type=float, default=1800)
    parser.add_argument("--mpi-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes]
    if args.mpi_worker:
        mpi_rank_main(args)
        return 0

    from _report import cpu_header, machine_info

    info = machine_info()
    print(f"{cpu_header()}, load average {info['load_average_1_5_15'][0]:.2f}; "
          f"tensorxfer {info['tensorxfer']}, numpy {info['numpy']}, torch {info['torch']}", flush=True)
    notes: list[str] = []
    deepspeed_cache: Optional[Path] = None
    if "deepspeed" in args.variants:
        cache = args.deepspeed_cache or _deepspeed_shm.default_cache()
        try:
            _, description = _deepspeed_shm.build(cache, download=not args.no_download)
            deepspeed_cache = cache
            notes.append(description + ", one thread per rank")
        except _deepspeed_shm.Unavailable as error:
            print(f"deepspeed shm: skipped: {error}", flush=True)
            notes.append(f"deepspeed shm skipped: {error}")
    if any(s % 4 for s in sizes):
        raise SystemExit("sizes must be multiples of 4 bytes")
    results: dict[tuple[int, str], dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-collectives-") as scratch:
        for world in args.ranks:
            if set(args.variants) & {"numpy", "torch", "deepspeed", "gloo", "floor", "barrier"}:
                results[(world, "spawn")] = spawn_launch(world, args, deepspeed_cache)
            if "mpi" in args.variants and "float32" in args.dtypes and not args.interleave_dtypes:
                results[(world, "mpirun")] = mpi_launch(world, args, Path(scratch) / f"mpi{world}.json")
    load_after = os.getloadavg()[0]
    if load_after > info["cpus"] / 2:
        notes.append(f"the machine was loaded during the run (load average {load_after:.1f} at the end on "
                     f"{info['cpus']} CPUs)")
    report, spreads = build_report(results, args, notes)
    from tensorxfer.benchmarks.report import _align

    print(_align(spreads))
    print(report.table())
    json_path, png_path = report.write(args.out, "collectives")
    print(f"wrote {json_path}" + (f" and {png_path}" if png_path else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
