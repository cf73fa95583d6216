"""Ranks of the multi-process fake CUDA tests (spawned children import this module first,
so the fake variant of the extension is installed before tensorxfer is imported)."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fake_core_loader import install  # noqa: E402

core = install()


def ipc_rank(rank: int, name: str, results: Any) -> None:
    """Rank `rank` of 2: writes into the peer's CUDA IpcMemory region, reads its own."""
    from tensorxfer.runtime import IpcMemory, LocalGroup

    with LocalGroup.join(name, rank=rank, world_size=2, timeout=60) as group:
        memory = IpcMemory.create(group, 64, device="cuda", timeout=60)
        ctypes.memmove(memory.remote_data[1 - rank], bytes([rank + 1]) * 8, 8)
        group.barrier(timeout=60)
        seen = ctypes.string_at(memory.remote_data[rank], 8)
        group.barrier(timeout=60)
        memory.close()
        group.barrier(timeout=60)
    results.put((rank, seen, core.fake_cuda.gil_violations()))


def close_rank(rank: int, name: str, results: Any) -> None:
    """Rank `rank` of 2 closes a CUDA IpcMemory; rank 1 is slow to get there. Reports
    whether this rank freed its allocation while the peer still had it open."""
    import time

    from tensorxfer.runtime import IpcMemory, LocalGroup

    with LocalGroup.join(name, rank=rank, world_size=2, timeout=60) as group:
        memory = IpcMemory.create(group, 64, device="cuda", timeout=60)
        group.barrier(timeout=60)
        if rank == 1:
            time.sleep(0.5)  # rank 0 reaches close() first
        memory.close()
        results.put((rank, core.fake_cuda.freed_while_imported(), core.fake_cuda.open_imports(),
                     core.fake_cuda.live_allocations()))
        group.barrier(timeout=60)


def failing_map_rank(rank: int, name: str, results: Any) -> None:
    """Rank 1 cannot open rank 0's handle; both must raise promptly, and no rank may free
    memory the other still has open."""
    from tensorxfer.runtime import IpcMemory, LocalGroup

    if rank == 1:
        core.fake_cuda.fail("cudaIpcOpenMemHandle", 205)  # cudaErrorMapBufferObjectFailed
    with LocalGroup.join(name, rank=rank, world_size=2, timeout=60) as group:
        try:
            IpcMemory.create(group, 64, device="cuda", timeout=20)
            outcome = "created"
        except Exception as error:  # noqa: BLE001 - the test reports the type
            outcome = type(error).__name__
        results.put((rank, outcome, core.fake_cuda.freed_while_imported(), core.fake_cuda.live_allocations()))
        group.barrier(timeout=60)
