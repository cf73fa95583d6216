"""One rank of a Megatron refit test (run by test_megatron_refit.py; not collected).

    python megatron_refit_worker.py BACKEND SCENARIO WORLD RANK INIT_FILE MODE

RANK is ignored under mpirun (the MPI rank is used); INIT_FILE ``env`` takes the rank and a
``tcp://`` rendezvous from the environment (RANK, MASTER_ADDR, MASTER_PORT: a simulated cluster). MODE: ``execute`` runs Megatron's
``execute_reshard_plan`` twice with the service (the second refit into a destination
wiped in between); ``swap`` runs ``swap_model_weights(src, dst, refit_method=service)``
twice; ``persistent`` builds tensorxfer's persistent plan of Megatron's ReshardPlan
(tensorxfer.resharding.megatron.build_refit_plan) and runs it twice. The expected weights come from megatron_models (the layouts alone). Prints
``REFIT OK rank R`` at the end; anything else is a failure.
"""

from __future__ import annotations

import os
import sys
import warnings

warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")
warnings.filterwarnings("ignore", category=UserWarning, module="megatron")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_models as models  # noqa: E402

HIDDEN, FFN = 8, 16


def build_service(backend: str) -> object:
    from tensorxfer.resharding.copy_services import build_copy_service

    if backend == "mpi":
        from mpi4py import MPI

        return build_copy_service("mpi", MPI.COMM_WORLD, timeout=60)
    if backend == "local":
        return build_copy_service("local")
    return build_copy_service(backend, None, timeout=60)


def main() -> None:
    backend, name, world_text, rank_text, init_file, mode = sys.argv[1:7]
    world = int(world_text)
    if init_file == "env":  # a simulated cluster's ranks (SimulatedCluster.start_ranks): tcp:// rendezvous
        rank = int(os.environ["RANK"])
        init_method = f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    else:
        rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", rank_text))
        init_method = f"file://{init_file}"
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    import tensorxfer.resharding.copy_services  # noqa: F401  (before megatron: the lazy registration)
    from megatron.core.resharding import build_centralized_reshard_plan, execute_reshard_plan, swap_model_weights
    from megatron.core.resharding.copy_services.base import CopyService as MegatronCopyService

    src_layout, dst_layout, layers = models.scenario(name, world)
    groups = models.build_groups([src_layout, dst_layout])
    src = models.build_model(src_layout, groups[0], layers, HIDDEN, FFN)
    dst = models.build_model(dst_layout, groups[1], layers, HIDDEN, FFN, fill=-1.0)
    models.check_partition_dims(src)
    models.check_partition_dims(dst)
    service = build_service(backend)
    assert isinstance(service, MegatronCopyService), type(service).__mro__
    addresses = [p.data_ptr() for p in dst.parameters()]
    plan = build_centralized_reshard_plan(src, dst)
    local_ops = sum(op.peer_rank == rank for op in plan.recv_ops)
    refit = None
    if mode == "persistent":
        from tensorxfer.resharding.megatron import build_refit_plan

        refit = build_refit_plan(plan, src, dst, service)
        assert refit.native, refit  # host tensors: a native plan on every backend
    for attempt in range(2):
        if mode == "execute":
            execute_reshard_plan(plan, src, dst, service)
        elif mode == "swap":
            swap_model_weights(src, dst, refit_method=service)
        elif refit is not None:
            assert refit.run(version=attempt) == attempt
        else:
            raise SystemExit(f"unknown mode {mode}")
        wrong = models.mismatches(dst, dst_layout, layers, HIDDEN, FFN)
        assert not wrong, f"refit {attempt}: wrong weights: {wrong}"
        assert [p.data_ptr() for p in dst.parameters()] == addresses, "destination parameters moved"
        with torch.no_grad():
            for param in dst.parameters():
                param.fill_(-1.0)
    service.close()  # type: ignore[attr-defined]
    dist.barrier()
    dist.destroy_process_group()
    routes = f" routes={refit.routes}" if refit is not None else ""
    print(f"REFIT OK rank {rank} recvs={len(plan.recv_ops)} local={local_ops} sends={len(plan.send_ops)}{routes}",
          flush=True)


if __name__ == "__main__":
    main()
