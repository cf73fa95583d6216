"""What every replay transfer backend shares: argument checks, per-slot ready
bookkeeping, trace spans and the close / context-manager lifecycle.

``TransferBackendBase`` implements the public methods of the
``ReplayTransferBackend`` contract once; a backend supplies the device work
through the ``_``-prefixed hooks documented on the class.
"""

from __future__ import annotations

import abc
import dataclasses
import threading
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from tensorxfer._arguments import check_int
from tensorxfer.errors import ClosedError, check_timeout
from tensorxfer.ipc.replay_pipelines.base import ReplayTickMetadata
from tensorxfer.ipc.shared_array import normalize_shape

TRACE_CATEGORY = "replay_transfer"
SUBMIT_SPAN_NAME = "replay.h2d_submit"
COPY_SPAN_NAME = "replay.h2d_copy"


def require_int(value: Any, name: str, *, minimum: int) -> int:
    """``value`` as an int >= ``minimum`` (the package's integer rules: numpy integers accepted, bools refused)."""
    return check_int(value, name, minimum)


def require_ring_depth(ring_depth: Any) -> int:
    """Validates the number of ring slots a backend tracks."""
    return require_int(ring_depth, "ring_depth", minimum=1)


def wait_blocking(
    wait: Callable[[], Any], timeout: Optional[float], what: str, *, done: Optional[Callable[[], bool]] = None
) -> None:
    """Blocks until ``wait()`` returns; ``TimeoutError`` naming ``what`` after ``timeout`` s
    (``None``: no deadline; Ctrl-C still interrupts the caller's wait).

    ``wait`` is a blocking device wait that releases the GIL (``Event.synchronize``,
    ``Stream.synchronize``): the calling thread sleeps until it returns, nothing
    polls.  Device waits take no timeout of their own, so ``wait`` runs in a
    daemon helper thread and the caller waits for it with the timeout; a wait
    given up on finishes by itself once the device work does.  ``done`` (a
    non-blocking query) skips the helper thread when the work already finished.
    Exceptions of ``wait`` are re-raised in the caller.
    """
    if done is not None and done():
        return
    finished = threading.Event()
    failure: List[BaseException] = []

    def run() -> None:
        try:
            wait()
        except BaseException as error:  # handed to the caller below
            failure.append(error)
        finally:
            finished.set()

    threading.Thread(target=run, name=f"tensorxfer-wait ({what})", daemon=True).start()
    if not finished.wait(timeout):
        raise TimeoutError(f"{what} did not finish within {timeout:g} s")
    if failure:
        raise failure[0]


def resolve_h2d_nbytes(
    *,
    dst_dtype: str,
    dst_nbytes: int,
    describe_dst: Callable[[], str],
    src_dtype: str,
    src_nbytes: int,
    describe_src: Callable[[], str],
    h2d_bytes: Any,
) -> int:
    """The number of bytes to copy.  ``dst`` and ``src`` must share a dtype; with
    ``h2d_bytes=None`` their sizes must match and everything is copied, else
    ``h2d_bytes`` (an int >= 0) must fit in both and that prefix is copied.
    ``describe_*`` are only called to word an error."""
    if dst_dtype != src_dtype:
        raise TypeError(f"dst and src must have the same dtype, got dst {describe_dst()} and src {describe_src()}")
    if h2d_bytes is None:
        if dst_nbytes != src_nbytes:
            raise ValueError(
                f"dst and src must have the same size in bytes (or pass h2d_bytes), got dst {dst_nbytes} bytes "
                f"({describe_dst()}) and src {src_nbytes} bytes ({describe_src()})"
            )
        return dst_nbytes
    nbytes = require_int(h2d_bytes, "h2d_bytes", minimum=0)
    if nbytes > dst_nbytes or nbytes > src_nbytes:
        raise ValueError(
            f"h2d_bytes must be <= the size of both dst ({dst_nbytes} bytes) and src ({src_nbytes} bytes), got {nbytes}"
        )
    return nbytes


def torch_dtype_if_torch(dtype: Any) -> Any:
    """``dtype`` when it is a ``torch.dtype``, else None (without importing torch)."""
    import sys

    torch = sys.modules.get("torch")
    return dtype if torch is not None and isinstance(dtype, torch.dtype) else None


