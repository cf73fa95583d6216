"""``LocalCopyService``: the copy service of one process (same-rank ops only).

Sends and receives are matched strictly by task id
(:func:`~tensorxfer.resharding.copy_services.match_local_ops_by_task_id`) and
copied by the native copy engine (GIL released) when both sides are contiguous
host tensors, else by numpy/torch: the submit queue, the matching and the copies
are those of the other backends.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

from tensorxfer.resharding.copy_services import _tensors
from tensorxfer.resharding.copy_services._pattern import OpPattern, pattern_for
from tensorxfer.resharding.copy_services._queue import Columns, SubmitQueue
from tensorxfer.resharding.copy_services._service import QueuedCopyService


class LocalRun:
    """The run of one process: the same-rank pairs, matched and copied (no peers, no plan)."""

    plans_built = 0

    def __init__(self, backend_name: str, rank: int) -> None:
        self.backend_name = backend_name
        self.rank = rank
        self._pattern: Optional[OpPattern] = None

    def run(self, take: Callable[[], Tuple[Columns, Columns]], timeout: Optional[float]) -> None:
        """Copies every queued send into the receive of the same task id.

        Args:
            take: returns the queued sends and receives (and empties the queue).
            timeout: unused, nothing waits.

        Raises:
            TaskMismatchError: match_local_ops_by_task_id's, or a pair of different byte
                sizes; nothing is copied then.
        """
        sends, recvs = take()
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

    def close(self) -> None:
        """Drops the pattern kept from the last run (the next run matches its ops anew)."""
        self._pattern = None


class LocalCopyService(QueuedCopyService):
    """Same-process copies by task id.

    ``group``: None means world size 1, rank 0; a torch.distributed process
    group (or the default one, when initialized and ``group`` is None) gives
    this process's rank in it, but only ops to and from that same rank are
    accepted (ValueError otherwise). ``run()`` copies every queued send into the
    receive of the same task id, then clears the queue; it raises
    TaskMismatchError (match_local_ops_by_task_id's, or a pair of different byte
    sizes) and copies nothing then.
    """

    backend_name = "LocalCopyService"
    requires_process_group_barrier = False  # nothing crosses processes

    def __init__(self, group: Any = None, **options: Any) -> None:
        if options:
            raise TypeError(f"LocalCopyService takes no options, got {sorted(options)}")
        super().__init__(group)
        # Tensors on a device are copied by torch.
        queue = SubmitQueue(self.backend_name, self.world_size, host_only=False, peers=(self.rank, self.rank + 1),
                            same_rank_message=f"LocalCopyService copies within rank {self.rank} only")
        self._compose(queue, LocalRun(self.backend_name, self.rank))


__all__ = ["LocalCopyService", "LocalRun"]
