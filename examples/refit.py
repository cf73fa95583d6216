"""Refit: Megatron's planner, tensorxfer's persistent plan, two ranks on one host.

A trainer model (tensor-parallel over 2 ranks) and an inference model (TP1, a full copy on
each rank) live on the same two ranks, as in colocated RL post-training. Megatron's
``build_centralized_reshard_plan`` plans the copy once; tensorxfer's ``build_refit_plan``
turns that plan into a persistent plan, and every "training step" ends with one
``plan.run(version=step)``: the weights move in place into the inference model's parameters.

    pip install megatron-core==0.16.1      # needs torch, numpy, packaging
    python examples/refit.py
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import warnings


def rank_main(rank: int, init_file: str) -> None:
    warnings.filterwarnings("ignore")  # megatron warns that Transformer Engine and Apex are absent
    import torch
    import torch.distributed as dist
    from megatron.core.model_parallel_config import ModelParallelConfig  # type: ignore[import-untyped, import-not-found]
    from megatron.core.process_groups_config import ProcessGroupCollection  # type: ignore[import-untyped, import-not-found]
    from megatron.core.resharding import build_centralized_reshard_plan  # type: ignore[import-untyped, import-not-found]
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear  # type: ignore[import-untyped, import-not-found]

    from tensorxfer.resharding.copy_services import build_copy_service
    from tensorxfer.resharding.megatron import build_refit_plan

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    tp2 = dist.new_group([0, 1], backend="gloo")
    tp1 = [dist.new_group([r], backend="gloo") for r in (0, 1)][rank]
    both = dist.new_group([0, 1], backend="gloo")

    class Model(torch.nn.Module):
        """One Megatron layer, with the process groups Megatron's planner reads."""

        def __init__(self, tp_group: object, dp_group: object, tp: int) -> None:
            super().__init__()
            config = ModelParallelConfig(tensor_model_parallel_size=tp, use_cpu_initialization=True)
            self.proj = ColumnParallelLinear(64, 256, config=config, init_method=torch.nn.init.zeros_, bias=False,
                                             gather_output=False, tp_group=tp_group)
            self.pg_collection = ProcessGroupCollection(tp=tp_group, dp=dp_group, pp=tp1)

        def weight(self) -> torch.Tensor:
            return self.proj.weight

    def model(tp_group: object, dp_group: object, tp: int) -> Model:
        return Model(tp_group, dp_group, tp)

    trainer = model(tp2, tp1, tp=2)      # rank r holds rows [128 r, 128 r + 128)
    inference = model(tp1, both, tp=1)   # every rank holds all 256 rows
    reshard_plan = build_centralized_reshard_plan(trainer, inference)
    with build_copy_service("shm", timeout=60) as service:
        refit = build_refit_plan(reshard_plan, trainer, inference, service)  # once
        for step in range(3):
            with torch.no_grad():
                trainer.weight().fill_(10 * step + rank)  # "training": in place
            refit.run(version=step)  # every rank, every step
            rows = inference.weight()
            assert torch.all(rows[:128] == 10 * step) and torch.all(rows[128:] == 10 * step + 1)
        print(f"rank {rank}: {refit.runs} refits, landed version {refit.landed_version}, "
              f"{refit.bytes_per_run} bytes per refit")
        refit.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as directory:
        init_file = os.path.join(directory, "rendezvous")
        context = multiprocessing.get_context("spawn")
        ranks = [context.Process(target=rank_main, args=(rank, init_file)) for rank in (0, 1)]
        for process in ranks:
            process.start()
        for process in ranks:
            process.join(120)
        assert all(process.exitcode == 0 for process in ranks), [process.exitcode for process in ranks]
