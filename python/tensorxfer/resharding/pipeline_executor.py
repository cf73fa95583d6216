"""The pipelined pack/send/unpack executor behind the shared-memory copy service.

The host counterpart of the upstream NVSHMEM ``PipelineExecutor``: an
:class:`~tensorxfer.runtime.IpcMemory` holding two send and two receive slots
per rank plays the symmetric heap (:class:`DoubleBufferManager`), the native
copy engine packs and unpacks batches on the executor's host streams
(:class:`HostKernelLauncher`). Per iteration i: pack i straight into the
destination's receive slot (async; packing and "sending" are one copy on the
host), unpack i-1 (async), wait for both, barrier; a receive slot is rewritten
only after every rank has unpacked it, and every barrier carries the identity
of the run it belongs to (the native executor's header,
``resharding/pipeline_executor.h``, gives the argument).

Usage (every rank, collectively)::

    schedule = build_schedule(all_sends, all_receives, world_size, slot_nbytes=...)
    executor = PipelineExecutor(HostKernelLauncher(sends, receives), DoubleBufferManager(group), rank)
    executor.process_self_moves(sends, receives)
    executor.execute_pipeline(schedule.iteration_schedules(rank), schedule.num_iterations)
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from tensorxfer import _core
from tensorxfer.errors import ClosedError, UnsupportedError
from tensorxfer.ipc.pack import default_copy_engine
from tensorxfer.resharding.copy_services import _tensors
from tensorxfer.resharding.schedule import BatchTask, ReceiveRequest, ScheduledBatch, SendRequest
from tensorxfer.runtime.group import LocalGroup
from tensorxfer.runtime.ipc_memory import IpcMemory, create_and_map

#: Default bytes of one slot.
DEFAULT_SLOT_NBYTES = 4 << 20


class DoubleBufferManager:
    """Two send and two receive slots of ``slot_nbytes`` per rank, in an IpcMemory
    every rank of ``group`` maps. Collective: every rank constructs it together."""

    def __init__(self, group: LocalGroup, slot_nbytes: int = DEFAULT_SLOT_NBYTES, *,
                 timeout: Optional[float] = None) -> None:
        """``slot_nbytes`` is compared between ranks (``ValueError`` on every rank
        naming both values); a rank whose construction fails makes every rank's fail."""
        def region_nbytes() -> int:  # checked inside the exchange: a bad argument fails every rank
            if isinstance(slot_nbytes, bool) or not isinstance(slot_nbytes, int) or slot_nbytes < 64 or slot_nbytes % 64:
                raise ValueError(f"slot_nbytes: expected a positive multiple of 64, got {slot_nbytes!r}")
            return int(_core.pipeline_region_nbytes(slot_nbytes))

        self.group = group
        self.slot_nbytes = slot_nbytes
        self.memory = IpcMemory(create_and_map("DoubleBufferManager", group, region_nbytes, "cpu", timeout,
                                               {"slot_nbytes": slot_nbytes}))

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self.memory.closed

    def _ensure_open(self) -> None:
        if self.memory.closed:
            raise ClosedError("DoubleBufferManager is closed")

    def send_slot(self, index: int) -> np.ndarray:
        """This rank's send slot 0 or 1, as uint8 (for inspection and tests)."""
        return self._slot(self.group.rank, index)

    def recv_slot(self, index: int) -> np.ndarray:
        """This rank's receive slot 0 or 1, as uint8."""
        return self._slot(self.group.rank, 2 + index)

    def _slot(self, rank: int, position: int) -> np.ndarray:
        self._ensure_open()
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


_U32 = 1 << 32
_U64 = 1 << 64


