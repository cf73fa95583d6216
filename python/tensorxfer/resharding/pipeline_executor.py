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

import json
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from tensorxfer import _core
from tensorxfer.errors import ClosedError, UnsupportedError
from tensorxfer.resharding._copy_engine import resharding_copy_engine
from tensorxfer.resharding.copy_services import _tensors
from tensorxfer.resharding.native_batch import U32, NativeBatches, field_int, task_rows
from tensorxfer.resharding.cuda_pipeline import CudaKernelLauncher, CudaPipeline, cuda_tensor_locator, device_bytes
from tensorxfer.resharding.schedule import ReceiveRequest, ScheduledBatch, SendRequest
from tensorxfer.runtime.cuda_collectives import cuda_device_index, cuda_torch
from tensorxfer.runtime.group import LocalGroup
from tensorxfer.runtime.ipc_memory import IpcMemory, create_and_map

#: Default bytes of one slot.
DEFAULT_SLOT_NBYTES = 4 << 20


class DoubleBufferManager:
    """Two send and two receive slots of ``slot_nbytes`` per rank, in an IpcMemory.

    Every rank of ``group`` maps it. Collective: every rank constructs it together.

    Args:
        group: the ranks (a LocalGroup).
        slot_nbytes: bytes of one slot.
        timeout: seconds to wait for the peers while constructing (and, on a GPU, in
            the collective close).
        device: ``"cpu"`` (shared memory; the host executor) or ``"cuda"`` /
            ``"cuda:N"`` (GPU memory mapped through CUDA IPC; the CUDA executor,
            ``tensorxfer.resharding.cuda_pipeline``, with a :class:`CudaKernelLauncher`).
    """

    def __init__(self, group: LocalGroup, slot_nbytes: int = DEFAULT_SLOT_NBYTES, *,
                 timeout: Optional[float] = None, device: str = "cpu") -> None:
        """``slot_nbytes`` and the kind of device are compared between ranks.

        A difference is a ``ValueError`` on every rank naming both values; a rank whose
        construction fails makes every rank's fail.
        """
        def region_nbytes() -> int:  # checked inside the exchange: a bad argument fails every rank
            if isinstance(slot_nbytes, bool) or not isinstance(slot_nbytes, int) or slot_nbytes < 64 or slot_nbytes % 64:
                raise ValueError(f"slot_nbytes: expected a positive multiple of 64, got {slot_nbytes!r}")
            return int(_core.pipeline_region_nbytes(slot_nbytes))

        self.cuda_device = -1
        if device != "cpu":
            torch = cuda_torch("DoubleBufferManager(device='cuda')")
            self.cuda_device = cuda_device_index(torch, device, "DoubleBufferManager")
        self.device = "cpu" if device == "cpu" else "cuda"
        self.group = group
        self.slot_nbytes = slot_nbytes
        where = "cpu" if device == "cpu" else f"cuda:{self.cuda_device}"
        native = create_and_map("DoubleBufferManager", group, region_nbytes, where, timeout,
                                {"slot_nbytes": slot_nbytes, "device": self.device})
        # GPU memory is closed collectively: no rank frees its region while a peer still maps it.
        self.memory = IpcMemory(native, group if self.device == "cuda" else None, timeout)
        self._regions = [int(address) for address in self.memory.remote_data]  # fixed while open

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self.memory.closed

    def _ensure_open(self) -> None:
        if self.memory.closed:
            raise ClosedError("DoubleBufferManager is closed")

    def send_slot(self, index: int) -> Any:
        """This rank's send slot 0 or 1, as uint8 (for inspection and tests).

        numpy, or a torch tensor on the GPU that does not keep the mapping alive.
        """
        return self._slot(self.group.rank, index)

    def recv_slot(self, index: int) -> Any:
        """This rank's receive slot 0 or 1, as uint8."""
        return self._slot(self.group.rank, 2 + index)

    def slot_address(self, rank: int, position: int) -> int:
        """Where rank ``rank``'s slot ``position`` (0, 1: send; 2, 3: receive) is mapped in this process.

        Valid while open.
        """
        return self._regions[rank] + position * self.slot_nbytes

    def _slot(self, rank: int, position: int) -> Any:
        self._ensure_open()
        if self.device == "cuda":
            return device_bytes(self.slot_address(rank, position), self.slot_nbytes, self.cuda_device)
        region = self.memory.buffer(rank, np.uint8, (4, self.slot_nbytes))
        return region[position]

    def close(self) -> None:
        """Unmaps the slots (host views taken before stay readable until dropped).

        On a GPU it is collective, like ``IpcMemory.close``.
        """
        self.memory.close()


