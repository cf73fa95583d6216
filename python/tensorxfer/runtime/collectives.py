"""Collectives among the ranks of one host over an :class:`~tensorxfer.runtime.IpcMemory`.

all_reduce, all_gather, reduce_scatter, broadcast and barrier.

``Communicator(group, max_bytes=...)`` is collective (every rank of the group
makes one, with the same sizes). Every call is collective too: all ranks make
the same calls in the same order, with the same sizes and dtypes (a mismatch
raises ``ValueError`` on every rank). Inputs are numpy arrays or torch
tensors (host memory, C-contiguous). The GIL is released while a call copies,
reduces or waits; Ctrl-C interrupts a wait.

``all_reduce`` works in place for float32, float64, bfloat16, float16 (summed
in float32), int32 and int64, ops ``sum``, ``avg``, ``max``, ``min``, with the
``one_shot`` (every rank reads every input), ``two_shot`` (reduce-scatter,
then all-gather) or ``auto`` algorithm. Each element is reduced in rank order,
so every rank gets bitwise the same result whatever the algorithm or chunking.
Messages larger than ``max_bytes`` are cut into chunks through two staging
windows per rank. A tensor made with :meth:`~tensorxfer.runtime.Communicator.buffer` already lives
in shared memory: it is reduced there, without copying it in.

What a user may write: only :meth:`~tensorxfer.runtime.Communicator.buffer` (the zero-copy
buffer) is the user's part of the communicator's shared memory. The rest of
its :attr:`~tensorxfer.runtime.Communicator.ipc_memory` -- each rank's two staging windows and
the flags -- belongs to the communicator: a tensor overlapping any rank's
staging windows is refused with ``ValueError`` (writing there, e.g. through
``comm.ipc_memory.buffer(...)``, would corrupt the results).

One operation at a time per communicator: a call made while another thread
runs one raises ``ValueError`` at once; :meth:`~tensorxfer.runtime.Communicator.close` from
another thread ends a running call with :class:`tensorxfer.errors.ClosedError`.

``timeout`` (seconds) bounds each call; None waits without limit but still
notices dead ranks (``tensorxfer.PeerLostError``) and Ctrl-C. After a timeout,
a lost rank or a mismatch the communicator is unusable: make a new one.
"""

from __future__ import annotations

from typing import Any, Optional

from tensorxfer import _core
from tensorxfer._arguments import check_int
from tensorxfer.runtime.ipc_memory import GroupLike, IpcMemory, create_and_map, typed_view

#: Default bytes per chunk (each of the two staging windows per rank), the same for
#: every world size. Measured back to back with bench_collectives.py --max-bytes on an
#: AMD EPYC (2 vCPUs): 1 MiB ties 256 KiB with 2 ranks (16 MiB: 1.02 vs 1.01 ms) and is
#: up to 2x faster with 4 ranks on 2 cores (1 MiB: 171 vs 335 us; 64 MiB: 14.8 vs
#: 24.9 ms); 4 MiB and 64 MiB chunks lose at 16-64 MiB (the windows leave L2).
DEFAULT_MAX_BYTES = 1 << 20


def default_max_bytes(world_size: int) -> int:
    """Returns the chunk size a Communicator of ``world_size`` ranks uses when none is given.

    It is :data:`DEFAULT_MAX_BYTES` for every ``world_size``. It depends on nothing a rank
    could see differently (CPU affinity, CPU count), so every rank computes the same
    value; the construction checks it anyway.
    """
    if world_size < 1:
        raise ValueError(f"default_max_bytes: world_size must be >= 1, got {world_size}")
    return DEFAULT_MAX_BYTES


def _checked_spin(spin_us: Any) -> Optional[float]:
    if spin_us is None:
        return None
    if isinstance(spin_us, bool) or not isinstance(spin_us, (int, float)) or not (0 <= float(spin_us) <= 1e6):
        raise ValueError(f"Communicator: spin_us must be None or in [0, 1e6], got {spin_us!r}")
    return float(spin_us)


