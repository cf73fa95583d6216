"""All-reduce on one host: tensorxfer's Communicator vs MPI and vs gloo, side by side.

Launched once, this script starts ``mpirun -n R`` for every rank count R; in
each rank process it measures, interleaved repeat by repeat, float32 in-place
all-reduce (sum) of every size with:

* ``mpi``: mpi4py ``Allreduce(IN_PLACE, ...)`` (Open MPI, shared-memory transport);
* ``tensorxfer``: ``Communicator.all_reduce`` on a numpy array in the caller's memory;
* ``tensorxfer_buffer``: the same with the array already in ``comm.buffer(...)`` (zero-copy);
* ``gloo``: ``torch.distributed.all_reduce`` with the gloo backend (tcp://127.0.0.1).

The group for tensorxfer is made from the MPI communicator (handles exchanged
with MPI allgather). Each sample is the time per operation of a timed loop,
taken as the slowest rank's; the table shows medians over repeats and the
ratios (MPI time / tensorxfer time, gloo time / tensorxfer time) against the
targets. Writes ``<out>/collectives.json`` and ``.png``.

    python bench/python/bench_collectives.py [--ranks 2 4] [--sizes 1K 64K 1M 16M 64M] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional, Sequence

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE.parent / "results"
DEFAULT_SIZES = ["1K", "64K", "1M", "16M", "64M"]
VARIANTS = ["mpi", "tensorxfer", "tensorxfer_buffer", "gloo"]


def parse_size(text: str) -> int:
    """'1K', '64M', '4096' -> bytes (binary units); a multiple of 4 (float32)."""
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


def loop_count(nbytes: int, quick: bool) -> int:
    """Operations per timed loop: enough that one loop takes milliseconds."""
    count = max(2, min(2000, (64 << 20) // max(nbytes, 1) // 8))
    return max(2, count // 10) if quick else count


# ---- rank side (under mpirun) ------------------------------------------------------------


class MpiGroup:
    """rank / world_size / all_gather_bytes / barrier over an mpi4py communicator."""

    def __init__(self, comm: Any) -> None:
        self._comm = comm
        self.rank = comm.Get_rank()
        self.world_size = comm.Get_size()

    def all_gather_bytes(self, data: bytes, timeout: Optional[float] = None) -> list[bytes]:
        return self._comm.allgather(bytes(data))

    def barrier(self, timeout: Optional[float] = None) -> None:
        self._comm.Barrier()


def make_group(comm: Any) -> Any:
    """tensorxfer's LocalGroup.from_mpi when the package has it, else the MPI adapter above."""
    try:
        from tensorxfer.runtime import LocalGroup  # type: ignore[attr-defined]

        return LocalGroup.from_mpi(comm)
    except (ImportError, AttributeError):
        return MpiGroup(comm)


