"""The part of the CUDA/ROCm and XPU backends that is the same: one copy stream,
one ready event per slot, ``torch.<runtime>`` streams and events."""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

from tensorxfer.ipc.replay_pipelines.transfer._common import SubmittedCopy, TransferBackendBase, wait_blocking
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
    ("cuda" or "xpu") and implement the host-slot registration hooks; they may
    replace how the copy is issued (``_order_copy_stream``, ``_issue_copy``).

    Every copy first waits (on the device) for the work queued so far on the
    caller's current stream, so a ``dst`` still read by the previous step is not
    overwritten early.  The tensors of a copy are kept alive until its slot's
    event is known to have completed.
    """

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
        self._ready_events = [self._new_ready_event() for _ in range(self.ring_depth)]
        # Per slot, the (dst, src) tensors of copies not yet known to be done.
        self._in_flight: List[List[Tuple[Any, Any]]] = [[] for _ in range(self.ring_depth)]

    def _new_ready_event(self) -> Any:
        """A slot's ready event (subclasses pick flags, e.g. blocking sync)."""
        return self._runtime.Event()

    def _allocate_impl(self, count: int, shape: Tuple[int, ...], dtype: Any) -> List[Any]:
        return torch_allocate(self._torch, count, shape, dtype, self.device)

    # -- how a copy is issued (torch by default) ---------------------------------
    def _order_copy_stream(self, copy_stream: Any, current_stream: Any) -> None:
        """Makes the copy stream wait for the work queued so far on ``current_stream``."""
        copy_stream.wait_stream(current_stream)

    def _issue_copy(self, dst_tensor: Any, src_tensor: Any, nbytes: int, copy_stream: Any) -> None:
        """Queues the copy of ``src_tensor`` into ``dst_tensor`` (``nbytes`` > 0) on ``copy_stream``."""
        with self._runtime.stream(copy_stream):
            dst_tensor.copy_(src_tensor, non_blocking=True)

    # -- transfer ----------------------------------------------------------------
    def _enqueue_h2d(self, slot: int, dst: Any, src: Any, h2d_bytes: Any, timing: bool) -> SubmittedCopy:
        dst_tensor, src_tensor, nbytes = prepare_torch_copy(
            self._torch, dst=dst, src=src, h2d_bytes=h2d_bytes, device=self.device
        )
        runtime, stream, ready = self._runtime, self._copy_stream, self._ready_events[slot]
        if ready.query():  # the slot's earlier copies are done: their tensors may go
            self._in_flight[slot].clear()
        self._order_copy_stream(stream, runtime.current_stream(self.device))
        start_event = end_event = None
        if timing:
            start_event = runtime.Event(enable_timing=True)
            start_event.record(stream)
        if nbytes:
            self._issue_copy(dst_tensor, src_tensor, nbytes, stream)
            self._in_flight[slot].append((dst_tensor, src_tensor))
        ready.record(stream)
        if timing:
            end_event = runtime.Event(enable_timing=True)
            end_event.record(stream)
        return SubmittedCopy(nbytes, start_event, end_event)

    def _query_ready(self, slot: int) -> bool:
        done = bool(self._ready_events[slot].query())
        if done:
            self._in_flight[slot].clear()
        return done

    def _wait_ready(self, slot: int, timeout: Optional[float]) -> None:
        event = self._ready_events[slot]
        wait_blocking(event.synchronize, timeout, f"the copy into slot {slot} on {self.device}", done=event.query)
        self._in_flight[slot].clear()

    def _stream_wait_ready(self, slot: int, timeout: Optional[float]) -> None:
        self._runtime.current_stream(self.device).wait_event(self._ready_events[slot])

    def _synchronize_copy_stream(self, what: str) -> None:
        stream = getattr(self, "_copy_stream", None)
        if stream is not None:
            wait_blocking(stream.synchronize, CLOSE_TIMEOUT_S, what, done=stream.query)

    def _close_impl(self) -> None:
        self._synchronize_copy_stream(f"the copy stream of {type(self).__name__} at close")
        self._copy_stream = None
        for tensors in self._in_flight:
            tensors.clear()


__all__ = ["CLOSE_TIMEOUT_S", "TorchStreamBackendBase"]
