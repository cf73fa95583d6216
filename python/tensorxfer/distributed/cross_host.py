"""The cross-host step of the hierarchical collectives: gloo, or MPI under ``mpirun``.

A cross-host group holds one rank per host: the ranks with local index i
(hosts of equal size: one group per local index), or the hosts' first ranks
(hosts of unequal size). Its members are numbered by host index. Every
transport moves contiguous CPU tensors in place, reduces with ``sum``,
``min`` or ``max``, and gives every member bitwise the same reduction.

:func:`make_cross_host` picks the transport. MPI when every rank was started by
``mpirun`` (``OMPI_COMM_WORLD_SIZE`` or ``PMI_SIZE``/``PMIX_RANK`` set),
mpi4py imports, and ``MPI.COMM_WORLD`` holds exactly this process group's
ranks; ``COMM_WORLD`` is then split into the cross-host communicators. Else
gloo, on the process group's store. ``TENSORXFER_DIST_CROSS_HOST=gloo|mpi``
overrides the choice (``mpi`` raises, on ranks of several hosts, where MPI
cannot be used). The ranks agree on the choice through the store.

A rank waiting in a gloo step also looks, every :data:`WATCH_S`, whether a rank
published a failure (``GlooCrossHost.watch``): a peer that failed in another
step keeps its connections open until it exits.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, Optional, Protocol

import torch
import torch.distributed as dist
from torch.distributed import PrefixStore, ProcessGroupGloo

from tensorxfer.distributed.reduce_ops import REDUCE_OPS
from tensorxfer.distributed.scratch import ScratchBuffers, copy_on_this_thread, pieces_on_this_thread
from tensorxfer.distributed.topology import Topology

#: The cross-host reduce-scatter's own reduction of the blocks it received (elementwise, ``out=``).
_ELEMENTWISE: dict[str, Callable[..., torch.Tensor]] = {"sum": torch.add, "min": torch.minimum, "max": torch.maximum}
_HALF = (torch.bfloat16, torch.float16)
_MPIRUN_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")
CHOICE_VARIABLE = "TENSORXFER_DIST_CROSS_HOST"
#: How often a waiting gloo step looks whether a rank published a failure.
WATCH_S = 0.05


class CrossHost(Protocol):
    """One cross-host group. ``transport`` is ``"gloo"`` or ``"mpi"``; ``calls`` counts the collectives run."""

    transport: str
    calls: int
    host_index: int
    hosts: int

    def all_reduce(self, tensor: torch.Tensor, op: str) -> None: ...

    def gather_others(self, others: torch.Tensor, input: torch.Tensor) -> None:
        """``others`` ((hosts - 1) * n elements) = every other member's ``input`` (n), in host order.

        This member's own input is not copied: the caller has it.
        """

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, op: str) -> None:
        """``output`` = block ``host_index`` of the reduction of every member's ``input``."""

    def broadcast(self, tensor: torch.Tensor, root: int) -> None:
        """Every member's ``tensor`` becomes member ``root``'s (a host index)."""

    def barrier(self) -> None: ...

