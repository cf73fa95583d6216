"""CUDA/ROCm replay transfer backend.

Copies run on a dedicated ``torch.cuda.Stream``; a ``torch.cuda.Event`` per
slot marks when the slot's copy is done.  ``register_host_slots`` pins the
shared host slots in place with ``cudaHostRegister`` (undone on ``close``), so
the copy engine reads them directly (DMA from pinned memory, truly
asynchronous).  On a ROCm build of torch the same calls go to HIP and
``device_family`` is "rocm".
"""

from __future__ import annotations

from typing import Any, List, Tuple

from tensorxfer.ipc.replay_pipelines.transfer._common import poll_until_done
from tensorxfer.ipc.replay_pipelines.transfer._torch_device import host_slot_tensors
from tensorxfer.ipc.replay_pipelines.transfer._torch_stream import CLOSE_TIMEOUT_S, TorchStreamBackendBase

_CUDA_HOST_REGISTER_DEFAULT = 0


class CudaLikeReplayTransferBackend(TorchStreamBackendBase):
    """Replay transfer to a CUDA or ROCm device through torch.cuda streams and events.

    ``host_pinned`` / ``direct_pinned_shared`` turn True once
    ``register_host_slots`` has page-locked every slot in place (``pin_error``
    says why it did not); the backend then keeps the slots alive until they are
    unregistered (re-registration or ``close``), since freeing registered memory
    is undefined in CUDA.  ``wait_current_stream_for_ready`` makes
    ``torch.cuda.current_stream()`` wait for the slot's event without blocking
    the CPU.  With ``trace_cuda_events=True`` each submit hands a pair of timing
    events to ``trace_recorder.add_cuda_pending_span``.
    """

    _runtime_name = "cuda"
    h2d_submitter = "torch_cuda_copy_stream"
    host_memory_kind = "pinned_shared"
    supports_async_submit = True
    supports_timing_events = True

    def __init__(self, *, device: Any, ring_depth: int) -> None:
        super().__init__(device=device, ring_depth=ring_depth)
        self.device_family = "rocm" if self._torch.version.hip else "cuda"
        self.host_pinned = False
        self.direct_pinned_shared = False
        self.pin_error = None

    def _register_host_slots_impl(self, slots: List[Any]) -> List[Tuple[int, Any]]:
        torch = self._torch
        tensors = host_slot_tensors(torch, slots, prefault=False)  # cudaHostRegister faults the pages in
        cudart = torch.cuda.cudart()
        registered: List[Tuple[int, Any]] = []
        self.pin_error = None
        with torch.cuda.device(self.device):
            for index, tensor in enumerate(tensors):
                nbytes = tensor.numel() * tensor.element_size()
                if nbytes == 0 or tensor.is_pinned():
                    registered.append((0, tensor))  # nothing to register (already pinned by its owner)
                    continue
                status = cudart.cudaHostRegister(tensor.data_ptr(), nbytes, _CUDA_HOST_REGISTER_DEFAULT)
                if int(status) != 0:
                    self.pin_error = (
                        f"cudaHostRegister(slots[{index}], {nbytes} bytes) failed with error {int(status)}"
                    )
                    self._release_host_slots_impl(registered)
                    return []
                registered.append((tensor.data_ptr(), tensor))
        self.host_pinned = self.direct_pinned_shared = True
        return registered

    def _release_host_slots_impl(self, registration: List[Tuple[int, Any]]) -> None:
        self.host_pinned = self.direct_pinned_shared = False
        pointers = [pointer for pointer, _tensor in registration if pointer]
        if pointers:
            stream = getattr(self, "_copy_stream", None)
            if stream is not None:  # no DMA may still read memory being unpinned
                poll_until_done(stream.query, CLOSE_TIMEOUT_S, "the copy stream before cudaHostUnregister")
            cudart = self._torch.cuda.cudart()
            for pointer in pointers:
                cudart.cudaHostUnregister(pointer)


__all__ = ["CudaLikeReplayTransferBackend"]
