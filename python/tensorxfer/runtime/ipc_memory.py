"""IPC memory: a data region and barrier words per rank of a local group, mapped by every rank.

The object has the fields of TVM's ``CUDAIPCMemoryObj`` (the reference):
``num_workers``, ``worker_id``, ``remote_data`` (rank i's data address in this
process; the own rank's is local), ``barrier_in`` / ``barrier_out`` (the
ranks' barrier words, same arrangement) and ``barrier_flag`` (the last barrier
epoch used: 64-bit, only increases).

Host memory (``device="cpu"``): one shared segment per rank (``/dev/shm``,
mode 0600), mapped by every rank; the names are removed as soon as every rank
has mapped them, so nothing is left behind even if a rank is killed later.
``device="cuda"`` builds the same object over ``cudaIpcGetMemHandle`` /
``cudaIpcOpenMemHandle`` (builds with CUDA and a device only).
"""

from __future__ import annotations

import json
import sys
from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence

import numpy as np

from tensorxfer import _core
from tensorxfer._arguments import check_int, check_rank
from tensorxfer.errors import ClosedError, TensorxferError


class GroupLike(Protocol):
    """What :meth:`~tensorxfer.runtime.IpcMemory.create` needs from a group (``tensorxfer.runtime.LocalGroup``)."""

    @property
    def rank(self) -> int:
        """This process's rank."""
        ...

    @property
    def world_size(self) -> int:
        """How many ranks the group has."""
        ...

    def all_gather_bytes(self, data: bytes, timeout: Optional[float] = None) -> Sequence[bytes]:
        """Every rank's ``data`` in rank order."""
        ...

    def barrier(self, timeout: Optional[float] = None) -> None:
        """Return once every rank has called it."""
        ...


def _is_torch_dtype(dtype: Any) -> bool:
    return type(dtype).__module__ == "torch" and type(dtype).__name__ == "dtype"


def typed_view(region: np.ndarray, dtype: Any, shape: Any, what: str) -> Any:
    """A numpy (numpy dtype) or torch (torch dtype) view of the first bytes of ``region`` (uint8)."""
    if isinstance(shape, int):
        shape = (shape,)
    shape = tuple(int(dim) for dim in shape)
    if any(dim < 0 for dim in shape):
        raise ValueError(f"{what}: shape must have dimensions >= 0, got {shape}")
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if _is_torch_dtype(dtype):
        import torch

        itemsize = torch.empty((), dtype=dtype).element_size()
        nbytes = count * itemsize
        if nbytes > region.nbytes:
            raise ValueError(f"{what}: {shape} of {dtype} needs {nbytes} bytes, the region holds {region.nbytes}")
        return torch.from_numpy(region[:nbytes]).view(dtype).view(shape)
    np_dtype = np.dtype(dtype)
    nbytes = count * np_dtype.itemsize
    if nbytes > region.nbytes:
        raise ValueError(f"{what}: {shape} of {np_dtype} needs {nbytes} bytes, the region holds {region.nbytes}")
    return region[:nbytes].view(np_dtype).reshape(shape)


#: The most bytes one rank's construction message may take (a handle, its layout, an error text).
_MAX_MESSAGE_NBYTES = 64 << 10


def _gather(group: GroupLike, data: bytes, timeout: Optional[float]) -> Sequence[bytes]:
    """``group.all_gather_bytes``, bounded by :data:`_MAX_MESSAGE_NBYTES` where the group supports a bound."""
    native = getattr(group, "_native", None)
    if isinstance(native, _core.LocalGroup):
        return group.all_gather_bytes(data, timeout=timeout, max_nbytes=_MAX_MESSAGE_NBYTES)  # type: ignore[call-arg]
    return group.all_gather_bytes(data, timeout=timeout)


def _abandon(group: GroupLike) -> None:
    """Tells the peers this rank gave up (their waits end with PeerLostError), where the group can."""
    native = getattr(group, "_native", None)
    if isinstance(native, _core.LocalGroup):
        native.abandon()


def _message(ok: bool, text: str, layout: Dict[str, Any]) -> bytes:
    shown = {key: repr(value) for key, value in layout.items()}
    return json.dumps({"ok": ok, "text": text[:4096], "layout": shown}).encode()


