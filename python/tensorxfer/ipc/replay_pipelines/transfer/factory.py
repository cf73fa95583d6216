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
    """Builds the transfer backend for a learner device.

    Without torch installed only "cpu" works.

    Args:
        device: a ``torch.device`` or a device string: "cpu" gives a
            ``HostReplayTransferBackend``, "cuda[:N]" a ``CudaLikeReplayTransferBackend``
            (CUDA or ROCm), "xpu[:N]" an ``XpuReplayTransferBackend``, any other torch
            device a ``TorchCopyReplayTransferBackend``.
        ring_depth: the number of slots the backend tracks (an int >= 1).

    Returns:
        The backend; close it, or use it as a context manager.

    Raises:
        tensorxfer.UnsupportedError: the device is not present (the message names what
            is missing).
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