class GlooCrossHost:
    """The cross-host group as a gloo process group on the backend's store."""

    transport = "gloo"

    def __init__(self, group: Any, host_index: int, hosts: int) -> None:
        self.host_index, self.hosts, self.calls = host_index, hosts, 0
        self._group = group
        self._scratch = ScratchBuffers()
        #: Called while a step waits (see _wait); raises to end the wait.
        self.watch: Optional[Callable[[], None]] = None

    def all_reduce(self, tensor: torch.Tensor, op: str) -> None:
        self.calls += 1
        options = dist.AllreduceOptions()
        options.reduceOp = REDUCE_OPS[op]  # type: ignore[assignment]  # torch converts the enum
        self._wait(self._group.allreduce([tensor], options))

    def gather_others(self, others: torch.Tensor, input: torch.Tensor) -> None:
        """An all-to-all that sends nothing to itself: no copy of its own input, no buffer of gloo's.

        (gloo's all-gather allocates the whole output, copies the input into it
        and copies it out: 2 x 2 hosts, 64 MiB all_gather_into_tensor, its
        cross-host step alone took 47-50 ms, 13.5 ms this way; AMD EPYC, 2 vCPUs.)
        """
        self.calls += 1
        numel = input.numel()
        splits = [0 if host == self.host_index else numel for host in range(self.hosts)]
        if self.hosts == 2:
            sent = input.view(-1)
        else:  # gloo's all-to-all reads one region per member: the input once per other member
            sent = self._scratch.get("sent", (self.hosts - 1) * numel, input.dtype)
            for block in sent.view(self.hosts - 1, -1):
                copy_on_this_thread(block, input.view(-1))
        self._wait(self._group.alltoall_base(others.view(-1), sent, splits, splits, dist.AllToAllOptions()))

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, op: str) -> None:
        """Every member's block ``host_index`` comes here (all-to-all), reduced in host order.

        gloo's own reduce-scatter all-reduces the whole input and keeps a block:
        twice the bytes across hosts (2 x 2 hosts, 64 MiB reduce_scatter_tensor,
        its cross-host step alone: 70 ms, 22 ms this way; AMD EPYC, 2 vCPUs),
        and its work has no future to watch.
        """
        self.calls += 1
        received = self._scratch.get("received", input.numel(), input.dtype)
        self._wait(self._group.alltoall_base(received, input.view(-1), [], [], dist.AllToAllOptions()))
        blocks, out, reduce = received.view(self.hosts, -1), output.view(-1), _ELEMENTWISE[op]
        for piece in pieces_on_this_thread(out.numel()):
            reduce(blocks[0, piece], blocks[1, piece], out=out[piece])
            for host in range(2, self.hosts):
                reduce(out[piece], blocks[host, piece], out=out[piece])

    def broadcast(self, tensor: torch.Tensor, root: int) -> None:
        self.calls += 1
        options = dist.BroadcastOptions()
        options.rootRank = root
        self._wait(self._group.broadcast([tensor], options))

    def barrier(self) -> None:
        self.calls += 1
        self._wait(self._group.barrier(dist.BarrierOptions()))

    def _wait(self, work: Any) -> None:
        """``work.wait()``; while it waits, ``watch()`` runs every :data:`WATCH_S` and may raise.

        A peer that failed elsewhere keeps its gloo connections open until it
        exits; ``watch`` (the failure reporter's look at the store) ends the wait
        as soon as any rank published a failure.
        """
        if self.watch is None:
            work.wait()
            return
        done = threading.Event()
        work.get_future().add_done_callback(lambda _: done.set())
        while not done.wait(WATCH_S):
            self.watch()
        work.wait()


def _as_bytes(tensor: torch.Tensor) -> Any:
    """A numpy uint8 view of a contiguous tensor's memory (any dtype)."""
    return tensor.reshape(-1).view(torch.uint8).numpy()


def _reduced_in(tensor: torch.Tensor, body: Callable[[torch.Tensor], None]) -> None:
    """Runs ``body`` on ``tensor``, or on a float32 copy for half types (MPI has none), copied back."""
    if tensor.dtype not in _HALF:
        body(tensor)
        return
    wide = tensor.float()
    body(wide)
    tensor.copy_(wide)


