"""IpcMemory(device="cuda") across two spawned processes (needs CUDA devices)."""

from __future__ import annotations

import pytest

from collectives_workers import run_spawned
from cuda_availability import fail_if_the_core_misses_torchs_gpu

torch = pytest.importorskip("torch", reason="torch is not installed (pip install .[torch])")
fail_if_the_core_misses_torchs_gpu(torch)

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.multiprocess,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine"),
]


def map_cuda_regions(group) -> list:
    import torch

    from tensorxfer.runtime import IpcMemory

    torch.cuda.set_device(group.rank % torch.cuda.device_count())
    with IpcMemory.create(group, 1 << 20, device="cuda", timeout=60) as memory:
        return [memory.num_workers, memory.worker_id, len(memory.remote_data), memory.barrier_flag,
                all(address != 0 for address in memory.remote_data + memory.barrier_in + memory.barrier_out)]


def test_cuda_ipc_memory_maps_every_rank(tmp_path):
    results = run_spawned(2, map_cuda_regions, (), str(tmp_path))
    for rank, result in enumerate(results):
        assert result == [2, rank, 2, 0, True]
