"""``ShmCopyService``: the copy service for the ranks of one host.

Built on a :class:`tensorxfer.runtime.LocalGroup` (or a torch.distributed
group / mpi4py communicator whose ranks are all on this host). A run shares
the matching, size agreement, local copies and plan reuse of the other
backends; the remote tasks then move in two ways:

* large tasks (``cma_min_bytes`` and up; from 2 MiB on, only sources mostly in
  huge pages: see ``_shm_plan.attach_flags``) in one copy: the receiver reads the
  sender's tensor with cross-memory attach (``process_vm_readv``, parallel
  chunks), where the kernel permits it between the two processes -- probed once
  per service for every pair (``cma_pairs``; ``python -m tensorxfer info``
  reports the machine-wide answer);
* any task whose source lies in the sender's shared send buffer
  (``ShmCopyService.buffer()``, ``buffer_bytes`` at construction): the
  receiver copies it straight from that mapping, one user-space copy (about
  twice as fast as cross-memory attach, ``bench/cpp/transport_floor``, and
  permitted wherever the ranks share memory);
* everything else through the pipeline executor: a schedule every rank
  computes alike packs tasks into batches, and double-buffered slots in an
  :class:`~tensorxfer.runtime.IpcMemory` move them (pack this batch straight
  into the peer's receive slot, unpack the previous one, barrier).

Host tensors only (numpy arrays, CPU torch tensors).
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

import numpy as np

from tensorxfer._arguments import check_int, check_optional_int
from tensorxfer.resharding.copy_services._queue import SubmitQueue
from tensorxfer.resharding.copy_services._run_protocol import UNSET, RunProtocol
from tensorxfer.resharding.copy_services._send_buffer import NOT_IN_BUFFER
from tensorxfer.resharding.copy_services._service import QueuedCopyService
from tensorxfer.resharding.copy_services._shm_mover import ShmMover
from tensorxfer.resharding.copy_services._shm_plan import ShmPlan, build_shm_plan, published_for_receives
from tensorxfer.resharding.copy_services.base import DEFAULT_TIMEOUT, check_timeout
from tensorxfer.runtime.group import LocalGroup

#: Bytes of one pipeline slot (each rank maps two send and two receive slots).
DEFAULT_SLOT_NBYTES = 4 << 20
#: Remote tasks of at least this many bytes move by cross-memory attach where permitted
#: (from 2 MiB on, only from huge pages).
DEFAULT_CMA_MIN_BYTES = 1 << 20


def as_local_group(group: Any, timeout: Optional[float]) -> Tuple[LocalGroup, bool]:
    """``group`` as a LocalGroup, and whether this service made it (and closes it).

    Args:
        group: a LocalGroup (returned as it is), a torch.distributed group, an mpi4py
            communicator, or None: the default torch.distributed group, as upstream.
        timeout: for the LocalGroup made here (``timeout=`` of ``LocalGroup.from_torch``
            / ``LocalGroup.from_mpi``).

    Returns:
        ``(local_group, made_here)``.
    """
    if isinstance(group, LocalGroup):
        return group, False
    if group is None:
        return LocalGroup.from_torch(None, timeout=timeout), True
    if type(group).__module__.startswith("mpi4py"):
        return LocalGroup.from_mpi(group, timeout=timeout), True
    return LocalGroup.from_torch(group, timeout=timeout), True


class ShmCopyService(QueuedCopyService):
    """Batched send/recv among the ranks of one host through shared memory.

    Collective construction: every rank of the group builds its service together.

    Args:
        group: a LocalGroup, a torch.distributed group, an mpi4py communicator, or None
            for the default torch.distributed group.
        timeout: seconds a run waits for its peers (None = forever, still watching the
            peers and Ctrl-C).
        slot_nbytes: sizes the pipeline's slots (a multiple of 64).
        max_tasks_per_batch: bounds a batch.
        cma_min_bytes: where cross-memory attach takes over (None: never; from 2 MiB on
            only for sources in huge pages).
        buffer_bytes: sizes this rank's shared send buffer (``buffer()``; the same on
            every rank, 0 = none).
    """

    backend_name = "ShmCopyService"
    _mover: ShmMover
    # run() ends with the executor's group barrier whenever any rank moved bytes.
    requires_process_group_barrier = False

    def __init__(self, group: Any = None, *, timeout: Optional[float] = DEFAULT_TIMEOUT,
                 slot_nbytes: int = DEFAULT_SLOT_NBYTES, max_tasks_per_batch: int = 10000,
                 cma_min_bytes: Optional[int] = DEFAULT_CMA_MIN_BYTES, buffer_bytes: int = 0) -> None:
        # TypeError for a value that is not an integer, ValueError out of range (the README's "Errors").
        slot_nbytes = check_int(slot_nbytes, "slot_nbytes", minimum=64, multiple_of=64)
        max_tasks_per_batch = check_int(max_tasks_per_batch, "max_tasks_per_batch", minimum=1)
        buffer_bytes = check_int(buffer_bytes, "buffer_bytes", minimum=0)
        cma_min_bytes = check_optional_int(cma_min_bytes, "cma_min_bytes", minimum=0)
        self.slot_nbytes = slot_nbytes
        self.max_tasks_per_batch = max_tasks_per_batch
        self.cma_min_bytes = cma_min_bytes
        self.buffer_bytes = buffer_bytes
        local, self._owns_group = as_local_group(group, timeout)
        self._local = local
        try:
            super().__init__(group)
            self.rank, self.world_size = local.rank, local.world_size
            self.timeout = check_timeout(timeout, f"{self.backend_name}(timeout=...)")
            queue = SubmitQueue(self.backend_name, self.world_size)
            self._mover = ShmMover(self.backend_name, local, slot_nbytes, max_tasks_per_batch, cma_min_bytes,
                                   buffer_bytes)
            # Compares the plan-shaping options on every rank before anything is mapped.
            self._protocol = RunProtocol(self.backend_name, self.rank, self.world_size, self._mover.gather,
                                         self._mover.plan_options(), self.timeout, on_broken=self._on_broken)
            self._protocol.mover = self._mover
            self._mover.open(self._protocol, timeout)
            self._compose(queue, self._protocol)
        except BaseException:
            # Released now, not by the collector: peers waiting on this rank see it leave.
            self._release()
            raise

    @property
    def cma_pairs(self) -> np.ndarray:
        """Whether rank dst may read rank src's memory by cross-memory attach, as ``cma_pairs[src, dst]``."""
        return self._mover.cma_pairs

    @property
    def buffer_tasks_read(self) -> int:
        """Tasks received straight from a peer's send buffer, in all runs."""
        return self._mover.buffer_tasks_read

    @property
    def _pids(self) -> List[int]:
        return self._mover.pids

    @property
    def _shm_mover(self) -> ShmMover:
        assert self._mover is not None, "made in __init__"
        return self._mover

    def buffer(self, dtype: Any, shape: Any) -> Any:
        """A view of this rank's shared send buffer: numpy for a numpy dtype, torch for a torch dtype.

        Tasks whose source lies in it (contiguous, whole) are read by their
        receiver straight from the shared mapping, in one user-space copy,
        whatever their size and whether or not cross-memory attach is permitted.
        Views start at the buffer's first byte; slice the result to hold several
        tensors. Write it between runs only: receivers read it until run()
        returns on every rank.

        Raises:
            ValueError: ``shape`` of ``dtype`` does not fit ``buffer_bytes``.
        """
        self._check_open("buffer")
        return self._mover.buffers.view(dtype, shape)

    def close(self) -> None:
        """Unmaps the slots, takes back the ptrace permission and leaves the group.

        It leaves the group only if this service made it.
        """
        if not self._closed:
            self._release()
            super().close()

    def _release(self) -> None:
        if "_mover" in self.__dict__:
            self._mover.release()
        if self._owns_group:
            self._local.close()

    def _on_broken(self) -> None:
        # Peers may still wait in a barrier of this group: leaving it (when this service
        # made it) makes them fail now rather than at their timeout. A group the caller
        # passed must be closed by the caller (see LocalGroup.barrier).
        if self._owns_group:
            self._local.close()

    # ---- persistent plans (tensorxfer.resharding.persistent_plan) --------------------------

    def _build_persistent_runner(self, send_ids: List[Any], send_tensors: List[Any], send_peers: List[int],
                                 recv_ids: List[Any], recv_tensors: List[Any], recv_peers: List[int],
                                 timeout: Any) -> Any:
        """A persistent plan's runner of these ops (collective): see _build_persistent."""
        from tensorxfer.resharding.persistent_plan import StepsRunner

        steps, plan_id, executor, engine = self._build_persistent(send_ids, send_tensors, send_peers, recv_ids,
                                                                  recv_tensors, recv_peers, timeout)
        return StepsRunner(steps, plan_id, executor, engine)

    def _build_persistent(self, send_ids: List[Any], send_tensors: List[Any], send_peers: List[int],
                          recv_ids: List[Any], recv_tensors: List[Any], recv_peers: List[int],
                          timeout: Any) -> Tuple[Any, int, Any, Any]:
        """The native copy lists of a persistent plan of these ops (collective).

        Same-rank pairs, reads from the peers' send buffers, the pipeline's packs and unpacks.
        """
        from tensorxfer.resharding import persistent_plan as persistent

        self._check_open("persistent_plan")
        queue = SubmitQueue(self.backend_name, self.world_size)  # the submits' own checks
        for task_id, tensor, peer in zip(send_ids, send_tensors, send_peers):
            queue.submit_send(tensor, peer, task_id)
        for task_id, tensor, peer in zip(recv_ids, recv_tensors, recv_peers):
            queue.submit_recv(tensor, peer, task_id)
        sends, recvs = queue.take()

        def build(tables: List[Tuple[np.ndarray, np.ndarray]], digests: List[bytes]) -> ShmPlan:
            # Cross-memory attach is not planned: the plan reads peers only through mappings.
            return build_shm_plan(self.backend_name, self.rank, self.world_size, tables, digests, self.slot_nbytes,
                                  self.max_tasks_per_batch, None, self._mover.cma_pairs)

        prepare_timeout = UNSET if timeout is persistent.SERVICE_TIMEOUT else timeout
        pattern, plan, send_spans, recv_spans = self._protocol.prepare(sends, recvs, build, prepare_timeout)
        wait = self.timeout if timeout is persistent.SERVICE_TIMEOUT else timeout
        send_meta, send_dims = persistent.describe_views(sends.tensors)
        recv_meta, recv_dims = persistent.describe_views(recvs.tensors)
        send_rows, recv_rows = pattern.sends.remote, pattern.recvs.remote  # remote op -> op index
        pipe_sends = np.stack([plan.pipe_send_ids, send_rows[plan.pipe_send_local]], axis=1).astype(np.uint64)
        pipe_recvs = np.stack([plan.pipe_recv_ids, recv_rows[plan.pipe_recv_local]], axis=1).astype(np.uint64)
        pairs = (np.stack(pattern.pairs, axis=1).astype(np.uint64) if pattern.pairs[0].size
                 else np.zeros((0, 2), np.uint64))
        direct = np.zeros((0, 3), np.uint64)
        if plan.any_direct:
            remote_sends = pattern.sends.remote_part(sends.tensors, send_spans)[1]
            with self._mover.group_wait("the direct reads' addresses"):
                published = self._mover.exchange_direct_addresses(plan, remote_sends.address, remote_sends.nbytes, wait)
            if plan.direct_recv_ids.size:
                published = published_for_receives(self.backend_name, plan, published)
                receives = recv_rows[plan.direct_recv_local]
                read_nbytes = recv_spans.nbytes[receives].astype(np.uint64)
                if np.any(published[:, 2] == NOT_IN_BUFFER):
                    raise RuntimeError(f"{self.backend_name}: a peer planned a direct task outside its send buffer")
                mapped = self._mover.buffers.peer_addresses(plan.direct_recv_src, published[:, 2], read_nbytes,
                                                      self.backend_name)
                direct = np.stack([mapped, receives.astype(np.uint64), read_nbytes], axis=1)
        pipeline = plan.pipeline if plan.pipeline.num_iterations else None
        steps = self._mover.executor.build_steps(pipeline, send_meta, send_dims, recv_meta, recv_dims, pipe_sends,
                                           pipe_recvs, pairs, np.ascontiguousarray(direct), plan.any_direct,
                                           plan.has_remote_work, None)
        plan_id = persistent.plan_digest(plan.digests, self._protocol.run_index)
        return steps, plan_id, self._mover.executor, self._mover.engine


__all__ = ["DEFAULT_CMA_MIN_BYTES", "DEFAULT_SLOT_NBYTES", "ShmCopyService", "as_local_group"]
