"""Host runtime: streams, events, the multi-threaded copy engine and local groups.

* :class:`HostStream` -- a worker thread running a FIFO of copies, event
  records and event waits with CUDA-stream semantics (``enqueue_copy`` returns
  at once; ``synchronize(timeout)`` / ``query()``; a failed task's error is
  raised by the next ``synchronize``). The stream keeps the tensors of a
  queued copy alive until the copy has run.
* :class:`HostEvent` -- recorded on a stream, done once the work before it has
  run: ``query()`` never blocks, ``wait(timeout)`` raises ``TimeoutError``.
* :class:`CopyEngine` -- worker threads that split large copies (and
  ``pack_rows``) with the calling thread; pass one to ``HostStream`` to make
  its copies multi-threaded.
* :class:`LocalGroup` -- the ranks of one host (joined through shared memory,
  torch.distributed or MPI): ``barrier``, ``all_gather_bytes``, liveness;
  :class:`GroupHandle` lets spawned workers join.

* :class:`IpcMemory` -- per-rank shared regions and barrier words every local
  rank maps (``num_workers``, ``worker_id``, ``remote_data``, ``barrier_in``,
  ``barrier_out``, ``barrier_flag``), made collectively on a group.
* :class:`Communicator` -- all_reduce / all_gather / reduce_scatter /
  broadcast / barrier among the ranks of one host over an IpcMemory.
* :class:`CudaCommunicator` -- all_reduce of CUDA tensors among the ranks of
  one host over an IpcMemory(device="cuda"), queued on torch's current stream
  (CUDA graphs capture it).

All are native (``tensorxfer._core``) and release the GIL while they copy,
reduce or wait.  ``timeout`` follows the package rules (:mod:`tensorxfer.errors`):
seconds, ``0`` to check once, ``None`` (the default) for no deadline; Ctrl-C
interrupts any wait with ``KeyboardInterrupt`` (the stream and event stay
usable; a group or communicator does not: its ranks are out of step).
"""

from tensorxfer._core import CopyEngine, HostEvent, HostStream
from tensorxfer.runtime.collectives import Communicator
from tensorxfer.runtime.cuda_collectives import CudaCommunicator
from tensorxfer.runtime.group import GroupHandle, LocalGroup
from tensorxfer.runtime.ipc_memory import IpcMemory

__all__ = ["CopyEngine", "Communicator", "CudaCommunicator", "GroupHandle", "HostEvent", "HostStream", "IpcMemory", "LocalGroup"]
