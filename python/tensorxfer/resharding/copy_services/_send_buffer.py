"""The shm backend's shared send buffers (private).

Each rank's IpcMemory region holds the pipeline's slots, then (page aligned)
its send buffer of ``nbytes``. A task whose source lies wholly in its sender's
buffer is read by the receiver straight from the mapping, in one copy.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from tensorxfer.resharding.copy_services import _tensors
from tensorxfer.resharding.copy_services._shm_plan import FLAG_IN_SEND_BUFFER
from tensorxfer.runtime.ipc_memory import IpcMemory, typed_view

#: What a sender publishes for a task whose source is not in its send buffer.
NOT_IN_BUFFER = np.uint64(2**64 - 1)
_PAGE = 4096


class SendBuffers:
    """Every rank's send buffer in ``memory`` (``nbytes`` each, after ``pipeline_nbytes``)."""

    def __init__(self, pipeline_nbytes: int, nbytes: int, rank: int) -> None:
        self.offset = (pipeline_nbytes + _PAGE - 1) // _PAGE * _PAGE  # in each rank's region
        self.nbytes = nbytes
        self.rank = rank
        self.memory: Optional[IpcMemory] = None  # the mapping, once made (region of offset + nbytes)

    def _memory(self) -> IpcMemory:
        assert self.memory is not None  # set by a constructor that returned
        return self.memory

    def view(self, dtype: Any, shape: Any) -> Any:
        """A view of this rank's buffer (numpy or torch by dtype); ValueError if it does not fit."""
        region = self._memory()._native.region(self.rank)
        return typed_view(region[self.offset:self.offset + self.nbytes], dtype, shape, "ShmCopyService.buffer")

    def start(self) -> np.uint64:
        """Where this rank's send buffer starts, in its own address space."""
        return np.uint64(int(self._memory().remote_data[self.rank]) + self.offset)

    def offsets(self, addresses: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
        """Each [address, address + nbytes)'s offset in this rank's buffer, NOT_IN_BUFFER
        where it does not lie wholly inside."""
        start = self.start()
        addresses = addresses.astype(np.uint64)
        inside = (addresses >= start) & (addresses + nbytes.astype(np.uint64) <= start + np.uint64(self.nbytes))
        return np.where(inside, addresses - start, NOT_IN_BUFFER)

    def send_flags(self, spans: _tensors.Spans, rows: np.ndarray) -> Optional[np.ndarray]:
        """The FLAGS column of the sends ``spans[rows]``: FLAG_IN_SEND_BUFFER for each inside."""
        if self.nbytes == 0:
            return None
        inside = spans.contiguous[rows] & (self.offsets(spans.address[rows], spans.nbytes[rows]) != NOT_IN_BUFFER)
        return inside.astype(np.int64) * FLAG_IN_SEND_BUFFER

    def peer_addresses(self, sources: np.ndarray, offsets: np.ndarray, sizes: np.ndarray, backend: str) -> np.ndarray:
        """Where offsets[i] of rank sources[i]'s buffer is mapped in this process. Every rank's
        buffer has nbytes (IpcMemory checks the region sizes): a peer's offsets are checked
        against it before anything is read (RuntimeError)."""
        limit = np.uint64(self.nbytes)
        if np.any(offsets > limit) or np.any(sizes > limit - offsets):
            raise RuntimeError(f"{backend}: a peer published a task past its {self.nbytes}-byte send buffer")
        regions = np.array(self._memory().remote_data, np.uint64) + np.uint64(self.offset)
        return regions[sources] + offsets


__all__ = ["NOT_IN_BUFFER", "SendBuffers"]
