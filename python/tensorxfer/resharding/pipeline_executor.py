"""The pipelined pack/send/unpack executor behind the shared-memory copy service.

The host counterpart of the upstream NVSHMEM ``PipelineExecutor``: an
:class:`~tensorxfer.runtime.IpcMemory` holding two send and two receive slots
per rank plays the symmetric heap (:class:`DoubleBufferManager`), the native
copy engine packs and unpacks batches on the executor's host streams
(:class:`HostKernelLauncher`), and "send" copies a packed slot into the
destination's receive slot. Per iteration i: pack i+1 (async), unpack i-1
(async), send i, wait for the pack and unpack, barrier; a receive slot is
rewritten only after every rank has unpacked it (the native executor's header,
``resharding/pipeline_executor.h``, gives the argument).

Usage (every rank, collectively)::

    schedule = build_schedule(all_sends, all_receives, world_size, slot_nbytes=...)
    executor = PipelineExecutor(HostKernelLauncher(sends, receives), DoubleBufferManager(group), rank)
    executor.process_self_moves(sends, receives)
    executor.execute_pipeline(schedule.iteration_schedules(rank), schedule.num_iterations)
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from tensorxfer import _core
from tensorxfer.errors import UnsupportedError
from tensorxfer.ipc.pack import default_copy_engine
from tensorxfer.resharding.copy_services import _tensors
from tensorxfer.resharding.schedule import ReceiveRequest, ScheduledBatch, SendRequest
from tensorxfer.runtime.group import LocalGroup
from tensorxfer.runtime.ipc_memory import IpcMemory

#: Default bytes of one slot.
DEFAULT_SLOT_NBYTES = 4 << 20


class DoubleBufferManager:
    """Two send and two receive slots of ``slot_nbytes`` per rank, in an IpcMemory
    every rank of ``group`` maps. Collective: every rank constructs it together."""

    def __init__(self, group: LocalGroup, slot_nbytes: int = DEFAULT_SLOT_NBYTES, *,
                 timeout: Optional[float] = None) -> None:
        if isinstance(slot_nbytes, bool) or not isinstance(slot_nbytes, int) or slot_nbytes < 64 or slot_nbytes % 64:
            raise ValueError(f"slot_nbytes: expected a positive multiple of 64, got {slot_nbytes!r}")
        self.group = group
        self.slot_nbytes = slot_nbytes
        self.memory = IpcMemory.create(group, int(_core.pipeline_region_nbytes(slot_nbytes)), timeout=timeout)

    def send_slot(self, index: int) -> np.ndarray:
        """This rank's send slot 0 or 1, as uint8 (for inspection and tests)."""
        return self._slot(self.group.rank, index)

    def recv_slot(self, index: int) -> np.ndarray:
        """This rank's receive slot 0 or 1, as uint8."""
        return self._slot(self.group.rank, 2 + index)

    def _slot(self, rank: int, position: int) -> np.ndarray:
        region = self.memory.buffer(rank, np.uint8, (4, self.slot_nbytes))
        return region[position]

    def close(self) -> None:
        """Unmaps the slots (views taken before stay readable until dropped)."""
        self.memory.close()


def _task_memory(requests: Sequence[Any], tensor_field: str, position_field: str, side: str) -> np.ndarray:
    """(n, 3) uint64 rows (task_id, address, size) of requests, checked against their tensors."""
    rows = np.zeros((len(requests), 3), np.uint64)
    for i, request in enumerate(requests):
        tensor = getattr(request, tensor_field)
        info = _tensors.describe(_tensors.normalize(tensor, f"{side} task {request.task_id}", side == "receive"))
        if not (info.contiguous and info.host):
            raise ValueError(f"{side} task {request.task_id}: the tensor must be a contiguous host tensor")
        position, size = int(getattr(request, position_field)), int(request.size)
        if position < 0 or size < 0 or position + size > info.nbytes:
            raise ValueError(f"{side} task {request.task_id}: bytes [{position}, {position + size}) do not lie "
                             f"in its tensor of {info.nbytes} bytes")
        rows[i] = (request.task_id, info.address + position, size)
    return rows


class HostKernelLauncher:
    """Packs and unpacks batches with the native copy engine (GIL released).

    Holds this rank's requests: where each task's bytes start (``src_tensor`` +
    ``src_pos``, ``dest_tensor`` + ``dest_pos``). The tensors must stay alive
    and unmoved while the executor runs.
    """

    def __init__(self, send_requests: Sequence[SendRequest] = (), receive_requests: Sequence[ReceiveRequest] = (),
                 engine: Optional[_core.CopyEngine] = None) -> None:
        self.engine = engine if engine is not None else default_copy_engine()
        self.version = 0  # bumped by set_requests, so the executor reloads the task memory
        self.set_requests(send_requests, receive_requests)

    def set_requests(self, send_requests: Sequence[SendRequest], receive_requests: Sequence[ReceiveRequest]) -> None:
        """Replaces the requests the next pipeline packs from and unpacks into."""
        self.send_requests = list(send_requests)
        self.receive_requests = list(receive_requests)
        self.send_memory = _task_memory(self.send_requests, "src_tensor", "src_pos", "send")
        self.receive_memory = _task_memory(self.receive_requests, "dest_tensor", "dest_pos", "receive")
        self.version += 1


def _native_batch(batch: ScheduledBatch) -> tuple:
    segments = np.array([(t.task_id, t.task_offset, t.size, t.slot_offset) for t in batch.tasks],
                        np.uint64).reshape(-1, 4)
    return (batch.src_pe, batch.dest_pe, batch.batch_index, batch.iteration, batch.total_size, segments)


