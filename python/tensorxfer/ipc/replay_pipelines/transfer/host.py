"""Host replay transfer backend: device "cpu", copies on a native host stream.

``submit_h2d`` enqueues the copy on a ``tensorxfer._core.HostStream`` (a worker
thread running a FIFO, copies split across a ``CopyEngine``'s threads with the
GIL released) and records the slot's ``HostEvent`` after it, so it returns
before the copy finishes.  Works with numpy alone; torch is optional.
"""

from __future__ import annotations

import sys
from typing import Any, List, Optional, Tuple

from tensorxfer import _core
from tensorxfer._tensor import as_view, is_torch_tensor
from tensorxfer.ipc.replay_pipelines.transfer import _host_memory
from tensorxfer.ipc.replay_pipelines.transfer._common import (
    SubmittedCopy,
    TransferBackendBase,
    numpy_dtype,
    resolve_h2d_nbytes,
    torch_dtype_if_torch,
)


def _require_host_device(device: Any) -> None:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(device, torch.device):
        text, kind = str(device), device.type
    elif isinstance(device, str):
        text = device
        kind, _, index = device.strip().lower().partition(":")
        if index and not index.isdigit():
            kind = device
    else:
        raise TypeError(f"device must be 'cpu' (str or torch.device), got {type(device).__name__} {device!r}")
    if kind != "cpu":
        raise ValueError(
            f"HostReplayTransferBackend copies on the host and needs device 'cpu', got {text!r} "
            "(build_replay_transfer_backend picks the backend for other devices)"
        )


def _host_byte_prefix(obj: Any, nbytes: int) -> Any:
    """The first ``nbytes`` bytes of a contiguous host tensor/array, as a flat uint8 view."""
    if is_torch_tensor(obj):
        from tensorxfer.ipc.replay_pipelines.transfer._torch_device import byte_prefix

        return byte_prefix(sys.modules["torch"], obj.detach(), nbytes)
    import numpy

    array = obj if isinstance(obj, numpy.ndarray) else None
    if array is None:
        array = numpy.from_dlpack(obj) if hasattr(obj, "__dlpack__") else numpy.asarray(memoryview(obj))
    return array.reshape(-1).view(numpy.uint8)[:nbytes]