class MpiCrossHost:
    """The cross-host group as an MPI communicator split from ``COMM_WORLD`` (members ranked by host)."""

    transport = "mpi"

    def __init__(self, comm: Any, mpi: Any, host_index: int, hosts: int) -> None:
        self.host_index, self.hosts, self.calls = host_index, hosts, 0
        self._comm = comm
        self._mpi = mpi
        if comm.Get_rank() != host_index or comm.Get_size() != hosts:
            raise RuntimeError(f"tensorxfer backend: MPI cross-host communicator has rank {comm.Get_rank()} of "
                               f"{comm.Get_size()}, expected {host_index} of {hosts}")

    def _op(self, op: str) -> Any:
        return {"sum": self._mpi.SUM, "min": self._mpi.MIN, "max": self._mpi.MAX}[op]

    def all_reduce(self, tensor: torch.Tensor, op: str) -> None:
        self.calls += 1

        def body(values: torch.Tensor) -> None:
            array = values.reshape(-1).numpy()
            if self.hosts == 2:  # a + b == b + a: every member gets the same bits
                self._comm.Allreduce(self._mpi.IN_PLACE, array, op=self._op(op))
                return
            # MPI does not promise one result on every member: reduce once, then share it.
            if self.host_index == 0:
                self._comm.Reduce(self._mpi.IN_PLACE, array, op=self._op(op), root=0)
            else:
                self._comm.Reduce(array, None, op=self._op(op), root=0)
            self._comm.Bcast(array, root=0)

        _reduced_in(tensor, body)

    def gather_others(self, others: torch.Tensor, input: torch.Tensor) -> None:
        """An all-to-all that sends nothing to itself, every member reading the same input."""
        self.calls += 1
        nbytes = input.numel() * input.element_size()
        counts = [0 if host == self.host_index else nbytes for host in range(self.hosts)]
        offsets = [sum(counts[:host]) for host in range(self.hosts)]
        self._comm.Alltoallv([_as_bytes(input), counts, [0] * self.hosts, self._mpi.BYTE],
                             [_as_bytes(others), counts, offsets, self._mpi.BYTE])

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, op: str) -> None:
        self.calls += 1
        if input.dtype in _HALF:
            wide = output.float()
            self._comm.Reduce_scatter_block(input.float().reshape(-1).numpy(), wide.reshape(-1).numpy(),
                                            op=self._op(op))
            output.copy_(wide)
            return
        self._comm.Reduce_scatter_block(input.reshape(-1).numpy(), output.reshape(-1).numpy(), op=self._op(op))

    def broadcast(self, tensor: torch.Tensor, root: int) -> None:
        self.calls += 1
        self._comm.Bcast(_as_bytes(tensor), root=root)

    def barrier(self) -> None:
        self.calls += 1
        self._comm.Barrier()

def _launched_by_mpirun() -> bool:
    return any(name in os.environ for name in _MPIRUN_VARIABLES)


def _mpi_world(world_size: int) -> Optional[Any]:
    """mpi4py's MPI module when this process can use it for a group of ``world_size`` ranks, else None."""
    if not _launched_by_mpirun():
        return None
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    return MPI if MPI.COMM_WORLD.Get_size() == world_size else None


def _agreed_transport(store: Any, rank: int, world_size: int) -> str:
    choice = os.environ.get(CHOICE_VARIABLE, "auto").strip().lower() or "auto"
    if choice not in ("auto", "gloo", "mpi"):
        raise ValueError(f"tensorxfer backend: {CHOICE_VARIABLE} must be auto, gloo or mpi, got {choice!r}")
    usable = choice != "gloo" and _mpi_world(world_size) is not None
    if choice == "mpi" and not usable:
        raise RuntimeError(f"tensorxfer backend: {CHOICE_VARIABLE}=mpi, but this rank was not started by mpirun "
                           f"with mpi4py importable and MPI.COMM_WORLD of the process group's {world_size} ranks")
    store.set(f"mpi/{rank}", "1" if usable else "0")
    store.wait([f"mpi/{r}" for r in range(world_size)])
    every = all(bytes(store.get(f"mpi/{r}")) == b"1" for r in range(world_size))
    return "mpi" if every else "gloo"


def make_cross_host(store: Any, topology: Topology, timeout: Any) -> Optional[CrossHost]:
    """Collective: this rank's cross-host group, or None (one host; hosts of unequal size: not a first rank)."""
    hosts = topology.hosts
    if len(hosts) == 1:
        return None
    world_size = sum(len(ranks) for ranks in hosts)
    transport = _agreed_transport(store, topology.rank, world_size)
    index = topology.local_rank
    member = topology.equal_hosts or index == 0
    if transport == "mpi":
        mpi = _mpi_world(world_size)
        assert mpi is not None  # the agreement says every rank can use it
        # Split is collective over COMM_WORLD: ranks of no cross-host group pass UNDEFINED.
        comm = mpi.COMM_WORLD.Split(index if member else mpi.UNDEFINED, topology.host_index)
        return MpiCrossHost(comm, mpi, topology.host_index, len(hosts)) if member else None
    if not member:
        return None
    members = [ranks[index] for ranks in hosts]
    group = ProcessGroupGloo(PrefixStore(f"cross/{index}/", store), members.index(topology.rank), len(members), timeout)
    return GlooCrossHost(group, topology.host_index, len(hosts))
