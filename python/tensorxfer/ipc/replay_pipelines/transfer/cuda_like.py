"""CUDA/ROCm replay transfer backend.

Copies run on a dedicated ``torch.cuda.Stream``; a ``torch.cuda.Event`` per
slot marks when the slot's copy is done.  ``register_host_slots`` pins the
shared host slots in place with ``cudaHostRegister`` (undone on ``close``), so
the copy engine reads them directly (DMA from pinned memory, truly
asynchronous). A source that is not registered (or otherwise pinned) is
pageable memory: CUDA stages it through its own pinned buffer, so
``submit_h2d`` returns only once the copy, and the work it waits for, is done.

Who issues the copy (``h2d_submitter``), as upstream:

* ``"pybind11"``: the extension was built with CUDA and torch is a CUDA build.
  ``tensorxfer._core.CudaCopySubmitter`` calls ``cudaMemcpyAsync`` on the raw
  handle of the copy stream (``torch.cuda.Stream.cuda_stream``) with the GIL
  released; nothing is compiled at run time.
* ``"torch_copy_stream"``: otherwise, and always on ROCm (``device_family``
  "rocm"): ``Tensor.copy_(non_blocking=True)`` under ``torch.cuda.stream``.
  Also where the extension's CUDA runtime cannot start although torch's can
  (a driver older than the toolkit the extension was built with);
  ``native_submitter_error`` then says why.

Either way the copy stream first waits for the caller's current stream.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

from tensorxfer import _core
from tensorxfer.errors import UnsupportedError
from tensorxfer.ipc.replay_pipelines.transfer._torch_device import host_slot_tensors
from tensorxfer.ipc.replay_pipelines.transfer._torch_stream import TorchStreamBackendBase

_CUDA_HOST_REGISTER_DEFAULT = 0
NATIVE_SUBMITTER = "pybind11"
TORCH_SUBMITTER = "torch_copy_stream"


def native_submitter_compiled() -> bool:
    """Whether this build of the extension has the native CUDA copy submitter.

    It has when it was built with the CUDA toolkit. Makes no CUDA call.
    """
    return bool(getattr(_core, "cuda_copy_compiled", False)) and hasattr(_core, "CudaCopySubmitter")


def select_h2d_submitter(*, native_compiled: bool, hip: bool) -> str:
    """Chooses the ``h2d_submitter`` of a CUDA-like backend.

    Args:
        native_compiled: whether the native submitter is compiled in
            (:func:`native_submitter_compiled`).
        hip: whether torch runs ROCm (HIP); the native submitter speaks CUDA only.

    Returns:
        ``"pybind11"`` when the native submitter is compiled in and torch runs CUDA,
        ``"torch_copy_stream"`` otherwise.
    """
    return NATIVE_SUBMITTER if native_compiled and not hip else TORCH_SUBMITTER


class CudaLikeReplayTransferBackend(TorchStreamBackendBase):
    """Replay transfer to a CUDA or ROCm device through a dedicated copy stream.

    ``h2d_submitter`` says who issues the copy (see the module docstring).
    ``host_pinned`` / ``direct_pinned_shared`` turn True once
    ``register_host_slots`` has page-locked every slot in place (``pin_error``
    says why it did not); the backend then keeps the slots alive until they are
    unregistered (re-registration or ``close``), since freeing registered memory
    is undefined in CUDA.  ``synchronize_ready`` blocks in
    ``cudaEventSynchronize`` (ready events use blocking sync, so the waiting
    thread sleeps); ``wait_current_stream_for_ready`` makes
    ``torch.cuda.current_stream()`` wait for the slot's event without blocking
    the CPU.  With ``trace_cuda_events=True`` each submit hands a pair of timing
    events to ``trace_recorder.add_cuda_pending_span``.
    """

    _runtime_name = "cuda"
    h2d_submitter: str
    host_memory_kind = "pinned_shared"
    supports_async_submit = True
    supports_timing_events = True

    def __init__(self, *, device: Any, ring_depth: int) -> None:
        super().__init__(device=device, ring_depth=ring_depth)
        hip = bool(self._torch.version.hip)
        self.device_family = "rocm" if hip else "cuda"
        self.h2d_submitter = select_h2d_submitter(native_compiled=native_submitter_compiled(), hip=hip)
        self.native_submitter_error: Optional[str] = None
        self._native = None
        if self.h2d_submitter == NATIVE_SUBMITTER:
            try:
                self._native = _core.CudaCopySubmitter(self.device.index)
            except UnsupportedError as error:
                # torch runs here but the extension's CUDA runtime does not (e.g. a driver older
                # than the toolkit it was built with): torch issues the copies instead.
                self.native_submitter_error = str(error)
                self.h2d_submitter = TORCH_SUBMITTER
        self.host_pinned = False
        self.direct_pinned_shared = False
        self.pin_error: Optional[str] = None

    def _new_ready_event(self) -> Any:
        return self._torch.cuda.Event(blocking=True)  # synchronize() sleeps instead of spinning

    # -- the native submitter --------------------------------------------------
    def _order_copy_stream(self, copy_stream: Any, current_stream: Any) -> None:
        if self._native is None:
            super()._order_copy_stream(copy_stream, current_stream)
        else:
            self._native.order_after(copy_stream.cuda_stream, current_stream.cuda_stream)

    def _issue_copy(self, dst_tensor: Any, src_tensor: Any, nbytes: int, copy_stream: Any) -> None:
        if self._native is None:
            super()._issue_copy(dst_tensor, src_tensor, nbytes, copy_stream)
            return
        # dst may come from torch's caching allocator: its block must not be reused
        # by the caller's stream before this copy finishes.
        dst_tensor.record_stream(copy_stream)
        self._native.copy_host_to_device(
            dst_tensor.data_ptr(), src_tensor.data_ptr(), nbytes, copy_stream.cuda_stream
        )

    # -- host slots --------------------------------------------------------------
    def _register_host_slots_impl(self, slots: List[Any]) -> List[Tuple[int, Any]]:
        tensors = host_slot_tensors(self._torch, slots, prefault=False)  # cudaHostRegister faults the pages in
        registered: List[Tuple[int, Any]] = []
        self.pin_error = None
        for index, tensor in enumerate(tensors):
            nbytes = tensor.numel() * tensor.element_size()
            if nbytes == 0:
                registered.append((0, tensor))
                continue
            try:
                pinned_here = self._pin(tensor.data_ptr(), nbytes, tensor)
            except (RuntimeError, ValueError, OSError) as error:
                self.pin_error = f"cudaHostRegister(slots[{index}], {nbytes} bytes) failed: {error}"
                self._release_host_slots_impl(registered)
                return []
            # 0: already pinned by its owner, nothing to undo.
            registered.append((tensor.data_ptr() if pinned_here else 0, tensor))
        self.host_pinned = self.direct_pinned_shared = True
        return registered

    def _pin(self, pointer: int, nbytes: int, tensor: Any) -> bool:
        """Page-locks one slot; True when this call registered it (to be undone)."""
        if self._native is not None:
            # In the extension: the whole range is checked, and a failure leaves no CUDA error set.
            return bool(_core.cuda_host_register(pointer, nbytes, self.device.index))
        # ROCm, or an extension whose CUDA runtime cannot start: torch's runtime does it
        # (whether the slot is pinned is judged from its first byte there).
        if tensor.is_pinned():
            return False
        with self._torch.cuda.device(self.device):
            status = int(self._torch.cuda.cudart().cudaHostRegister(pointer, nbytes, _CUDA_HOST_REGISTER_DEFAULT))
        if status != 0:
            raise RuntimeError(f"error {status}")
        return True

    def _release_host_slots_impl(self, registration: List[Tuple[int, Any]]) -> None:
        self.host_pinned = self.direct_pinned_shared = False
        pointers = [pointer for pointer, _tensor in registration if pointer]
        if not pointers:
            return
        # No DMA may still read memory being unpinned.
        self._synchronize_copy_stream("the copy stream before cudaHostUnregister")
        if self._native is not None:
            for pointer in pointers:
                _core.cuda_host_unregister(pointer, self.device.index)  # with the slot's device current
            return
        cudart = self._torch.cuda.cudart()
        with self._torch.cuda.device(self.device):
            for pointer in pointers:
                cudart.cudaHostUnregister(pointer)


__all__ = ["CudaLikeReplayTransferBackend", "select_h2d_submitter", "native_submitter_compiled"]
