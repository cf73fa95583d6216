"""The part of the CUDA/ROCm and XPU backends that is the same: one copy stream,
one ready event per slot, ``torch.<runtime>`` streams and events."""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

from tensorxfer.ipc.replay_pipelines.transfer._common import SubmittedCopy, TransferBackendBase, poll_until_done
from tensorxfer.ipc.replay_pipelines.transfer._torch_device import (
    import_torch,
    parse_device,
    prepare_torch_copy,
    require_present_device,
    torch_allocate,
)

CLOSE_TIMEOUT_S = 10.0


class TorchStreamBackendBase(TransferBackendBase):
    """Copies on a dedicated ``torch.<runtime>.Stream`` and records a
    ``torch.<runtime>.Event`` per slot.  Subclasses set ``_runtime_name``
    ("cuda" or "xpu") and implement the host-slot registration hooks."""

    _runtime_name: str

    def __init__(self, *, device: Any, ring_depth: int) -> None:
        super().__init__(ring_depth=ring_depth)
        name = type(self).__name__
        torch = import_torch(name)
        requested = parse_device(torch, device)
        if requested.type != self._runtime_name:
            raise ValueError(
                f"{name} needs a '{self._runtime_name}' device, got '{requested}' "
                "(build_replay_transfer_backend picks the backend for a device)"
            )
        self.device = require_present_device(torch, requested)
        self._torch = torch
        self._runtime = getattr(torch, self._runtime_name)
        self._copy_stream = self._runtime.Stream(device=self.device)
        self._ready_events = [self._runtime.Event() for _ in range(self.ring_depth)]

    def _allocate_impl(self, count: int, shape: Tuple[int, ...], dtype: Any) -> List[Any]:
        return torch_allocate(self._torch, count, shape, dtype, self.device)

    def _enqueue_h2d(self, slot: int, dst: Any, src: Any, h2d_bytes: Any, timing: bool) -> SubmittedCopy:
        dst_tensor, src_tensor, nbytes = prepare_torch_copy(
            self._torch, dst=dst, src=src, h2d_bytes=h2d_bytes, device=self.device
        )
        stream = self._copy_stream
        start_event = end_event = None
        with self._runtime.stream(stream):
            if timing:
                start_event = self._runtime.Event(enable_timing=True)
                start_event.record(stream)
            if nbytes:
                dst_tensor.copy_(src_tensor, non_blocking=True)
            self._ready_events[slot].record(stream)
            if timing:
                end_event = self._runtime.Event(enable_timing=True)
                end_event.record(stream)
        return SubmittedCopy(nbytes, start_event, end_event)

    def _query_ready(self, slot: int) -> bool:
        return self._ready_events[slot].query()

    def _wait_ready(self, slot: int, timeout: Optional[float]) -> None:
        poll_until_done(self._ready_events[slot].query, timeout, f"the copy into slot {slot} on {self.device}")

    def _stream_wait_ready(self, slot: int, timeout: Optional[float]) -> None:
        self._runtime.current_stream(self.device).wait_event(self._ready_events[slot])

    def _close_impl(self) -> None:
        stream = getattr(self, "_copy_stream", None)
        if stream is not None:
            poll_until_done(stream.query, CLOSE_TIMEOUT_S, f"the copy stream of {type(self).__name__} at close")
        self._copy_stream = None


__all__ = ["TorchStreamBackendBase"]
