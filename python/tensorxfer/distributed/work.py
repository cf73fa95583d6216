"""Work objects and the backend's own thread: ops run one at a time, in submission order.

A :class:`Work` is what every op of the process group returns. Like gloo's:
``wait()`` blocks until the op finished and raises its error; ``get_future()``
is a ``torch.futures.Future`` completed with the op's output tensors (or its
error); ``is_completed()`` never blocks. ``wait()`` sleeps in short slices on
the calling thread, so Ctrl-C interrupts it there (the op itself keeps running
on the backend's thread until its own deadline).
"""

from __future__ import annotations

import queue
import threading
from datetime import timedelta
from typing import Any, Callable, List, Optional

import torch
import torch.distributed as dist

#: How often a waiting thread wakes to let Python deliver Ctrl-C.
WAIT_SLICE_S = 0.05


class Work(dist._Work):  # type: ignore[misc,name-defined]
    """The result of one op (see the module docstring)."""

    def __init__(self, name: str, outputs: List[Any]) -> None:
        super().__init__()
        self.name = name
        self._outputs = outputs
        self._done = threading.Event()
        self._error: Optional[BaseException] = None
        self._future: torch.futures.Future = torch.futures.Future()

    def finish(self, error: Optional[BaseException] = None) -> None:
        """Completes the work (on the backend's thread): result, or ``error``."""
        self._error = error
        if error is None:
            self._future.set_result(self._outputs)
        else:
            self._future.set_exception(error)
        self._done.set()

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        """Blocks until done (``timeout`` > 0: at most that long, else ``TimeoutError``); raises the op's error."""
        limit = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout or 0)
        waited = 0.0
        while not self._done.wait(WAIT_SLICE_S):
            waited += WAIT_SLICE_S
            if limit > 0 and waited >= limit:
                raise TimeoutError(f"tensorxfer backend: {self.name} did not finish within {limit} s")
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return self._done.is_set()

    def is_success(self) -> bool:
        return self._done.is_set() and self._error is None

    def exception(self) -> Optional[BaseException]:
        return self._error

    def get_future(self) -> torch.futures.Future:
        return self._future

    def result(self) -> List[Any]:
        self.wait()
        return self._outputs

    def synchronize(self) -> None:
        self.wait()


class OpThread:
    """One daemon thread that runs submitted ops in order; ``on_error`` maps failures.

    After the first failure every later op fails with the same error without
    running (the ranks are out of step), as gloo's process group does.
    """

    def __init__(self, name: str, on_error: Callable[[str, BaseException], BaseException]) -> None:
        self._queue: "queue.SimpleQueue[Optional[tuple]]" = queue.SimpleQueue()
        self._on_error = on_error
        self.failure: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, name: str, outputs: List[Any], body: Callable[[Work], None]) -> Work:
        """Queues ``body(work)``; ``body`` finishes the work (or raises, which fails it)."""
        work = Work(name, outputs)
        self._queue.put((body, work))
        return work

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            body, work = item
            if self.failure is not None:
                work.finish(self.failure)
                continue
            try:
                body(work)
            except BaseException as error:  # noqa: BLE001 - every failure goes to the waiter
                self.failure = self._on_error(work.name, error)
                work.finish(self.failure)

    def stop(self, timeout: float) -> bool:
        """Stops after the queued ops; True if the thread ended within ``timeout``."""
        self._queue.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()


class CompletionThread:
    """Finishes works whose op runs elsewhere (gloo point-to-point) when that op completes.

    Point-to-point ops are started in order on the op thread but not waited for
    there (a send waiting for its receive would block the peer's send), so this
    thread waits for them instead, in order.
    """

    def __init__(self, name: str, on_error: Callable[[str, BaseException], BaseException]) -> None:
        self._queue: "queue.SimpleQueue[Optional[tuple]]" = queue.SimpleQueue()
        self._on_error = on_error
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def finish_when_done(self, inner: Any, work: Work) -> None:
        self._queue.put((inner, work))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            inner, work = item
            try:
                inner.wait()
            except BaseException as error:  # noqa: BLE001
                work.finish(self._on_error(work.name, error))
            else:
                work.finish()

    def stop(self, timeout: float) -> bool:
        self._queue.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()
