"""The submit queue every copy service holds (private).

A step of a resharding job submits thousands of ops, so a submit must cost
little more than its checks, and allocate nothing the garbage collector
tracks (with torch imported, a full collection costs tens of milliseconds).
The queue is therefore three plain lists per direction (task ids, tensors,
ranks), and that is its only store. ``send_ops`` / ``recv_ops`` are the
documented lists of ``SendOp`` / ``RecvOp``: :class:`QueuedOps` shows the
columns as such a list. What a caller changes there (clears it, edits an op it
read from it, assigns a new list) is what ``run()`` executes.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, MutableSequence, Optional, Tuple, Union, overload

import numpy as np

from tensorxfer.errors import ClosedError
from tensorxfer.resharding.copy_services import _tensors
from tensorxfer.resharding.copy_services.base import RecvOp, SendOp, check_rank, check_task_id

_ndarray = np.ndarray
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1

# What run() gets from a queue: task ids, tensors (normalized), ranks (peers), in submit order.
Columns = Tuple[List[Optional[int]], List[Any], List[int]]
Op = Union[SendOp, RecvOp]


class SubmitQueue:
    """The ops submitted since the last run, checked as they come.

    ``peers``: the [low, high) range of ranks a submit may name without
    ``same_rank_message`` (the local backend's own rank); every rank of
    ``world_size`` otherwise. ``host_only``: torch tensors must be on the host.
    """

    def __init__(self, backend_name: str, world_size: int, host_only: bool = True,
                 peers: Optional[Tuple[int, int]] = None, same_rank_message: str = "") -> None:
        self.backend_name = backend_name
        self.world_size = world_size
        self.host_only = host_only
        self.closed = False
        self._low, self._high = peers if peers is not None else (0, world_size)
        self._same_rank_message = same_rank_message
        self._torch_type: type = _tensors.torch_tensor_type()  # the fast path's, once torch is seen
        self.send_ops = QueuedOps(self, SendOp)
        self.recv_ops = QueuedOps(self, RecvOp)
        self._reset()

    def _reset(self) -> None:
        self._send_ids: List[Optional[int]] = []
        self._send_tensors: List[Any] = []
        self._send_ranks: List[int] = []
        self._recv_ids: List[Optional[int]] = []
        self._recv_tensors: List[Any] = []
        self._recv_ranks: List[int] = []
        self.send_ops._forget()
        self.recv_ops._forget()

    def columns(self, op_type: type) -> Columns:
        """The live columns of one direction (SendOp: the sends)."""
        if op_type is SendOp:
            return self._send_ids, self._send_tensors, self._send_ranks
        return self._recv_ids, self._recv_tensors, self._recv_ranks

    def counts(self) -> Tuple[int, int]:
        """How many sends and receives are queued."""
        return len(self._send_ids), len(self._recv_ids)

    def take(self) -> Tuple[Columns, Columns]:
        """(task ids, tensors, ranks) of the queued sends and receives, leaving the queue empty."""
        self.send_ops._write_back()
        self.recv_ops._write_back()
        taken = self.columns(SendOp), self.columns(RecvOp)
        self._reset()
        return taken

    def close(self) -> None:
        """Drops the queued ops; later submits raise tensorxfer.ClosedError."""
        self.closed = True
        self._high = self._low  # no rank passes the fast path: submits take the checked one
        self._reset()

    # ---- submission -------------------------------------------------------------------
    # The common case (a numpy array or a torch tensor, an int rank in range, an int
    # task id or None, an open queue) is one test; anything else takes the checked
    # path, which raises what the base class documents.

    def submit_send(self, src_tensor: Any, dest_rank: int, task_id: Optional[int] = None) -> None:
        """Queue ``src_tensor`` to be sent to ``dest_rank``; its bytes are read during run()."""
        kind = type(src_tensor)
        if (((kind is _ndarray and not src_tensor.dtype.hasobject)
             or (kind is self._torch_type and (not self.host_only or src_tensor.is_cpu)))
                and type(dest_rank) is int and self._low <= dest_rank < self._high
                and (task_id is None or (type(task_id) is int and _INT64_MIN <= task_id <= _INT64_MAX))):
            self._send_ids.append(task_id)
            self._send_tensors.append(src_tensor)
            self._send_ranks.append(dest_rank)
            return
        tensor, rank, task_id = self._checked(src_tensor, "src_tensor", False, dest_rank, "dest_rank", task_id)
        self._send_ids.append(task_id)
        self._send_tensors.append(tensor)
        self._send_ranks.append(rank)

    def submit_recv(self, dest_tensor: Any, src_rank: int, task_id: Optional[int] = None) -> None:
        """Queue ``dest_tensor`` to receive from ``src_rank`` (any layout: staged if not contiguous)."""
        kind = type(dest_tensor)
        if (((kind is _ndarray and dest_tensor.flags.writeable and not dest_tensor.dtype.hasobject)
             or (kind is self._torch_type and (not self.host_only or dest_tensor.is_cpu)))
                and type(src_rank) is int and self._low <= src_rank < self._high
                and (task_id is None or (type(task_id) is int and _INT64_MIN <= task_id <= _INT64_MAX))):
            self._recv_ids.append(task_id)
            self._recv_tensors.append(dest_tensor)
            self._recv_ranks.append(src_rank)
            return
        tensor, rank, task_id = self._checked(dest_tensor, "dest_tensor", True, src_rank, "src_rank", task_id)
        self._recv_ids.append(task_id)
        self._recv_tensors.append(tensor)
        self._recv_ranks.append(rank)

    def _checked(self, tensor: Any, tensor_argument: str, writable: bool, rank: Any, rank_argument: str,
                 task_id: Any) -> Tuple[Any, int, Optional[int]]:
        """The submit's arguments checked in order (tensor, rank, task id), or what they raise."""
        if self.closed:
            raise ClosedError(f"{self.backend_name} is closed")
        if type(rank) is int and 0 <= rank < self.world_size and not self._low <= rank < self._high:
            raise ValueError(f"{rank_argument}: {self._same_rank_message}, got rank {rank}")
        tensor = _tensors.normalize_fast(tensor, tensor_argument, writable, self.host_only, self.backend_name)
        self._torch_type = _tensors.torch_tensor_type()
        rank = check_rank(rank, self.world_size, rank_argument)
        if not self._low <= rank < self._high:
            raise ValueError(f"{rank_argument}: {self._same_rank_message}, got rank {rank}")
        return tensor, rank, check_task_id(task_id)


class QueuedOps(MutableSequence):  # type: ignore[type-arg]
    """``send_ops`` / ``recv_ops``: one direction of a SubmitQueue seen as a list of
    SendOp / RecvOp. An op read from it stays linked to its entry (its edits are
    what run() executes) until the list's length changes by a removal or an
    insertion other than an append; run() empties the list."""

    def __init__(self, queue: SubmitQueue, op_type: type) -> None:
        self._queue = queue
        self._op_type = op_type
        self._linked: Dict[int, Op] = {}  # entry -> the op object handed out for it

    def _forget(self) -> None:
        self._linked = {}

    def _write_back(self) -> None:
        """Copies the linked ops' fields into the columns (ranks as the op type names them)."""
        ids, tensors, ranks = self._queue.columns(self._op_type)
        for index, op in self._linked.items():
            ids[index], tensors[index], ranks[index] = op.task_id, op.tensor, _peer(op)

    def __len__(self) -> int:
        return len(self._queue.columns(self._op_type)[0])

    @overload
    def __getitem__(self, index: int) -> Op: ...

    @overload
    def __getitem__(self, index: slice) -> List[Op]: ...

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        ids, tensors, ranks = self._queue.columns(self._op_type)
        position = range(len(ids))[index]  # IndexError as a list raises it
        op = self._linked.get(position)
        if op is None:
            op = self._linked[position] = self._op_type(ids[position], tensors[position], ranks[position])
        return op

    def __setitem__(self, index: Any, op: Any) -> None:
        if isinstance(index, slice):
            self._write_back()
            items = list(self)
            items[index] = op
            self._replace(items)
            return
        ids, tensors, ranks = self._queue.columns(self._op_type)
        position = range(len(ids))[index]
        ids[position], tensors[position], ranks[position] = op.task_id, op.tensor, _peer(op)
        self._linked[position] = op

    def __delitem__(self, index: Any) -> None:
        self._write_back()
        for column in self._queue.columns(self._op_type):
            del column[index]
        self._forget()

    def insert(self, index: int, op: Op) -> None:
        if index >= len(self):
            self.append(op)
            return
        self._write_back()
        ids, tensors, ranks = self._queue.columns(self._op_type)
        ids.insert(index, op.task_id)
        tensors.insert(index, op.tensor)
        ranks.insert(index, _peer(op))
        self._forget()

    def append(self, op: Op) -> None:
        ids, tensors, ranks = self._queue.columns(self._op_type)
        self._linked[len(ids)] = op
        ids.append(op.task_id)
        tensors.append(op.tensor)
        ranks.append(_peer(op))

    def clear(self) -> None:
        for column in self._queue.columns(self._op_type):
            column.clear()
        self._forget()

    def _replace(self, ops: Iterable[Op]) -> None:
        self.clear()
        for op in ops:
            self.append(op)

    def __eq__(self, other: object) -> bool:
        return list(self) == (list(other) if isinstance(other, QueuedOps) else other)

    def __repr__(self) -> str:
        return repr(list(self))


def _peer(op: Op) -> int:
    return op.dest_rank if isinstance(op, SendOp) else op.src_rank


def bind_submits(service: Any, queue: SubmitQueue) -> None:
    """Makes ``service.submit_send`` / ``submit_recv`` the queue's own methods (a step
    submits thousands of ops: no call in between; the class's methods say the same)."""
    service.submit_send = queue.submit_send
    service.submit_recv = queue.submit_recv


class QueueAttribute:
    """``send_ops`` / ``recv_ops`` of a service that holds a SubmitQueue as ``_queue``:
    reads give the QueuedOps, an assignment replaces the queued ops with the list's."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, service: Any, owner: Any = None) -> Any:
        if service is None:
            return self
        return getattr(service._queue, self.name)

    def __set__(self, service: Any, ops: Iterable[Op]) -> None:
        queue = service.__dict__.get("_queue")
        if queue is not None:  # before the queue exists (CopyService.__init__), nothing is queued
            getattr(queue, self.name)._replace(list(ops))


__all__ = ["Columns", "QueueAttribute", "QueuedOps", "SubmitQueue", "bind_submits"]