def rank_main(args: argparse.Namespace) -> None:
    import numpy as np
    from mpi4py import MPI

    from tensorxfer.runtime import Communicator

    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    sizes = [parse_size(s) for s in args.sizes]
    largest = max(sizes)
    variants = [v for v in VARIANTS if v in args.variants]

    dist = None
    if "gloo" in variants:
        import torch
        import torch.distributed as dist_module

        port = comm.bcast(free_port() if rank == 0 else None, root=0)
        dist_module.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        dist = dist_module

    group = make_group(comm)
    txf = Communicator(group, max_bytes=args.max_bytes or None, buffer_bytes=largest, timeout=120)
    samples: dict[str, dict[str, list[float]]] = {}
    for nbytes in sizes:
        count = nbytes // 4
        mine = np.zeros(count, np.float32)
        in_buffer = txf.buffer(np.float32, (count,))
        in_buffer[:] = 0
        gloo_tensor = None
        if dist is not None:
            import torch

            gloo_tensor = torch.zeros(count, dtype=torch.float32)
        ops = {
            "mpi": lambda: comm.Allreduce(MPI.IN_PLACE, mine, op=MPI.SUM),
            "tensorxfer": lambda: txf.all_reduce(mine, algorithm=args.algorithm),
            "tensorxfer_buffer": lambda: txf.all_reduce(in_buffer, algorithm=args.algorithm),
            "gloo": lambda: dist.all_reduce(gloo_tensor),
        }
        loops = {name: loop_count(nbytes, args.quick) for name in variants}
        if "gloo" in loops:  # gloo is ~100x slower on small messages: keep its loops short
            loops["gloo"] = max(2, loops["gloo"] // 20)
        per_size: dict[str, list[float]] = {name: [] for name in variants}
        for name in variants:  # warm up (page faults, connections)
            for _ in range(min(3, loops[name])):
                ops[name]()
        for repeat in range(args.repeats):
            order = variants[repeat % len(variants):] + variants[:repeat % len(variants)]
            for name in order:
                comm.Barrier()
                op, n = ops[name], loops[name]
                begin = time.perf_counter()
                for _ in range(n):
                    op()
                elapsed = (time.perf_counter() - begin) / n
                per_size[name].append(comm.allreduce(elapsed, op=MPI.MAX))
        samples[str(nbytes)] = per_size
    txf.close()
    if dist is not None:
        dist.destroy_process_group()
    if rank == 0:
        Path(args.result).write_text(json.dumps({"world": world, "samples": samples}))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# ---- launcher side -----------------------------------------------------------------------


def mpirun_path() -> str:
    candidate = Path(sys.executable).parent / "mpirun"
    return str(candidate) if candidate.exists() else "mpirun"


def launch(ranks: int, args: argparse.Namespace, result: Path) -> dict:
    env = dict(os.environ)
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    command = [mpirun_path(), "-n", str(ranks), "--oversubscribe", sys.executable, str(Path(__file__).resolve()),
               "--rank-worker", "--result", str(result), "--repeats", str(args.repeats),
               "--max-bytes", str(args.max_bytes), "--algorithm", args.algorithm,
               "--sizes", *args.sizes, "--variants", *args.variants]
    if args.quick:
        command.append("--quick")
    subprocess.run(command, env=env, check=True, timeout=args.launch_timeout)
    return json.loads(result.read_text())


TARGETS_2 = {  # size -> (vs mpi, vs mpi with the buffer, vs gloo)
    1 << 10: (1.0, 1.0, 20.0),
    64 << 10: (1.5, 1.5, None),
    1 << 20: (1.5, 1.5, None),
    16 << 20: (1.5, 1.5, None),
    64 << 20: (1.5, 2.0, None),
}


def build_report(results: dict[int, dict], args: argparse.Namespace) -> Any:
    sys.path.insert(0, str(HERE))
    from _report import Report

    report = Report("all-reduce float32 (sum) on one host: tensorxfer vs MPI vs gloo",
                    {"ranks": args.ranks, "sizes": args.sizes, "repeats": args.repeats, "max_bytes": args.max_bytes,
                     "algorithm": args.algorithm, "quick": args.quick})
    for ranks, result in results.items():
        for nbytes_text, per_variant in result["samples"].items():
            nbytes = int(nbytes_text)
            case = f"{ranks} ranks, {size_name(nbytes)}"
            for variant, seconds in per_variant.items():
                report.add(case, variant, "time per all-reduce", [s * 1e6 for s in seconds], "us",
                           lower_is_better=True)
                report.add(case, variant, "bus bandwidth", [algorithm_bandwidth(nbytes, s) for s in seconds], "GB/s",
                           lower_is_better=False)
            if ranks == 2 and nbytes in TARGETS_2:
                vs_mpi, vs_mpi_buffer, vs_gloo = TARGETS_2[nbytes]
            else:
                vs_mpi, vs_mpi_buffer, vs_gloo = (1.0, 1.0, None) if ranks >= 4 else (None, None, None)
            if "mpi" in per_variant:
                if "tensorxfer" in per_variant:
                    report.compare(case, "time per all-reduce", "tensorxfer", "mpi", target=vs_mpi)
                if "tensorxfer_buffer" in per_variant:
                    report.compare(case, "time per all-reduce", "tensorxfer_buffer", "mpi", target=vs_mpi_buffer)
            if "gloo" in per_variant and "tensorxfer" in per_variant:
                report.compare(case, "time per all-reduce", "tensorxfer", "gloo", target=vs_gloo)
    return report


def algorithm_bandwidth(nbytes: int, seconds: float) -> float:
    """Bytes reduced per second (message size / time), in GB/s."""
    return nbytes / seconds / 1e9 if seconds > 0 else float("inf")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--sizes", nargs="+", default=DEFAULT_SIZES, help="message sizes (1K, 64M, ...)")
    parser.add_argument("--variants", nargs="+", default=VARIANTS, choices=VARIANTS)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--max-bytes", type=int, default=0, help="tensorxfer chunk size (0: the Communicator default)")
    parser.add_argument("--algorithm", default="auto", choices=["auto", "one_shot", "two_shot"])
    parser.add_argument("--quick", action="store_true", help="short loops (smoke test)")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="directory for collectives.json / .png")
    parser.add_argument("--launch-timeout", type=float, default=1800)
    parser.add_argument("--rank-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for size in args.sizes:
        parse_size(size)
    if args.rank_worker:
        rank_main(args)
        return 0

    sys.path.insert(0, str(HERE))
    from _report import machine_info

    info = machine_info()
    print(f"CPU: {info['cpu_model']} ({info['cpus']} CPUs), load average {info['load_average_1_5_15'][0]:.2f}; "
          f"tensorxfer {info['tensorxfer']}, numpy {info['numpy']}, torch {info['torch']}", flush=True)
    results: dict[int, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-collectives-") as scratch:
        for ranks in args.ranks:
            results[ranks] = launch(ranks, args, Path(scratch) / f"ranks{ranks}.json")
    report = build_report(results, args)
    print(report.table())
    json_path, png_path = report.write(args.out, "collectives")
    print(f"wrote {json_path}" + (f" and {png_path}" if png_path else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
