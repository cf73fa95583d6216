"""The shm backend's mover: how a run's remote tasks move among the ranks of one host (private).

:class:`ShmMover` is the :class:`~._run_protocol.Mover` of ``ShmCopyService``: it owns the
ranks' shared region (the pipeline's slots and each rank's send buffer), the native
pipeline executor and the cross-memory-attach permissions, plans a batch
(:func:`~._shm_plan.build_shm_plan`) and moves it: direct reads first (from a peer's send
buffer, or by cross-memory attach), then the pipeline.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from tensorxfer import _core
from tensorxfer.errors import PeerLostError
from tensorxfer.resharding._copy_engine import resharding_copy_engine
from tensorxfer.resharding.copy_services import _ptracer, _tensors
from tensorxfer.resharding.copy_services._cross_memory import probe_cross_memory_attach
from tensorxfer.resharding.copy_services._run_protocol import _STEP_DIRECT_ADDRESSES, RunProtocol
from tensorxfer.resharding.copy_services._send_buffer import NOT_IN_BUFFER, SendBuffers
from tensorxfer.resharding.copy_services._shm_plan import (ShmPlan, build_shm_plan, attach_flags,
                                                            published_for_receives)
from tensorxfer.runtime.group import LocalGroup
from tensorxfer.runtime.ipc_memory import IpcMemory


def remaining(deadline: Optional[float]) -> Optional[float]:
    """Seconds left until ``deadline`` (a time.monotonic() value; None: no deadline)."""
    return None if deadline is None else max(deadline - time.monotonic(), 0.0)


class ShmMover:
    """The shm backend's transport (see the module docstring). ``gather`` is usable at
    once (the run protocol's construction uses it); :meth:`open` then maps the region,
    makes the executor and probes cross-memory attach (collective, every rank together).
    ``protocol``: the RunProtocol it moves for (its all-gathers carry the run's identity).
    """

    protocol: RunProtocol  # set by open()

    def __init__(self, backend_name: str, local: LocalGroup, slot_nbytes: int, max_tasks_per_batch: int,
                 cma_min_bytes: Optional[int], buffer_bytes: int) -> None:
        self.backend_name = backend_name
        self.local = local
        self.rank, self.world_size = local.rank, local.world_size
        self.slot_nbytes = slot_nbytes
        self.max_tasks_per_batch = max_tasks_per_batch
        self.cma_min_bytes = cma_min_bytes
        self.buffer_tasks_read = 0  # tasks received straight from a peer's send buffer, in all runs
        self.memory: Optional[IpcMemory] = None
        self.executor: Any = None
        self.engine = resharding_copy_engine()
        self.cma_pairs = np.zeros((local.world_size, local.world_size), bool)
        self.pids: List[int] = []
        self._ptracer_grant: Optional[int] = None
        self._task_memory: Optional[Tuple[np.ndarray, ...]] = None  # what the executor's task maps hold
        pipeline_nbytes = int(_core.pipeline_region_nbytes(slot_nbytes))
        # Each rank's region: the pipeline's slots, then (page aligned) its send buffer.
        self.buffers = SendBuffers(pipeline_nbytes, buffer_bytes, self.rank)
        self._buffer_bytes = buffer_bytes

    def plan_options(self) -> Dict[str, Optional[int]]:
        """The options that shape the plan: every rank must pass the same values."""
        return {"slot_nbytes": self.slot_nbytes, "max_tasks_per_batch": self.max_tasks_per_batch,
                "cma_min_bytes": self.cma_min_bytes, "buffer_bytes": self._buffer_bytes}

    def open(self, protocol: RunProtocol, timeout: Optional[float]) -> None:
        """Maps the shared region, makes the executor, probes cross-memory attach (collective)."""
        self.protocol = protocol
        self.memory = IpcMemory.create(self.local, self.buffers.offset + self._buffer_bytes, timeout=timeout)
        self.buffers.memory = self.memory
        self.executor = _core.PipelineExecutor(self.memory._native, self.local._native, self.slot_nbytes, self.engine)
        self.cma_pairs, self.pids, self._ptracer_grant = probe_cross_memory_attach(
            self.local, self.cma_min_bytes is not None, timeout)

    def release(self) -> None:
        """The native executor before the memory it points into; the ptrace permission."""
        self.executor = None
        if self.memory is not None:
            self.memory.close()
        _ptracer.release(self._ptracer_grant)
        self._ptracer_grant = None

    @contextlib.contextmanager
    def group_wait(self, what: str) -> Any:
        """Says which service, rank and step a group wait failed in."""
        try:
            yield
        except PeerLostError as error:
            raise PeerLostError(f"{self.backend_name}: a peer of rank {self.rank} was lost during {what}: {error}") from error
        except TimeoutError as error:
            raise TimeoutError(f"{self.backend_name}: rank {self.rank} timed out in {what}; a peer did not call run() "
                               f"or stalled: {error}") from error

    def gather(self, data: bytes, fixed: bool, deadline: Optional[float], timeout: Optional[float]) -> List[bytes]:
        with self.group_wait("the all-gather of the batch's metadata"):
            return list(self.local.all_gather_bytes(data, remaining(deadline)))

    def send_flags(self, spans: _tensors.Spans, rows: np.ndarray) -> Optional[np.ndarray]:
        """Flags the sends whose source lies in this rank's send buffer (read directly by their
        receiver), and those cross-memory attach reads fast (_shm_plan.attach_flags)."""
        flags = self.buffers.send_flags(spans, rows)
        if self.cma_min_bytes is None or not self.cma_pairs.any():
            return flags
        readable = attach_flags(spans, rows, self.cma_min_bytes)
        return readable if flags is None else flags | readable

    def build_plan(self, tables: List[Tuple[np.ndarray, np.ndarray]], digests: List[bytes]) -> ShmPlan:
        return build_shm_plan(self.backend_name, self.rank, self.world_size, tables, digests, self.slot_nbytes,
                              self.max_tasks_per_batch, self.cma_min_bytes, self.cma_pairs)

    def execute(self, plan: Any, send_tensors: Sequence[Any], send_spans: _tensors.Spans,
                 recv_tensors: Sequence[Any], recv_spans: _tensors.Spans, deadline: Optional[float],
                 timeout: Optional[float]) -> None:
        # Sources as they are now (non-contiguous ones copied once); destinations as
        # the copies see them (non-contiguous ones staged, copied back at the end).
        kept_alive, send_addresses = _tensors.sources_as_now(send_tensors, send_spans)  # read until the end
        # (staging tensors live in `pending` until copied back)
        _, recv_addresses, pending = _tensors.staged_targets(recv_tensors, recv_spans)
        if plan.any_direct:
            with self.group_wait("the direct reads"):
                published = self.exchange_direct_addresses(plan, send_addresses, send_spans.nbytes,
                                                            remaining(deadline))
            failure: Optional[Exception] = None
            try:
                self._read_directly(plan, published, recv_addresses, recv_spans.nbytes)
            except Exception as error:  # agreed below: no rank goes on to the executor's barriers
                failure = error
            with self.group_wait("the direct reads"):
                self.protocol.agree_on_step("its direct reads", failure, deadline, timeout)
        send_local, recv_local = plan.pipe_send_local, plan.pipe_recv_local
        memory = (plan.pipe_send_ids, send_addresses[send_local], send_spans.nbytes[send_local].astype(np.uint64),
                  plan.pipe_recv_ids, recv_addresses[recv_local], recv_spans.nbytes[recv_local].astype(np.uint64))
        # The executor's task maps are rebuilt only when a task's memory moved (a step
        # that submits the same tensors again keeps them); they are read only by execute.
        if self._task_memory is None or not all(np.array_equal(new, old) for new, old in zip(memory, self._task_memory)):
            self._task_memory = None
            self.executor.set_task_memory(*memory)
            self._task_memory = memory
        try:
            # Its final barrier also tells senders that every cross-memory read is done.
            with self.group_wait("the batch's transfers"):
                # What is left of the run's one deadline, not the whole timeout again.
                self.executor.execute(plan.pipeline, remaining(deadline), self.protocol.run_index)
        except BaseException:
            empty = np.zeros(0, np.uint64)
            self._task_memory = None
            self.executor.set_task_memory(empty, empty, empty, empty, empty, empty)
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
            peer = self.buffers.peer_addresses(sources[from_buffer], published[from_buffer, 2], sizes,
                                                self.backend_name)
            spans = np.stack([peer, targets[from_buffer], sizes], axis=1)
            _core.copy_spans(np.ascontiguousarray(spans), self.engine)
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
            _core.read_process_spans(self.pids[int(src)], np.ascontiguousarray(spans), self.engine)

    def exchange_direct_addresses(self, plan: ShmPlan, send_addresses: np.ndarray, send_nbytes: np.ndarray,
                                   timeout: Optional[float]) -> np.ndarray:
        """Publishes where each of this rank's direct sends is -- (task, address, offset
        in the send buffer or NOT_IN_BUFFER) -- and returns every rank's rows, by task."""
        addresses = send_addresses[plan.direct_send_local].astype(np.uint64)
        offsets = self.buffers.offsets(addresses, send_nbytes[plan.direct_send_local])
        table = np.stack([plan.direct_send_ids.astype(np.uint64), addresses, offsets], axis=1)
        deadline = None if timeout is None else time.monotonic() + timeout
        gathered = [np.frombuffer(data, np.uint64).reshape(-1, 3)
                    for data in self.protocol.all_gather(_STEP_DIRECT_ADDRESSES, table.tobytes(), deadline, timeout)]
        rows = np.concatenate(gathered)
        return rows[np.argsort(rows[:, 0], kind="stable")]



__all__ = ["ShmMover", "remaining"]
