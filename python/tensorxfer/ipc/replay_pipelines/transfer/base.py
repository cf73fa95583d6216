"""Replay transfer backend contract.

A backend moves packed replay batches from shared host slots (filled by
collector processes) into device slots of the learner, one ring slot at a time,
and tracks per slot whether the last copy into it has finished.
"""

from __future__ import annotations

from typing import Any, List, Mapping, Optional, Protocol, Sequence, runtime_checkable

from tensorxfer.ipc.replay_pipelines.base import ReplayTickMetadata


@runtime_checkable
class TraceRecorder(Protocol):
    """Receives the spans a backend emits when ``submit_h2d`` gets a ``trace_recorder``."""

    def add_slice(self, name: str, category: str, begin_ns: int, end_ns: int, args: Mapping[str, Any]) -> None:
        """A finished CPU span, timestamps from ``time.monotonic_ns()``."""
        ...

    def add_cuda_pending_span(
        self,
        name: str,
        category: str,
        cpu_begin_ns: int,
        start_event: Any,
        end_event: Any,
        args: Mapping[str, Any],
    ) -> None:
        """A device span bracketed by two timing events that may not have completed yet.

        The recorder resolves it later (``start_event.elapsed_time(end_event)``
        once both completed) and places it at ``cpu_begin_ns`` on the CPU clock.
        """
        ...


@runtime_checkable
class ReplayTransferBackend(Protocol):
    """Device-specific host-to-device transfer backend.

    Attributes: ``device`` (a ``torch.device`` when torch is importable, else
    the device string), ``device_family`` ("cpu", "cuda", "rocm", "xpu", or a
    torch device type), ``h2d_submitter`` (what issues the copy),
    ``host_memory_kind`` (what the host slots are: "shared", "pageable_shared",
    ...), ``host_pinned`` (the registered host slots are page-locked),
    ``direct_pinned_shared`` (the copy reads the shared slots in place, pinned,
    without a staging buffer), ``supports_async_submit`` (``submit_h2d``
    returns before the copy finishes), ``supports_timing_events`` (device
    timing events can be handed to a trace recorder).

    Slots are ring indices ``0 <= slot < ring_depth``.  Every method raises
    ``ClosedError("... is closed")`` (a ``ValueError``) after ``close``.  Backends are meant to be
    driven from one thread.
    """

    device: Any
    device_family: str
    h2d_submitter: str
    host_memory_kind: str
    host_pinned: bool
    direct_pinned_shared: bool
    supports_async_submit: bool
    supports_timing_events: bool

    def register_host_slots(self, slots: Sequence[Any]) -> None:
        """Validates the shared host slots (contiguous host tensors/arrays, at most
        ``ring_depth`` of them) and prepares them for fast copies: pre-faults them
        and page-locks them where the backend can (``host_pinned`` says whether it
        did).  A second call replaces the first registration.  Undone by ``close``.
        """
        ...

    def allocate_device_slots(self, *, count: int, shape: Sequence[int], dtype: Any) -> List[Any]:
        """``count`` contiguous, uninitialised-or-zeroed tensors of ``shape`` and
        ``dtype`` on the backend's device, suitable as ``dst`` of ``submit_h2d``."""
        ...

    def submit_h2d(
        self,
        *,
        slot: int,
        dst: Any,
        src: Any,
        metadata: Optional[ReplayTickMetadata] = None,
        trace_recorder: Optional[TraceRecorder] = None,
        trace_cuda_events: bool = False,
        h2d_bytes: Optional[int] = None,
        pack_layout: str = "",
        pack_executor: str = "",
    ) -> float:
        """Copies the first ``h2d_bytes`` bytes (default: all of ``dst``) of ``src``
        (a host slot) into ``dst`` (a device slot) on the backend's copy stream and
        records the ready event of ``slot``.  Returns the seconds the CPU spent
        submitting, not the transfer time.  ``metadata`` (optional) must carry a
        tick id larger than every earlier one and, when its ``batch_host_slot``
        is set, ``batch_host_slot == slot``.  The trace span arguments carry
        ``slot``, ``h2d_bytes``, ``pinned_memory``, ``pack_layout``,
        ``pack_executor``, ``h2d_submitter``, ``direct_pinned_shared`` and the
        seven ``ReplayTickMetadata`` fields (None without metadata).  The copy is
        ordered after the work queued so far on the caller's current stream.
        """
        ...

    def clear_ready(self, slot: int) -> None:
        """Forgets the slot's last submit: afterwards the slot reads as ready, as
        before its first submit.  A copy already submitted still runs."""
        ...

    def ready_query(self, slot: int) -> bool:
        """True when the last copy submitted to ``slot`` has finished (or none was
        submitted since construction / ``clear_ready``).  Never blocks."""
        ...

    def synchronize_ready(self, slot: int) -> None:
        """Blocks the calling thread until the last copy submitted to ``slot`` has
        finished (a blocking event wait, no polling).  Raises ``TimeoutError``
        after a bounded wait."""
        ...

    def wait_current_stream_for_ready(self, slot: int) -> None:
        """Makes the caller's current stream wait for the slot's last copy (on
        devices with streams this returns at once; on the host the calling thread
        is the stream, so it waits)."""
        ...

    def close(self) -> None:
        """Waits for submitted copies (bounded), releases the copy stream and
        undoes ``register_host_slots``.  Idempotent; also runs on context-manager
        exit and when the backend is garbage-collected."""
        ...


__all__ = ["ReplayTransferBackend", "TraceRecorder"]
