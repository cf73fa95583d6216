"""The submit queue every copy service holds (private).

A step of a resharding job submits thousands of ops, so a submit must cost
little more than the call, and allocate nothing the garbage collector tracks
(with torch imported, a full collection costs tens of milliseconds). Each
direction is a native ``_core.SubmitSide``: the queue's only store, four
columns kept in step (task ids, tensors, ranks, and what run() needs of each
tensor: address, byte size, contiguous, on the host). Every change writes the
description of exactly the ops it touches: a torch tensor's is read natively
when run() takes the ops, a submitted numpy array's at its submit (it cannot
be resized while queued), anything else's by run(); no description outlives
its op. Its ``submit`` takes the common case (a torch tensor or numpy array,
an int rank in range, an int task id or None) without entering Python;
anything else comes back to this module's checked submit, which raises what
the base class documents.

A tensor is used as it is when run() starts: one resized or re-pointed
(``set_``, ``.data =``) after its submit is read in its new memory, never the
memory it let go; its bytes are read (sends) or written (receives) during run().

``send_ops`` / ``recv_ops`` are the documented lists of ``SendOp`` /
``RecvOp``: :class:`QueuedOps` shows the columns as such a list. What a caller
writes there (sets or deletes an entry, clears it, assigns a new list) is what
``run()`` executes; an op read from it is a value (changing it queues nothing).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, MutableSequence, NamedTuple, Optional, Tuple, Union, overload

import numpy as np

from tensorxfer import _core
from tensorxfer.errors import ClosedError
from tensorxfer.resharding.copy_services import _tensors
from tensorxfer.resharding.copy_services.base import RecvOp, SendOp, check_rank, check_task_id

_ndarray = np.ndarray
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
Op = Union[SendOp, RecvOp]


class Columns(NamedTuple):
    """One direction's queued ops as run() gets them, in submit order."""

    task_ids: List[Optional[int]]
    tensors: List[Any]  # normalized (numpy arrays, torch tensors)
    ranks: List[int]  # the peers
    rows: np.ndarray  # the description taken with the ops (see spans)

    def spans(self) -> _tensors.Spans:
        """Address, byte size, contiguity and host residence of every tensor: as taken with
        the ops where it could be, described now otherwise (raises what describing raises)."""
        return _tensors.describe_many(self.tensors, self.rows)


