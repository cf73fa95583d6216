"""Collectives of one process group: shared memory inside a host, gloo or MPI across hosts.

On one host every accelerated op is one :class:`~tensorxfer.runtime.Communicator`
call. Across hosts every op is composed of shared-memory steps inside the host
and one cross-host step (:mod:`tensorxfer.distributed.cross_host`). With hosts of
equal size the cross-host step runs among the ranks with the same local index,
each on its own share of the data:

* ``all_reduce``: reduce-scatter in the host (local rank i gets shard i),
  all-reduce of shard i across hosts, all-gather in the host; up to
  :data:`REPLICATED_MAX_BYTES`, all-reduce in the host, then every local
  index all-reduces the whole host sum across hosts (two steps, not three);
* ``reduce_scatter``: reduce-scatter in the host (local rank i gets the blocks
  of the ranks with local index i), reduce-scatter of those across hosts;
* ``all_gather``: all-gather across hosts of each rank's input, then in the host;
* ``broadcast``: across hosts among the root's local index, then in the host.

With hosts of unequal size the hosts' first ranks ("leaders") do the
cross-host step on whole tensors: reduce (all_reduce, reduce_scatter) or
gather in the host, the leaders' step, broadcast in the host. ``barrier`` is a
barrier in the host, among the leaders, and in the host again. Every rank ends
with bitwise the same result.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from tensorxfer.distributed.cross_host import CrossHost
from tensorxfer.distributed.reduce_ops import REDUCE_OPS
from tensorxfer.distributed.topology import Topology
from tensorxfer.runtime import Communicator

#: Communicator's reduction dtypes (all_gather and broadcast copy any dtype).
REDUCE_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32, torch.int64)
# Every synchronous op looks these up: a set and a tuple are the cheapest forms.
_REDUCE_DTYPE_SET = frozenset(REDUCE_DTYPES)
_REDUCE_OP_ITEMS = tuple(REDUCE_OPS.items())


#: Equal hosts: all-reduces up to this size go through :meth:`HostCollectives._all_reduce_replicated`.
REPLICATED_MAX_BYTES = 256 << 10

#: torch splits a copy over its OpenMP threads from this many elements (at::internal::GRAIN_SIZE).
_TORCH_GRAIN = 32768


def _copy_on_this_thread(destination: torch.Tensor, source: torch.Tensor) -> None:
    """``destination.copy_(source)`` (1-D) in pieces torch copies on the calling thread.

    A parallel copy leaves torch's OpenMP workers spinning for a while after
    it; on a host whose cores the ranks' spinning waits already fill, those
    workers take the CPU from the ranks (measured: 30x slower at 1 MiB, 2 ranks on 2 cores).
    """
    for start in range(0, source.numel(), _TORCH_GRAIN):
        destination[start:start + _TORCH_GRAIN].copy_(source[start:start + _TORCH_GRAIN])


def reducible(tensor: torch.Tensor, reduce_op: Any) -> Optional[str]:
    """The Communicator op name when shared memory can reduce ``tensor`` with ``reduce_op``, else None
    (a dtype it does not reduce; product, premul_sum, bitwise ops). One call: every synchronous op asks."""
    if tensor.dtype not in _REDUCE_DTYPE_SET:
        return None
    try:
        for name, torch_op in _REDUCE_OP_ITEMS:
            if reduce_op == torch_op:
                return name
    except TypeError:
        return None
    return None


class HostCollectives:
    """Runs the collectives over ``comm`` (this host) and ``cross`` (across hosts); inputs contiguous, on the CPU.

    Reductions take Communicator's op names and a dtype of :data:`REDUCE_DTYPES`;
    copies (all_gather, broadcast) take any dtype.
    """

    def __init__(self, topology: Topology, comm: Communicator, cross: Optional[CrossHost], timeout_s: float) -> None:
        self.topology = topology
        self.comm = comm
        self.cross = cross  # None on one host, or for non-leaders with hosts of unequal sizes
        self.timeout_s = timeout_s
        self.world_size = sum(len(ranks) for ranks in topology.hosts)
        hosts, local_size = topology.hosts, len(topology.local_ranks)
        self.multi_host = len(hosts) > 1
        self._sharded = self.multi_host and topology.equal_hosts
        #: Equal hosts: the global rank of row i * hosts + h of a [local index][host] layout.
        self._by_local_index = torch.tensor([hosts[h][i] for i in range(local_size) for h in range(len(hosts))]
                                            if topology.equal_hosts else [], dtype=torch.int64)
        self._scratch_by_dtype: dict[torch.dtype, torch.Tensor] = {}

    def _scratch(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A flat tensor of ``numel`` elements, kept for the next op of the same dtype.

        Ops run one at a time (every one goes through ``comm``, which takes one op
        at a time), so one buffer per dtype, the largest asked for, serves them all.
        A new tensor per op is memory the kernel maps and zeroes again at every
        call (2 hosts x 2 ranks, float32 64 MiB dist.all_reduce: 107 -> 84 ms with
        this alone, Intel Xeon, 2 vCPUs).
        """
        held = self._scratch_by_dtype.get(dtype)
        if held is None or held.numel() < numel:
            held = torch.empty(numel, dtype=dtype)
            self._scratch_by_dtype[dtype] = held
        return held[:numel]

    @property
    def _leader(self) -> bool:
        return self.topology.local_rank == 0

    def _cross(self) -> CrossHost:
        assert self.cross is not None, "only ranks of a cross-host group run the cross-host step"
        return self.cross

    # ---- all_reduce and reduce ------------------------------------------------------

    def all_reduce(self, tensor: torch.Tensor, op: str) -> None:
        """In place; ``tensor`` contiguous, on the CPU, of a reducible dtype."""
        if tensor.numel() == 0:
            return
        if self._sharded and tensor.numel() * tensor.element_size() <= REPLICATED_MAX_BYTES:
            self._all_reduce_replicated(tensor, op)
        elif self._sharded:
            self._all_reduce_sharded(tensor.view(-1), op)
        elif self.multi_host:
            self._all_reduce_through_leaders(tensor, op)
        else:
            # Half types go to Communicator as they are: it widens to float32, sums in rank
            # order and rounds once with vectorised kernels (5-8x faster than a float32 copy
            # made here: 2 ranks, bfloat16 16 MiB 0.95-0.99 ms against 8.3-8.5 ms).
            self.comm.all_reduce(tensor, op, timeout=self.timeout_s)

    def _finish_avg(self, tensor: torch.Tensor, op: str) -> None:
        if op == "avg":
            if tensor.is_floating_point():
                tensor.div_(self.world_size)
            else:
                tensor.copy_(torch.div(tensor, self.world_size, rounding_mode="floor"))

    def _all_reduce_replicated(self, tensor: torch.Tensor, op: str) -> None:
        """All-reduce in host, then of the whole host sum across hosts by every local index at once.

        Two steps instead of three. Every rank of a host holds bitwise the same
        host sum, and every cross-host group reduces the same host sums in the
        same host order, so every rank still ends with the same bits.
        """
        self.comm.all_reduce(tensor, _in_host(op), timeout=self.timeout_s)
        self._cross().all_reduce(tensor, _in_host(op))
        self._finish_avg(tensor, op)

    def _all_reduce_sharded(self, flat: torch.Tensor, op: str) -> None:
        """Reduce-scatter in host, all-reduce of each shard across hosts, all-gather in host.

        Half types stay half: Communicator sums them in float32 and rounds once
        per host (a float32 copy around it made 2 hosts x 2 ranks, bfloat16
        64 MiB, 276 ms against flat gloo's 111 ms).
        """
        numel = flat.numel()
        local_size = len(self.topology.local_ranks)
        shard_elems = -(-numel // local_size)
        padded_elems = shard_elems * local_size
        if padded_elems == numel:
            staging = flat
        else:
            staging = torch.empty(padded_elems, dtype=flat.dtype)
            _copy_on_this_thread(staging[:numel], flat)
            staging[numel:].zero_()
        shard = self._scratch(shard_elems, flat.dtype)
        self.comm.reduce_scatter(shard, staging, _in_host(op), timeout=self.timeout_s)
        self._cross().all_reduce(shard, _in_host(op))
        self._finish_avg(shard, op)
        gathered = flat if padded_elems == numel else torch.empty(padded_elems, dtype=flat.dtype)
        self.comm.all_gather(gathered, shard, timeout=self.timeout_s)
        if gathered is not flat:
            _copy_on_this_thread(flat, gathered[:numel])

    def _all_reduce_through_leaders(self, tensor: torch.Tensor, op: str) -> None:
        self.comm.all_reduce(tensor, _in_host(op), timeout=self.timeout_s)
        if self._leader:
            self._cross().all_reduce(tensor, _in_host(op))
            self._finish_avg(tensor, op)
        self.comm.broadcast(tensor, 0, timeout=self.timeout_s)

    # ---- reduce_scatter -----------------------------------------------------------------

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, op: str) -> None:
        """``output`` (n elements) = this rank's block of the reduction of every ``input`` (world_size * n)."""
        if output.numel() == 0:
            return
        if not self.multi_host:
            self.comm.reduce_scatter(output, input, op, timeout=self.timeout_s)
            return
        rows = input.view(self.world_size, -1)
        if not self._sharded:  # leaders reduce whole tensors; each rank keeps its block
            reduced = rows.clone()
            self._all_reduce_through_leaders(reduced.view(-1), op)
            output.view(-1).copy_(reduced[self.topology.rank])
            return
        # Rows in [local index][host] order: the in-host reduce-scatter gives local rank i the
        # rows of the ranks with local index i, whose reduce-scatter across hosts gives each its own.
        by_local_index = rows.index_select(0, self._by_local_index)
        shard = self._scratch(len(self.topology.hosts) * output.numel(), output.dtype)
        self.comm.reduce_scatter(shard, by_local_index.view(-1), _in_host(op), timeout=self.timeout_s)
        self._cross().reduce_scatter(output.view(-1), shard, _in_host(op))
        self._finish_avg(output, op)

    # ---- copies -----------------------------------------------------------------------

    def all_gather(self, output: torch.Tensor, input: torch.Tensor) -> None:
        """``output`` (world_size * n elements) = every rank's ``input`` (n) in rank order."""
        if input.numel() == 0:
            return
        if not self.multi_host:
            self.comm.all_gather(output, input, timeout=self.timeout_s)
            return
        rows = output.view(self.world_size, -1)
        hosts = self.topology.hosts
        if self._sharded:
            across = torch.empty(len(hosts) * input.numel(), dtype=input.dtype)
            self._cross().all_gather(across, input.view(-1))
            by_local_index = torch.empty_like(rows)
            self.comm.all_gather(by_local_index.view(-1), across, timeout=self.timeout_s)
            rows.index_copy_(0, self._by_local_index, by_local_index)
            return
        local = torch.empty(len(self.topology.local_ranks), input.numel(), dtype=input.dtype)
        self.comm.all_gather(local.view(-1), input.view(-1), timeout=self.timeout_s)
        if self._leader:  # host blocks padded to the largest host: gloo gathers equal sizes
            largest = max(len(ranks) for ranks in hosts)
            padded = torch.zeros(largest, input.numel(), dtype=input.dtype)
            padded[:len(local)] = local
            every = torch.empty(len(hosts), largest, input.numel(), dtype=input.dtype)
            self._cross().all_gather(every, padded)
            for host, ranks in enumerate(hosts):
                rows.index_copy_(0, torch.tensor(ranks), every[host, :len(ranks)])
        self.comm.broadcast(output, 0, timeout=self.timeout_s)

    def broadcast(self, tensor: torch.Tensor, root: int) -> None:
        """Every rank's ``tensor`` becomes global rank ``root``'s."""
        if tensor.numel() == 0:
            return
        hosts = self.topology.hosts
        root_host = next(index for index, ranks in enumerate(hosts) if root in ranks)
        root_local = hosts[root_host].index(root)
        if not self.multi_host:
            self.comm.broadcast(tensor, root_local, timeout=self.timeout_s)
            return
        if self._sharded:  # the root's local index carries it across, then every host copies it in
            if self.topology.local_rank == root_local:
                self._cross().broadcast(tensor, root_host)
            self.comm.broadcast(tensor, root_local, timeout=self.timeout_s)
            return
        on_root_host = self.topology.host_index == root_host
        if on_root_host:  # to its leader and the rest of its host
            self.comm.broadcast(tensor, root_local, timeout=self.timeout_s)
        if self._leader:
            self._cross().broadcast(tensor, root_host)
        if not on_root_host:
            self.comm.broadcast(tensor, 0, timeout=self.timeout_s)

    def barrier(self) -> None:
        self.comm.barrier(timeout=self.timeout_s)
        if self.multi_host:
            if self._leader:
                self._cross().barrier()
            self.comm.barrier(timeout=self.timeout_s)


def _in_host(op: str) -> str:
    """The op the partial reductions use: ``avg`` sums, and the last step divides."""
    return "sum" if op == "avg" else op
