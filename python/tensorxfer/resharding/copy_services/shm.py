"""``ShmCopyService``: the copy service for the ranks of one host.

Built on a :class:`tensorxfer.runtime.LocalGroup` (or a torch.distributed
group / mpi4py communicator whose ranks are all on this host). A run shares
the matching, size agreement, local copies and plan reuse of the other
backends; the remote tasks then move in two ways:

* large tasks (``cma_min_bytes`` and up) in one copy: the receiver reads the
  sender's tensor with cross-memory attach (``process_vm_readv``, parallel
  chunks), where the kernel permits it between the two processes -- probed once
  per service for every pair (``cma_pairs``; ``python -m tensorxfer info``
  reports the machine-wide answer);
* any task whose source lies in the sender's shared send buffer
  (:meth:`ShmCopyService.buffer`, ``buffer_bytes`` at construction): the
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

import contextlib
import time
from types import SimpleNamespace
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from tensorxfer import _core
from tensorxfer._arguments import check_int, check_optional_int
from tensorxfer.ipc.pack import default_copy_engine
from tensorxfer.resharding.copy_services import _ptracer, _tensors
from tensorxfer.resharding.copy_services._forwarding import ForwardsToProtocol
from tensorxfer.resharding.copy_services._queue import SubmitQueue
from tensorxfer.resharding.copy_services._run_protocol import _STEP_DIRECT_ADDRESSES, UNSET, RunProtocol
from tensorxfer.resharding.copy_services._cross_memory import probe_cross_memory_attach
from tensorxfer.resharding.copy_services._send_buffer import NOT_IN_BUFFER, SendBuffers
from tensorxfer.resharding.copy_services._shm_plan import ShmPlan, build_shm_plan, published_for_receives
from tensorxfer.errors import PeerLostError
from tensorxfer.resharding.copy_services.base import DEFAULT_TIMEOUT, check_timeout
from tensorxfer.runtime.group import LocalGroup
from tensorxfer.runtime.ipc_memory import IpcMemory

#: Bytes of one pipeline slot (each rank maps two send and two receive slots).
DEFAULT_SLOT_NBYTES = 4 << 20
#: Remote tasks of at least this many bytes move by cross-memory attach where permitted.
DEFAULT_CMA_MIN_BYTES = 1 << 20


def remaining(deadline: Optional[float]) -> Optional[float]:
    """Seconds left until ``deadline`` (a time.monotonic() value; None: no deadline)."""
    return None if deadline is None else max(deadline - time.monotonic(), 0.0)


def as_local_group(group: Any, timeout: Optional[float]) -> Tuple[LocalGroup, bool]:
    """``group`` as a LocalGroup, and whether this service made it (and closes it).

    None means the default torch.distributed group, as upstream."""
    if isinstance(group, LocalGroup):
        return group, False
    if group is None:
        return LocalGroup.from_torch(None, timeout=timeout), True
    if type(group).__module__.startswith("mpi4py"):
        return LocalGroup.from_mpi(group, timeout=timeout), True
    return LocalGroup.from_torch(group, timeout=timeout), True


class ShmCopyService(ForwardsToProtocol):
    """Batched send/recv among the ranks of one host through shared memory.

    ``group``: a LocalGroup, a torch.distributed group, an mpi4py communicator,
    or None for the default torch.distributed group. ``slot_nbytes`` sizes the
    pipeline's slots (a multiple of 64), ``max_tasks_per_batch`` bounds a batch,
    ``cma_min_bytes`` is where cross-memory attach takes over (None: never).
    ``buffer_bytes`` sizes this rank's shared send buffer (:meth:`buffer`; the
    same on every rank, 0 = none).
    Collective construction: every rank of the group builds its service together.
    """

    backend_name = "ShmCopyService"
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
        self.buffer_tasks_read = 0  # tasks received straight from a peer's send buffer, in all runs
        self._memory: Optional[IpcMemory] = None
        self._task_memory: Optional[Tuple[np.ndarray, ...]] = None  # what the executor's task maps hold
        self._ptracer_grant: Optional[int] = None
        self._pids: List[int] = []
        local, self._owns_group = as_local_group(group, timeout)
        self._local = local
        try:
            super().__init__(group)
            self.rank, self.world_size = local.rank, local.world_size
            self._hold_queue()
            self.timeout = check_timeout(timeout, f"{self.backend_name}(timeout=...)")
            # Compares the plan-shaping options on every rank before anything is mapped.
            self._protocol = RunProtocol(self.backend_name, self.rank, self.world_size, self._gather,
                                         self._plan_options(), self.timeout, on_broken=self._on_broken)
            self._protocol.mover = SimpleNamespace(send_flags=self._buffers_send_flags, build_plan=self._build_plan,
                                                   execute=self._execute)
            self._engine = default_copy_engine()
            pipeline_nbytes = int(_core.pipeline_region_nbytes(slot_nbytes))
            # Each rank's region: the pipeline's slots, then (page aligned) its send buffer.
            self._buffers = SendBuffers(pipeline_nbytes, buffer_bytes, self.rank)
            self._memory = IpcMemory.create(local, self._buffers.offset + buffer_bytes, timeout=timeout)
            self._buffers.memory = self._memory
            self._executor = _core.PipelineExecutor(self._memory._native, local._native, slot_nbytes, self._engine)
            self.cma_pairs, self._pids, self._ptracer_grant = probe_cross_memory_attach(
                local, self.cma_min_bytes is not None, timeout)
        except BaseException:
            # Released now, not by the collector: peers waiting on this rank see it leave.
            self._release()
            raise

    def _plan_options(self) -> Dict[str, Optional[int]]:
        return {"slot_nbytes": self.slot_nbytes, "max_tasks_per_batch": self.max_tasks_per_batch,
                "cma_min_bytes": self.cma_min_bytes, "buffer_bytes": self.buffer_bytes}

    def buffer(self, dtype: Any, shape: Any) -> Any:
        """A view of this rank's shared send buffer: numpy for a numpy dtype, torch for a torch dtype.

        Tasks whose source lies in it (contiguous, whole) are read by their
        receiver straight from the shared mapping, in one user-space copy,
        whatever their size and whether or not cross-memory attach is permitted.
        Views start at the buffer's first byte; slice the result to hold several
        tensors. Write it between runs only: receivers read it until run()
        returns on every rank.
        Raises ValueError if ``shape`` of ``dtype`` does not fit ``buffer_bytes``.
        """
        self._check_open("buffer")
        return self._buffers.view(dtype, shape)

    def close(self) -> None:
        """Unmaps the slots, takes back the ptrace permission and (if this service made
        it) leaves the group."""
        if not self._closed:
            self._release()
            self._close_steps()

    def _release(self) -> None:
        self.__dict__.pop("_executor", None)  # the native executor before the memory it points into
        if self._memory is not None:
            self._memory.close()
        _ptracer.release(self._ptracer_grant)
        self._ptracer_grant = None
        if self._owns_group:
            self._local.close()

    def _on_broken(self) -> None:
        # Peers may still wait in a barrier of this group: leaving it (when this service
        # made it) makes them fail now rather than at their timeout. A group the caller
        # passed must be closed by the caller (see LocalGroup.barrier).
        if self._owns_group:
            self._local.close()

    # ---- persistent plans (tensorxfer.resharding.persistent_plan) --------------------------

    def _build_persistent(self, send_ids: List[Any], send_tensors: List[Any], send_peers: List[int],
                          recv_ids: List[Any], recv_tensors: List[Any], recv_peers: List[int],
                          timeout: Any) -> Tuple[Any, int, Any, Any]:
        """The native copy lists of a persistent plan of these ops (collective): same-rank
        pairs, reads from the peers' send buffers, the pipeline's packs and unpacks."""
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
                                  self.max_tasks_per_batch, None, self.cma_pairs)

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
            with self._group_wait("the direct reads' addresses"):
                published = self._exchange_direct_addresses(plan, remote_sends.address, remote_sends.nbytes, wait)
            if plan.direct_recv_ids.size:
                published = published_for_receives(self.backend_name, plan, published)
                receives = recv_rows[plan.direct_recv_local]
                read_nbytes = recv_spans.nbytes[receives].astype(np.uint64)
                if np.any(published[:, 2] == NOT_IN_BUFFER):
                    raise RuntimeError(f"{self.backend_name}: a peer planned a direct task outside its send buffer")
                mapped = self._buffers.peer_addresses(plan.direct_recv_src, published[:, 2], read_nbytes,
                                                      self.backend_name)
                direct = np.stack([mapped, receives.astype(np.uint64), read_nbytes], axis=1)
        pipeline = plan.pipeline if plan.pipeline.num_iterations else None
        steps = self._executor.build_steps(pipeline, send_meta, send_dims, recv_meta, recv_dims, pipe_sends,
                                           pipe_recvs, pairs, np.ascontiguousarray(direct), plan.any_direct,
                                           plan.has_remote_work, None)
        plan_id = persistent.plan_digest(plan.digests, self._protocol.run_index)
        return steps, plan_id, self._executor, self._engine

    # ---- transport of the shared run() ------------------------------------------------

    @contextlib.contextmanager
    def _group_wait(self, what: str) -> Any:
        """Says which service, rank and step a group wait failed in."""
        try:
            yield
        except PeerLostError as error:
            raise PeerLostError(f"{self.backend_name}: a peer of rank {self.rank} was lost during {what}: {error}") from error
        except TimeoutError as error:
            raise TimeoutError(f"{self.backend_name}: rank {self.rank} timed out in {what}; a peer did not call run() "
                               f"or stalled: {error}") from error

    def _gather(self, data: bytes, fixed: bool, deadline: Optional[float], timeout: Optional[float]) -> List[bytes]:
        with self._group_wait("the all-gather of the batch's metadata"):
            return list(self._local.all_gather_bytes(data, remaining(deadline)))

    # ---- planning -----------------------------------------------------------------------

    def _buffers_send_flags(self, spans: _tensors.Spans, rows: np.ndarray) -> Optional[np.ndarray]:
        return self._buffers.send_flags(spans, rows)

    def _build_plan(self, tables: List[Tuple[np.ndarray, np.ndarray]], digests: List[bytes]) -> ShmPlan:
        return build_shm_plan(self.backend_name, self.rank, self.world_size, tables, digests, self.slot_nbytes,
                              self.max_tasks_per_batch, self.cma_min_bytes, self.cma_pairs)

    # ---- execution ----------------------------------------------------------------------

    def _execute(self, plan: Any, send_tensors: Sequence[Any], send_spans: _tensors.Spans,
                 recv_tensors: Sequence[Any], recv_spans: _tensors.Spans, deadline: Optional[float],
                 timeout: Optional[float]) -> None:
        # Sources as they are now (non-contiguous ones copied once); destinations as
        # the copies see them (non-contiguous ones staged, copied back at the end).
        kept_alive, send_addresses = _tensors.sources_as_now(send_tensors, send_spans)  # read until the end
        # (staging tensors live in `pending` until copied back)
        _, recv_addresses, pending = _tensors.staged_targets(recv_tensors, recv_spans)
        if plan.any_direct:
            with self._group_wait("the direct reads"):
                published = self._exchange_direct_addresses(plan, send_addresses, send_spans.nbytes,
                                                            remaining(deadline))
            failure: Optional[Exception] = None
            try:
                self._read_directly(plan, published, recv_addresses, recv_spans.nbytes)
            except Exception as error:  # agreed below: no rank goes on to the executor's barriers
                failure = error
            with self._group_wait("the direct reads"):
                self._protocol.agree_on_step("its direct reads", failure, deadline, timeout)
        send_local, recv_local = plan.pipe_send_local, plan.pipe_recv_local
        memory = (plan.pipe_send_ids, send_addresses[send_local], send_spans.nbytes[send_local].astype(np.uint64),
                  plan.pipe_recv_ids, recv_addresses[recv_local], recv_spans.nbytes[recv_local].astype(np.uint64))
        # The executor's task maps are rebuilt only when a task's memory moved (a step
        # that submits the same tensors again keeps them); they are read only by execute.
        if self._task_memory is None or not all(np.array_equal(new, old) for new, old in zip(memory, self._task_memory)):
            self._task_memory = None
            self._executor.set_task_memory(*memory)
            self._task_memory = memory
        try:
            # Its final barrier also tells senders that every cross-memory read is done.
            with self._group_wait("the batch's transfers"):
                # What is left of the run's one deadline, not the whole timeout again.
                self._executor.execute(plan.pipeline, remaining(deadline), self._protocol.run_index)
        except BaseException:
            empty = np.zeros(0, np.uint64)
            self._task_memory = None
            self._executor.set_task_memory(empty, empty, empty, empty, empty, empty)
            raise
        _tensors.copy_back(pending)

    def _read_directly(self, plan: ShmPlan, published: np.ndarray, recv_addresses: np.ndarray,
                       recv_nbytes: np.ndarray) -> None:
        """Receivers read direct tasks straight from their senders' memory (``published``:
        see _exchange_direct_addresses): from a sender's shared send buffer with a
        plain copy, else by cross-memory attach."""
        if plan.direct_recv_ids.size == 0:
            return
        published = published_for_receives(self.backend_name, plan, published)
        sources = plan.direct_recv_src
        nbytes = recv_nbytes[plan.direct_recv_local].astype(np.uint64)
        targets = recv_addresses[plan.direct_recv_local].astype(np.uint64)
        from_buffer = published[:, 2] != NOT_IN_BUFFER
        if from_buffer.any():
            sizes = nbytes[from_buffer]
            peer = self._buffers.peer_addresses(sources[from_buffer], published[from_buffer, 2], sizes,
                                                self.backend_name)
            spans = np.stack([peer, targets[from_buffer], sizes], axis=1)
            _core.copy_spans(np.ascontiguousarray(spans), self._engine)
            self.buffer_tasks_read += int(from_buffer.sum())
        by_attach = ~from_buffer
        refused = by_attach & ~self.cma_pairs[sources, self.rank]
        if refused.any():
            src = int(sources[np.flatnonzero(refused)[0]])
            raise RuntimeError(f"{self.backend_name}: rank {src} sent a task from outside its send buffer that "
                               f"rank {self.rank} may not read by cross-memory attach")
        for src in np.unique(sources[by_attach]):
            rows = by_attach & (sources == src)  # every task from one sender: one gathered read
            spans = np.stack([published[rows, 1], targets[rows], nbytes[rows]], axis=1)
            _core.read_process_spans(self._pids[int(src)], np.ascontiguousarray(spans), self._engine)

    def _exchange_direct_addresses(self, plan: ShmPlan, send_addresses: np.ndarray, send_nbytes: np.ndarray,
                                   timeout: Optional[float]) -> np.ndarray:
        """Publishes where each of this rank's direct sends is -- (task, address, offset
        in the send buffer or NOT_IN_BUFFER) -- and returns every rank's rows, by task."""
        addresses = send_addresses[plan.direct_send_local].astype(np.uint64)
        offsets = self._buffers.offsets(addresses, send_nbytes[plan.direct_send_local])
        table = np.stack([plan.direct_send_ids.astype(np.uint64), addresses, offsets], axis=1)
        deadline = None if timeout is None else time.monotonic() + timeout
        gathered = [np.frombuffer(data, np.uint64).reshape(-1, 3)
                    for data in self._protocol.all_gather(_STEP_DIRECT_ADDRESSES, table.tobytes(), deadline, timeout)]
        rows = np.concatenate(gathered)
        return rows[np.argsort(rows[:, 0], kind="stable")]


__all__ = ["DEFAULT_CMA_MIN_BYTES", "DEFAULT_SLOT_NBYTES", "ShmCopyService", "as_local_group"]