class SubmitQueue:
    """The ops submitted since the last run, checked as they come.

    ``peers``: the [low, high) range of ranks a submit may name without
    ``same_rank_message`` (the local backend's own rank); every rank of
    ``world_size`` otherwise. ``host_only``: torch tensors must be on the host.
    ``submit_send`` / ``submit_recv`` are the native submits (see the module docstring).
    """

    submit_send: Callable[..., None]
    submit_recv: Callable[..., None]

    def __init__(self, backend_name: str, world_size: int, host_only: bool = True,
                 peers: Optional[Tuple[int, int]] = None, same_rank_message: str = "") -> None:
        self.backend_name = backend_name
        self.world_size = world_size
        self.closed = False
        self._host_only = host_only
        self._low, self._high = peers if peers is not None else (0, world_size)
        self._same_rank_message = same_rank_message
        self._torch_type: type = _tensors.torch_tensor_type()  # the native path's, once torch is seen
        self._sides: Dict[type, Any] = {SendOp: _core.SubmitSide(self._submit_send_checked),
                       RecvOp: _core.SubmitSide(self._submit_recv_checked, writable=True)}
        self.submit_send = self._sides[SendOp].submit
        self.submit_recv = self._sides[RecvOp].submit
        self._update_checks()
        self.send_ops = QueuedOps(self, SendOp)
        self.recv_ops = QueuedOps(self, RecvOp)

    @property
    def host_only(self) -> bool:
        return self._host_only

    @host_only.setter
    def host_only(self, value: bool) -> None:
        self._host_only = value
        self._update_checks()

    def _update_checks(self) -> None:
        """Tells the native submits what they may take without the checked path."""
        for side in self._sides.values():
            side.set_checks(self._torch_type, _ndarray, self._low, self._high, self._host_only)

    def side(self, op_type: type) -> Any:
        """The native store of one direction (SendOp: the sends)."""
        return self._sides[op_type]

    def counts(self) -> Tuple[int, int]:
        """How many sends and receives are queued."""
        return len(self._sides[SendOp]), len(self._sides[RecvOp])

    def take(self) -> Tuple[Columns, Columns]:
        """The queued sends and receives, leaving the queue empty."""
        return Columns(*self._sides[SendOp].take()), Columns(*self._sides[RecvOp].take())

    def close(self) -> None:
        """Drops the queued ops; later submits raise tensorxfer.ClosedError."""
        self.closed = True
        self._high = self._low  # no rank passes the native path: submits take the checked one
        self._update_checks()
        self.take()

    # ---- the checked submits ---------------------------------------------------------------
    # What the native submit does not take comes here. The common case of the other
    # tensor kinds (a numpy array, a torch tensor before the native path knew torch)
    # is one test; anything else takes the checked path, which raises what the base
    # class documents.

    def _submit_send_checked(self, src_tensor: Any, dest_rank: int, task_id: Optional[int] = None) -> None:
        """Queue ``src_tensor`` to be sent to ``dest_rank``; its bytes are read during run()."""
        kind = type(src_tensor)
        if not (((kind is _ndarray and not src_tensor.dtype.hasobject)
                 or (kind is self._torch_type and (not self._host_only or src_tensor.is_cpu)))
                and type(dest_rank) is int and self._low <= dest_rank < self._high
                and (task_id is None or (type(task_id) is int and _INT64_MIN <= task_id <= _INT64_MAX))):
            src_tensor, dest_rank, task_id = self._checked(src_tensor, "src_tensor", False, dest_rank, "dest_rank",
                                                           task_id)
        self._sides[SendOp].append(task_id, src_tensor, dest_rank)

    def _submit_recv_checked(self, dest_tensor: Any, src_rank: int, task_id: Optional[int] = None) -> None:
        """Queue ``dest_tensor`` to receive from ``src_rank`` (any layout: staged if not contiguous)."""
        kind = type(dest_tensor)
        if not (((kind is _ndarray and dest_tensor.flags.writeable and not dest_tensor.dtype.hasobject)
                 or (kind is self._torch_type and (not self._host_only or dest_tensor.is_cpu)))
                and type(src_rank) is int and self._low <= src_rank < self._high
                and (task_id is None or (type(task_id) is int and _INT64_MIN <= task_id <= _INT64_MAX))):
            dest_tensor, src_rank, task_id = self._checked(dest_tensor, "dest_tensor", True, src_rank, "src_rank",
                                                           task_id)
        self._sides[RecvOp].append(task_id, dest_tensor, src_rank)

    def _checked(self, tensor: Any, tensor_argument: str, writable: bool, rank: Any, rank_argument: str,
                 task_id: Any) -> Tuple[Any, int, Optional[int]]:
        """The submit's arguments checked in order (tensor, rank, task id), or what they raise."""
        if self.closed:
            raise ClosedError(f"{self.backend_name} is closed")
        if type(rank) is int and 0 <= rank < self.world_size and not self._low <= rank < self._high:
            raise ValueError(f"{rank_argument}: {self._same_rank_message}, got rank {rank}")
        tensor = _tensors.normalize_fast(tensor, tensor_argument, writable, self._host_only, self.backend_name)
        if self._torch_type is not _tensors.torch_tensor_type():  # torch was imported since
            self._torch_type = _tensors.torch_tensor_type()
            self._update_checks()
        rank = check_rank(rank, self.world_size, rank_argument)
        if not self._low <= rank < self._high:
            raise ValueError(f"{rank_argument}: {self._same_rank_message}, got rank {rank}")
        return tensor, rank, check_task_id(task_id)


class QueuedOps(MutableSequence):  # type: ignore[type-arg]
    """``send_ops`` / ``recv_ops``: one direction of a SubmitQueue seen as a list of
    SendOp / RecvOp. The columns are the only store: reading gives a new op (a
    value: changing it changes nothing queued), writing (``[i] = op``, ``del``,
    ``insert``, ``append``, ``clear``, assigning a list) changes the columns, the
    description of exactly the ops written with them (SubmitSide's set / insert /
    remove); run() empties them."""

    def __init__(self, queue: SubmitQueue, op_type: type) -> None:
        self._side = queue.side(op_type)
        self._op_type = op_type

    def __len__(self) -> int:
        return len(self._side)

    @overload
    def __getitem__(self, index: int) -> Op: ...

    @overload
    def __getitem__(self, index: slice) -> List[Op]: ...

    def __getitem__(self, index: Any) -> Any:
        positions = range(len(self._side))[index]  # IndexError as a list raises it
        if isinstance(index, slice):
            return [self._op_type(*self._side.op(position)) for position in positions]
        return self._op_type(*self._side.op(positions))

    def __setitem__(self, index: Any, op: Any) -> None:
        if isinstance(index, slice):
            items = list(self)
            items[index] = op
            self._replace(items)
            return
        self._side.set(range(len(self._side))[index], op.task_id, op.tensor, _peer(op))

    def __delitem__(self, index: Any) -> None:
        positions = range(len(self._side))[index]
        for position in sorted(positions, reverse=True) if isinstance(index, slice) else [positions]:
            self._side.remove(position)

    def insert(self, index: int, op: Op) -> None:
        length = len(self._side)
        position = max(0, min(length, index + length if index < 0 else index))  # as list.insert clamps
        self._side.insert(position, op.task_id, op.tensor, _peer(op))

    def append(self, op: Op) -> None:
        self._side.append(op.task_id, op.tensor, _peer(op))

    def clear(self) -> None:
        self._side.clear()

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


__all__ = ["Columns", "QueuedOps", "SubmitQueue"]