def _host_tensor(tensor: Any, where: str, writable: bool) -> Tuple[int, int]:
    """task_rows' ``locate`` for the host executor: contiguous host tensors (numpy or torch)."""
    info = _tensors.describe(_tensors.normalize(tensor, where, writable))
    if not (info.contiguous and info.host):
        raise ValueError(f"{where}: the tensor must be a contiguous host tensor")
    return info.address, info.nbytes


class HostKernelLauncher:
    """Packs and unpacks batches with the native copy engine (GIL released).

    Holds this rank's requests: where each task's bytes start (``src_tensor`` +
    ``src_pos``, ``dest_tensor`` + ``dest_pos``). The tensors must stay alive
    and unmoved while the executor runs.
    """

    def __init__(self, send_requests: Sequence[SendRequest] = (), receive_requests: Sequence[ReceiveRequest] = (),
                 engine: Optional[_core.CopyEngine] = None) -> None:
        self.engine = engine if engine is not None else resharding_copy_engine()
        self.version = 0  # bumped by set_requests, so the executor reloads the task memory
        self.set_requests(send_requests, receive_requests)

    def set_requests(self, send_requests: Sequence[SendRequest], receive_requests: Sequence[ReceiveRequest]) -> None:
        """Replaces the requests the next pipeline packs from and unpacks into."""
        self.send_requests = list(send_requests)
        self.receive_requests = list(receive_requests)
        self.send_memory = task_rows(self.send_requests, "send", _host_tensor)
        self.receive_memory = task_rows(self.receive_requests, "receive", _host_tensor)
        self.version += 1


