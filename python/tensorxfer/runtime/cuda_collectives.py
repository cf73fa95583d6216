"""All-reduce of CUDA tensors among the ranks of one host, over an IpcMemory(device="cuda").

``CudaCommunicator(group, max_bytes=...)`` is collective: every rank of ``group``
makes one on its GPU (``device``: ``"cuda"`` for torch's current GPU, or
``"cuda:N"``). ``all_reduce(tensor, op, algorithm)`` reduces a contiguous CUDA
tensor in place (float32, float64, bfloat16, float16 summed in float32, int32,
int64; ``sum``, ``avg``, ``max``, ``min``) and, like NCCL, only queues the work on
torch's current stream: the call returns at once, later work on that stream sees
the result, and the call can be captured in a CUDA graph (the barriers' epochs
live on the GPU, so every replay uses fresh ones).

Algorithms: ``one_shot`` (every rank reads every rank's input), ``two_shot``
(reduce-scatter, then all-gather) or ``auto`` (one-shot up to
``_core.CudaAllReduce.one_shot_max_bytes``). Each element is reduced in rank
order with the host's arithmetic, so every rank gets bitwise the same result,
equal to :class:`~tensorxfer.runtime.Communicator`'s on the same inputs. Tensors
larger than ``max_bytes`` go through the regions in chunks.

Every rank must make the same calls with the same dtype, op, algorithm and size.
A rank whose peer announced another call, or that waited longer than ``timeout``
seconds for a peer at a barrier, stops on the GPU (its kernels return without
touching the tensor, so nothing hangs) and records the failure; the next call,
and :meth:`~tensorxfer.runtime.CudaCommunicator.check` once the stream has caught up, raise it (``ValueError`` or
``TimeoutError`` naming the peer). The communicator is then unusable.
"""

from __future__ import annotations

from typing import Any

from tensorxfer import _core
from tensorxfer._arguments import check_int
from tensorxfer.errors import ClosedError, UnsupportedError
from tensorxfer.runtime.ipc_memory import GroupLike, IpcMemory

#: Bytes of each rank's region, which is also the chunk size.
DEFAULT_MAX_BYTES = 8 << 20
#: Seconds a barrier on the GPU waits for a peer before it gives up.
DEFAULT_TIMEOUT = 60.0


def cuda_torch(user: str) -> Any:
    """torch, when it runs CUDA here; else UnsupportedError naming ``user`` (what needs it)."""
    try:
        import torch
    except ImportError as missing:
        raise UnsupportedError(f"{user} needs torch with CUDA (pip install torch)") from missing
    if not torch.cuda.is_available():
        raise UnsupportedError(f"{user}: no CUDA device (torch.cuda.is_available() is False)")
    return torch


def cuda_device_index(torch: Any, device: Any, user: str) -> int:
    """The GPU index ``device`` names: ``"cuda"`` (torch's current GPU) or ``"cuda:N"``; else ValueError."""
    if device == "cuda":
        return int(torch.cuda.current_device())
    if isinstance(device, str) and device.startswith("cuda:") and device[5:].isdigit():
        return int(device[5:])
    raise ValueError(f"{user}: device must be 'cuda' or 'cuda:N', got {device!r}")


class CudaCommunicator:
    """All-reduce of CUDA tensors for the ranks of ``group`` (see the module docstring).

    ``max_bytes``: bytes of each rank's region (the chunk size, >= 8);
    ``timeout``: seconds a barrier on the GPU waits for a peer (> 0; the IpcMemory
    exchange at construction uses it too).
    """

    def __init__(self, group: GroupLike, max_bytes: int = DEFAULT_MAX_BYTES, *, device: str = "cuda",
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        max_bytes = check_int(max_bytes, "max_bytes", minimum=8)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 1e6:
            raise ValueError(f"CudaCommunicator: timeout must be a number of seconds in (0, 1e6], got {timeout!r}")
        torch = cuda_torch("CudaCommunicator")
        index = cuda_device_index(torch, device, "CudaCommunicator")
        self._torch = torch
        self._device = torch.device("cuda", index)
        self._max_bytes = max_bytes
        self._native: Any = None
        self._memory = IpcMemory.create(group, max_bytes, f"cuda:{index}", timeout=float(timeout))
        try:
            self._native = _core.CudaAllReduce(
                rank=self._memory.worker_id, world_size=self._memory.num_workers, cuda_device=index,
                data=self._memory.remote_data, barrier_in=self._memory.barrier_in,
                barrier_out=self._memory.barrier_out, data_nbytes=max_bytes, timeout=float(timeout))
        except BaseException:
            self._memory.close()
            raise

    @property
    def rank(self) -> int:
        """This rank's index in the group."""
        return self._memory.worker_id

    @property
    def world_size(self) -> int:
        """The number of ranks."""
        return self._memory.num_workers

    @property
    def device(self) -> Any:
        """This rank's GPU (a ``torch.device``)."""
        return self._device

    @property
    def max_bytes(self) -> int:
        """Bytes of each rank's region, which is also the chunk size."""
        return self._max_bytes

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run."""
        return self._native is None

    def all_reduce(self, tensor: Any, op: str = "sum", algorithm: str = "auto") -> Any:
        """Queues the in-place all-reduce of ``tensor`` on torch's current stream; returns ``tensor``."""
        native = self._require_open()
        torch = self._torch
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"CudaCommunicator.all_reduce: tensor must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.device != self._device:
            raise ValueError(f"CudaCommunicator.all_reduce: tensor is on {tensor.device}, this communicator on "
                             f"{self._device}")
        if not tensor.is_contiguous():
            raise ValueError("CudaCommunicator.all_reduce: tensor must be contiguous")
        dtype = str(tensor.dtype).replace("torch.", "")  # the native call refuses other dtypes (TypeError)
        if not isinstance(op, str) or not isinstance(algorithm, str):
            raise TypeError("CudaCommunicator.all_reduce: op and algorithm must be str")
        stream = torch.cuda.current_stream(self._device).cuda_stream
        native.all_reduce(tensor.data_ptr(), tensor.numel(), dtype, op, algorithm, stream)
        return tensor

    def check(self) -> None:
        """Raises the failure the GPU recorded (``TimeoutError``, ``ValueError``), if any.

        Complete once torch's stream has run the calls made so far.
        """
        self._require_open().throw_if_failed()

    def close(self) -> None:
        """Collective: waits for this GPU's queued work, then frees the regions. Idempotent."""
        if self._native is None:
            return
        self._torch.cuda.synchronize(self._device)
        self._native = None
        self._memory.close()

    def __enter__(self) -> "CudaCommunicator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return (f"CudaCommunicator(rank={self.rank}, world_size={self.world_size}, device={self._device}, "
                f"max_bytes={self._max_bytes}, {state})")

    def _require_open(self) -> Any:
        if self._native is None:
            raise ClosedError("CudaCommunicator is closed")
        return self._native


__all__ = ["CudaCommunicator", "DEFAULT_MAX_BYTES", "DEFAULT_TIMEOUT"]
