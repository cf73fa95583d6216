"""Intel XPU replay transfer backend.

Copies run on a dedicated ``torch.xpu.Stream`` with a ``torch.xpu.Event`` per
slot.  The shared host slots stay pageable (``host_memory_kind`` is
"pageable_shared"): ``register_host_slots`` validates and pre-faults them but
does not pin them.
"""

from __future__ import annotations

from typing import Any, List

from tensorxfer.ipc.replay_pipelines.transfer._torch_device import host_slot_tensors
from tensorxfer.ipc.replay_pipelines.transfer._torch_stream import TorchStreamBackendBase


class XpuReplayTransferBackend(TorchStreamBackendBase):
    """XPU stream/event backend for packed replay batch transfer.

    ``__init__(*, device, ring_depth)``: ``device`` is an "xpu" / "xpu:N"
    string or ``torch.device``; a machine without an XPU raises
    ``tensorxfer.UnsupportedError`` saying what is missing.
    ``wait_current_stream_for_ready`` makes ``torch.xpu.current_stream()``
    wait for the slot's event without blocking the CPU.
    """

    _runtime_name = "xpu"
    device_family = "xpu"
    h2d_submitter = "torch_xpu_copy_stream"
    host_memory_kind = "pageable_shared"
    host_pinned = False
    direct_pinned_shared = False
    supports_async_submit = True
    supports_timing_events = False

    def _register_host_slots_impl(self, slots: List[Any]) -> List[Any]:
        host_slot_tensors(self._torch, slots, prefault=True)
        return []  # pageable: nothing to undo, and the slots are not kept alive


__all__ = ["XpuReplayTransferBackend"]
