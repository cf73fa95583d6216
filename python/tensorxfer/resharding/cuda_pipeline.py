"""The CUDA half of :class:`~tensorxfer.resharding.pipeline_executor.PipelineExecutor`.

Used when the executor's ``DoubleBufferManager`` lives on a GPU
(``device="cuda"``): every rank's two send and two receive slots are one
``IpcMemory(device="cuda")`` region, which every rank of the host maps through
CUDA IPC. Per iteration i, as upstream's NVSHMEM executor does:

1. pack iteration i+1 into this rank's send slot (i+1)%2: the span copy kernel
   on the pack stream, then ``pack_events[(i+1)%2]`` is recorded;
2. unpack iteration i-1 from this rank's receive slot (i-1)%2 (the kernel on the
   unpack stream, then ``unpack_events[(i-1)%2]``);
3. put iteration i: the send stream waits for ``pack_events[i%2]``, then
   ``cudaMemcpyAsync`` writes send slot i%2 into the peer's receive slot i%2;
4. wait for the put and the unpack, then a barrier of the group.

Iteration 0 is packed before the loop; after it the last batch is unpacked and a
final barrier ends the run. Why no slot is rewritten early is the host
executor's argument (``resharding/pipeline_executor.h``): a peer writes receive
slot i%2 only after the barrier of iteration i-1, which every rank entered after
its unpack of iteration i-2 from that slot had finished (step 4 waits before the
barrier, not after); send slot (i+1)%2 was last read by the put of iteration
i-1, finished in that iteration's step 4. Every barrier carries the run's
identity (the operation, the barrier's index and count): ranks out of step raise
``TensorxferError`` instead of going on with stale slots. Packing first waits for
torch's current stream, and the call returns once every byte has landed.
"""

from __future__ import annotations

import struct
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from tensorxfer import _core
from tensorxfer.errors import TensorxferError
from tensorxfer.resharding.native_batch import task_rows
from tensorxfer.resharding.schedule import ReceiveRequest, SendRequest

_ROW = 24  # bytes of one span row: (source, destination, nbytes) as uint64
_STREAM_NAMES = ("pack", "unpack", "send", "copy")


def cuda_tensor_locator(device: int) -> Callable[[Any, str, bool], Tuple[int, int]]:
    """task_rows' ``locate`` for contiguous torch tensors on GPU ``device``."""
    def locate(tensor: Any, where: str, writable: bool) -> Tuple[int, int]:
        if not hasattr(tensor, "is_cuda") or not tensor.is_cuda or tensor.device.index != device:
            raise ValueError(f"{where}: the tensor must be a torch tensor on cuda:{device}, got "
                             f"{getattr(tensor, 'device', type(tensor).__name__)}")
        if not tensor.is_contiguous():
            raise ValueError(f"{where}: the tensor must be contiguous")
        return tensor.data_ptr(), tensor.numel() * tensor.element_size()
    return locate


class _DeviceBytesInterface:
    """A raw device span as ``__cuda_array_interface__`` (uint8), for torch.as_tensor."""

    def __init__(self, address: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (address, False),
                                         "strides": None, "version": 3}


def device_bytes(address: int, nbytes: int, device: int) -> Any:
    """A uint8 torch tensor over ``nbytes`` of GPU memory at ``address`` (it does not own them)."""
    import torch
    return torch.as_tensor(_DeviceBytesInterface(address, nbytes), device=torch.device("cuda", device))


class CudaKernelLauncher:
    """Packs and unpacks batches on the GPU with the span copy kernel.

    Holds this rank's requests (contiguous CUDA tensors on the GPU of the
    ``DoubleBufferManager``, ``device``: an index, default torch's current
    GPU). The tensors must stay alive and unmoved while the executor runs.
    """

    def __init__(self, send_requests: Sequence[SendRequest] = (), receive_requests: Sequence[ReceiveRequest] = (),
                 device: Optional[int] = None) -> None:
        import torch  # a CUDA launcher is made by a torch user
        self.device = int(torch.cuda.current_device()) if device is None else int(device)
        self.version = 0  # bumped by set_requests, so the executor reloads the task memory
        self.set_requests(send_requests, receive_requests)

    def set_requests(self, send_requests: Sequence[SendRequest], receive_requests: Sequence[ReceiveRequest]) -> None:
        """Replaces the requests the next pipeline packs from and unpacks into."""
        self.send_requests = list(send_requests)
        self.receive_requests = list(receive_requests)
        locate = cuda_tensor_locator(self.device)
        self.send_memory = task_rows(self.send_requests, "send", locate)
        self.receive_memory = task_rows(self.receive_requests, "receive", locate)
        self.version += 1


