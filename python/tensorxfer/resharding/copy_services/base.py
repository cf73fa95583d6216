"""The copy-service interface: batched sends and receives matched by task id.

Every backend queues ``SendOp`` / ``RecvOp`` entries through ``submit_send`` /
``submit_recv`` and moves them all in ``run()``. A task id is shared by the
send and the receive of one transfer; same-rank pairs are matched strictly by
:func:`~tensorxfer.resharding.copy_services.match_local_ops_by_task_id`.
"""

from __future__ import annotations

import abc
import sys
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from tensorxfer import _arguments, _core
from tensorxfer.errors import ClosedError

DEFAULT_TIMEOUT = 300.0
"""Seconds ``run()`` waits for its peers unless told otherwise."""


@dataclass
class SendOp:
    """Single send operation pending in a CopyService queue."""

    task_id: Optional[int]
    tensor: Any
    dest_rank: int


@dataclass
class RecvOp:
    """Single receive operation pending in a CopyService queue."""

    task_id: Optional[int]
    tensor: Any
    src_rank: int


class TaskMismatchError(RuntimeError):
    """The sends and receives of a batch do not pair up.

    A task id with a send but no receive (or the reverse), or a send and a receive
    of different byte sizes. Raised on every rank of the batch before any byte moves.
    """


def match_local_ops_by_task_id(
    local_sends: Sequence[Any], local_recvs: Sequence[Any], backend_name: str, rank: int
) -> List[Tuple[Any, Any]]:
    """Pair same-rank send/recv ops by task_id, raising on any mismatch.

    The pairing is the one matcher the remote pairs go through
    (``resharding/task_matcher.h``).

    Args:
        local_sends: the same-rank sends; either op may be a backend-local wrapper
            exposing ``.task_id``.
        local_recvs: the same-rank receives (the same).
        backend_name: names the backend in the errors.
        rank: this rank, named in the errors.

    Returns:
        ``(send_op, recv_op)`` tuples in receive order.

    Raises:
        TaskMismatchError: a ``RuntimeError``; checked in this order: a ``None`` task id
            on either side; different counts or a duplicate id; a receive whose task id
            no send has.
    """
    send_ids = [op.task_id for op in local_sends]
    recv_ids = [op.task_id for op in local_recvs]
    if any(task_id is None for task_id in send_ids) or any(task_id is None for task_id in recv_ids):
        raise TaskMismatchError(f"{backend_name}: local (same-rank) transfer requires a task_id to match sends "
                                "with recvs")
    unmatched = TaskMismatchError(f"{backend_name}: unmatched local ops on rank {rank}: {len(send_ids)} local sends "
                                  f"vs {len(recv_ids)} local recvs")
    if len(send_ids) != len(recv_ids):
        raise unmatched
    if not recv_ids:
        return []
    # The matcher's task ids: each id's rank among all ids (it compares them, nothing else).
    keys, dense = np.unique(np.array(send_ids + recv_ids, np.int64), return_inverse=True)
    endpoints = np.zeros((dense.size, 4), np.int64)  # (task, nbytes, src, dst): sizes are checked apart
    endpoints[:, 0] = dense.reshape(-1)
    endpoints[:, 2:] = rank
    problem, _, recv_index, _, pairs = _core.find_task_pairs(endpoints[:len(send_ids)], endpoints[len(send_ids):])
    if problem in ("duplicate_send", "duplicate_receive"):
        raise unmatched
    if problem:  # with as many sends as receives and no duplicate, a receive has no send
        sent = set(send_ids)
        missing = next(task_id for task_id in recv_ids if task_id not in sent)
        raise TaskMismatchError(f"{backend_name}: missing local send for task_id={missing} on rank {rank}")
    in_receive_order = pairs[np.argsort(pairs[:, 1], kind="stable")]
    return [(local_sends[int(send)], local_recvs[int(recv)]) for send, recv in in_receive_order]


def check_timeout(timeout: Optional[float], operation: str = "CopyService") -> Optional[float]:
    """``timeout`` as float seconds (None = no deadline), by the package's one set of rules.

    The rules are :mod:`tensorxfer.errors`'s; a timeout that breaks them raises ValueError /
    TypeError naming ``operation``.
    """
    return _core.check_timeout(timeout, operation)


check_rank = _arguments.check_rank  # ``value`` as a rank in [0, world_size) (tensorxfer._arguments)
check_task_id = _arguments.check_task_id  # ``value`` as an int task id or None


