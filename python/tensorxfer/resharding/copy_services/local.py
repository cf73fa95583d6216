"""``LocalCopyService``: the copy service of one process (same-rank ops only).

Sends and receives are matched strictly by task id
(:func:`match_local_ops_by_task_id`) and copied by the native copy engine (GIL
released) when both sides are contiguous host tensors, else by numpy/torch.
"""

from __future__ import annotations

from typing import Any, List, Optional

from tensorxfer.resharding.copy_services import _tensors
from tensorxfer.resharding.copy_services.base import CopyService, TaskMismatchError, match_local_ops_by_task_id


class LocalCopyService(CopyService):
    """Same-process copies by task id.

    ``group``: None means world size 1, rank 0; a torch.distributed process
    group (or the default one, when initialized and ``group`` is None) gives
    this process's rank in it, but only ops to and from that same rank are
    accepted (ValueError otherwise).
    """

    backend_name = "LocalCopyService"
    requires_process_group_barrier = False  # nothing crosses processes

    def __init__(self, group: Any = None) -> None:
        super().__init__(group)
        self._send_info: List[_tensors.TensorInfo] = []
        self._recv_info: List[_tensors.TensorInfo] = []

    def _check_same_rank(self, rank: Any, argument: str) -> None:
        if rank != self.rank:
            raise ValueError(f"{argument}: LocalCopyService copies within rank {self.rank} only, got rank {rank}")

    def submit_send(self, src_tensor: Any, dest_rank: int, task_id: Optional[int] = None) -> None:
        """Queue ``src_tensor`` for the receive of the same task id on this rank."""
        self._check_open("submit_send")
        tensor = _tensors.normalize(src_tensor, "src_tensor", writable=False)
        self._queue_send(tensor, dest_rank, task_id)
        try:
            self._check_same_rank(self.send_ops[-1].dest_rank, "dest_rank")
        except ValueError:
            self.send_ops.pop()
            raise
        self._send_info.append(_tensors.describe(tensor))

    def submit_recv(self, dest_tensor: Any, src_rank: int, task_id: Optional[int] = None) -> None:
        """Queue ``dest_tensor`` to receive the send of the same task id on this rank."""
        self._check_open("submit_recv")
        tensor = _tensors.normalize(dest_tensor, "dest_tensor", writable=True)
        self._queue_recv(tensor, src_rank, task_id)
        try:
            self._check_same_rank(self.recv_ops[-1].src_rank, "src_rank")
        except ValueError:
            self.recv_ops.pop()
            raise
        self._recv_info.append(_tensors.describe(tensor))

    def run(self) -> None:
        """Copy every queued send into the receive of the same task id, then clear the queue.

        Raises RuntimeError from match_local_ops_by_task_id, or TaskMismatchError
        when a pair differs in byte size; nothing is copied then.
        """
        self._check_open("run")
        sends, recvs = self._take_ops()
        send_info, recv_info = self._send_info, self._recv_info
        self._send_info, self._recv_info = [], []
        for index, send in enumerate(sends):
            send.index = index  # type: ignore[attr-defined]
        for index, recv in enumerate(recvs):
            recv.index = index  # type: ignore[attr-defined]
        pairs = match_local_ops_by_task_id(sends, recvs, self.backend_name, self.rank)
        for send, recv in pairs:
            sent, received = send_info[send.index].nbytes, recv_info[recv.index].nbytes
            if sent != received:
                raise TaskMismatchError(
                    f"{self.backend_name}: size mismatch for task_id={send.task_id} on rank {self.rank}: "
                    f"the local send has {sent} bytes, the local recv {received} bytes"
                )
        dst_addresses, src_addresses, sizes = [], [], []
        for send, recv in pairs:
            src, dst = send_info[send.index], recv_info[recv.index]
            if src.nbytes == 0:
                continue
            if src.contiguous and dst.contiguous and src.host and dst.host:
                dst_addresses.append(dst.address)
                src_addresses.append(src.address)
                sizes.append(src.nbytes)
            else:
                _tensors.copy_bytes_into(recv.tensor, _tensors.contiguous(send.tensor))
        if sizes:
            _tensors.copy_host_spans(src_addresses, dst_addresses, sizes)

    def close(self) -> None:
        """Drop queued ops; later calls raise tensorxfer.ClosedError."""
        self._send_info, self._recv_info = [], []
        self.send_ops, self.recv_ops = [], []
        self._closed = True


__all__ = ["LocalCopyService"]