def split_spans(source: np.ndarray, destination: np.ndarray, sizes: np.ndarray, piece: int) -> np.ndarray:
    """(k, 3) uint64 rows (source, destination, nbytes): each span cut into pieces of at most ``piece`` bytes.

    One block of the kernel copies one row; empty spans are dropped.
    """
    sizes = sizes.astype(np.int64)
    pieces = np.maximum(1, -(-sizes // piece))
    owner = np.repeat(np.arange(len(sizes)), pieces)
    first = np.repeat(np.cumsum(pieces) - pieces, pieces)
    offset = (np.arange(len(owner)) - first) * piece
    nbytes = np.minimum(piece, sizes[owner] - offset)
    rows = np.stack([source[owner] + offset.astype(np.uint64), destination[owner] + offset.astype(np.uint64),
                     nbytes.astype(np.uint64)], axis=1)
    return np.ascontiguousarray(rows[nbytes > 0]).reshape(-1, 3)


def span_rows(segments: np.ndarray, memory: np.ndarray, slot: int, into_slot: bool, piece: int) -> np.ndarray:
    """The span table of one batch (split_spans' rows).

    ``segments`` are the batch's (task_id, task_offset, size, slot_offset) rows,
    ``memory`` the side's (task_id, address, size) rows (every task id present:
    the plan was checked), ``slot`` the slot's address; packing copies task
    memory into the slot, unpacking the other way.
    """
    if len(segments) == 0:
        return np.zeros((0, 3), np.uint64)
    order = np.argsort(memory[:, 0], kind="stable")
    where = order[np.searchsorted(memory[order, 0], segments[:, 0])]
    task = memory[where, 1] + segments[:, 1]
    packed = np.uint64(slot) + segments[:, 3]
    source, destination = (task, packed) if into_slot else (packed, task)
    return split_spans(source, destination, segments[:, 2], piece)


def _stream_handle(stream: Any, name: str) -> int:
    """The CUDA stream handle of a torch stream, a cuda.core / cupy stream (``.handle`` / ``.ptr``) or an int."""
    for attribute in ("cuda_stream", "handle", "ptr"):
        if hasattr(stream, attribute):
            stream = getattr(stream, attribute)
            break
    try:
        return int(stream)
    except (TypeError, ValueError):
        raise ValueError(f"set_streams: {name} must be a CUDA stream (torch, cuda.core or cupy) or its handle, "
                         f"got {type(stream).__name__}") from None


class CudaPipeline:
    """Streams, events and the iteration loop of one CUDA executor (see the module docstring)."""

    def __init__(self, launcher: CudaKernelLauncher, buffers: Any, my_pe: int) -> None:
        import torch
        self._torch = torch
        self.launcher = launcher
        self.buffers = buffers
        self.my_pe = my_pe
        self.device = torch.device("cuda", buffers.cuda_device)
        if launcher.device != buffers.cuda_device:
            raise ValueError(f"PipelineExecutor: the kernel launcher's tensors are on cuda:{launcher.device}, the "
                             f"DoubleBufferManager on cuda:{buffers.cuda_device}")
        self.streams: Dict[str, Any] = {name: torch.cuda.Stream(self.device) for name in _STREAM_NAMES}
        self.pack_events: List[Any] = [torch.cuda.Event() for _ in range(2)]
        self.unpack_events: List[Any] = [torch.cuda.Event() for _ in range(2)]
        self._launched: List[Any] = []  # tables of _launch_pack / _launch_unpack, alive until synchronize
        self._plan_table: Optional[Tuple[Any, ...]] = None  # (key, entries, table, extents) of the last plan

    def set_streams(self, given: Dict[str, Tuple[Any, Any]]) -> None:
        """``given[name]`` = (raw stream, torch stream) for pack, unpack, send and copy.

        None keeps the executor's own. A pair given twice must be the same CUDA stream.
        """
        torch = self._torch
        chosen = {}
        for name, (raw, wrapped) in given.items():
            handles = {_stream_handle(s, f"{name}_stream") for s in (raw, wrapped) if s is not None}
            if len(handles) > 1:
                raise ValueError(f"set_streams: {name}_stream and torch_{name}_stream must be the same CUDA stream, "
                                 f"got handles {sorted(handles)}")
            if wrapped is not None and isinstance(wrapped, torch.cuda.Stream):
                chosen[name] = wrapped
            elif handles:
                chosen[name] = torch.cuda.ExternalStream(handles.pop(), device=self.device)
        self.streams.update(chosen)

    def set_events(self, pack_events: Optional[List[Any]], unpack_events: Optional[List[Any]]) -> None:
        """Two torch.cuda.Event each (double-buffered by iteration % 2); None or [] keeps the executor's own."""
        for name, events in (("pack_events", pack_events), ("unpack_events", unpack_events)):
            if not events:
                continue
            if len(events) != 2 or not all(isinstance(e, self._torch.cuda.Event) for e in events):
                raise ValueError(f"set_events: {name} must be two torch.cuda.Event, got {events!r}")
            setattr(self, name, list(events))

    def _slot(self, pe: int, position: int) -> int:
        return self.buffers.slot_address(pe, position)

    def _plan_table_for(self, entries: List[Tuple[Any, bool, int]]) -> Tuple[Any, List[Tuple[int, int]]]:
        """_table(entries), reused while what it was built from is unchanged.

        Reused while the launcher's requests and every native batch object are the same as
        last time (PipelineExecutor converts an unchanged batch to the same object).
        """
        launcher = self.launcher
        key = (id(launcher), launcher.version, [(id(native), into, slot) for native, into, slot in entries])
        cached = self._plan_table
        if cached is not None and cached[0] == key:
            return cached[2], cached[3]
        table, extents = self._table(entries)
        self._plan_table = (key, entries, table, extents)  # holding entries keeps their ids unique
        return table, extents

    def _table(self, batches: Sequence[Tuple[Any, bool, int]]) -> Tuple[Any, List[Tuple[int, int]]]:
        """One device table for (native batch, into_slot, slot address) entries: (tensor, [(first row, rows)])."""
        launcher, piece = self.launcher, int(_core.cuda_span_piece_bytes)
        parts, extents, first = [], [], 0
        for batch, into_slot, slot in batches:
            memory = launcher.send_memory if into_slot else launcher.receive_memory
            rows = span_rows(batch[5], memory, slot, into_slot, piece)
            parts.append(rows)
            extents.append((first, len(rows)))
            first += len(rows)
        return self._upload(np.concatenate(parts) if parts else np.zeros((0, 3), np.uint64)), extents

    def _upload(self, rows: np.ndarray) -> Any:
        """Span rows as a tensor on this GPU (the copy has finished when it returns)."""
        return self._torch.from_numpy(rows.view(np.int64).reshape(-1)).to(self.device)

    def _copy(self, table: Any, extent: Tuple[int, int], stream: Any) -> None:
        first, rows = extent
        _core.cuda_copy_spans(table.data_ptr() + first * _ROW, rows, self.device.index, stream.cuda_stream)

    def _enqueue(self, table: Any, extent: Tuple[int, int], iteration: int, packing: bool) -> None:
        """Packs (unpacks) the table's rows on the pack (unpack) stream, then records its event of ``iteration``."""
        stream = self.streams["pack" if packing else "unpack"]
        self._copy(table, extent, stream)
        (self.pack_events if packing else self.unpack_events)[iteration % 2].record(stream)

    def _barrier(self, operation: int, barrier: int, barriers: int, timeout: Optional[float]) -> None:
        """A barrier of the group that every rank enters with the same (operation, barrier, barriers)."""
        mine = (operation, barrier, barriers)
        for pe, reply in enumerate(self.buffers.group.all_gather_bytes(struct.pack("<3Q", *mine), timeout)):
            seen = struct.unpack("<3Q", reply)
            if seen != mine:
                raise TensorxferError(f"PipelineExecutor: ranks out of step: rank {self.my_pe} left barrier "
                                      f"{barrier} of {barriers} of operation {operation}, which rank {pe} entered "
                                      f"as barrier {seen[1]} of {seen[2]} of operation {seen[0]}")

    def execute(self, steps: List[Tuple[Any, Any]], timeout: Optional[float], operation: int) -> None:
        """Runs checked native steps [(send batch or None, receive batch or None), ...] (collective)."""
        me, count = self.my_pe, len(steps)
        entries: List[Tuple[Any, bool, int]] = []
        where: Dict[Tuple[int, bool], int] = {}
        for i, (send, receive) in enumerate(steps):
            if send is not None:
                where[i, True] = len(entries)
                entries.append((send, True, self._slot(me, i % 2)))
            if receive is not None:
                where[i, False] = len(entries)
                entries.append((receive, False, self._slot(me, 2 + i % 2)))
        table, extents = self._plan_table_for(entries)
        pack, unpack, send_stream = self.streams["pack"], self.streams["unpack"], self.streams["send"]
        caller = self._torch.cuda.current_stream(self.device)
        pack.wait_stream(caller)  # the sources are written by work queued before this call
        unpack.wait_stream(caller)  # and the destinations may still be read by it

        def launch(i: int, packing: bool) -> None:
            self._enqueue(table, extents[where[i, packing]], i, packing)

        try:
            if count and steps[0][0] is not None:
                launch(0, True)
            for i in range(count):
                if i + 1 < count and steps[i + 1][0] is not None:
                    launch(i + 1, True)
                if i >= 1 and steps[i - 1][1] is not None:
                    launch(i - 1, False)
                batch = steps[i][0]
                if batch is not None:
                    send_stream.wait_event(self.pack_events[i % 2])
                    _core.cuda_put(self._slot(batch[1], 2 + i % 2), self._slot(me, i % 2), batch[4],
                                   self.device.index, send_stream.cuda_stream)
                send_stream.synchronize()
                if i >= 1 and steps[i - 1][1] is not None:
                    self.unpack_events[(i - 1) % 2].synchronize()
                self._barrier(operation, i, count + 1, timeout)
            if count and steps[count - 1][1] is not None:
                launch(count - 1, False)
                self.unpack_events[(count - 1) % 2].synchronize()
            self._barrier(operation, count, count + 1, timeout)
        finally:
            self.synchronize()  # nothing touches the caller's memory (or frees the table) once this returns

    def launch(self, iteration: int, batch: Any, packing: bool) -> None:
        """Enqueues packing (unpacking) one checked native batch into (from) slot ``iteration % 2``."""
        me = self.my_pe
        slot = self._slot(me, iteration % 2) if packing else self._slot(me, 2 + iteration % 2)
        table, extents = self._table([(batch, packing, slot)])
        self.streams["pack" if packing else "unpack"].wait_stream(self._torch.cuda.current_stream(self.device))
        self._enqueue(table, extents[0], iteration, packing)
        self._launched.append(table)

    def copy_spans(self, rows: np.ndarray) -> None:
        """Copies (source, destination, nbytes) rows on the copy stream and waits (the self-moves)."""
        spans = split_spans(rows[:, 0], rows[:, 1], rows[:, 2], int(_core.cuda_span_piece_bytes))
        stream = self.streams["copy"]
        stream.wait_stream(self._torch.cuda.current_stream(self.device))
        table = self._upload(spans)
        _core.cuda_copy_spans(table.data_ptr(), len(spans), self.device.index, stream.cuda_stream)
        stream.synchronize()

    def synchronize(self) -> None:
        """Waits for everything launched on the pack, unpack and send streams."""
        for name in ("pack", "unpack", "send"):
            self.streams[name].synchronize()
        self._launched.clear()
