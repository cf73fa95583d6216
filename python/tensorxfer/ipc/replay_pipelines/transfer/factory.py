"""Replay transfer backend factory."""

from __future__ import annotations

from typing import Any

from tensorxfer.ipc.replay_pipelines.transfer._common import require_ring_depth
from tensorxfer.ipc.replay_pipelines.transfer.base import ReplayTransferBackend


def _torch_or_none():
    try:
        import torch
    except ImportError:
        return None
    return torch


def build_replay_transfer_backend(*, device: Any, ring_depth: int) -> ReplayTransferBackend:
    """Build the transfer backend for a learner device.

    ``device`` is a ``torch.device`` or a device string: "cpu" ->
    ``HostReplayTransferBackend``, "cuda[:N]" -> ``CudaLikeReplayTransferBackend``
    (CUDA or ROCm), "xpu[:N]" -> ``XpuReplayTransferBackend``, any other torch
    device -> ``TorchCopyReplayTransferBackend``.  ``ring_depth`` (int >= 1) is
    the number of slots the backend tracks.  A device that is not present
    raises ``tensorxfer.UnsupportedError`` naming what is missing; without torch
    installed only "cpu" works.
    """
    ring_depth = require_ring_depth(ring_depth)
    torch = _torch_or_none()
    if torch is None:
        from tensorxfer.ipc.replay_pipelines.transfer._torch_device import parse_device_without_torch

        kind = parse_device_without_torch(device)
    else:
        from tensorxfer.ipc.replay_pipelines.transfer._torch_device import parse_device

        device = parse_device(torch, device)
        kind = device.type
    if kind == "cpu":
        from tensorxfer.ipc.replay_pipelines.transfer.host import HostReplayTransferBackend

        return HostReplayTransferBackend(device=device, ring_depth=ring_depth)
    if kind == "cuda":
        from tensorxfer.ipc.replay_pipelines.transfer.cuda_like import CudaLikeReplayTransferBackend

        return CudaLikeReplayTransferBackend(device=device, ring_depth=ring_depth)
    if kind == "xpu":
        from tensorxfer.ipc.replay_pipelines.transfer.xpu import XpuReplayTransferBackend

        return XpuReplayTransferBackend(device=device, ring_depth=ring_depth)
    from tensorxfer.ipc.replay_pipelines.transfer.torch_copy import TorchCopyReplayTransferBackend

    return TorchCopyReplayTransferBackend(device=device, ring_depth=ring_depth)


__all__ = ["build_replay_transfer_backend"]