def numpy_dtype(dtype: Any):
    """A numpy dtype from a numpy dtype, scalar type or name; TypeError naming ``dtype`` otherwise."""
    import numpy

    try:
        return numpy.dtype(dtype)
    except TypeError as error:
        raise TypeError(
            f"dtype must be a torch.dtype, a numpy dtype or a numpy dtype name, got {type(dtype).__name__} {dtype!r}"
        ) from error


class SubmittedCopy(NamedTuple):
    """What a backend's ``_enqueue_h2d`` hook reports back."""

    nbytes: int
    start_event: Any = None  # timing events, only when trace_cuda_events was honoured
    end_event: Any = None


class TransferBackendBase(abc.ABC):
    """The public methods of ``ReplayTransferBackend``, on top of these hooks:

    * ``_register_host_slots_impl(slots) -> list`` pins/pre-faults validated
      slots and returns what ``_release_host_slots_impl`` needs to undo it
      (called on re-registration and close, also with an empty list).
    * ``_allocate_impl(count, shape, dtype) -> list`` builds device slots.
    * ``_enqueue_h2d(slot, dst, src, h2d_bytes, timing) -> SubmittedCopy``
      validates the tensors, issues the copy and records the slot's ready event.
    * ``_query_ready(slot)`` / ``_wait_ready(slot, timeout)`` /
      ``_stream_wait_ready(slot, timeout)`` act on the recorded event.
    * ``_close_impl()`` releases the stream and events.
    """

    device_family: str
    h2d_submitter: str
    host_memory_kind: str
    supports_async_submit: bool
    supports_timing_events: bool = False
    host_pinned: bool = False
    direct_pinned_shared: bool = False

    def __init__(self, *, ring_depth: Any) -> None:
        self._ring_depth = require_ring_depth(ring_depth)
        self._closed = False
        self._close_lock = threading.Lock()
        # True once a copy was submitted to the slot and not cleared: ready_query consults its event.
        self._submitted = [False] * self._ring_depth
        self._last_tick_id: Optional[int] = None
        self._host_registration: List[Any] = []

    # -- lifecycle -------------------------------------------------------------
    @property
    def ring_depth(self) -> int:
        """Number of ring slots this backend tracks."""
        return self._ring_depth

    @property
    def closed(self) -> bool:
        """True after ``close``."""
        return self._closed

    def close(self) -> None:
        """Waits for submitted copies (bounded), releases the copy stream and undoes
        ``register_host_slots``.  Idempotent; runs on context exit and on deletion."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._close_impl()
        finally:
            self._release_host_slots()

    def __enter__(self):
        self._check_open()
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if hasattr(self, "_close_lock"):
                self.close()
        except Exception:  # a destructor must not raise; close() already released what it could
            pass

    def __repr__(self) -> str:
        state = "closed" if getattr(self, "_closed", True) else "open"
        device = getattr(self, "device", None)
        return f"{type(self).__name__}(device={device!s}, ring_depth={getattr(self, '_ring_depth', None)}, {state})"

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"{type(self).__name__} is closed")

    def _check_slot(self, slot: Any) -> int:
        self._check_open()
        return check_int(slot, f"slot (ring_depth={self._ring_depth})", 0, self._ring_depth - 1)

    # -- host and device slots -------------------------------------------------
    def register_host_slots(self, slots: Sequence[Any]) -> None:
        """Validates the shared host slots (1 to ``ring_depth`` contiguous host
        tensors/arrays) and prepares them for copies (pre-fault, page-lock where
        the backend can; ``host_pinned`` reports it).  Replaces an earlier
        registration.  Undone by ``close``."""
        self._check_open()
        if isinstance(slots, (str, bytes)) or not hasattr(slots, "__len__") or not hasattr(slots, "__iter__"):
            raise TypeError(f"slots must be a list of host tensors or arrays, got {type(slots).__name__}")
        slots = list(slots)
        if not 1 <= len(slots) <= self._ring_depth:
            raise ValueError(f"slots must hold 1 to ring_depth={self._ring_depth} host slots, got {len(slots)}")
        self._release_host_slots()
        self._host_registration = list(self._register_host_slots_impl(slots))

    def _release_host_slots(self) -> None:
        registration, self._host_registration = self._host_registration, []
        self._release_host_slots_impl(registration)

    def allocate_device_slots(self, *, count: int, shape: Sequence[int], dtype: Any) -> List[Any]:
        """``count`` zero-filled contiguous slots of ``shape``/``dtype`` on the
        backend's device (see the backend for which array family)."""
        self._check_open()
        count = require_int(count, "count", minimum=1)
        return self._allocate_impl(count, normalize_shape(shape), dtype)

    # -- transfer --------------------------------------------------------------
    def submit_h2d(
        self,
        *,
        slot: int,
        dst: Any,
        src: Any,
        metadata: Optional[ReplayTickMetadata] = None,
        trace_recorder: Any = None,
        trace_cuda_events: bool = False,
        h2d_bytes: Optional[int] = None,
        pack_layout: str = "",
        pack_executor: str = "",
    ) -> float:
        """Copies ``src`` (host slot) into ``dst`` (device slot) on the copy stream
        and records the ready event of ``slot``; returns the CPU seconds spent
        submitting.  See ``ReplayTransferBackend.submit_h2d``."""
        cpu_begin = time.perf_counter()
        begin_ns = time.monotonic_ns()
        slot = self._check_slot(slot)
        self._check_submit_labels(metadata, slot, trace_recorder, trace_cuda_events, pack_layout, pack_executor)
        timing = bool(trace_cuda_events) and self.supports_timing_events
        submitted = self._enqueue_h2d(slot, dst, src, h2d_bytes, timing)
        self._submitted[slot] = True
        if metadata is not None:
            self._last_tick_id = metadata.tick_id
        end_ns = time.monotonic_ns()
        if trace_recorder is not None:
            args = self._trace_args(slot, submitted.nbytes, metadata, pack_layout, pack_executor)
            trace_recorder.add_slice(SUBMIT_SPAN_NAME, TRACE_CATEGORY, begin_ns, end_ns, args)
            if timing:
                trace_recorder.add_cuda_pending_span(
                    COPY_SPAN_NAME, TRACE_CATEGORY, begin_ns, submitted.start_event, submitted.end_event, dict(args)
                )
        return time.perf_counter() - cpu_begin

    def _check_submit_labels(self, metadata, slot, trace_recorder, trace_cuda_events, pack_layout, pack_executor):
        if metadata is not None:
            if not isinstance(metadata, ReplayTickMetadata):
                raise TypeError(f"metadata must be a ReplayTickMetadata or None, got {type(metadata).__name__}")
            if metadata.batch_host_slot is not None and metadata.batch_host_slot != slot:
                raise ValueError(
                    f"metadata.batch_host_slot must equal slot={slot} (or be None), "
                    f"got metadata.batch_host_slot={metadata.batch_host_slot}"
                )
            if self._last_tick_id is not None and metadata.tick_id <= self._last_tick_id:
                raise ValueError(
                    f"metadata.tick_id must strictly increase per backend: got {metadata.tick_id} "
                    f"after {self._last_tick_id}"
                )
        if not isinstance(trace_cuda_events, bool):
            raise TypeError(f"trace_cuda_events must be a bool, got {type(trace_cuda_events).__name__}")
        for name, label in (("pack_layout", pack_layout), ("pack_executor", pack_executor)):
            if not isinstance(label, str):
                raise TypeError(f"{name} must be a str label, got {type(label).__name__} {label!r}")
        if trace_recorder is not None:
            needed = ["add_slice"]
            if trace_cuda_events and self.supports_timing_events:
                needed.append("add_cuda_pending_span")
            missing = [name for name in needed if not callable(getattr(trace_recorder, name, None))]
            if missing:
                raise TypeError(
                    f"trace_recorder must have {' and '.join(needed)}(), got a {type(trace_recorder).__name__} "
                    f"without {', '.join(missing)}"
                )

    def _trace_args(
        self, slot: int, nbytes: int, metadata: Optional[ReplayTickMetadata], pack_layout: str, pack_executor: str
    ) -> Dict[str, Any]:
        """The arguments of a submit's trace spans: the submit, the backend's memory
        and submitter, and all seven ``ReplayTickMetadata`` fields (None without metadata)."""
        args: Dict[str, Any] = {
            "slot": slot,
            "h2d_bytes": nbytes,
            "pinned_memory": bool(self.host_pinned),
            "pack_layout": pack_layout,
            "pack_executor": pack_executor,
            "h2d_submitter": self.h2d_submitter,
            "direct_pinned_shared": bool(self.direct_pinned_shared),
            "device": str(self.device),
        }
        if metadata is not None:
            args.update(metadata.trace_args())
        else:
            args.update({field.name: None for field in dataclasses.fields(ReplayTickMetadata)})
        return args

    # -- readiness -------------------------------------------------------------
    def clear_ready(self, slot: int) -> None:
        """Forgets the slot's last submit, so it reads as ready again (a copy
        already submitted still runs)."""
        slot = self._check_slot(slot)
        self._submitted[slot] = False

    def ready_query(self, slot: int) -> bool:
        """True when the slot's last submitted copy has finished, or none is
        pending (before the first submit / after ``clear_ready``).  Never blocks."""
        slot = self._check_slot(slot)
        return not self._submitted[slot] or bool(self._query_ready(slot))

    def synchronize_ready(self, slot: int, *, timeout: Optional[float] = None) -> None:
        """Blocks until the slot's last submitted copy has finished; returns at once
        when none is pending.  ``timeout``: seconds (0: check once), ``None`` (the
        default): no deadline, Ctrl-C still interrupts (``KeyboardInterrupt``).
        ``TimeoutError`` when it passes."""
        slot = self._check_slot(slot)
        timeout = check_timeout(timeout, f"{type(self).__name__}.synchronize_ready")
        if self._submitted[slot]:
            self._wait_ready(slot, timeout)

    def wait_current_stream_for_ready(self, slot: int, *, timeout: Optional[float] = None) -> None:
        """Orders the caller's current stream after the slot's last copy (devices
        with streams: returns at once; host: the calling thread waits, bounded by
        ``timeout`` as in ``synchronize_ready``)."""
        slot = self._check_slot(slot)
        timeout = check_timeout(timeout, f"{type(self).__name__}.wait_current_stream_for_ready")
        if self._submitted[slot]:
            self._stream_wait_ready(slot, timeout)

    # -- hooks -----------------------------------------------------------------
    @abc.abstractmethod
    def _register_host_slots_impl(self, slots: List[Any]) -> List[Any]:
        """Device-specific registration of validated host slots; returns what _release_host_slots_impl undoes."""

    def _release_host_slots_impl(self, registration: List[Any]) -> None:
        pass

    @abc.abstractmethod
    def _allocate_impl(self, count: int, shape: Tuple[int, ...], dtype: Any) -> List[Any]:
        """``count`` contiguous slots of ``shape`` and ``dtype`` on the device."""

    @abc.abstractmethod
    def _enqueue_h2d(self, slot: int, dst: Any, src: Any, h2d_bytes: Any, timing: bool) -> SubmittedCopy:
        """Queues the copy on the copy stream and records the slot's ready event."""

    @abc.abstractmethod
    def _query_ready(self, slot: int) -> bool:
        """Whether the slot's last copy finished; never blocks."""

    @abc.abstractmethod
    def _wait_ready(self, slot: int, timeout: Optional[float]) -> None:
        """Blocks the caller until the slot's last copy finished; TimeoutError after
        ``timeout`` (``None``: no deadline; the wait must stay interruptible by Ctrl-C)."""

    def _stream_wait_ready(self, slot: int, timeout: Optional[float]) -> None:
        self._wait_ready(slot, timeout)

    def _close_impl(self) -> None:
        pass


__all__ = [
    "TRACE_CATEGORY",
    "SUBMIT_SPAN_NAME",
    "COPY_SPAN_NAME",
    "SubmittedCopy",
    "TransferBackendBase",
    "normalize_shape",
    "numpy_dtype",
    "wait_blocking",
    "require_int",
    "require_ring_depth",
    "resolve_h2d_nbytes",
    "torch_dtype_if_torch",
]