class PipelineExecutor:
    """Executes a schedule with pack/send/unpack overlap over double-buffered slots."""

    def __init__(self, kernel_launcher: Any, buffer_manager: DoubleBufferManager, my_pe: int) -> None:
        """Pairs a kernel launcher with a buffer manager of its kind.

        Args:
            kernel_launcher: a :class:`HostKernelLauncher` with a host ``DoubleBufferManager``,
                or a :class:`~tensorxfer.resharding.cuda_pipeline.CudaKernelLauncher` with a
                CUDA one.
            buffer_manager: the slots.
            my_pe: this process's rank in the buffer manager's group.

        Raises:
            ValueError: ``my_pe`` is not this process's rank, or the launcher is not of
                the buffer manager's kind.
            tensorxfer.ClosedError: the buffer manager is closed.
        """
        buffer_manager._ensure_open()
        if my_pe != buffer_manager.group.rank:
            raise ValueError(f"my_pe: expected this process's rank {buffer_manager.group.rank}, got {my_pe}")
        on_gpu = buffer_manager.device == "cuda"
        expected = CudaKernelLauncher if on_gpu else HostKernelLauncher
        if not issubclass(type(kernel_launcher), expected):
            raise ValueError(f"PipelineExecutor: a DoubleBufferManager on {buffer_manager.device} needs a "
                             f"{expected.__name__}, got {type(kernel_launcher).__name__}")
        self.kernel_launcher: Any = kernel_launcher
        self.buffer_manager = buffer_manager
        self.my_pe = my_pe
        self._native: Any = None  # the host executor
        self._cuda: Optional[CudaPipeline] = None  # or the CUDA one
        if on_gpu:
            self._cuda = CudaPipeline(self.kernel_launcher, buffer_manager, my_pe)
        else:
            self._native = _core.PipelineExecutor(buffer_manager.memory._native, buffer_manager.group._native,
                                                  buffer_manager.slot_nbytes, self.kernel_launcher.engine)
        self._loaded: Optional[tuple] = None  # (launcher, version) whose task memory the native side holds
        self._operations = 0  # execute_pipeline calls that reached the native executor
        self._batches = NativeBatches()

    def set_streams(self, pack_stream: Any = None, unpack_stream: Any = None, send_stream: Any = None,
                    copy_stream: Any = None, torch_pack_stream: Any = None, torch_unpack_stream: Any = None,
                    torch_copy_stream: Any = None) -> None:
        """The CUDA streams to run on (CUDA executor).

        Each stream is a torch, cuda.core or cupy stream or a handle; None keeps the
        executor's own stream. The host executor packs and unpacks on its own host
        streams, so there every argument must be None.

        Args:
            pack_stream: packs run on it.
            unpack_stream: unpacks run on it.
            send_stream: puts run on it.
            copy_stream: self-moves run on it.
            torch_pack_stream: the torch view of the same stream as ``pack_stream``.
            torch_unpack_stream: the torch view of the same stream as ``unpack_stream``.
            torch_copy_stream: the torch view of the same stream as ``copy_stream``.

        Raises:
            ValueError: both of a pair are given and differ.
            tensorxfer.UnsupportedError: a stream given to the host executor.
        """
        pairs = {"pack": (pack_stream, torch_pack_stream), "unpack": (unpack_stream, torch_unpack_stream),
                 "send": (send_stream, None), "copy": (copy_stream, torch_copy_stream)}
        if self._cuda is not None:
            self._cuda.set_streams(pairs)
        elif any(s is not None for pair in pairs.values() for s in pair):
            raise UnsupportedError("PipelineExecutor.set_streams: the host executor runs on its own host streams; "
                                   "device streams need a DoubleBufferManager(device='cuda')")

    def set_events(self, pack_events: Optional[List[Any]], unpack_events: Optional[List[Any]]) -> None:
        """Two torch.cuda.Event each, recorded after packing (unpacking) iteration i as ``events[i % 2]``.

        For the CUDA executor. On the host both must be None or empty.

        Raises:
            tensorxfer.UnsupportedError: events given to the host executor.
        """
        if self._cuda is not None:
            self._cuda.set_events(pack_events, unpack_events)
        elif pack_events or unpack_events:
            raise UnsupportedError("PipelineExecutor.set_events: the host executor keeps its own completion "
                                   "order; device events need a DoubleBufferManager(device='cuda')")

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
        """Runs ``num_iterations`` iterations (collective; the same count on every rank).

        Every field is checked before anything moves, with a ``ValueError``
        naming it: a send starts at this rank and a receive ends here, the peer
        (``dest_pe`` / ``src_pe``) is another rank of the group, ``iteration``
        is the batch's position, no two batches of one peer share a
        ``batch_index``, ``total_size`` fits the slot, and every task's
        ``task_offset``/``size`` lies inside its request and ``slot_offset``/``size``
        inside the batch, without overlapping another task in the slot.

        With ``agree`` (the default) the ranks then compare their plans in one
        all-gather: the same ``num_iterations``, and every batch received
        exactly as its sender sends it. A failed check on any rank is a
        ``ValueError`` on every rank, still before anything moves.

        Args:
            iter_schedules: ``iter_schedules[i]`` is ``{"send": batch or None, "recv":
                batch or None}`` (``TransferSchedule.iteration_schedules``).
            num_iterations: the same on every rank.
            timeout: seconds to wait for the peers in the barriers (None: no deadline).
            agree: compare the plans between ranks first (see above).

        Raises:
            ValueError: a failed check (see above).
            tensorxfer.errors.ClosedError: after ``DoubleBufferManager.close()``.
            TimeoutError: from the barriers.
            tensorxfer.PeerLostError: from the barriers.
        """
        self.buffer_manager._ensure_open()
        self._batches.start()
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
        if self._cuda is not None:
            self._cuda.execute(plan[1], timeout, self._operations)
        else:
            self._native.execute(plan[0], timeout, self._operations)

    def _checked_plan(self, iter_schedules: List[Dict[str, Optional[ScheduledBatch]]], num_iterations: int) -> Any:
        """(the native plan, its steps), checked against the group, the slots and the requests (ValueError)."""
        if isinstance(num_iterations, bool) or not isinstance(num_iterations, int) or num_iterations < 0:
            raise ValueError(f"num_iterations must be an int >= 0, got {num_iterations!r}")
        if num_iterations != len(iter_schedules):
            raise ValueError(f"num_iterations is {num_iterations} but {len(iter_schedules)} schedules were given")
        steps = []
        for i, step in enumerate(iter_schedules):
            if not isinstance(step, dict):
                raise ValueError(f"iter_schedules[{i}] must be a dict with 'send' and 'recv', got {type(step).__name__}")
            send, recv = step.get("send"), step.get("recv")
            steps.append((None if send is None else self._batches.native(send, f"iter_schedules[{i}]['send']"),
                          None if recv is None else self._batches.native(recv, f"iter_schedules[{i}]['recv']")))
        plan = _core.PipelinePlan.from_iterations(steps)
        if self._cuda is not None:
            _core.check_pipeline_plan(plan, *self._task_columns(), **self._bounds())
        else:
            self._load_requests()
            self._native.check(plan)
        return plan, steps

    def _task_columns(self) -> tuple:
        sends, receives = self.kernel_launcher.send_memory, self.kernel_launcher.receive_memory
        return (sends[:, 0], sends[:, 1], sends[:, 2], receives[:, 0], receives[:, 1], receives[:, 2])

    def _bounds(self) -> Dict[str, int]:
        return {"my_pe": self.my_pe, "world_size": self.buffer_manager.group.world_size,
                "slot_nbytes": self.buffer_manager.slot_nbytes}

    def _agree_on_plan(self, iter_schedules: List[Dict[str, Optional[ScheduledBatch]]], num_iterations: Any,
                       error: Optional[BaseException], timeout: Optional[float]) -> None:
        """All-gathers every rank's check result and batch digests.

        Raises ValueError on every rank unless every rank's plan is valid and the senders
        and receivers of every batch agree.
        """
        batches = []
        for i, step in enumerate(iter_schedules):
            for role in ("send", "recv"):
                batch = step.get(role)
                if batch is not None:
                    peer = batch.dest_pe if role == "send" else batch.src_pe
                    batches.append([i, role, int(peer), self._batches.digest(batch)])
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
        self._launch(iteration, batch, True)

    def _launch_unpack(self, iteration: int, batch: ScheduledBatch) -> None:
        """Enqueues unpacking ``batch`` from receive slot ``iteration % 2`` (async)."""
        self._launch(iteration, batch, False)

    def _launch(self, iteration: int, batch: ScheduledBatch, packing: bool) -> None:
        self.buffer_manager._ensure_open()
        where = "_launch_pack" if packing else "_launch_unpack"
        index, native = field_int(iteration, "iteration", where, U32), self._batches.native(batch, where)
        if self._cuda is not None:
            columns = self._task_columns()[0:3] if packing else self._task_columns()[3:6]
            _core.check_pipeline_batch(native, packing, *columns, **self._bounds())
            self._cuda.launch(index, native, packing)
            return
        self._load_requests()
        (self._native.launch_pack if packing else self._native.launch_unpack)(index, native)

    def synchronize(self) -> None:
        """Waits for launched packs and unpacks; raises what they raised."""
        (self._cuda if self._cuda is not None else self._native).synchronize()

    def process_self_moves(self, send_requests: Sequence[SendRequest],
                           receive_requests: Sequence[ReceiveRequest]) -> None:
        """Copies the requests whose source and destination are this rank (``dest_pe == src_pe == my_pe``).

        The sends and receives are matched by task id.

        Raises:
            ValueError: naming the task, for a receive with no send, or sizes that differ.
        """
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
        if not pairs_send:
            return
        locate = _host_tensor if self._cuda is None else cuda_tensor_locator(self.buffer_manager.cuda_device)
        source, target = task_rows(pairs_send, "send", locate), task_rows(pairs_recv, "receive", locate)
        spans = np.ascontiguousarray(np.stack([source[:, 1], target[:, 1], source[:, 2]], axis=1))
        if self._cuda is not None:
            self._cuda.copy_spans(spans)
        else:
            _core.copy_spans(spans, self.kernel_launcher.engine)


__all__ = ["CudaKernelLauncher", "DEFAULT_SLOT_NBYTES", "DoubleBufferManager", "HostKernelLauncher", "PipelineExecutor"]
