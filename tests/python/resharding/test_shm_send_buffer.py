"""ShmCopyService's shared send buffer: tasks whose source is a view of it are
read by the receiver straight from the shared mapping (one user-space copy),
large or small; sources outside it still move by cross-memory attach or the
pipeline."""

from __future__ import annotations

import os
import sys
import uuid

import numpy as np
import pytest

from tensorxfer.errors import ClosedError
from tensorxfer.resharding.copy_services import ShmCopyService
from tensorxfer.runtime import LocalGroup

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from copy_service_launch import run_ranks  # noqa: E402

MIB = 1 << 20


def pattern(seed: int, nbytes: int) -> np.ndarray:
    return ((np.arange(nbytes, dtype=np.int64) * 31 + seed * 7) % 251).astype(np.uint8)


def exchange_rank(name: str, rank: int, world: int, cma_min_bytes) -> dict:
    """Rank `rank` sends four tasks to its partner: two large from the buffer
    (numpy and torch views), one large from private memory, one small from the
    buffer; receives the partner's four and checks every byte, twice."""
    import torch

    with LocalGroup.join(name, rank=rank, world_size=world, timeout=60) as group, \
            ShmCopyService(group, timeout=60, buffer_bytes=8 * MIB, cma_min_bytes=cma_min_bytes) as service:
        peer = rank ^ 1
        counts = []
        for run in range(2):
            staged = service.buffer(np.uint8, (8 * MIB,))
            sizes = {"buffer numpy": 2 * MIB + 64, "buffer torch": 3 * MIB, "private": 2 * MIB, "small": 4096}
            sources = {
                "buffer numpy": staged[:sizes["buffer numpy"]],
                "buffer torch": torch.from_numpy(staged[4 * MIB:7 * MIB]),
                "private": np.empty(sizes["private"], np.uint8),
                "small": staged[7 * MIB:7 * MIB + 4096],
            }
            targets = {}
            for index, (kind, nbytes) in enumerate(sizes.items()):
                source = sources[kind]
                data = pattern(100 * run + 10 * rank + index, nbytes)
                if isinstance(source, torch.Tensor):
                    source.copy_(torch.from_numpy(data))
                else:
                    source[:] = data
                service.submit_send(source, peer, 1000 * rank + index)
                targets[kind] = np.zeros(nbytes, np.uint8)
                service.submit_recv(targets[kind], peer, 1000 * peer + index)
            service.run()
            for index, (kind, nbytes) in enumerate(sizes.items()):
                expected = pattern(100 * run + 10 * peer + index, nbytes)
                assert np.array_equal(targets[kind], expected), f"run {run}: {kind} arrived wrong"
            counts.append(service.buffer_tasks_read)
        return {"counts": counts, "cma": bool(service.cma_pairs[peer, rank])}


@pytest.mark.multiprocess
@pytest.mark.parametrize("cma_min_bytes", [MIB, None], ids=["with-cma", "cma-off"])
def test_sources_in_the_send_buffer_are_read_from_it(cma_min_bytes):
    got = run_ranks(exchange_rank, 2, cma_min_bytes, deadline=120.0)
    for rank in range(2):
        # The three buffer views (two large, one small) each run; private memory goes by
        # cross-memory attach or the pipeline, whichever the kernel permits.
        assert got[rank]["counts"] == [3, 6], got[rank]


def test_buffer_views_and_argument_errors():
    name = f"sendbuf-{uuid.uuid4().hex[:10]}"
    with LocalGroup.join(name, rank=0, world_size=1, timeout=30) as group:
        with pytest.raises(ValueError, match="buffer_bytes"):
            ShmCopyService(group, buffer_bytes=-1)
        service = ShmCopyService(group, buffer_bytes=MIB)
        view = service.buffer(np.float32, (MIB // 4,))
        view[:] = 2.0
        assert service.buffer(np.float32, (16,)).sum() == 32.0  # views share the buffer's first bytes
        with pytest.raises(ValueError, match="needs 1048580 bytes"):
            service.buffer(np.float32, (MIB // 4 + 1,))
        empty = ShmCopyService(group)
        with pytest.raises(ValueError, match="needs 4 bytes"):
            empty.buffer(np.float32, (1,))
        empty.close()
        service.close()
        with pytest.raises(ClosedError, match="^ShmCopyService is closed$"):
            service.buffer(np.uint8, (1,))
    assert view.sum() == 2.0 * (MIB // 4)  # the view kept its mapping
