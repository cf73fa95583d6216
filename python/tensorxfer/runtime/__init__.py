"""Host runtime: streams, events and the multi-threaded copy engine.

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

All three are native (``tensorxfer._core``) and release the GIL while they copy
or wait.  ``timeout`` follows the package rules (:mod:`tensorxfer.errors`):
seconds, ``0`` to check once, ``None`` (the default) for no deadline; Ctrl-C
interrupts any wait with ``KeyboardInterrupt`` (the stream and event stay
usable).
"""

from tensorxfer._core import CopyEngine, HostEvent, HostStream

__all__ = ["CopyEngine", "HostEvent", "HostStream"]