class Communicator:
    """Collectives for the ranks of ``group``, over shared memory of this host.

    Construction is collective: every rank of the group makes one, with the same sizes
    (compared: a difference raises ``ValueError`` on every rank, naming both values).
    Every call is collective too, made in the same order on every rank.

    Args:
        group: a :class:`~tensorxfer.runtime.LocalGroup` (or anything with its
            ``rank``, ``world_size``, ``all_gather_bytes`` and ``barrier``).
        max_bytes: the chunk size, two staging windows of it per rank (default
            :func:`~tensorxfer.runtime.collectives.default_max_bytes`).
        buffer_bytes: the size of the zero-copy buffer, :meth:`buffer` (default
            ``max_bytes``).
        timeout: seconds for the construction exchange; ``None`` for no deadline.
        spin_us: how long waits spin before they sleep (default: the standard policy of
            every tensorxfer wait, see :class:`~tensorxfer.ipc.SlotRing`: 2 ms while the
            ranks fit the CPUs, 20 us yielding the CPU when they outnumber them).

    Example:
        Two ranks, each with its own process::

            with LocalGroup.join("job", rank=r, world_size=2) as group, Communicator(group) as comm:
                grads = numpy.full(1024, r + 1, numpy.float32)
                comm.all_reduce(grads)          # in place: 3.0 everywhere, on both ranks
    """

    def __init__(
        self,
        group: GroupLike,
        max_bytes: Optional[int] = None,
        *,
        buffer_bytes: Optional[int] = None,
        timeout: Optional[float] = None,
        spin_us: Optional[float] = None,
    ) -> None:
        """Collective: every rank of ``group`` calls it with the same sizes.

        ``max_bytes`` and ``buffer_bytes`` are compared between ranks: a
        difference raises ``ValueError`` on every rank naming both values. A
        rank whose construction fails (a bad argument, no memory) makes every
        rank's construction fail, also with ``timeout=None``.
        """
        self._group = group
        world = int(group.world_size)
        requested = {"max_bytes": max_bytes, "buffer_bytes": buffer_bytes}
        sizes: dict = {}

        def region_nbytes() -> int:  # checked inside the exchange: a bad argument fails every rank
            chunk = default_max_bytes(world) if max_bytes is None else check_int(max_bytes, "max_bytes", minimum=0)
            buffer = chunk if buffer_bytes is None else check_int(buffer_bytes, "buffer_bytes", minimum=0)
            _checked_spin(spin_us)
            sizes.update(max_bytes=chunk, buffer_bytes=buffer)
            return int(_core.communicator_required_nbytes(chunk, buffer, world))

        native_memory = create_and_map("Communicator", group, region_nbytes, "cpu", timeout, requested)
        check = getattr(group, "check_peers", None)
        try:
            self._native = _core.Communicator(native_memory, sizes["max_bytes"], sizes["buffer_bytes"], check,
                                              spin_us)
        except BaseException:
            native_memory.close()
            raise
        self._memory = IpcMemory(self._native.memory)

    @property
    def rank(self) -> int:
        """This process's rank."""
        return int(self._native.rank)

    @property
    def world_size(self) -> int:
        """The number of ranks."""
        return int(self._native.world_size)

    @property
    def max_bytes(self) -> int:
        """Bytes per chunk (rounded up to 4 KiB)."""
        return int(self._native.max_bytes)

    @property
    def spin_us(self) -> float:
        """How long waits spin before they sleep, in microseconds, as used now.

        Set it to a number (a fixed budget) or ``None`` (the standard policy of
        every tensorxfer wait) between calls; every rank may choose its own.
        """
        return float(self._native.spin_us)

    @spin_us.setter
    def spin_us(self, spin_us: Optional[float]) -> None:
        self._native.spin_us = _checked_spin(spin_us)

    @property
    def ipc_memory(self) -> IpcMemory:
        """The IpcMemory the collectives run over (its fields, e.g. ``barrier_flag``).

        Read-only for the user except :meth:`buffer`'s part: each region
        starts with this communicator's two staging windows, which its
        collectives write (a tensor overlapping them is refused).
        """
        return self._memory

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return bool(self._native.closed)

    def buffer(self, dtype: Any, shape: Any, rank: Optional[int] = None) -> Any:
        """A numpy (numpy dtype) or torch (torch dtype) view of a rank's zero-copy buffer.

        Fill this rank's buffer (``rank=None``) and pass the view to
        :meth:`all_reduce`: it is reduced in place, without the copy in. Every
        rank must use the same offset (the same call) for its tensor.
        """
        which = self.rank if rank is None else int(rank)
        return typed_view(self._native.buffer_array(which), dtype, shape, "Communicator.buffer")

    def all_reduce(self, tensor: Any, op: str = "sum", algorithm: str = "auto", *, timeout: Optional[float] = None) -> Any:
        """Reduces ``tensor`` over all ranks, in place; returns ``tensor``.

        Every rank gets bitwise the same result: the order of the reduction is fixed
        (rank 0, 1, ...) whatever the algorithm. Half types accumulate in float32.

        Args:
            tensor: a contiguous host numpy array or CPU torch tensor of float32, float64,
                bfloat16, float16, int32 or int64, the same size and dtype on every rank.
            op: ``"sum"``, ``"avg"``, ``"max"`` or ``"min"``.
            algorithm: ``"auto"``, ``"one_shot"`` or ``"two_shot"``.
            timeout: seconds; ``None`` for no deadline.

        Raises:
            ValueError: ranks called with different sizes, dtypes, ops or algorithms
                (every rank raises, in the caller's words), or an unsupported dtype or op.
            TimeoutError: a rank did not come within ``timeout`` (named).
            tensorxfer.PeerLostError: a rank died or gave up (named).
        """
        self._native.all_reduce(tensor, op, algorithm, timeout)
        return tensor

    def all_gather(self, output: Any, input: Any, *, timeout: Optional[float] = None) -> Any:
        """``output`` (world_size times ``input``'s size, same dtype) = every rank's ``input`` in rank order."""
        self._native.all_gather(output, input, timeout)
        return output

    def reduce_scatter(self, output: Any, input: Any, op: str = "sum", *, timeout: Optional[float] = None) -> Any:
        """``output`` = this rank's block (``input`` split in world_size blocks) of the reduction of every ``input``."""
        self._native.reduce_scatter(output, input, op, timeout)
        return output

    def broadcast(self, tensor: Any, src: int = 0, *, timeout: Optional[float] = None) -> Any:
        """Every rank's ``tensor`` becomes rank ``src``'s; returns ``tensor``."""
        self._native.broadcast(tensor, int(src), timeout)
        return tensor

    def barrier(self, *, timeout: Optional[float] = None) -> None:
        """Return once every rank has called it."""
        self._native.barrier(timeout)

    def close(self) -> None:
        """Unmap the shared memory (views from :meth:`buffer` keep it alive). Idempotent."""
        if not self._native.closed:
            self._native.close()

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Communicator(rank={self.rank}, world_size={self.world_size}, max_bytes={self.max_bytes})"


__all__ = ["Communicator", "DEFAULT_MAX_BYTES", "default_max_bytes"]