class PipelineExecutor:
    """Executes a schedule with pack/send/unpack overlap over double-buffered slots."""

    def __init__(self, kernel_launcher: HostKernelLauncher, buffer_manager: DoubleBufferManager, my_pe: int) -> None:
        if my_pe != buffer_manager.group.rank:
            raise ValueError(f"my_pe: expected this process's rank {buffer_manager.group.rank}, got {my_pe}")
        self.kernel_launcher = kernel_launcher
        self.buffer_manager = buffer_manager
        self.my_pe = my_pe
        self._native = _core.PipelineExecutor(buffer_manager.memory._native, buffer_manager.group._native,
                                              buffer_manager.slot_nbytes, kernel_launcher.engine)
        self._loaded: Optional[tuple] = None  # (launcher, version) whose task memory the native side holds

    def set_streams(self, pack_stream: Any = None, unpack_stream: Any = None, send_stream: Any = None,
                    copy_stream: Any = None, torch_pack_stream: Any = None, torch_unpack_stream: Any = None,
                    torch_copy_stream: Any = None) -> None:
        """Upstream takes CUDA streams here. On the host the executor packs and
        unpacks on its own host streams, so every argument must be None."""
        given = [s for s in (pack_stream, unpack_stream, send_stream, copy_stream, torch_pack_stream,
                             torch_unpack_stream, torch_copy_stream) if s is not None]
        if given:
            raise UnsupportedError("PipelineExecutor.set_streams: the host executor runs on its own host streams; "
                                   "device streams need the CUDA executor, which this build does not have")

    def set_events(self, pack_events: Optional[List[Any]], unpack_events: Optional[List[Any]]) -> None:
        """Upstream takes CUDA events here; on the host both must be None or empty."""
        if pack_events or unpack_events:
            raise UnsupportedError("PipelineExecutor.set_events: the host executor keeps its own completion "
                                   "order; device events need the CUDA executor")

    def _load_requests(self) -> None:
        launcher = self.kernel_launcher
        key = (launcher, launcher.version)
        if self._loaded != key:
            sends, receives = launcher.send_memory, launcher.receive_memory
            self._native.set_task_memory(sends[:, 0], sends[:, 1], sends[:, 2],
                                         receives[:, 0], receives[:, 1], receives[:, 2])
            self._loaded = key

    def execute_pipeline(self, iter_schedules: List[Dict[str, Optional[ScheduledBatch]]], num_iterations: int,
                         timeout: Optional[float] = None) -> None:
        """Runs ``num_iterations`` iterations (collective; the same count on every
        rank). ``iter_schedules[i]`` is ``{"send": batch or None, "recv": batch or
        None}`` (``TransferSchedule.iteration_schedules``). Raises ValueError for a
        batch that does not fit its task or slot (before anything moves),
        TimeoutError / tensorxfer.PeerLostError from the barriers."""
        if num_iterations != len(iter_schedules):
            raise ValueError(f"num_iterations is {num_iterations} but {len(iter_schedules)} schedules were given")
        steps = []
        for step in iter_schedules:
            send, recv = step.get("send"), step.get("recv")
            steps.append((None if send is None else _native_batch(send), None if recv is None else _native_batch(recv)))
        plan = _core.PipelinePlan.from_iterations(steps)
        self._load_requests()
        self._native.execute(plan, timeout)

    def _launch_pack(self, iteration: int, batch: ScheduledBatch) -> None:
        """Enqueues packing ``batch`` into send slot ``iteration % 2`` (async; see ``synchronize``)."""
        self._load_requests()
        self._native.launch_pack(iteration, _native_batch(batch))

    def _launch_unpack(self, iteration: int, batch: ScheduledBatch) -> None:
        """Enqueues unpacking ``batch`` from receive slot ``iteration % 2`` (async)."""
        self._load_requests()
        self._native.launch_unpack(iteration, _native_batch(batch))

    def synchronize(self) -> None:
        """Waits for launched packs and unpacks; raises what they raised."""
        self._native.synchronize()

    def process_self_moves(self, send_requests: Sequence[SendRequest],
                           receive_requests: Sequence[ReceiveRequest]) -> None:
        """Copies the requests whose source and destination are this rank
        (``dest_pe == src_pe == my_pe``), matched by task id; a receive with no
        send, or sizes that differ, raise ValueError naming the task."""
        me = self.my_pe
        sends = {r.task_id: r for r in send_requests if r.dest_pe == me}
        receives = [r for r in receive_requests if r.src_pe == me]
        pairs_send, pairs_recv = [], []
        for receive in receives:
            send = sends.get(receive.task_id)
            if send is None:
                raise ValueError(f"process_self_moves: missing send for task_id={receive.task_id} on rank {me}")
            if send.size != receive.size:
                raise ValueError(f"process_self_moves: task_id={receive.task_id} sends {send.size} bytes "
                                 f"but receives {receive.size}")
            pairs_send.append(send)
            pairs_recv.append(receive)
        if pairs_send:
            source = _task_memory(pairs_send, "src_tensor", "src_pos", "send")
            target = _task_memory(pairs_recv, "dest_tensor", "dest_pos", "receive")
            spans = np.stack([source[:, 1], target[:, 1], source[:, 2]], axis=1)
            _core.copy_spans(np.ascontiguousarray(spans), self.kernel_launcher.engine)


__all__ = ["DEFAULT_SLOT_NBYTES", "DoubleBufferManager", "HostKernelLauncher", "PipelineExecutor"]
