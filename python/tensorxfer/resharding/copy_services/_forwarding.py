"""The public methods a backend forwards to the steps it holds (private).

A backend is a :class:`~tensorxfer.resharding.copy_services.base.CopyService`
holding its steps as objects: a :class:`~._queue.SubmitQueue` as ``_queue``
and, for the multi-process backends, a :class:`~._run_protocol.RunProtocol`
as ``_protocol``. These two CopyService classes add only the forwarding of
``submit_send`` / ``submit_recv`` / ``send_ops`` / ``recv_ops`` (and ``run`` /
``plans_built``) to them, written once; the steps themselves are not inherited.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from tensorxfer.resharding.copy_services._messages import MessageExecutor
from tensorxfer.resharding.copy_services._queue import QueueAttribute, SubmitQueue, bind_submits
from tensorxfer.resharding.copy_services._run_protocol import UNSET, RunProtocol
from tensorxfer.resharding.copy_services.base import CopyService, check_timeout


class ForwardsToQueue(CopyService):
    """Submits and the queued-op lists of a service holding a SubmitQueue as ``_queue``."""

    _queue: SubmitQueue
    send_ops = QueueAttribute("send_ops")
    recv_ops = QueueAttribute("recv_ops")

    def _hold_queue(self, **options: Any) -> None:
        """Makes this service's queue (SubmitQueue's options) and binds its submits to it."""
        self._queue = SubmitQueue(self.backend_name, self.world_size, **options)
        bind_submits(self, self._queue)

    def submit_send(self, src_tensor: Any, dest_rank: int, task_id: Optional[int] = None) -> None:
        """Queue ``src_tensor`` to be sent to ``dest_rank``. Its memory is taken now (do not
        resize or re-point it before run() returns), its bytes are read during run()."""
        self._queue.submit_send(src_tensor, dest_rank, task_id)

    def submit_recv(self, dest_tensor: Any, src_rank: int, task_id: Optional[int] = None) -> None:
        """Queue ``dest_tensor`` to receive from ``src_rank`` (any layout: staged if not contiguous).
        Its memory is taken now (do not resize or re-point it before run() returns)."""
        self._queue.submit_recv(dest_tensor, src_rank, task_id)


class ForwardsToProtocol(ForwardsToQueue):
    """``run`` and ``plans_built`` of a service that also holds a RunProtocol as ``_protocol``."""

    timeout: Optional[float]
    _protocol: RunProtocol

    def _hold_message_steps(self, transport: Any, timeout: Any, options: Dict[str, Any], **queue_options: Any) -> None:
        """The steps of a message backend (mpi, torch): the queue, a MessageExecutor over
        ``transport`` (the window options), the RunProtocol (a collective step: the
        ranks compare the options); the transport then watches the peers."""
        self._hold_queue(**queue_options)
        self.timeout = check_timeout(timeout, f"{self.backend_name}(timeout=...)")
        messages = MessageExecutor(self.backend_name, self.rank, transport, **options)
        self._protocol = RunProtocol(self.backend_name, self.rank, self.world_size, messages.gather,
                                     messages.plan_options(), self.timeout)
        self._protocol.mover = messages
        transport.watch = self._protocol.watch

    def run(self, timeout: Optional[float] = UNSET) -> None:
        """Moves every queued op as one batch (collective), then clears the queue (also when
        it raises). What it raises, and when the service stays usable: RunProtocol.run."""
        self._check_open("run")
        self._protocol.run(self._queue.take, timeout)

    @property
    def plans_built(self) -> int:
        """How many runs had to build their plan (the rest reused one)."""
        return self._protocol.plans_built

    def _close_steps(self) -> None:
        """Drops plans, staging and queued ops; later calls raise tensorxfer.ClosedError."""
        self._protocol.close()
        self._queue.close()
        self._closed = True


__all__ = ["ForwardsToProtocol", "ForwardsToQueue"]