def _field(value: Any, name: str, where: str, high: int) -> int:
    """``value`` as an int in [0, high), or ValueError naming the field."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{where}: {name} must be an int, got {type(value).__name__} {value!r}")
    if not 0 <= int(value) < high:
        raise ValueError(f"{where}: {name} must be in [0, {high}), got {int(value)}")
    return int(value)


def _native_batch(batch: ScheduledBatch, where: str = "batch") -> tuple:
    """The native form of ``batch``, its fields checked (ValueError naming the field). The ranges
    that depend on the group and the slots are checked natively, also before anything moves."""
    if not isinstance(batch, ScheduledBatch):
        raise ValueError(f"{where}: expected a ScheduledBatch or None, got {type(batch).__name__}")
    src = _field(batch.src_pe, "src_pe", where, 1 << 31)
    dest = _field(batch.dest_pe, "dest_pe", where, 1 << 31)
    index = _field(batch.batch_index, "batch_index", where, _U32)
    iteration = _field(batch.iteration, "iteration", where, _U32)
    total = _field(batch.total_size, "total_size", where, _U64)
    rows = []
    for k, task in enumerate(batch.tasks):
        if not isinstance(task, BatchTask):
            raise ValueError(f"{where}: tasks[{k}] must be a BatchTask, got {type(task).__name__}")
        rows.append(tuple(_field(getattr(task, name), f"tasks[{k}].{name}", where, _U64)
                          for name in ("task_id", "task_offset", "size", "slot_offset")))
    segments = np.array(rows, np.uint64).reshape(-1, 4)
    return (src, dest, index, iteration, total, segments)


class PipelineExecutor:
    """Executes a schedule with pack/send/unpack overlap over double-buffered slots."""

    def __init__(self, kernel_launcher: HostKernelLauncher, buffer_manager: DoubleBufferManager, my_pe: int) -> None:
        buffer_manager._ensure_open()
        if my_pe != buffer_manager.group.rank:
            raise ValueError(f"my_pe: expected this process's rank {buffer_manager.group.rank}, got {my_pe}")
        self.kernel_launcher = kernel_launcher
        self.buffer_manager = buffer_manager
        self.my_pe = my_pe
        self._native = _core.PipelineExecutor(buffer_manager.memory._native, buffer_manager.group._native,
                                              buffer_manager.slot_nbytes, kernel_launcher.engine)
        self._loaded: Optional[tuple] = None  # (launcher, version) whose task memory the native side holds
        self._operations = 0  # execute_pipeline calls that reached the native executor

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
                         timeout: Optional[float] = None, *, agree: bool = True) -> None:
        """Runs ``num_iterations`` iterations (collective; the same count on every
        rank). ``iter_schedules[i]`` is ``{"send": batch or None, "recv": batch or
        None}`` (``TransferSchedule.iteration_schedules``).

        Every field is checked before anything moves, with a ``ValueError``
        naming it: a send starts at this rank and a receive ends here, the peer
        (``dest_pe`` / ``src_pe``) is another rank of the group, ``iteration``
        is the batch's position, no two batches of one peer share a
        ``batch_index``, ``total_size`` fits the slot, and every task's
        ``task_offset``/``size`` lies inside its request and ``slot_offset``/``size``
        inside the batch, without overlapping another task in the slot.
        :class:`tensorxfer.errors.ClosedError` after ``DoubleBufferManager.close()``;
        TimeoutError / tensorxfer.PeerLostError from the barriers.

        With ``agree`` (the default) the ranks then compare their plans in one
        all-gather: the same ``num_iterations``, and every batch received
        exactly as its sender sends it. A failed check on any rank is a
        ``ValueError`` on every rank, still before anything moves."""
        self.buffer_manager._ensure_open()
        error: Optional[BaseException] = None
        plan = None
        try:
            plan = self._checked_plan(iter_schedules, num_iterations)
        except ValueError as failure:
            if not agree:
                raise
            error = failure
        if agree:
            self._agree_on_plan(iter_schedules if error is None else [], num_iterations, error, timeout)
        assert plan is not None  # a failed check raised above
        self._operations += 1  # the same count on every rank: the identity its barriers carry
        self._native.execute(plan, timeout, self._operations)

    def _checked_plan(self, iter_schedules: List[Dict[str, Optional[ScheduledBatch]]], num_iterations: int) -> Any:
        """The native plan, checked against the group, the slots and the requests (ValueError)."""
        if isinstance(num_iterations, bool) or not isinstance(num_iterations, int) or num_iterations < 0:
            raise ValueError(f"num_iterations must be an int >= 0, got {num_iterations!r}")
        if num_iterations != len(iter_schedules):
            raise ValueError(f"num_iterations is {num_iterations} but {len(iter_schedules)} schedules were given")
        steps = []
        for i, step in enumerate(iter_schedules):
            if not isinstance(step, dict):
                raise ValueError(f"iter_schedules[{i}] must be a dict with 'send' and 'recv', got {type(step).__name__}")
            send, recv = step.get("send"), step.get("recv")
            steps.append((None if send is None else _native_batch(send, f"iter_schedules[{i}]['send']"),
                          None if recv is None else _native_batch(recv, f"iter_schedules[{i}]['recv']")))
        plan = _core.PipelinePlan.from_iterations(steps)
        self._load_requests()
        self._native.check(plan)
        return plan

    def _agree_on_plan(self, iter_schedules: List[Dict[str, Optional[ScheduledBatch]]], num_iterations: Any,
                       error: Optional[BaseException], timeout: Optional[float]) -> None:
        """All-gathers every rank's check result and batch digests; raises ValueError on every rank
        unless every rank's plan is valid and the senders and receivers of every batch agree."""
        batches = []
        for i, step in enumerate(iter_schedules):
            for role in ("send", "recv"):
                batch = step.get(role)
                if batch is not None:
                    peer = batch.dest_pe if role == "send" else batch.src_pe
                    native = _native_batch(batch)
                    digest = hashlib.blake2b(repr(native[:5]).encode() + native[5].tobytes(),
                                             digest_size=12).hexdigest()
                    batches.append([i, role, int(peer), digest])
        mine = {"error": None if error is None else str(error)[:2000], "n": repr(num_iterations), "batches": batches}
        group = self.buffer_manager.group
        replies = [json.loads(reply) for reply in group.all_gather_bytes(json.dumps(mine).encode(), timeout)]
        if error is not None:
            raise error
        me = self.my_pe
        for rank, reply in enumerate(replies):
            if reply["error"] is not None:
                raise ValueError(f"execute_pipeline: rank {rank}'s plan was refused ({reply['error']}); "
                                 f"rank {me} refuses too, before anything moved")
            if reply["n"] != mine["n"]:
                raise ValueError(f"execute_pipeline: every rank must run the same num_iterations: rank {me} "
                                 f"has {mine['n']}, rank {rank} has {reply['n']}")
        sent = {(rank, i, peer): digest for rank, reply in enumerate(replies)
                for i, role, peer, digest in reply["batches"] if role == "send"}
        received = {(peer, i, rank): digest for rank, reply in enumerate(replies)
                    for i, role, peer, digest in reply["batches"] if role == "recv"}
        for key in sorted(set(sent) | set(received)):
            if sent.get(key) != received.get(key):
                src, i, dest = key
                what = ("differ" if key in sent and key in received
                        else "is only sent" if key in sent else "is only received")
                raise ValueError(f"execute_pipeline: the batch from rank {src} to rank {dest} in iteration {i} "
                                 f"{what} (sender and receiver must hold the same batch); nothing moved")

    def _launch_pack(self, iteration: int, batch: ScheduledBatch) -> None:
        """Enqueues packing ``batch`` into send slot ``iteration % 2`` (async; see ``synchronize``)."""
        self.buffer_manager._ensure_open()
        self._load_requests()
        self._native.launch_pack(_field(iteration, "iteration", "_launch_pack", _U32), _native_batch(batch))

    def _launch_unpack(self, iteration: int, batch: ScheduledBatch) -> None:
        """Enqueues unpacking ``batch`` from receive slot ``iteration % 2`` (async)."""
        self.buffer_manager._ensure_open()
        self._load_requests()
        self._native.launch_unpack(_field(iteration, "iteration", "_launch_unpack", _U32), _native_batch(batch))

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
