"""LocalGroup: the ranks of one host that work together.

Every rank calls one of the (collective) constructors::

    group = LocalGroup.join("job-42", rank=r, world_size=4, timeout=30.0)   # shared memory only
    group = LocalGroup.from_torch()            # reuse torch.distributed (ranks all on this host)
    group = LocalGroup.from_mpi(comm)          # reuse an mpi4py communicator

    group.barrier(timeout=5.0)
    parts = group.all_gather_bytes(b"mine")    # every rank's bytes, in rank order
    group.close()                              # or use it as a context manager

Spawned workers join through the picklable ``group.handle``:
``LocalGroup.from_handle(handle, rank=r)``.

The rendezvous needs no network: the first rank creates a shared-memory
segment named after the group (mode 0600; another user's segment is refused),
the others attach. A leftover segment of a dead job with the same name is
replaced; a live group with another ``world_size`` is refused naming both
sizes. Waits release the GIL and raise ``TimeoutError`` when their timeout
passes, and ``tensorxfer.PeerLostError`` naming the rank (and its pid) when a
rank has died or closed the group (checked at least every 20 ms). The segment
is removed when the last member closes the group or exits.
"""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

from tensorxfer import _core
from tensorxfer._arguments import check_int, check_rank
from tensorxfer._resource import SharedResource

__all__ = ["DEFAULT_MAX_GATHER_NBYTES", "GroupHandle", "LocalGroup"]

BOOT_ID = "/proc/sys/kernel/random/boot_id"

#: The default bound of :meth:`~tensorxfer.runtime.LocalGroup.all_gather_bytes` on one rank's contribution (256 MiB).
DEFAULT_MAX_GATHER_NBYTES = int(_core.LocalGroup.default_max_gather_nbytes)


@dataclass(frozen=True)
class GroupHandle:
    """What a worker needs to join a group: small and picklable (any start method)."""

    name: str
    world_size: int


def _check_name(name: Any) -> str:
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    encoded = name.encode("utf-8")
    limit = _core.LocalGroup.max_name_nbytes
    if not 1 <= len(encoded) <= limit or "\0" in name:
        raise ValueError(f"name must be 1..{limit} bytes of UTF-8 without NUL, got {name!r}")
    return name


def host_identity() -> Tuple[str, str]:
    """``(hostname, kernel boot id)``: equal for processes that can share this host's memory."""
    try:
        with open(BOOT_ID, encoding="ascii") as handle:
            boot_id = handle.read().strip()
    except OSError:
        boot_id = ""
    return socket.gethostname(), boot_id


def ranks_not_on_host(identities: Sequence[Any], reference: int = 0) -> List[int]:
    """The ranks whose host identity differs from rank ``reference``'s."""
    return [rank for rank, identity in enumerate(identities) if identity != identities[reference]]


def _not_local_error(source: str, identities: Sequence[Any], remote: List[int]) -> RuntimeError:
    where = ", ".join(f"rank {rank} on {identities[rank]!r}" for rank in remote)
    return RuntimeError(
        f"LocalGroup.{source}: every rank must be on this host, but ranks {remote} are not on the host "
        f"of rank 0 ({identities[0]!r}): {where}"
    )


