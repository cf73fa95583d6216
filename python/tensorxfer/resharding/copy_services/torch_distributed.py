"""``TorchDistributedCopyService``: the batched copy service over torch.distributed.

Each window is one ``batch_isend_irecv`` (gloo on CPU tensors, nccl on CUDA
tensors); small tensors go packed per peer. Gloo's point-to-point work never
reports completion before ``wait()`` is called, and a wait that times out
closes the connection, so a run waits once per work with the time left until
its deadline: a peer that never calls run() raises TimeoutError, one that dies
raises tensorxfer.PeerLostError (gloo sees the connection close). Ctrl-C is
handled when the current wait returns.
"""

from __future__ import annotations

import datetime
import time

from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

from tensorxfer.errors import PeerLostError
from tensorxfer.resharding.copy_services._hosts_plan import HostsPlanner
from tensorxfer.resharding.copy_services._liveness import PeerWatch
from tensorxfer.resharding.copy_services._network_engines import TorchEngine
from tensorxfer.resharding.copy_services._messages import MessageExecutor, Posting, message_run
from tensorxfer.resharding.copy_services._queue import SubmitQueue
from tensorxfer.resharding.copy_services._service import QueuedCopyService
from tensorxfer.resharding.copy_services.base import DEFAULT_TIMEOUT


class TorchDistributedCopyService(QueuedCopyService):
    """Batched send/recv by task id over a torch.distributed process group.

    Ranks are ranks of ``group``. Every rank of the group must call ``run()`` for
    each batch. numpy arrays are sent as CPU tensors. Collective construction: the
    ranks compare the options.

    Args:
        group: a process group; None = the default group (which must be initialized).
        timeout: seconds a run waits for its peers (None = forever, still watching
            same-host peers and Ctrl-C).
        **options: the window options, the same on every rank (the ranks compare them
            at construction): ``max_window_tasks`` (default 65536) and
            ``max_window_bytes`` (default 256 MiB) bound a window; tasks under
            ``coalesce_bytes`` (default 128 KiB) are packed per peer and window into one
            message; ``bucket_nbytes`` (default 1 MiB) is the message size of persistent
            plans between hosts.

    Raises:
        RuntimeError: torch.distributed is not initialized.
        ValueError: this process is not a member of ``group``, or a window option
            differs between ranks.
    """

    backend_name = "TorchDistributedCopyService"
    #: True unless the group is gloo (see __init__); nccl's wait() is stream-ordered.
    requires_process_group_barrier = True

    def __init__(self, group: Any = None, *, timeout: Optional[float] = DEFAULT_TIMEOUT, **options: Any) -> None:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "TorchDistributedCopyService: torch.distributed is not initialized "
                "(call torch.distributed.init_process_group first)"
            )
        process_group = group if group is not None else dist.group.WORLD
        if dist.get_rank(process_group) < 0:
            raise ValueError("group: this process is not a member of the given process group")
        # nccl's wait() only orders the caller's CUDA stream after the transfer; gloo's
        # returns once the bytes are in host memory.
        self.requires_process_group_barrier = "gloo" not in str(dist.get_backend(process_group)).lower()
        super().__init__(group)
        transport = _TorchTransport(group, process_group, self.rank, self.world_size)
        queue = SubmitQueue(self.backend_name, self.world_size, host_only=False)
        self._protocol = message_run(self.backend_name, self.rank, self.world_size, transport, timeout, options)
        self._messages: MessageExecutor = self._protocol.mover  # type: ignore[assignment]
        self.timeout = self._protocol.timeout
        self._planner = HostsPlanner(self, self._protocol, lambda plan_index: TorchEngine(process_group, plan_index),
                                     self._messages.bucket_nbytes)
        self._compose(queue, self._protocol)

    def close(self) -> None:
        """Releases the persistent plans' shared memory and threads; later calls raise tensorxfer.ClosedError."""
        if not self._closed and "_planner" in self.__dict__:
            self._planner.close()
        super().close()

    def _build_persistent_runner(self, send_ids: List[Any], send_tensors: List[Any], send_peers: List[int],
                                 recv_ids: List[Any], recv_tensors: List[Any], recv_peers: List[int],
                                 timeout: Any) -> Any:
        """A persistent plan's runner (collective): shared memory inside each host, gloo between hosts."""
        return self._planner.build(send_ids, send_tensors, send_peers, recv_ids, recv_tensors, recv_peers, timeout)


