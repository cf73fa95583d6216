"""Issue 13 section 5: "used after close" is one exception everywhere:
``tensorxfer.errors.ClosedError`` ("<kind> is closed"), a ValueError and a
TensorxferError; and one timeout parser, ``tensorxfer.errors.check_timeout``."""

from __future__ import annotations

import uuid
from typing import List

import numpy as np
import pytest

from tensorxfer import _core
from tensorxfer.errors import ClosedError, TensorxferError, check_timeout
from tensorxfer.inference._host_pool import create_host_mempool
from tensorxfer.ipc.replay_pipelines.transfer.factory import build_replay_transfer_backend
from tensorxfer.ipc.shared_array import SharedArray
from tensorxfer.ipc.slot_ring import SlotRing
from tensorxfer.resharding.pipeline_executor import DoubleBufferManager
from tensorxfer.runtime import Communicator, HostStream, IpcMemory, LocalGroup


def _one_rank_group() -> LocalGroup:
    return LocalGroup.join(f"closed-{uuid.uuid4().hex[:10]}", rank=0, world_size=1, timeout=10)


def _closed_cases() -> List[tuple]:
    cases: List[tuple] = []

    group = _one_rank_group()
    group.close()
    cases.append(("LocalGroup", lambda: group.barrier(timeout=1)))

    holder = _one_rank_group()
    memory = IpcMemory.create(holder, 4096)
    memory.close()
    cases.append(("IpcMemory", lambda: memory.buffer(0, np.uint8, (8,))))
    comm = Communicator(holder, max_bytes=4096)
    comm.close()
    cases.append(("Communicator", lambda: comm.barrier(timeout=1)))
    buffers = DoubleBufferManager(holder, 4096)
    buffers.close()
    cases.append(("DoubleBufferManager", lambda: buffers.send_slot(0)))
    holder.close()

    ring = SlotRing.create(2, 64)
    ring.close()
    cases.append(("ring", lambda: ring.acquire_free(timeout=0)))
    array = SharedArray.create((4,), "float32")
    array.close()
    cases.append(("shared array", lambda: array.array))
    pool = create_host_mempool()
    pool.close()
    cases.append(("HostPool", lambda: pool.allocate_block(64)))
    stream = HostStream(None)
    stream.close()
    cases.append(("HostStream", lambda: stream.record(_core.HostEvent())))
    backend = build_replay_transfer_backend(device="cpu", ring_depth=2)
    backend.close()
    cases.append((type(backend).__name__, lambda: backend.ready_query(0)))
    return cases


def test_every_class_raises_closed_error_after_close():
    for kind, use in _closed_cases():
        with pytest.raises(ClosedError, match=f"{kind} is closed") as caught:
            use()
        assert isinstance(caught.value, ValueError) and isinstance(caught.value, TensorxferError), kind


def test_check_timeout_is_the_one_parser():
    assert check_timeout(None, "op") is None
    assert check_timeout(2, "op") == 2.0
    with pytest.raises(ValueError, match="op"):
        check_timeout(-1, "op")
    with pytest.raises(TypeError, match="op"):
        check_timeout("1", "op")
    import tensorxfer.ipc.replay_pipelines.transfer._common as common

    assert not hasattr(common, "resolve_timeout")  # the duplicate name is gone
