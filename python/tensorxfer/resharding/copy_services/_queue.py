"""The submit queue of the batched copy services (private).

A step of a resharding job submits thousands of ops, so a submit must cost
little more than its checks, and allocate nothing the garbage collector
tracks (with torch imported, a full collection costs tens of milliseconds).
While nobody looks at them, the queues are therefore three plain lists (task
ids, tensors, ranks). ``send_ops`` / ``recv_ops`` are still the documented
lists of ``SendOp`` / ``RecvOp``: the first read builds that list from the
columns, and from then on, until ``run()`` takes the queue, submits append
dataclasses to it. So whoever holds the list sees only ``SendOp`` / ``RecvOp``
in it, and what they change there (clear it, edit an op) is what ``run()``
executes.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from tensorxfer.resharding.copy_services import _tensors
from tensorxfer.resharding.copy_services.base import CopyService, RecvOp, SendOp, check_rank, check_task_id

_ndarray = np.ndarray
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1

# What run() gets from a queue: task ids, tensors (normalized), ranks (peers), in submit order.
Columns = Tuple[List[Optional[int]], List[Any], List[int]]


class QueuedCopyService(CopyService):
    """CopyService whose submits check their arguments and queue them as columns.

    Subclasses set ``host_only`` and take the queue with ``_take_columns()``;
    ``world_size`` bounds the ranks a submit accepts.
    """

    host_only = True  # torch tensors must be on the host

    def __init__(self, group: Any = None) -> None:
        super().__init__(group)  # assigns send_ops / recv_ops (the setters below)
        self._torch_type: type = _tensors.torch_tensor_type()  # the fast path's, once torch is seen
        self._reset_queues()

    def _reset_queues(self) -> None:
        # Columns mode (_send_plain): the ops are in the three lists and _send_objects is
        # empty; else they are in _send_objects (the list send_ops returned or was given).
        # A closed service is never in columns mode, so its submits take the checked path.
        self._send_ids: List[Optional[int]] = []
        self._send_tensors: List[Any] = []
        self._send_ranks: List[int] = []
        self._send_objects: List[SendOp] = []
        self._recv_ids: List[Optional[int]] = []
        self._recv_tensors: List[Any] = []
        self._recv_ranks: List[int] = []
        self._recv_objects: List[RecvOp] = []
        self._send_plain = self._recv_plain = not self._closed

    # ---- the documented queues ------------------------------------------------------

    @property  # type: ignore[override]
    def send_ops(self) -> List[SendOp]:
        """The sends queued since the last run, as SendOp (``run()`` executes and clears them)."""
        if self._send_plain:
            self._send_objects = list(map(SendOp, self._send_ids, self._send_tensors, self._send_ranks))
            self._send_ids, self._send_tensors, self._send_ranks = [], [], []
            self._send_plain = False
        return self._send_objects

    @send_ops.setter
    def send_ops(self, ops: List[SendOp]) -> None:
        self._send_ids, self._send_tensors, self._send_ranks = [], [], []
        self._send_objects = ops
        self._send_plain = False

    @property  # type: ignore[override]
    def recv_ops(self) -> List[RecvOp]:
        """The receives queued since the last run, as RecvOp (``run()`` executes and clears them)."""
        if self._recv_plain:
            self._recv_objects = list(map(RecvOp, self._recv_ids, self._recv_tensors, self._recv_ranks))
            self._recv_ids, self._recv_tensors, self._recv_ranks = [], [], []
            self._recv_plain = False
        return self._recv_objects

    @recv_ops.setter
    def recv_ops(self, ops: List[RecvOp]) -> None:
        self._recv_ids, self._recv_tensors, self._recv_ranks = [], [], []
        self._recv_objects = ops
        self._recv_plain = False

    def close(self) -> None:
        """Drops the queued ops; later calls raise tensorxfer.ClosedError."""
        self._closed = True
        self._reset_queues()

    def _queued_counts(self) -> Tuple[int, int]:
        # Counted where the ops are, so that a repr() does not turn the queue into dataclasses.
        return (len(self._send_ids) if self._send_plain else len(self._send_objects),
                len(self._recv_ids) if self._recv_plain else len(self._recv_objects))

    def _take_columns(self) -> Tuple[Columns, Columns]:
        """(task ids, tensors, ranks) of the queued sends and receives, leaving the queues empty."""
        if self._send_plain:
            sends: Columns = (self._send_ids, self._send_tensors, self._send_ranks)
        else:
            send_ops = self._send_objects
            sends = ([op.task_id for op in send_ops], [op.tensor for op in send_ops], [op.dest_rank for op in send_ops])
        if self._recv_plain:
            recvs: Columns = (self._recv_ids, self._recv_tensors, self._recv_ranks)
        else:
            recv_ops = self._recv_objects
            recvs = ([op.task_id for op in recv_ops], [op.tensor for op in recv_ops], [op.src_rank for op in recv_ops])
        self._reset_queues()
        return sends, recvs

    # ---- submission -------------------------------------------------------------------
    # The common case (a numpy array or a torch tensor, an int rank in range, an int
    # task id or None, an open service nobody inspected the queue of) is one test;
    # anything else takes the checked path, which raises what the base class raises.

    def submit_send(self, src_tensor: Any, dest_rank: int, task_id: Optional[int] = None) -> None:
        """Queue ``src_tensor`` to be sent to ``dest_rank``; its bytes are read during run()."""
        kind = type(src_tensor)
        if (((kind is _ndarray and not src_tensor.dtype.hasobject)
             or (kind is self._torch_type and (not self.host_only or src_tensor.is_cpu)))
                and type(dest_rank) is int and 0 <= dest_rank < self.world_size
                and (task_id is None or (type(task_id) is int and _INT64_MIN <= task_id <= _INT64_MAX))
                and self._send_plain):
            self._send_ids.append(task_id)
            self._send_tensors.append(src_tensor)
            self._send_ranks.append(dest_rank)
            return
        self._check_open("submit_send")
        tensor = _tensors.normalize_fast(src_tensor, "src_tensor", False, self.host_only, self.backend_name)
        self._torch_type = _tensors.torch_tensor_type()
        rank = check_rank(dest_rank, self.world_size, "dest_rank")
        task_id = check_task_id(task_id)
        if self._send_plain:
            self._send_ids.append(task_id)
            self._send_tensors.append(tensor)
            self._send_ranks.append(rank)
        else:
            self._send_objects.append(SendOp(task_id, tensor, rank))

    def submit_recv(self, dest_tensor: Any, src_rank: int, task_id: Optional[int] = None) -> None:
        """Queue ``dest_tensor`` to receive from ``src_rank`` (any layout: staged if not contiguous)."""
        kind = type(dest_tensor)
        if (((kind is _ndarray and dest_tensor.flags.writeable and not dest_tensor.dtype.hasobject)
             or (kind is self._torch_type and (not self.host_only or dest_tensor.is_cpu)))
                and type(src_rank) is int and 0 <= src_rank < self.world_size
                and (task_id is None or (type(task_id) is int and _INT64_MIN <= task_id <= _INT64_MAX))
                and self._recv_plain):
            self._recv_ids.append(task_id)
            self._recv_tensors.append(dest_tensor)
            self._recv_ranks.append(src_rank)
            return
        self._check_open("submit_recv")
        tensor = _tensors.normalize_fast(dest_tensor, "dest_tensor", True, self.host_only, self.backend_name)
        self._torch_type = _tensors.torch_tensor_type()
        rank = check_rank(src_rank, self.world_size, "src_rank")
        task_id = check_task_id(task_id)
        if self._recv_plain:
            self._recv_ids.append(task_id)
            self._recv_tensors.append(tensor)
            self._recv_ranks.append(rank)
        else:
            self._recv_objects.append(RecvOp(task_id, tensor, rank))
