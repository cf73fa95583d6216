"""Collectives of one process group: shared memory inside a host, gloo across hosts.

On one host every accelerated op is one :class:`~tensorxfer.runtime.Communicator`
call. Across hosts of equal size, ``all_reduce`` is hierarchical:

1. reduce-scatter inside the host over shared memory (local rank i gets shard i);
2. all-reduce of shard i among the ranks with local index i, one per host, over gloo;
3. all-gather inside the host over shared memory.

With hosts of unequal size, each host reduces over shared memory, the hosts'
first ranks all-reduce over gloo, and each first rank broadcasts the result over
shared memory. Every rank ends with bitwise the same result.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist

from tensorxfer.distributed.topology import Topology
from tensorxfer.runtime import Communicator

#: Communicator's reduction dtypes (all_gather and broadcast copy any dtype).
REDUCE_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32, torch.int64)
HALF_DTYPES = (torch.bfloat16, torch.float16)
#: torch reduce ops Communicator runs, by their Communicator name.
REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}


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


def op_name(reduce_op: Any) -> Optional[str]:
    """Communicator's name for a torch ``ReduceOp``; None when it has none (product, premul_sum, bitwise)."""
    for name, torch_op in REDUCE_OPS.items():
        try:
            if reduce_op == torch_op:
                return name
        except TypeError:
            return None
    return None


def reducible(tensor: torch.Tensor, reduce_op: Any) -> Optional[str]:
    """The Communicator op name when shared memory can reduce ``tensor`` with ``reduce_op``, else None."""
    if tensor.dtype not in REDUCE_DTYPES:
        return None
    return op_name(reduce_op)


class HostCollectives:
    """Runs reductions and copies over ``comm`` (this host) and ``cross`` (gloo, across hosts)."""

    def __init__(self, topology: Topology, comm: Communicator, cross: Any, timeout_s: float) -> None:
        self.topology = topology
        self.comm = comm
        self.cross = cross  # None on one host, or for non-leaders with hosts of unequal sizes
        self.timeout_s = timeout_s
        self.world_size = sum(len(ranks) for ranks in topology.hosts)
        self._scratch = torch.empty(0, dtype=torch.float32)  # grown on demand, reused

    @property
    def multi_host(self) -> bool:
        return len(self.topology.hosts) > 1

    def _float32_scratch(self, numel: int) -> torch.Tensor:
        if self._scratch.numel() < numel:
            self._scratch = torch.empty(numel, dtype=torch.float32)
        return self._scratch[:numel]

    def all_reduce(self, tensor: torch.Tensor, op: str) -> None:
        """In place; ``tensor`` contiguous, on the CPU, of a reducible dtype."""
        if tensor.numel() == 0:
            return
        sharded = self.multi_host and self.topology.equal_hosts
        if sharded:
            self._all_reduce_sharded(tensor.view(-1), op)
            return
        # Half types go to Communicator as they are: it widens to float32, sums in rank
        # order and rounds once with vectorised kernels (5-8x faster than a float32 copy
        # made here: 2 ranks, bfloat16 16 MiB 0.95-0.99 ms against 8.3-8.5 ms).
        self._all_reduce_native(tensor, op)

    def _all_reduce_native(self, tensor: torch.Tensor, op: str) -> None:
        if not self.multi_host:
            self.comm.all_reduce(tensor, op, timeout=self.timeout_s)
        else:
            self._all_reduce_through_leaders(tensor, op)

    def _cross_all_reduce(self, tensor: torch.Tensor, op: str) -> None:
        torch_op = REDUCE_OPS["sum" if op == "avg" else op]
        options = dist.AllreduceOptions()
        options.reduceOp = torch_op  # type: ignore[assignment]  # torch converts the enum
        self.cross.allreduce([tensor], options).wait()

    def _finish_avg(self, tensor: torch.Tensor, op: str) -> None:
        if op == "avg":
            if tensor.is_floating_point():
                tensor.div_(self.world_size)
            else:
                tensor.copy_(torch.div(tensor, self.world_size, rounding_mode="floor"))

    def _all_reduce_sharded(self, flat: torch.Tensor, op: str) -> None:
        """Reduce-scatter in host, all-reduce of each shard across hosts, all-gather in host.

        Half types are reduced inside the host in float32 (as Communicator does,
        faster) and cross hosts in their own dtype (half the bytes on the wire).
        """
        numel = flat.numel()
        local_size = len(self.topology.local_ranks)
        shard_elems = -(-numel // local_size)
        padded_elems = shard_elems * local_size
        wide_dtype = torch.float32 if flat.dtype in HALF_DTYPES else flat.dtype
        if wide_dtype == flat.dtype and padded_elems == numel:
            staging = flat
        else:
            staging = (self._float32_scratch(padded_elems) if wide_dtype == torch.float32 and wide_dtype != flat.dtype
                       else torch.empty(padded_elems, dtype=flat.dtype))
            _copy_on_this_thread(staging[:numel], flat)
            staging[numel:].zero_()
        shard = torch.empty(shard_elems, dtype=wide_dtype)
        self.comm.reduce_scatter(shard, staging, "sum" if op == "avg" else op, timeout=self.timeout_s)
        if wide_dtype != flat.dtype:
            narrow = torch.empty(shard_elems, dtype=flat.dtype)
            _copy_on_this_thread(narrow, shard)
            shard = narrow
        self._cross_all_reduce(shard, op)
        self._finish_avg(shard, op)
        gathered = flat if padded_elems == numel else torch.empty(padded_elems, dtype=flat.dtype)
        self.comm.all_gather(gathered, shard, timeout=self.timeout_s)
        if gathered is not flat:
            _copy_on_this_thread(flat, gathered[:numel])

    def _all_reduce_through_leaders(self, tensor: torch.Tensor, op: str) -> None:
        in_host_op = "sum" if op == "avg" else op
        self.comm.all_reduce(tensor, in_host_op, timeout=self.timeout_s)
        if self.topology.local_rank == 0:
            self._cross_all_reduce(tensor, op)
            self._finish_avg(tensor, op)
        self.comm.broadcast(tensor, 0, timeout=self.timeout_s)