class LocalGroup(SharedResource):
    """A group of processes on one host (see the module docstring).

    ``_native`` is the ``tensorxfer._core.LocalGroup`` other native layers use.
    Collectives must be called in the same order on every rank, one at a time
    per group: a second one while another thread runs one raises ``ValueError``
    at once ("one operation at a time"); ``close()`` from another thread ends
    a running wait with :class:`tensorxfer.errors.ClosedError`. A rank whose
    collective fails (timeout, lost peer, Ctrl-C) is marked as having given
    up, so its peers' waits end with ``PeerLostError`` instead of waiting.
    """

    _kind = "LocalGroup"
    _share_hint = "pass its .handle and call LocalGroup.from_handle(handle, rank=r) in the other process"

    def __init__(self, native: Any) -> None:
        """Wraps a joined ``_core.LocalGroup``; use :meth:`join` or the other constructors."""
        if not isinstance(native, _core.LocalGroup):
            raise TypeError(f"native must be a tensorxfer._core.LocalGroup, got {type(native).__name__}")
        self._native = native
        self._closed = False

    # ---- constructors (collective) ---------------------------------------------

    @classmethod
    def join(cls, name: str, *, rank: int, world_size: int, timeout: Optional[float] = None) -> "LocalGroup":
        """Joins (or creates) the group ``name``; returns once all ``world_size`` ranks joined.

        Collective: every rank calls it. A segment left by a dead job of the same name
        is detected and replaced.

        Args:
            name: the group's name, the same on every rank and unique on this host.
            rank: this process's rank, ``0 <= rank < world_size``.
            world_size: how many ranks the group has.
            timeout: seconds to wait for the other ranks; ``None`` for no deadline.

        Returns:
            The joined group; close it (or use it as a context manager).

        Raises:
            ValueError: bad arguments, or a refused segment (a live group of another
                size, a rank taken by a live process, another user's segment).
            tensorxfer.CorruptSegmentError: a damaged segment.
            TimeoutError: ``timeout`` passed; the message names the ranks that did not
                come.
            tensorxfer.PeerLostError: a rank that had joined died.
        """
        name = _check_name(name)
        world_size = check_int(world_size, "world_size", 1, _core.LocalGroup.max_world_size)
        rank = check_rank(rank, world_size, "rank")
        return cls(_core.LocalGroup.join(name, rank, world_size, timeout))

    @classmethod
    def from_handle(cls, handle: GroupHandle, *, rank: int, timeout: Optional[float] = None) -> "LocalGroup":
        """Joins the group that ``handle`` (another member's :attr:`handle`) describes, as ``rank``."""
        if not isinstance(handle, GroupHandle):
            raise TypeError(f"handle must be a GroupHandle, got {type(handle).__name__}")
        return cls.join(handle.name, rank=rank, world_size=handle.world_size, timeout=timeout)

    @classmethod
    def from_torch(cls, process_group: Any = None, *, timeout: Optional[float] = None) -> "LocalGroup":
        """Makes a group of the ranks of a torch.distributed process group.

        Collective over ``process_group``. Rank and world size are the process group's;
        rank 0 picks a random group name, exchanged through torch.

        Args:
            process_group: the torch.distributed group (``None``: the default group).
            timeout: as for :meth:`join`.

        Raises:
            RuntimeError: torch.distributed is not initialized, or some ranks of the group
                are not on this host (named, on every rank).
        """
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("LocalGroup.from_torch: torch.distributed is not initialized "
                               "(call torch.distributed.init_process_group first)")
        group = process_group if process_group is not None else dist.group.WORLD
        rank, world_size = dist.get_rank(group), dist.get_world_size(group)
        if rank < 0:
            raise ValueError("LocalGroup.from_torch: this process is not a member of process_group")
        entries: List[Any] = [None] * world_size
        dist.all_gather_object(entries, (host_identity(), f"torch-{secrets.token_hex(12)}"), group=group)
        identities = [identity for identity, _ in entries]
        remote = ranks_not_on_host(identities)
        if remote:
            raise _not_local_error("from_torch", identities, remote)
        return cls.join(entries[0][1], rank=rank, world_size=world_size, timeout=timeout)

    @classmethod
    def from_mpi(cls, comm: Any = None, *, timeout: Optional[float] = None) -> "LocalGroup":
        """Makes a group of the ranks of an mpi4py communicator.

        Collective over ``comm``. Every rank must share this host's memory (checked with
        ``Split_type(COMM_TYPE_SHARED)``). Rank 0's random group name is broadcast.

        Args:
            comm: the communicator (``None``: ``MPI.COMM_WORLD``).
            timeout: as for :meth:`join`.

        Raises:
            RuntimeError: some ranks do not share this host's memory (named, on every
                rank).
        """
        from mpi4py import MPI

        comm = comm if comm is not None else MPI.COMM_WORLD
        node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
        try:
            node_leader = node.bcast(comm.Get_rank(), root=0)  # the lowest rank sharing my memory
        finally:
            node.Free()
        leaders = comm.allgather(node_leader)
        remote = ranks_not_on_host(leaders)
        if remote:
            identities = comm.allgather(host_identity())
            raise _not_local_error("from_mpi", identities, remote)
        name = comm.bcast(f"mpi-{secrets.token_hex(12)}" if comm.Get_rank() == 0 else None, root=0)
        return cls.join(name, rank=comm.Get_rank(), world_size=comm.Get_size(), timeout=timeout)

    # ---- properties ------------------------------------------------------------

    @property
    def rank(self) -> int:
        """This process's rank, 0..world_size-1."""
        return int(self._native.rank)

    @property
    def world_size(self) -> int:
        """How many ranks the group has."""
        return int(self._native.world_size)

    @property
    def name(self) -> str:
        """The group name every rank joined with."""
        return str(self._native.name)

    @property
    def handle(self) -> GroupHandle:
        """A picklable description for :meth:`from_handle` in spawned workers."""
        return GroupHandle(self.name, self.world_size)

    # ---- collectives -----------------------------------------------------------

    def barrier(self, timeout: Optional[float] = None) -> None:
        """Returns once every rank has entered this barrier.

        After a failure the group cannot be used for further collectives: close it.

        Args:
            timeout: seconds; ``None`` for no deadline.

        Raises:
            TimeoutError: ``timeout`` passed (the ranks that did not arrive are named).
            tensorxfer.PeerLostError: a rank died or gave up (named).
        """
        self._ensure_open()
        self._native.barrier(timeout)

    def all_gather_bytes(self, data: bytes, timeout: Optional[float] = None, *,
                         max_nbytes: int = DEFAULT_MAX_GATHER_NBYTES) -> List[bytes]:
        """Returns every rank's ``data`` in rank order (own included); sizes may differ.

        Contributions larger than the shared mailbox (64 KiB) are exchanged in rounds.

        Args:
            data: bytes-like (bytes, bytearray, memoryview of contiguous bytes).
            timeout: seconds; ``None`` for no deadline.
            max_nbytes: bounds every rank's contribution.

        Raises:
            ValueError: a contribution (own, or announced by a peer) is larger than
                ``max_nbytes``; raised on every rank, naming the rank and both sizes,
                before anything is allocated for it. The group stays usable.
            TypeError: ``data`` is not bytes-like.
            TimeoutError: as for :meth:`barrier`.
            tensorxfer.PeerLostError: as for :meth:`barrier`.
        """
        self._ensure_open()
        max_nbytes = check_int(max_nbytes, "max_nbytes", minimum=0)
        if not isinstance(data, bytes):
            if not isinstance(data, (bytearray, memoryview)):
                raise TypeError(f"data must be bytes-like (bytes, bytearray, memoryview), got {type(data).__name__}")
            data = bytes(data)
        return self._native.all_gather_bytes(data, timeout, max_nbytes)

    # ---- liveness --------------------------------------------------------------

    def rank_alive(self, rank: int) -> bool:
        """True while ``rank`` is a member (joined, not closed, its process alive)."""
        self._ensure_open()
        return bool(self._native.rank_alive(check_rank(rank, self.world_size, "rank")))

    def check_peers(self) -> None:
        """Raises ``tensorxfer.PeerLostError`` naming the first rank that died or closed the group."""
        self._ensure_open()
        self._native.check_peers()

    def _release(self) -> None:
        # A fork()ed child's close leaves the parent's membership alone (native rule).
        self._native.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"rank={self.rank}, world_size={self.world_size}"
        return f"LocalGroup({self._native.name!r}, {state}, pid={os.getpid()})"
