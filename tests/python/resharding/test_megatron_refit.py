"""megatron-core 0.16.1 as a client: its planner, its executor and its swap_model_weights
over tensorxfer's copy services, with its own ColumnParallelLinear / RowParallelLinear on
the CPU over gloo (issue 32, part 1).

The rank processes are megatron_refit_worker.py; the expected weights come from
megatron_models (the layouts alone, not from anything Megatron computed). Before the
``_with_id`` methods every colocated case failed on every rank ("local (same-rank) transfer
requires a task_id"), and ``swap`` raised TypeError (not a Megatron CopyService).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import copy_service_launch as launch  # noqa: E402
import warm_launcher  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "megatron_refit_worker.py")
TIMEOUT = 240.0


def _launch(backend: str, scenario: str, world: int, mode: str) -> tuple:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    rendezvous_dir = tempfile.mkdtemp(prefix="megatron-refit-")
    init_file = os.path.join(rendezvous_dir, "rendezvous")
    try:
        if backend == "mpi":
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                       OMPI_MCA_rmaps_base_oversubscribe="1", PRTE_MCA_rmaps_default_mapping_policy=":oversubscribe")
            command = [launch.mpirun_path(), "--oversubscribe", "-n", str(world), sys.executable, WORKER, backend,
                       scenario, str(world), "0", init_file, mode]
            processes = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True)]
        else:
            processes = [warm_launcher.popen([sys.executable, WORKER, backend, scenario, str(world), str(rank),
                                              init_file, mode], env=env, stdout=subprocess.PIPE,
                                             stderr=subprocess.STDOUT, text=True, preload=("megatron.core",))
                         for rank in range(world)]
        return launch._collect(processes, TIMEOUT)
    finally:
        import shutil

        shutil.rmtree(rendezvous_dir, ignore_errors=True)


def check_refit(backend: str, scenario: str, world: int, mode: str = "execute") -> None:
    launch.megatron_or_skip()
    reason = launch.unavailable(backend)
    if reason:
        pytest.skip(reason)
    codes, output = _launch(backend, scenario, world, mode)
    assert all(code == 0 for code in codes), f"exit codes {codes}:\n{output[-6000:]}"
    for rank in range(world):
        assert f"REFIT OK rank {rank} " in output, f"rank {rank} did not finish:\n{output[-6000:]}"


def case(backend: str, scenario: str, world: int, mode: str = "execute", *marks):
    return pytest.param(backend, scenario, world, mode, marks=list(marks), id=f"{backend}-{scenario}-x{world}-{mode}")


# The full tier keeps one case of each executor on each backend and layout; the stress tier
# adds the rest (the same paths again: each case costs about 7 s of CI).
CASES = [
    # The colocated refit, 2 ranks: 8 of each rank's 14 receives are same-rank copies.
    case("shm", "tp2_to_tp1", 2, "execute", pytest.mark.fast),
    case("torch", "tp2_to_tp1", 2),
    case("mpi", "tp2_to_tp1", 2),
    case("shm", "tp2_to_tp1", 2, "swap"),
    case("torch", "tp2_to_tp1", 2, "swap", pytest.mark.stress),
    # Not colocated, 2 ranks: every op crosses processes.
    case("shm", "tp1_to_tp1_apart", 2),
    case("torch", "tp1_to_tp1_apart", 2, "execute", pytest.mark.stress),
    # tensorxfer's persistent plan of Megatron's ReshardPlan (in place, no staging).
    case("shm", "tp2_to_tp1", 2, "persistent"),
    case("shm", "tp1_to_tp1_apart", 2, "persistent", pytest.mark.stress),
    case("torch", "tp2_to_tp1", 2, "persistent"),
    case("local", "tp1_to_tp1", 1, "persistent"),
    case("shm", "tp2pp2_to_tp1dp4", 4, "persistent", pytest.mark.stress),
    # One process: the local backend, every op a same-rank copy.
    case("local", "tp1_to_tp1", 1, "execute", pytest.mark.stress),
    case("local", "tp1_to_tp1", 1, "swap", pytest.mark.stress),
    # 4 ranks (stress): TP2xPP2 -> TP1xDP4 colocated, and TP2 -> TP1 not colocated.
    case("shm", "tp2pp2_to_tp1dp4", 4, "execute", pytest.mark.stress),
    case("torch", "tp2pp2_to_tp1dp4", 4, "execute", pytest.mark.stress),
    case("mpi", "tp2pp2_to_tp1dp4", 4, "execute", pytest.mark.stress),
    case("shm", "tp2pp2_to_tp1dp4", 4, "swap", pytest.mark.stress),
    case("shm", "tp2_to_tp1_apart", 4, "execute", pytest.mark.stress),
    case("torch", "tp2_to_tp1_apart", 4, "execute", pytest.mark.stress),
]


@pytest.mark.multiprocess
@pytest.mark.parametrize("backend,scenario,world,mode", CASES)
def test_megatron_refit(backend, scenario, world, mode):
    check_refit(backend, scenario, world, mode)


def _python(code: str) -> str:
    """Runs ``code`` in a fresh interpreter (megatron's import warns and is heavy: not in
    the test process); returns its stdout, failing with its output when it fails."""
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                            timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_importing_tensorxfer_does_not_import_megatron():
    out = _python("""
        import sys
        import tensorxfer
        from tensorxfer.resharding.copy_services import build_copy_service, LocalCopyService
        build_copy_service("local").close()
        print(sorted(name for name in sys.modules if name.split(".")[0] == "megatron"))
    """)
    assert out.strip() == "[]"


# Each case imports megatron in a child (about 6 s): the fast tier runs one order.
@pytest.mark.parametrize("order", [pytest.param("tensorxfer_first", marks=pytest.mark.slow), "megatron_first"])
def test_services_are_megatron_copy_services(order):
    launch.megatron_or_skip()
    first, second = ("import tensorxfer.resharding.copy_services as services",
                     "from megatron.core.resharding.copy_services.base import CopyService")
    if order == "megatron_first":
        first, second = second, first
    out = _python(f"""
        import warnings
        warnings.simplefilter("ignore")
        {first}
        {second}
        import tensorxfer.resharding.copy_services as services
        from megatron.core.resharding import swap_model_weights  # noqa: F401
        service = services.build_copy_service("local")
        print(isinstance(service, CopyService), issubclass(services.MpiCopyService, CopyService),
              issubclass(services.ShmCopyService, CopyService),
              issubclass(services.TorchDistributedCopyService, CopyService))
        service.close()
    """)
    assert out.split() == ["True"] * 4


def test_local_service_takes_megatron_submit_order():
    """Megatron's executor calls submit_send_with_id(task_id, tensor, peer); a same-rank pair
    submitted so is matched by its id (this raised AttributeError before)."""
    import numpy as np

    from tensorxfer.resharding.copy_services import LocalCopyService, build_copy_service
    from tensorxfer.resharding.copy_services.factory import BACKENDS

    import importlib

    for module_name, class_name in BACKENDS.values():
        try:
            service_class = getattr(importlib.import_module(module_name), class_name)
        except ImportError:
            continue
        for method, argument in (("submit_send_with_id", "src_tensor"), ("submit_recv_with_id", "dest_tensor")):
            code = getattr(service_class, method).__code__
            assert code.co_varnames[1:4] == ("task_id", argument, "dest_rank" if "send" in method else "src_rank")
    with build_copy_service("local") as service:
        assert isinstance(service, LocalCopyService)
        sources = [np.arange(10, dtype=np.float32) + i for i in range(3)]
        targets = [np.zeros(10, np.float32) for _ in range(3)]
        for task_id in (2, 0, 1):
            service.submit_recv_with_id(task_id, targets[task_id], 0)
        for task_id in range(3):
            service.submit_send_with_id(task_id, sources[task_id], 0)
        service.run()
        for source, target in zip(sources, targets):
            np.testing.assert_array_equal(source, target)


@pytest.mark.multiprocess
def test_refit_example_runs():
    """examples/refit.py, as a user runs it: two ranks, Megatron's planner, a persistent plan."""
    launch.megatron_or_skip()
    example = os.path.join(HERE, os.pardir, os.pardir, os.pardir, "examples", "refit.py")
    result = subprocess.run([sys.executable, example], capture_output=True, text=True, timeout=TIMEOUT,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in (0, 1):
        assert f"rank {rank}: 3 refits, landed version 2" in result.stdout, result.stdout + result.stderr
