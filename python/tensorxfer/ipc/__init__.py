"""Inter-process transfer: shared slot rings, shared arrays, native row packing.

* :class:`SlotRing` / :class:`SlotRingHandle` -- a ring of shared slots between
  several producer processes and one consumer, in publish order, with futex
  waits, timeouts and dead-peer detection.
* :class:`SharedArray` / :class:`SharedArrayHandle` -- a numpy array in shared memory.
* :class:`PackLayout` / :func:`pack_rows` -- gather indexed rows into a packed slot.
* ``tensorxfer.ipc.remote`` -- :class:`~tensorxfer.ipc.remote.RemoteSlotRing` / :class:`~tensorxfer.ipc.remote.RemoteProducers`: producers of a
  learner's ring on other hosts, over torch.distributed point-to-point (needs torch).
* ``tensorxfer.ipc.replay_pipelines.transfer`` -- host-to-device replay transfer backends.
"""

from tensorxfer.ipc.shared_array import SharedArray, SharedArrayHandle
from tensorxfer.ipc.slot_ring import SlotRing, SlotRingHandle
from tensorxfer.ipc.pack import PackLayout, pack_rows

__all__ = [
    "PackLayout",
    "SharedArray",
    "SharedArrayHandle",
    "SlotRing",
    "SlotRingHandle",
    "pack_rows",
]