class _TorchTransport:
    """Messages through batch_isend_irecv on a process group (a MessageTransport)."""

    def __init__(self, group: Any, process_group: Any, rank: int, world_size: int) -> None:
        import torch
        import torch.distributed as dist

        self._torch = torch
        self._dist = dist
        self._process_group = process_group
        self._global_ranks = [dist.get_global_rank(group, r) if group is not None else r for r in range(world_size)]
        self.backend_name = "TorchDistributedCopyService"
        self.rank, self.world_size = rank, world_size
        self.watch: Optional[PeerWatch] = None  # set once the ranks exchanged identities

    def _metadata_device(self) -> Any:
        backend = str(self._dist.get_backend(self._process_group)).lower()
        if "nccl" in backend:
            return self._torch.device("cuda", self._torch.cuda.current_device())
        return self._torch.device("cpu")

    # ---- transport ----------------------------------------------------------------------

    def start_all_gather(self, data: bytes, fixed: bool = False) -> Tuple[List[Any], Callable[[], Any]]:
        torch, dist = self._torch, self._dist
        device = self._metadata_device()
        payload = torch.from_numpy(np.frombuffer(data, np.uint8).copy()).to(device)
        if fixed:  # one step: every rank sends as many bytes
            everything = [torch.empty_like(payload) for _ in range(self.world_size)]
            work = dist.all_gather(everything, payload, group=self._process_group, async_op=True)
            return [work], lambda: [output.cpu().numpy().tobytes() for output in everything]
        own_size = torch.tensor([payload.numel()], dtype=torch.int64, device=device)
        sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(self.world_size)]
        work = dist.all_gather(sizes, own_size, group=self._process_group, async_op=True)

        def gather_data() -> Any:
            counts = [int(size.item()) for size in sizes]
            longest = max(counts)
            padded = torch.zeros(longest, dtype=torch.uint8, device=device)
            padded[: payload.numel()] = payload
            outputs = [torch.empty(longest, dtype=torch.uint8, device=device) for _ in range(self.world_size)]
            second = dist.all_gather(outputs, padded, group=self._process_group, async_op=True)

            def split() -> List[bytes]:
                return [output[:count].cpu().numpy().tobytes() for output, count in zip(outputs, counts)]

            return [second], split

        return [work], gather_data

    def new_staging(self, nbytes: int, like: Any) -> Any:
        device = like.device if hasattr(like, "device") and not isinstance(like, np.ndarray) else "cpu"
        return self._torch.empty(max(nbytes, 1), dtype=self._torch.uint8, device=device)

    def _message_tensor(self, tensor: Any, nbytes: int) -> Any:
        if isinstance(tensor, np.ndarray):
            tensor = self._torch.from_numpy(tensor)
        flat = tensor.reshape(-1)
        if flat.dtype != self._torch.uint8:
            flat = flat.view(self._torch.uint8)
        return flat[:nbytes]

    def post(self, sends: Sequence[Posting], recvs: Sequence[Posting]) -> List[Any]:
        dist = self._dist
        operations = []
        for peer, tag, tensor, _, nbytes in recvs:
            operations.append(dist.P2POp(dist.irecv, self._message_tensor(tensor, nbytes), self._global_ranks[peer],
                                         self._process_group, tag))
        for peer, tag, tensor, _, nbytes in sends:
            operations.append(dist.P2POp(dist.isend, self._message_tensor(tensor, nbytes), self._global_ranks[peer],
                                         self._process_group, tag))
        if not operations:
            return []
        return list(dist.batch_isend_irecv(operations))

    def wait(self, requests: List[Any], deadline: Optional[float], timeout: Optional[float], what: str,
             peers: Optional[List[int]]) -> None:
        for work in requests:
            try:
                if deadline is None:
                    work.wait()
                else:
                    remaining = max(deadline - time.monotonic(), 0.001)
                    work.wait(datetime.timedelta(seconds=remaining))
            except RuntimeError as error:
                text = str(error)
                dead = [p for p in range(self.world_size) if p != self.rank and self.watch is not None
                        and self.watch.is_dead(p)]
                if dead:
                    raise PeerLostError(f"{self.backend_name}: rank {dead[0]} died during {what} "
                                        f"(rank {self.rank}): {text}") from error
                if "Timed out" in text or "timed out" in text or "Timeout" in text:
                    waiting_on = "every rank" if peers is None else f"ranks {peers}"
                    raise TimeoutError(
                        f"{self.backend_name}: rank {self.rank} waited {waited_text(timeout)} for {what} with "
                        f"{waiting_on}; a peer did not call run() or stalled ({text})"
                    ) from error
                if "closed" in text or "reset" in text or "Broken pipe" in text:
                    raise PeerLostError(f"{self.backend_name}: a peer of rank {self.rank} was lost during "
                                        f"{what}: {text}") from error
                raise


def waited_text(timeout: Optional[float]) -> str:
    """How long a wait lasted, for a message.

    ``timeout`` None means no deadline of ours (the process group's own timeout then ended it).
    """
    return "without a deadline (until the process group's own timeout)" if timeout is None else f"{timeout:g} s"


__all__ = ["TorchDistributedCopyService"]
