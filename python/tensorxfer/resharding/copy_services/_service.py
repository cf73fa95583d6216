"""The one copy-service class every backend is: a queue and a run, composed (private).

A backend (``local.py``, ``mpi.py``, ``torch_distributed.py``, ``shm.py``: one module
each, one entry each in ``factory.BACKENDS``) is a :class:`QueuedCopyService` that makes
its two steps in its constructor and hands them to :meth:`QueuedCopyService._compose`:

* a :class:`~._queue.SubmitQueue`: the submits (bound straight to its native ones) and
  the queued ops (``send_ops`` / ``recv_ops``);
* a :class:`Run`: how one batch executes. The multi-process backends use the
  :class:`~._run_protocol.RunProtocol` (agreement, plan reuse, failure handling) with
  their transport's mover (``_messages.MessageExecutor`` for mpi and torch,
  ``_shm_mover.ShmMover`` for shm); the local backend its same-rank copies alone.

Nothing else is inherited: what a backend adds is its resources (and their ``close``).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Protocol

from tensorxfer.resharding.copy_services._queue import QueuedOps, SubmitQueue
from tensorxfer.resharding.copy_services._run_protocol import UNSET
from tensorxfer.resharding.copy_services.base import CopyService, RecvOp, SendOp


class Run(Protocol):
    """How a service executes one batch."""

    def run(self, take: Any, timeout: Optional[float]) -> None:
        """Executes the ops ``take()`` returns ((sends, receives) Columns; it empties the queue)."""

    @property
    def plans_built(self) -> int:
        """How many runs had to build their plan."""

    def close(self) -> None:
        """Drops what the runs kept (plans, staging)."""


class QueuedCopyService(CopyService):
    """A CopyService composed of a SubmitQueue and a Run (see the module docstring)."""

    _queue: SubmitQueue
    _steps: Run

    def _compose(self, queue: SubmitQueue, steps: Run) -> None:
        """Holds the two steps; ops assigned to ``send_ops`` / ``recv_ops`` before (the base
        ``__init__`` assigns empty lists, a subclass may assign its own) are queued now."""
        self._queue = queue
        self._steps = steps
        # A step submits thousands of ops: the queue's native submits, no call in between.
        self.submit_send = queue.submit_send  # type: ignore[method-assign]
        self.submit_recv = queue.submit_recv  # type: ignore[method-assign]
        assigned: Dict[type, List[Any]] = self.__dict__.pop("_assigned_ops", {})
        for op_type, ops in assigned.items():
            self._queued(op_type)._replace(ops)

    def submit_send(self, src_tensor: Any, dest_rank: int, task_id: Optional[int] = None) -> None:
        """Queue ``src_tensor`` to be sent to ``dest_rank``. Its memory is taken now (do not
        resize or re-point it before run() returns), its bytes are read during run()."""
        self._queue.submit_send(src_tensor, dest_rank, task_id)

    def submit_recv(self, dest_tensor: Any, src_rank: int, task_id: Optional[int] = None) -> None:
        """Queue ``dest_tensor`` to receive from ``src_rank`` (any layout: staged if not contiguous).
        Its memory is taken now (do not resize or re-point it before run() returns)."""
        self._queue.submit_recv(dest_tensor, src_rank, task_id)

    def run(self, timeout: Optional[float] = UNSET) -> None:
        """Moves every queued op as one batch (collective for a multi-process backend), then
        clears the queue (also when it raises). What it raises, and when the service stays
        usable: RunProtocol.run (the local backend: LocalRun.run)."""
        self._check_open("run")
        self._steps.run(self._queue.take, timeout)

    @property
    def plans_built(self) -> int:
        """How many runs had to build their plan (the rest reused one)."""
        return self._steps.plans_built

    def close(self) -> None:
        """Drops plans, staging and queued ops; later calls raise tensorxfer.ClosedError.
        A backend that holds resources releases them, then calls this."""
        if "_queue" in self.__dict__:
            self._steps.close()
            self._queue.close()
        self._closed = True

    # ``send_ops`` / ``recv_ops``: the queue's ops as lists of SendOp / RecvOp (_queue.QueuedOps);
    # an assignment replaces the queued ops with the list's.

    def _queued(self, op_type: type) -> QueuedOps:
        return self._queue.send_ops if op_type is SendOp else self._queue.recv_ops

    def _assign(self, op_type: type, ops: Any) -> None:
        if "_queue" in self.__dict__:
            self._queued(op_type)._replace(list(ops))
        else:  # before _compose (CopyService.__init__, a subclass's own __init__): queued then
            self.__dict__.setdefault("_assigned_ops", {})[op_type] = list(ops)

    @property  # type: ignore[override]
    def send_ops(self) -> Any:
        return self._queued(SendOp)

    @send_ops.setter
    def send_ops(self, ops: Any) -> None:
        self._assign(SendOp, ops)

    @property  # type: ignore[override]
    def recv_ops(self) -> Any:
        return self._queued(RecvOp)

    @recv_ops.setter
    def recv_ops(self, ops: Any) -> None:
        self._assign(RecvOp, ops)


__all__ = ["QueuedCopyService", "Run"]