def _agree(what: str, group: GroupLike, ok: bool, text: str, layout: Dict[str, Any],
           timeout: Optional[float]) -> List[str]:
    """All-gathers every rank's status (and layout) once; returns every rank's text.

    A rank's text is its handle when it is ok. Raises on every rank if any rank failed or
    the layouts differ.
    """
    try:
        replies = [json.loads(bytes(reply)) for reply in _gather(group, _message(ok, text, layout), timeout)]
    except BaseException:
        _abandon(group)  # a wait that failed or was interrupted: peers must not wait for this rank
        raise
    rank = int(group.rank)
    if not ok:
        return []  # the caller raises its own error
    failed = [(r, reply["text"]) for r, reply in enumerate(replies) if not reply["ok"]]
    if failed:
        first, reason = failed[0]
        raise TensorxferError(f"{what}: rank {first} failed to construct its part ({reason}); "
                              f"rank {rank} gives up too")
    for key, value in layout.items():
        mine = repr(value)
        for r, reply in enumerate(replies):
            theirs = reply["layout"].get(key)
            if theirs != mine:
                raise ValueError(f"{what}: every rank must use the same {key}: rank {rank} has {mine}, "
                                 f"rank {r} has {theirs}")
    return [str(reply["text"]) for reply in replies]


def _device_argument(device: Any) -> tuple[str, int]:
    """("cpu" | "cuda", GPU index or -1) for ``IpcMemory.create``'s ``device``.

    The extension's CUDA runtime is not torch's and has its own current device, so
    a plain ``"cuda"`` names torch's current GPU explicitly when torch runs CUDA.
    """
    if device == "cpu":
        return "cpu", -1
    if device == "cuda":
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            return "cuda", int(torch.cuda.current_device())
        return "cuda", -1
    if isinstance(device, str) and device.startswith("cuda:") and device[5:].isdigit():
        return "cuda", int(device[5:])
    raise ValueError(f"IpcMemory.create: device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")


def create_and_map(what: str, group: GroupLike, nbytes: Callable[[], int], device: str, timeout: Optional[float],
                   layout: Optional[Dict[str, Any]] = None) -> Any:
    """Collective: a mapped ``_core.IpcMemory`` of ``nbytes()`` per rank, every rank's mapped here.

    Every rank reaches every exchange even when its own step failed, and says
    so: a failure on one rank (a bad argument, ENOSPC, a layout that differs)
    is an error on every rank, also with ``timeout=None``; an interrupted wait
    (Ctrl-C, a timeout) marks this rank as having given up, which ends the
    peers' waits. Whatever this rank made is released before the error leaves.
    ``layout`` (name -> value) must be equal on every rank (``ValueError``
    naming both values otherwise).
    """
    layout = dict(layout or {})
    native = None
    peers_may_map_ours = False
    try:
        try:
            kind, cuda_device = _device_argument(device)
            native = _core.IpcMemory.create_local(int(group.rank), int(group.world_size), nbytes(), kind, cuda_device)
            handle, error = bytes(native.local_handle).hex(), None
        except Exception as failure:  # noqa: BLE001 - reported to the peers, then re-raised
            handle, error = f"{type(failure).__name__}: {failure}", failure
        except BaseException:  # Ctrl-C outside a group wait
            _abandon(group)
            raise
        handles = _agree(what, group, error is None, handle, layout, timeout)
        if error is not None:
            raise error
        assert native is not None
        peers_may_map_ours = True
        try:
            native.map_peers([bytes.fromhex(h) for h in handles])
        except Exception as failure:  # noqa: BLE001
            error = failure
        except BaseException:
            _abandon(group)
            raise
        _agree(what, group, error is None, "" if error is None else f"{type(error).__name__}: {error}", {}, timeout)
        if error is not None:
            raise error
        native.release_handles()
        return native
    except BaseException:
        if native is not None:
            if peers_may_map_ours and native.device == "cuda":
                _close_cuda_collectively(native, group, timeout)
            else:
                native.close()
        raise


def _close_cuda_collectively(native: Any, group: GroupLike, timeout: Optional[float]) -> None:
    """Frees this rank's CUDA allocation only after every rank closed its imports of it.

    Closes ours of the peers', barriers, then frees (also when the barrier fails).
    """
    native.close_peer_mappings()
    try:
        group.barrier(timeout=timeout)
    finally:
        native.close()