class HostReplayTransferBackend(TransferBackendBase):
    """Replay transfer into host memory on a native stream, with per-slot events.

    ``register_host_slots`` pre-faults the shared slots and tries to page-lock
    them with ``mlock`` (``host_pinned`` says whether that worked; the reason
    it did not is in ``pin_error``); ``allocate_device_slots`` returns numpy
    arrays for numpy dtypes and dtype names, torch tensors for torch dtypes.
    ``wait_current_stream_for_ready`` waits in the calling thread, which is the
    host's "current stream".  ``copy_engine`` (optional) shares a
    ``_core.CopyEngine`` between backends; by default each backend owns one
    with a thread per core.
    """

    device_family = "cpu"
    h2d_submitter = "tensorxfer_host_stream"
    host_memory_kind = "shared"
    supports_async_submit = True
    supports_timing_events = False

    def __init__(self, *, device: Any = "cpu", ring_depth: int, copy_engine: Optional[Any] = None) -> None:
        super().__init__(ring_depth=ring_depth)
        _require_host_device(device)
        if copy_engine is not None and not isinstance(copy_engine, _core.CopyEngine):
            raise TypeError(
                f"copy_engine must be a tensorxfer._core.CopyEngine or None, got {type(copy_engine).__name__}"
            )
        self._device: Any = None
        self.host_pinned = False
        self.direct_pinned_shared = False
        self.pin_error: Optional[str] = None
        self._engine = copy_engine if copy_engine is not None else _core.CopyEngine(0)
        self._stream = _core.HostStream(self._engine)
        self._ready_events = [_core.HostEvent() for _ in range(self.ring_depth)]

    @property
    def device(self) -> Any:
        """``torch.device("cpu")`` when torch is importable, else ``"cpu"``."""
        if self._device is None:
            try:
                import torch
            except ImportError:
                self._device = "cpu"
            else:
                self._device = torch.device("cpu")
        return self._device

    # -- host and device slots -------------------------------------------------
    def _register_host_slots_impl(self, slots: List[Any]) -> List[Tuple[int, int]]:
        # Only the locked address ranges are kept: registering must not keep a ring's
        # slot memory alive (the ring may be closed first; munmap drops the locks then).
        views = [as_view(slot, f"slots[{index}]", host=True) for index, slot in enumerate(slots)]
        for index, view in enumerate(views):
            _host_memory.prefault(view, f"slots[{index}]")
        locked: List[Tuple[int, int]] = []
        self.pin_error = None
        for index, view in enumerate(views):
            if view.nbytes == 0:
                continue
            error = _host_memory.lock(view.data_ptr, view.nbytes)
            if error:
                self.pin_error = (
                    f"mlock(slots[{index}], {view.nbytes} bytes) failed: {_host_memory.errno_name(error)}; "
                    "raise RLIMIT_MEMLOCK (ulimit -l) to page-lock the slots"
                )
                self._release_host_slots_impl(locked)
                return []
            locked.append((view.data_ptr, view.nbytes))
        self.host_pinned = self.direct_pinned_shared = True
        return locked

    def _release_host_slots_impl(self, registration: List[Tuple[int, int]]) -> None:
        for address, nbytes in registration:
            _host_memory.unlock(address, nbytes)
        self.host_pinned = self.direct_pinned_shared = False

    def _allocate_impl(self, count: int, shape: Tuple[int, ...], dtype: Any) -> List[Any]:
        torch_dtype = torch_dtype_if_torch(dtype)
        if torch_dtype is not None:
            slots = [sys.modules["torch"].zeros(shape, dtype=torch_dtype) for _ in range(count)]
        else:
            import numpy

            element = numpy_dtype(dtype)
            slots = [numpy.zeros(shape, dtype=element) for _ in range(count)]
        for slot in slots:
            _host_memory.prefault(as_view(slot, "slot"), "device slot")
        return slots

    # -- transfer --------------------------------------------------------------
    def _enqueue_h2d(self, slot: int, dst: Any, src: Any, h2d_bytes: Any, timing: bool) -> SubmittedCopy:
        dst_view = as_view(dst, "dst", host=True, writable=True)
        src_view = as_view(src, "src", host=True)
        nbytes = resolve_h2d_nbytes(
            dst_dtype=dst_view.dtype, dst_nbytes=dst_view.nbytes, describe_dst=dst_view.describe,
            src_dtype=src_view.dtype, src_nbytes=src_view.nbytes, describe_src=src_view.describe,
            h2d_bytes=h2d_bytes,
        )
        if nbytes:
            dst_begin, src_begin = dst_view.data_ptr, src_view.data_ptr
            if dst_begin < src_begin + nbytes and src_begin < dst_begin + nbytes:
                raise ValueError(f"dst and src must not overlap, got dst {dst_view!r} and src {src_view!r}")
            if nbytes != dst_view.nbytes or nbytes != src_view.nbytes:
                dst_view = as_view(_host_byte_prefix(dst, nbytes), "dst", host=True, writable=True)
                src_view = as_view(_host_byte_prefix(src, nbytes), "src", host=True)
            self._stream.enqueue_copy(dst_view, src_view)
        self._stream.record(self._ready_events[slot])
        return SubmittedCopy(nbytes)

    def _query_ready(self, slot: int) -> bool:
        return self._ready_events[slot].query()

    def _wait_ready(self, slot: int, timeout: Optional[float]) -> None:
        try:
            self._ready_events[slot].wait(timeout)
        except TimeoutError as error:
            raise TimeoutError(f"the copy into slot {slot} did not finish within {timeout:g} s") from error

    def _close_impl(self) -> None:
        self._stream.close()


__all__ = ["HostReplayTransferBackend"]
