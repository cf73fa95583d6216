"""Starting the rank programs of torch_backend_workers.py: plain processes or under mpirun.

:func:`launch` runs a scenario to the end and loads each rank's result;
:func:`start` / :func:`finish` (and :func:`kill_and_finish`) give the test the
processes in between; :func:`mpirun_command` is the same under ``mpirun``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

import warm_launcher

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "torch_backend_workers.py")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def launch(scenario: str, world: int, backend: str, out_dir: str, *, timeout_s: float = 60.0,
           wrappers: Optional[Sequence[Sequence[str]]] = None, pg_timeout_s: float = 30.0,
           extra: str = "") -> List[Any]:
    """Runs ``scenario`` on ``world`` ranks; returns each rank's result (raises with their output on failure).

    ``wrappers[r]`` prefixes rank r's command (e.g. an ``unshare`` that gives it its own /dev/shm).
    """
    import torch

    processes = start(scenario, world, backend, out_dir, wrappers=wrappers, pg_timeout_s=pg_timeout_s, extra=extra)
    outputs = finish(processes, timeout_s)
    failed = [rank for rank, (code, _) in enumerate(outputs) if code != 0]
    if failed:
        text = "\n".join(f"--- rank {r} exit {code}\n{out}" for r, (code, out) in enumerate(outputs))
        raise AssertionError(f"{scenario} with {backend}: ranks {failed} failed\n{text}")
    return [torch.load(os.path.join(out_dir, f"{rank}.pt")) for rank in range(world)]


def start(scenario: str, world: int, backend: str, out_dir: str, *,
          wrappers: Optional[Sequence[Sequence[str]]] = None, pg_timeout_s: float = 30.0,
          extra: str = "") -> List[subprocess.Popen]:
    init = f"tcp://127.0.0.1:{free_port()}"
    env = worker_env()
    processes = []
    for rank in range(world):
        prefix = list(wrappers[rank]) if wrappers else []
        command = prefix + [sys.executable, WORKER, scenario, str(rank),
                            str(world), backend, init, out_dir, str(pg_timeout_s), extra]
        processes.append(warm_launcher.popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                             text=True))
    return processes


MPIRUN = os.path.join(os.path.dirname(sys.executable), "mpirun")


def mpirun_command(scenario: str, world: int, backend: str, out_dir: str, *,
                   wrappers: Optional[Sequence[Sequence[str]]] = None, pg_timeout_s: float = 30.0,
                   extra: str = "") -> List[str]:
    """An ``mpirun`` command line running ``scenario`` on ``world`` ranks (MPMD: one app context per rank,
    so ``wrappers[r]`` prefixes rank r's command); MPI over TCP (the ranks may not share /dev/shm)."""
    init = f"tcp://127.0.0.1:{free_port()}"
    command = [MPIRUN, "--oversubscribe", "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo",
               "-x", "PYTHONPATH"]
    if os.geteuid() == 0:
        command.append("--allow-run-as-root")
    for rank in range(world):
        prefix = list(wrappers[rank]) if wrappers else []
        if rank:
            command.append(":")
        command += ["-np", "1"] + prefix + [sys.executable, WORKER, scenario,
                                            "mpi", str(world), backend, init, out_dir, str(pg_timeout_s), extra]
    return command


def worker_env() -> Dict[str, str]:
    env = dict(os.environ)
    paths = (HERE, *env.get("PYTHONPATH", "").split(os.pathsep), *sys.path)
    # absolute: mpirun's daemons start ranks in another directory
    env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in paths if p)
    return env


def kill_and_finish(processes: List[subprocess.Popen], victim: int, timeout_s: float) -> tuple:
    """Waits for the victim's READY line, SIGKILLs it, then :func:`finish`; returns (outputs, seconds since the kill)."""
    import signal

    line = processes[victim].stdout.readline() if processes[victim].stdout else ""
    assert "READY" in line, line
    killed_at = time.monotonic()
    processes[victim].send_signal(signal.SIGKILL)
    outputs = finish(processes, timeout_s)
    return outputs, time.monotonic() - killed_at


def finish(processes: List[subprocess.Popen], timeout_s: float) -> List[tuple]:
    deadline = time.monotonic() + timeout_s
    outputs = []
    for process in processes:
        try:
            out, _ = process.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            out, _ = process.communicate()
            out += "\n[killed by the test: timeout]"
        outputs.append((process.returncode, out))
    return outputs