class IpcMemory:
    """Per-rank regions of ``nbytes`` bytes plus barrier words, every rank's mapped by every rank.

    Make one with :meth:`create` (collective). Fields: ``num_workers``,
    ``worker_id``, ``remote_data``, ``barrier_in``, ``barrier_out``,
    ``barrier_flag``. ``buffer(rank, dtype, shape)`` views a rank's region.
    Use as a context manager or call :meth:`close`.
    """

    def __init__(self, native: Any, group: Optional[GroupLike] = None, timeout: Optional[float] = None) -> None:
        """Wraps a mapped ``tensorxfer._core.IpcMemory``; use :meth:`create` instead.

        ``group`` and ``timeout`` serve the collective close of CUDA memory.
        """
        self._native = native
        self._group = group
        self._timeout = timeout

    @classmethod
    def create(
        cls, group: GroupLike, nbytes: int, device: str = "cpu", *, timeout: Optional[float] = None
    ) -> "IpcMemory":
        """Collective: every rank of ``group`` calls it with the same ``nbytes`` and kind of device.

        ``device`` is ``"cpu"``, ``"cuda:N"`` (this rank's region on GPU N) or
        ``"cuda"`` (torch's current GPU when torch has CUDA, else the extension
        runtime's current one); ``timeout`` (seconds, None = no limit) bounds the
        exchange. Raises ``TypeError`` for an ``nbytes`` that is not an integer, ``ValueError`` for
        other bad arguments,
        ``tensorxfer.UnsupportedError`` for ``"cuda"`` without CUDA,
        ``tensorxfer.PeerLostError`` when a rank died during the exchange.
        """
        def size() -> int:  # checked inside the exchange, so a bad argument fails every rank
            checked = check_int(nbytes, "nbytes", minimum=0)
            _device_argument(device)  # ValueError for anything but cpu, cuda, cuda:N
            return checked

        kind = str(device).split(":")[0]  # each rank may name its own GPU: the kind must agree
        return cls(create_and_map("IpcMemory.create", group, size, device, timeout,
                                  {"nbytes": nbytes, "device": kind}), group, timeout)

    @property
    def num_workers(self) -> int:
        """The number of ranks."""
        return int(self._native.num_workers)

    @property
    def worker_id(self) -> int:
        """This process's rank."""
        return int(self._native.worker_id)

    @property
    def remote_data(self) -> list[int]:
        """Rank i's data address in this process, for each rank i (this rank's own is the local address)."""
        return list(self._native.remote_data)

    @property
    def barrier_in(self) -> list[int]:
        """Rank i's start-barrier words in this process."""
        return list(self._native.barrier_in)

    @property
    def barrier_out(self) -> list[int]:
        """Rank i's middle/end-barrier words in this process."""
        return list(self._native.barrier_out)

    @property
    def barrier_flag(self) -> int:
        """The last barrier epoch used (64-bit, only increases)."""
        return int(self._native.barrier_flag)

    @property
    def nbytes(self) -> int:
        """Bytes of each rank's data region."""
        return int(self._native.nbytes)

    @property
    def device(self) -> str:
        """``"cpu"`` or ``"cuda"``."""
        return str(self._native.device)

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return bool(self._native.closed)

    def buffer(self, rank: int, dtype: Any, shape: Any) -> Any:
        """A view of the start of rank ``rank``'s region: numpy for a numpy dtype, torch for a torch dtype.

        Writes through the view are seen by every rank; synchronise with a
        barrier. The view keeps the mapping alive (host memory only). In the
        IpcMemory of a ``Communicator`` (``comm.ipc_memory``) only the region
        of ``Communicator.buffer()`` is the user's to write: the start of
        each region holds the communicator's staging windows, and a tensor
        overlapping them is refused by the collectives.
        """
        if self.closed:
            raise ClosedError("IpcMemory is closed")
        rank = check_rank(rank, self.num_workers, "rank")
        return typed_view(self._native.region(rank), dtype, shape, "IpcMemory.buffer")

    def close(self) -> None:
        """Unmap every region (views made by :meth:`buffer` keep theirs alive). Idempotent.

        ``device="cuda"``: collective. Each rank closes its imports of the peers'
        allocations, waits for every rank to have done so (a group barrier bounded
        by the ``timeout`` given to :meth:`create`), then frees its own, so no rank
        frees memory a peer still has mapped. The allocation is freed also when the
        barrier fails (a peer died: ``PeerLostError`` is raised after freeing).
        """
        group, self._group = self._group, None
        if group is not None and self.device == "cuda" and not self.closed:
            _close_cuda_collectively(self._native, group, self._timeout)
            return
        self._native.close()

    def __enter__(self) -> "IpcMemory":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"nbytes={self.nbytes}"
        return f"IpcMemory(worker_id={self.worker_id}, num_workers={self.num_workers}, {state}, device={self.device!r})"


__all__ = ["IpcMemory", "GroupLike"]
