"""Device transfer backends for replay pipelines.

A backend copies packed replay batches from shared host slots into device
slots on its own copy stream and tracks, per ring slot, whether the last copy
finished.  ``build_replay_transfer_backend(device=..., ring_depth=...)`` picks
the backend for a device:

=========  ==================================  ===========================================
device     backend                             how
=========  ==================================  ===========================================
cpu        ``HostReplayTransferBackend``       native host stream + copy engine, mlock
cuda       ``CudaLikeReplayTransferBackend``   torch.cuda streams/events, cudaHostRegister
xpu        ``XpuReplayTransferBackend``        torch.xpu streams/events, pageable slots
other      ``TorchCopyReplayTransferBackend``  ``Tensor.copy_`` (+ ``torch.Event`` if any)
=========  ==================================  ===========================================

Importing this package does not import torch.
"""

from tensorxfer.ipc.replay_pipelines.base import ReplayTickMetadata
from tensorxfer.ipc.replay_pipelines.transfer.base import ReplayTransferBackend, TraceRecorder
from tensorxfer.ipc.replay_pipelines.transfer.cuda_like import CudaLikeReplayTransferBackend
from tensorxfer.ipc.replay_pipelines.transfer.factory import build_replay_transfer_backend
from tensorxfer.ipc.replay_pipelines.transfer.host import HostReplayTransferBackend
from tensorxfer.ipc.replay_pipelines.transfer.torch_copy import TorchCopyReplayTransferBackend
from tensorxfer.ipc.replay_pipelines.transfer.xpu import XpuReplayTransferBackend

__all__ = [
    "CudaLikeReplayTransferBackend",
    "HostReplayTransferBackend",
    "ReplayTickMetadata",
    "ReplayTransferBackend",
    "TorchCopyReplayTransferBackend",
    "TraceRecorder",
    "XpuReplayTransferBackend",
    "build_replay_transfer_backend",
]
