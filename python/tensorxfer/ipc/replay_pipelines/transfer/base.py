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

    Slots are ring indices ``0 <= slot < ring_depth``. Every method raises
    ``ClosedError("... is closed")`` (a ``ValueError``) after ``close``. Backends are
    meant to be driven from one thread. Build one with
    :func:`~tensorxfer.ipc.replay_pipelines.transfer.build_replay_transfer_backend`.

    Attributes:
        device: a ``torch.device`` when torch is importable, else the device string.
        device_family: "cpu", "cuda", "rocm", "xpu", or a torch device type.
        h2d_submitter: what issues the copy (``"pybind11"``, ``"torch_copy_stream"``, ...).
        host_memory_kind: what the host slots are ("shared", "pageable_shared", ...).
        host_pinned: the registered host slots are page-locked.
        direct_pinned_shared: the copy reads the shared slots in place, pinned, without a
            staging buffer.
        supports_async_submit: ``submit_h2d`` returns before the copy finishes.
        supports_timing_events: device timing events can be handed to a trace recorder.
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
        """Validates the shared host slots and prepares them for fast copies.

        The slots are pre-faulted and page-locked where the backend can
        (``host_pinned`` says whether it did). A second call replaces the first
        registration; ``close`` undoes it.

        Args:
            slots: contiguous host tensors or arrays, at most ``ring_depth`` of them.
        """
        ...

    def allocate_device_slots(self, *, count: int, shape: Sequence[int], dtype: Any) -> List[Any]:
        """Allocates device slots, suitable as ``dst`` of ``submit_h2d``.

        Args:
            count: how many.
            shape: the shape of each.
            dtype: a numpy or torch dtype.

        Returns:
            ``count`` contiguous tensors on the backend's device, uninitialised or zeroed.
        """
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
        """Copies a host slot into a device slot on the backend's copy stream.

        The copy is ordered after the work queued so far on the caller's current
        stream, and records the ready event of ``slot``.

        Args:
            slot: the ring slot whose ready event the copy records.
            dst: the device slot.
            src: the host slot.
            metadata: optional; its tick id must be larger than every earlier one and,
                when its ``batch_host_slot`` is set, ``batch_host_slot == slot``.
            trace_recorder: receives the spans, if given. Their arguments carry
                ``slot``, ``h2d_bytes``, ``pinned_memory``, ``pack_layout``,
                ``pack_executor``, ``h2d_submitter``, ``direct_pinned_shared`` and the
                seven ``ReplayTickMetadata`` fields (None without metadata).
            trace_cuda_events: also record device timing events for the recorder.
            h2d_bytes: copy only the first ``h2d_bytes`` bytes (default: all of ``dst``).
            pack_layout: a label for the trace.
            pack_executor: a label for the trace.

        Returns:
            The seconds the CPU spent submitting, not the transfer time.
        """
        ...

    def clear_ready(self, slot: int) -> None:
        """Forgets the slot's last submit, so that it reads as ready again.

        A copy already submitted still runs.
        """
        ...

    def ready_query(self, slot: int) -> bool:
        """Whether the last copy submitted to ``slot`` has finished; never blocks.

        Also True when none was submitted since construction or ``clear_ready``.
        """
        ...

    def synchronize_ready(self, slot: int) -> None:
        """Blocks the calling thread until the last copy submitted to ``slot`` has finished.

        The wait sleeps on the event (no polling).

        Raises:
            TimeoutError: the copy did not finish within the backend's bound.
        """
        ...

    def wait_current_stream_for_ready(self, slot: int) -> None:
        """Makes the caller's current stream wait for the slot's last copy.

        On devices with streams this returns at once; on the host the calling thread
        is the stream, so it waits.
        """
        ...

    def close(self) -> None:
        """Waits for submitted copies (bounded), then releases the copy stream and the slots.

        Undoes ``register_host_slots``. Idempotent; also runs on context-manager
        exit and when the backend is garbage-collected.
        """
        ...


__all__ = ["ReplayTransferBackend", "TraceRecorder"]