def group_rank_and_size(group: Any) -> Tuple[int, int]:
    """This process's rank in ``group`` and the group's size.

    Args:
        group: an object with int ``rank`` / ``world_size`` attributes (a LocalGroup),
            an mpi4py communicator, a torch.distributed process group, or None: the
            default torch.distributed group when it is initialized, else a single
            process (rank 0 of 1).

    Returns:
        ``(rank, world_size)``.
    """
    if group is not None:
        rank, size = getattr(group, "rank", None), getattr(group, "world_size", None)
        if isinstance(rank, int) and isinstance(size, int):
            return rank, size
        if callable(getattr(group, "Get_rank", None)):
            return int(group.Get_rank()), int(group.Get_size())
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank(group)), int(dist.get_world_size(group))
    return 0, 1


class CopyService(abc.ABC):
    """Abstract interface for submitting and executing batched P2P copy operations.

    All backends accept an optional task_id on submit calls: a globally unique
    identifier shared by the matching send and recv of one transfer. It is
    required for same-rank (local) matching. ``run()`` executes everything
    submitted since the last run as one batch, then clears the queue (also when
    it raises). Only ``submit_send``, ``submit_recv`` and ``run`` are abstract;
    ``close()`` is a no-op here (backends that hold resources override it, and
    raise :class:`tensorxfer.ClosedError` when used after it).

    ``group``, ``rank`` and ``world_size`` are attributes the base ``__init__``
    sets from the group (see
    :func:`~tensorxfer.resharding.copy_services.base.group_rank_and_size`); a
    subclass whose ``__init__`` skips the base's gets the class defaults (None, 0, 1).
    """

    backend_name = "CopyService"
    group: Any = None
    rank: int = 0
    world_size: int = 1
    #: Whether a caller must barrier the process group after ``run()`` before it
    #: reuses what the batch read or wrote (upstream's executor does so when True,
    #: the default). False for a backend whose ``run()`` returns only once every
    #: transfer of this rank, sent and received, has completed in host memory.
    requires_process_group_barrier: bool = True
    _closed = False

    def __init__(self, group: Any = None) -> None:
        self.group = group
        rank, world_size = group_rank_and_size(group)
        # A subclass may still define rank / world_size as properties (the older API).
        if not isinstance(getattr(type(self), "rank", None), property):
            self.rank = rank
        if not isinstance(getattr(type(self), "world_size", None), property):
            self.world_size = world_size
        # A subclass holding its ops elsewhere (a property) keeps what it holds.
        if not isinstance(getattr(type(self), "send_ops", None), property):
            self.send_ops: List[SendOp] = []
        if not isinstance(getattr(type(self), "recv_ops", None), property):
            self.recv_ops: List[RecvOp] = []

    @abc.abstractmethod
    def submit_send(self, src_tensor: Any, dest_rank: int, task_id: Optional[int] = None) -> None:
        """Register a tensor send from the current rank to dest_rank."""

    @abc.abstractmethod
    def submit_recv(self, dest_tensor: Any, src_rank: int, task_id: Optional[int] = None) -> None:
        """Register a tensor receive into dest_tensor from src_rank."""

    @abc.abstractmethod
    def run(self) -> None:
        """Execute all previously submitted send/recv operations as a single batch."""

    # Megatron's executor (megatron-core's execute_reshard_plan) passes task ids only to
    # these two, with the id first, as its own services define them; without them a
    # colocated refit's same-rank ops arrive with no id and cannot be matched.
    def submit_send_with_id(self, task_id: Optional[int], src_tensor: Any, dest_rank: int) -> None:
        """``submit_send(src_tensor, dest_rank, task_id)`` in Megatron's argument order."""
        self.submit_send(src_tensor, dest_rank, task_id)

    def submit_recv_with_id(self, task_id: Optional[int], dest_tensor: Any, src_rank: int) -> None:
        """``submit_recv(dest_tensor, src_rank, task_id)`` in Megatron's argument order."""
        self.submit_recv(dest_tensor, src_rank, task_id)

    def close(self) -> None:
        """Release backend-owned resources. Default no-op; backends that hold resources override it."""

    @property
    def closed(self) -> bool:
        """True once a backend's ``close()`` ran."""
        return self._closed

    def _check_open(self, call: str) -> None:
        if self._closed:
            raise ClosedError(f"{self.backend_name} is closed")

    def __enter__(self) -> "CopyService":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def _queued_counts(self) -> Tuple[int, int]:
        """How many sends and receives are queued."""
        return len(getattr(self, "send_ops", ())), len(getattr(self, "recv_ops", ()))

    def __repr__(self) -> str:
        sends, recvs = self._queued_counts()
        state = "closed" if self._closed else f"{sends} sends, {recvs} recvs queued"
        return f"{type(self).__name__}(rank={self.rank}, world_size={self.world_size}, {state})"


from tensorxfer.resharding.copy_services._megatron import register_when_megatron_is_imported  # noqa: E402

register_when_megatron_is_imported(CopyService)

__all__ = [
    "DEFAULT_TIMEOUT",
    "group_rank_and_size",
    "SendOp",
    "RecvOp",
    "CopyService",
    "TaskMismatchError",
    "match_local_ops_by_task_id",
]
