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
* ``all_gather``: each rank's input to the same local index of every other host
  (an all-to-all that sends nothing to itself), then all-gather in the host;
* ``broadcast``: across hosts among the root's local index, then in the host.

The in-host steps of reduce_scatter and all_gather run once per host: on
host h's block of the caller's tensor where every host's ranks are consecutive
(ranks 0-1 on one host, 2-3 on the next), else through a staging tensor and a
copy to host h's ranks' rows.

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
from tensorxfer.distributed.scratch import ScratchBuffers, copy_on_this_thread
from tensorxfer.distributed.topology import Topology
from tensorxfer.runtime import Communicator

#: Communicator's reduction dtypes (all_gather and broadcast copy any dtype).
REDUCE_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32, torch.int64)
# Every synchronous op looks these up: a set and a tuple are the cheapest forms.
_REDUCE_DTYPE_SET = frozenset(REDUCE_DTYPES)
_REDUCE_OP_ITEMS = tuple(REDUCE_OPS.items())


#: Equal hosts: all-reduces up to this size go through :meth:`HostCollectives._all_reduce_replicated`.
REPLICATED_MAX_BYTES = 256 << 10

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
        #: Each host's global ranks, as index tensors.
        self._host_ranks = [torch.tensor(ranks, dtype=torch.int64) for ranks in hosts]
        #: Equal hosts whose ranks are consecutive: host h holds rows h * local_size ... of a rank-ordered tensor.
        self._host_blocks = self._sharded and all(
            ranks == list(range(h * local_size, (h + 1) * local_size)) for h, ranks in enumerate(hosts))
        self._scratch = ScratchBuffers()

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
            staging = self._scratch.get("staging", padded_elems, flat.dtype)
            copy_on_this_thread(staging[:numel], flat)
            staging[numel:].zero_()
        shard = self._scratch.get("shard", shard_elems, flat.dtype)
        self.comm.reduce_scatter(shard, staging, _in_host(op), timeout=self.timeout_s)
        self._cross().all_reduce(shard, _in_host(op))
        self._finish_avg(shard, op)
        self.comm.all_gather(staging, shard, timeout=self.timeout_s)
        if staging is not flat:
            copy_on_this_thread(flat, staging[:numel])

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
        # Per host h, local rank i gets the sum of row hosts[h][i] over its host's ranks (the rows of
        # host h's ranks: block h of the input when ranks are consecutive); the reduce-scatter of those
        # across hosts gives each rank its own row.
        hosts = self.topology.hosts
        shard = self._scratch.get("shard", len(hosts) * output.numel(), output.dtype)
        blocks = input.view(len(hosts), -1) if self._host_blocks else None
        for host, part in enumerate(shard.view(len(hosts), -1)):
            block = blocks[host] if blocks is not None else rows.index_select(0, self._host_ranks[host]).view(-1)
            self.comm.reduce_scatter(part, block, _in_host(op), timeout=self.timeout_s)
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
        if self._sharded:  # this local index's input from every other host, then in each host
            others = self._scratch.get("others", (len(hosts) - 1) * input.numel(), input.dtype)
            self._cross().gather_others(others, input.view(-1))
            host_elems = input.numel() * len(self.topology.local_ranks)
            staging = None if self._host_blocks else self._scratch.get("staging", host_elems, input.dtype)
            blocks = output.view(len(hosts), -1)
            for host, part in enumerate(_in_host_order(others, input.view(-1), self.topology.host_index)):
                self.comm.all_gather(blocks[host] if staging is None else staging, part, timeout=self.timeout_s)
                if staging is not None:  # host h's ranks are not consecutive: to their rows
                    rows.index_copy_(0, self._host_ranks[host], staging.view(-1, input.numel()))
            return
        local = torch.empty(len(self.topology.local_ranks), input.numel(), dtype=input.dtype)
        self.comm.all_gather(local.view(-1), input.view(-1), timeout=self.timeout_s)
        if self._leader:  # host blocks padded to the largest host: every member sends the same size
            largest = max(len(ranks) for ranks in hosts)
            padded = torch.zeros(largest, input.numel(), dtype=input.dtype)
            padded[:len(local)] = local
            others = torch.empty(len(hosts) - 1, largest, input.numel(), dtype=input.dtype)
            self._cross().gather_others(others, padded)
            for host, part in enumerate(_in_host_order(others, padded, self.topology.host_index)):
                rows.index_copy_(0, self._host_ranks[host], part[:len(hosts[host])])
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


def _in_host_order(others: torch.Tensor, own: torch.Tensor, host_index: int) -> list[torch.Tensor]:
    """Every host's part: ``others`` (every other host's, in host order) with ``own`` put in at ``host_index``."""
    parts = list(others.view(-1, *own.shape))
    return parts[:host_index] + [own] + parts[host_index:]


def _in_host(op: str) -> str:
    """The op the partial reductions use: ``avg`` sums, and the last step divides."""
    return "sum" if op == "avg" else op
