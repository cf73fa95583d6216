"""``LocalCopyService``: the copy service of one process (same-rank ops only).

Sends and receives are matched strictly by task id
(:func:`match_local_ops_by_task_id`) and copied by the native copy engine (GIL
released) when both sides are contiguous host tensors, else by numpy/torch:
the submit queue, the matching and the copies are those of the other backends.
"""

from __future__ import annotations

from typing import Any, Optional

from tensorxfer.resharding.copy_services import _tensors
from tensorxfer.resharding.copy_services._pattern import OpPattern, pattern_for
from tensorxfer.resharding.copy_services._forwarding import ForwardsToQueue


class LocalCopyService(ForwardsToQueue):
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
        # Tensors on a device are copied by torch.
        self._hold_queue(host_only=False, peers=(self.rank, self.rank + 1),
                         same_rank_message=f"LocalCopyService copies within rank {self.rank} only")
        self._pattern: Optional[OpPattern] = None

    def close(self) -> None:
        """Drops the queued ops; later calls raise tensorxfer.ClosedError."""
        self._closed = True
        self._queue.close()

    def run(self) -> None:
        """Copy every queued send into the receive of the same task id, then clear the queue.

        Raises RuntimeError from match_local_ops_by_task_id, or TaskMismatchError
        when a pair differs in byte size; nothing is copied then.
        """
        self._check_open("run")
        sends, recvs = self._queue.take()
        pattern = pattern_for(self._pattern, self.backend_name, self.rank, sends, recvs)
        self._pattern = pattern if pattern.match_error is None else None
        if pattern.match_error is not None:
            raise pattern.match_error
        send_spans = sends.spans()
        recv_spans = recvs.spans()
        error = pattern.local_error(send_spans.nbytes, recv_spans.nbytes)
        if error is not None:
            raise error
        if pattern.pairs[0].size:
            _tensors.copy_pairs(pattern.pairs, sends.tensors, recvs.tensors, send_spans, recv_spans)


__all__ = ["LocalCopyService"]
