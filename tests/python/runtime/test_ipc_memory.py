"""IpcMemory across spawned processes: the reference fields, views of every
rank's region (numpy and torch), names gone from /dev/shm after create, and
argument errors."""

from __future__ import annotations

import os

import numpy as np
import pytest

import tensorxfer
from tensorxfer.runtime import IpcMemory

from collectives_workers import FileGroup, run_spawned


def shm_names_of(pid: int) -> list[str]:
    return [name for name in os.listdir("/dev/shm") if name.startswith(f"tensorxfer-{pid}-")]


def exchange_through_regions(group, nbytes: int) -> dict:
    """Each rank writes into its region; after a barrier every rank reads all of them."""
    with IpcMemory.create(group, nbytes, timeout=60) as memory:
        leftover = shm_names_of(os.getpid())
        mine = memory.buffer(memory.worker_id, np.int64, (4,))
        mine[:] = [memory.worker_id, 10, 20, 30]
        group.barrier(timeout=60)
        seen = [memory.buffer(rank, np.int64, (4,)).tolist() for rank in range(memory.num_workers)]
        torch_seen = None
        try:
            import torch

            torch_seen = memory.buffer(0, torch.int64, (2, 2)).tolist()
        except ImportError:
            pass
        group.barrier(timeout=60)
        return {
            "num_workers": memory.num_workers,
            "worker_id": memory.worker_id,
            "remote_data": len(memory.remote_data),
            "distinct": len(set(memory.remote_data)),
            "barrier_in": len(memory.barrier_in),
            "barrier_out": len(memory.barrier_out),
            "barrier_flag": memory.barrier_flag,
            "leftover": leftover,
            "seen": seen,
            "torch_seen": torch_seen,
            "nbytes": memory.nbytes,
        }


@pytest.mark.multiprocess
def test_every_rank_sees_every_region_and_no_name_is_left(tmp_path):
    results = run_spawned(3, exchange_through_regions, (10_000,), str(tmp_path))
    for rank, result in enumerate(results):
        assert result["num_workers"] == 3 and result["worker_id"] == rank
        assert result["remote_data"] == result["distinct"] == 3
        assert result["barrier_in"] == result["barrier_out"] == 3
        assert result["barrier_flag"] == 0
        assert result["leftover"] == [], "names must be unlinked once every rank mapped"
        assert result["seen"] == [[r, 10, 20, 30] for r in range(3)]
        assert result["nbytes"] == 10_000
        if result["torch_seen"] is not None:
            assert result["torch_seen"] == [[0, 10], [20, 30]]


def test_single_rank_and_argument_errors(tmp_path):
    group = FileGroup(str(tmp_path), 0, 1)
    with IpcMemory.create(group, 64) as memory:
        assert memory.remote_data == [memory.remote_data[0]] and memory.remote_data[0] != 0
        assert memory.device == "cpu"
        view = memory.buffer(0, np.float32, 16)
        view[:] = 1.5
        assert memory.buffer(0, np.float32, (4, 4)).sum() == 24.0
        with pytest.raises(ValueError, match="needs 68 bytes"):
            memory.buffer(0, np.float32, 17)
        with pytest.raises(ValueError, match=r"^rank: expected a rank in \[0, 1\), got 1$"):
            memory.buffer(1, np.float32, 1)
    assert memory.closed
    with pytest.raises(ValueError, match="nbytes"):
        IpcMemory.create(group, -1)
    with pytest.raises(ValueError, match="device"):
        IpcMemory.create(group, 64, device="tpu")
    assert view.sum() == 24.0  # the view kept its mapping


def test_cuda_variant_without_a_device_says_why(tmp_path):
    try:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a CUDA device is present: see test_ipc_memory_cuda.py")
    except ImportError:
        pass
    with pytest.raises(tensorxfer.UnsupportedError, match="cuda|CUDA"):
        IpcMemory.create(FileGroup(str(tmp_path), 0, 1), 64, device="cuda")
