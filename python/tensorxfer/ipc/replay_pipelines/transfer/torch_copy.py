"""Portable torch-copy replay transfer backend.

``dst.copy_(src)`` on whatever torch device the learner uses (mps, a
privateuse1 backend, ..., and the CPU).  Where the device has events
(``torch.Event``) the copy is non-blocking and a per-slot event tracks it; on
the CPU, and on devices without events, the copy is synchronous and the slot
is ready when ``submit_h2d`` returns.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

from tensorxfer.ipc.replay_pipelines.transfer._common import SubmittedCopy, TransferBackendBase, wait_blocking
from tensorxfer.ipc.replay_pipelines.transfer._torch_device import (
    host_slot_tensors,
    import_torch,
    parse_device,
    prepare_torch_copy,
    require_present_device,
    torch_allocate,
)


def _device_events(torch, device, count: int):
    """Makes ``count`` torch.Event objects for ``device``, or returns None if it has none.

    The CPU and backends without event support have none: tried by recording one.
    """
    if device.type == "cpu":
        return None
    try:
        probe = torch.Event(device=device)
        probe.record()
        probe.synchronize()
        return [torch.Event(device=device) for _ in range(count)]
    except (RuntimeError, NotImplementedError, TypeError, AttributeError):
        return None


class TorchCopyReplayTransferBackend(TransferBackendBase):
    """Replay transfer through ``Tensor.copy_`` on any torch device (including the CPU).

    ``supports_async_submit`` is True only where per-slot ``torch.Event``
    objects work; ``allocate_device_slots`` returns torch tensors on the device
    (numpy dtypes and names are mapped to torch dtypes).  Host slots may be
    torch tensors or numpy arrays; they are only validated and pre-faulted by
    ``register_host_slots`` (pageable memory, never pinned).
    """

    h2d_submitter = "torch_tensor_copy"
    host_memory_kind = "pageable_shared"
    host_pinned = False
    direct_pinned_shared = False
    supports_timing_events = False

    def __init__(self, *, device: Any, ring_depth: int) -> None:
        super().__init__(ring_depth=ring_depth)
        torch = import_torch("TorchCopyReplayTransferBackend")
        self._torch = torch
        self.device = require_present_device(torch, parse_device(torch, device))
        self.device_family = self.device.type
        self._events = _device_events(torch, self.device, self.ring_depth)
        self.supports_async_submit = self._events is not None

    def _register_host_slots_impl(self, slots: List[Any]) -> List[Any]:
        host_slot_tensors(self._torch, slots, prefault=True)
        return []  # pageable: nothing to undo, and the slots are not kept alive

    def _allocate_impl(self, count: int, shape: Tuple[int, ...], dtype: Any) -> List[Any]:
        return torch_allocate(self._torch, count, shape, dtype, self.device)

    def _enqueue_h2d(self, slot: int, dst: Any, src: Any, h2d_bytes: Any, timing: bool) -> SubmittedCopy:
        dst_tensor, src_tensor, nbytes = prepare_torch_copy(
            self._torch, dst=dst, src=src, h2d_bytes=h2d_bytes, device=self.device
        )
        if nbytes:
            dst_tensor.copy_(src_tensor, non_blocking=self.supports_async_submit)
        if self._events is not None:
            self._events[slot].record()
        return SubmittedCopy(nbytes)

    def _query_ready(self, slot: int) -> bool:
        return self._events is None or self._events[slot].query()

    def _wait_ready(self, slot: int, timeout: Optional[float]) -> None:
        if self._events is not None:
            event = self._events[slot]
            wait_blocking(event.synchronize, timeout, f"the copy into slot {slot} on {self.device}", done=event.query)

    def _stream_wait_ready(self, slot: int, timeout: Optional[float]) -> None:
        if self._events is not None:
            self._events[slot].wait()  # orders the device's current stream; returns at once

    def _close_impl(self) -> None:
        if self._events is not None:
            for event in self._events:
                wait_blocking(event.synchronize, 10.0, f"a pending copy on {self.device} at close", done=event.query)
        self._events = None


__all__ = ["TorchCopyReplayTransferBackend"]
