"""Work objects and the order ops run in: one at a time, in submission order.

A :class:`Work` is what every op of the process group returns. Like gloo's:
``wait()`` blocks until the op finished and raises its error; ``get_future()``
is a ``torch.futures.Future`` completed with the op's output tensors (or its
error); ``is_completed()`` never blocks. ``wait()`` sleeps in short slices, so
Ctrl-C interrupts it on the main thread. :class:`OpThread` runs async ops on its
own thread and lets a synchronous caller run the next op itself (see there).
"""

from __future__ import annotations

import collections
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

    def __init__(self, name: str, outputs: List[Any], runner: Optional["OpThread"] = None) -> None:
        super().__init__()
        self.name = name
        self._runner = runner
        self._outputs = outputs
        self._done = threading.Event()
        self._finished = False  # the op ended (its future, when there is one, may still be completing)
        self._error: Optional[BaseException] = None
        self._future: Optional[torch.futures.Future] = None  # made on first get_future()
        self._future_lock = threading.Lock()
        self._source: Optional[int] = None  # a completed receive's sender

    def _complete(self, future: torch.futures.Future) -> None:
        """Completes ``future`` (running its callbacks on this thread), then the work, as gloo does."""
        try:
            if self._error is None:
                future.set_result(self._outputs)
            else:
                future.set_exception(self._error)
        finally:
            self._done.set()

    def finish(self, error: Optional[BaseException] = None, source_rank: Optional[int] = None) -> None:
        """Completes the work (on the thread that ran it): result, or ``error``; a receive names its sender.

        A future asked for already is completed once the thread that ran the op has ended its turn
        (:meth:`OpThread._future_ready`): its callbacks (a DDP comm hook's ``then``) may start another
        op and wait for it. The work counts as done once its future is, as in gloo.
        """
        self._source = source_rank
        with self._future_lock:
            self._error = error
            self._finished = True
            future = self._future
            if future is None:
                self._done.set()
                return
        if self._runner is not None:
            self._runner._future_ready(self, future)
        else:
            self._complete(future)

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        """Blocks until done (``timeout`` > 0: at most that long, else ``TimeoutError``); raises the op's error."""
        limit = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout or 0)
        if self._runner is not None and not self._done.is_set():
            self._runner.run_inline(self)
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
        with self._future_lock:
            if self._future is not None:
                return self._future
            future: torch.futures.Future = torch.futures.Future()
            self._future = future
            finished = self._finished
        if finished:  # asked after the op ended: completed here (finish() saw no future)
            self._complete(future)
        return future

    def result(self) -> List[Any]:
        self.wait()
        return self._outputs

    def synchronize(self) -> None:
        self.wait()

    def _source_rank(self) -> int:
        """The rank a completed receive got its data from (``dist.recv``/``irecv`` with no source ask it)."""
        if self._source is None:
            raise RuntimeError(f"tensorxfer backend: {self.name} has no source rank (only a completed receive has one)")
        return self._source


class CompletedWork(dist._Work):  # type: ignore[misc,name-defined]
    """The work of an op that already succeeded on the calling thread (no event, no lock: cheaper).

    Made by :meth:`OpThread.run_now`: ``CompletedWork()``, then ``_outputs`` set
    (a Python ``__init__`` calling the binding's costs twice as much, 0.57 vs 0.34 us).
    """

    __slots__ = ("_outputs",)
    _outputs: List[Any]

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self) -> Optional[BaseException]:
        return None

    def get_future(self) -> torch.futures.Future:
        future: torch.futures.Future = torch.futures.Future()
        future.set_result(self._outputs)
        return future

    def result(self) -> List[Any]:
        return self._outputs

    def synchronize(self) -> None:
        pass


class OpThread:
    """Runs submitted ops one at a time, in submission order; ``on_error`` maps failures.

    Ops run on this object's daemon thread, except that a thread that waits for
    an op which is next in line and nothing is running runs it itself
    (:meth:`run_inline`): a synchronous call then costs no thread hand-off,
    while async ops (DDP's buckets) still overlap with the caller. After the
    first failure every later op fails without running (the ranks are out of
    step), as gloo's process group does.

    A finished op's future is completed, and its callbacks run, by the thread
    that ran the op once its turn has ended. A callback may start an op and
    wait for its future (PowerSGD's comm hook does) while the thread it runs on
    is the one that would run that op: :meth:`submit` then starts a helper
    thread that runs the queue until it is empty.
    """

    def __init__(self, name: str, on_error: Callable[[str, BaseException], BaseException],
                 on_idle: Optional[Callable[[], None]] = None) -> None:
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._pending: "collections.deque[tuple]" = collections.deque()
        # Held while an op runs, here or on a caller's thread; taken without blocking. The
        # one who releases it wakes the op thread if ops are queued (it may have found it held).
        self._busy = threading.Lock()
        self._stopping = False
        self._on_error = on_error
        self._on_idle = on_idle
        self.failure: Optional[BaseException] = None
        self._ready: "collections.deque[tuple]" = collections.deque()  # (work, future) to complete
        self._in_callbacks: set = set()  # threads running futures' callbacks
        self._name = name
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, name: str, outputs: List[Any], body: Callable[[Work], None]) -> Work:
        """Queues ``body(work)``; ``body`` finishes the work (or raises, which fails it)."""
        work = Work(name, outputs, self)
        with self._cond:
            self._pending.append((body, work))
            self._cond.notify()
        if threading.get_ident() in self._in_callbacks:  # the thread that would run it may be this one
            threading.Thread(target=self._help, name=f"{self._name}-helper", daemon=True).start()
        return work

    def _help(self) -> None:
        """Runs queued ops until none is left (see the class docstring)."""
        while True:
            with self._cond:
                if not self._pending:
                    return
                if not self._busy.acquire(False):  # another thread runs one: look again when it ends
                    self._cond.wait(WAIT_SLICE_S)
                    continue
                if not self._pending:
                    self._busy.release()
                    return
                body, work = self._pending.popleft()
            self._execute(body, work)

    def _future_ready(self, work: Work, future: torch.futures.Future) -> None:
        """Completes ``future`` once no op runs: at once, or after the running op's turn (:meth:`_release`)."""
        self._ready.append((work, future))
        if not self._busy.locked():  # else the thread holding the turn completes it on release
            self._complete_ready()

    def _complete_ready(self) -> None:
        me = threading.get_ident()
        while self._ready:
            try:
                work, future = self._ready.popleft()
            except IndexError:  # another thread took the last one
                return
            self._in_callbacks.add(me)
            try:
                work._complete(future)
            finally:
                self._in_callbacks.discard(me)

    def run_now(self, name: str, outputs: List[Any], run: Callable[[], None]) -> Optional[dist._Work]:  # type: ignore[name-defined]
        """Runs ``run()`` on the calling thread if nothing is queued or running; else None (queue it instead).

        For a caller that waits at once (``async_op=False``): no hand-off, and on
        success a :class:`CompletedWork`. (The op thread's own ops find the
        lock held, so an op body that calls this queues instead.)
        """
        if not self._busy.acquire(False):
            return None
        try:
            if self._pending:
                return None
            if self.failure is None:
                try:
                    run()
                    completed = CompletedWork()
                    completed._outputs = outputs
                    return completed
                except BaseException as error:  # noqa: BLE001 - every failure goes to the waiter
                    failed = Work(name, outputs)
                    self._fail(failed, error)
                    return failed
            failed = Work(name, outputs)
            failed.finish(self.failure)
            return failed
        finally:
            self._release()

    def _release(self) -> None:
        """Ends an op's turn: frees the lock, then wakes the op thread if it has something to do."""
        self._busy.release()
        if self._pending or self._stopping:
            with self._cond:
                self._cond.notify_all()
        if self._ready:
            self._complete_ready()

    @property
    def queued(self) -> bool:
        """Whether ops wait in the queue (a snapshot)."""
        return bool(self._pending)

    def run_inline(self, work: Work) -> None:
        """Runs ``work`` on the calling thread if it is next and nothing runs; else does nothing."""
        if not self._busy.acquire(False):
            return
        with self._cond:
            is_next = bool(self._pending) and self._pending[0][1] is work
            if is_next:
                body, _ = self._pending.popleft()
        if not is_next:
            self._release()
            return
        self._execute(body, work)

    def _execute(self, body: Callable[[Work], None], work: Work) -> None:
        """Runs a queued op's ``body`` (the caller holds the lock; this releases it, first calling
        ``on_idle`` if the queue is empty: not for ops of :meth:`run_now`, which run only then)."""
        try:
            if self.failure is not None:
                work.finish(self.failure)
                return
            try:
                body(work)
            except BaseException as error:  # noqa: BLE001 - every failure goes to the waiter
                self._fail(work, error)
        finally:
            try:
                if self._on_idle is not None and not self._pending:
                    self._on_idle()
            except Exception:  # noqa: BLE001 - a setting for later ops: never worth the op thread
                pass
            finally:
                self._release()

    def _fail(self, work: Work, error: BaseException) -> None:
        """Fails ``work`` with ``error`` as ``on_error`` maps it; every later op fails too."""
        mapped = self._on_error(work.name, error)
        self.failure = mapped if not isinstance(mapped, KeyboardInterrupt) else RuntimeError(
            f"tensorxfer backend: {work.name} was interrupted (Ctrl-C); the ranks are out of step")
        work.finish(mapped)

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._busy.acquire(False):
                        if self._pending:
                            break
                        self._busy.release()
                        if self._stopping:  # nothing queued, nothing running
                            return
                    self._cond.wait()
                body, work = self._pending.popleft()
            self._execute(body, work)

    def stop(self, timeout: float) -> bool:
        """Stops after the queued ops; True if the thread ended within ``timeout``."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
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

    def finish_when_done(self, inner: Any, work: Work, receives: bool = False) -> None:
        """Finishes ``work`` once ``inner`` completes; a receive (``receives``) takes its sender from ``inner``."""
        self._queue.put((inner, work, receives))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            inner, work, receives = item
            try:
                inner.wait()
                source = inner._source_rank() if receives else None
            except BaseException as error:  # noqa: BLE001
                work.finish(self._on_error(work.name, error))
            else:
                work.finish(source_rank=source)

    def stop(self, timeout: float) -> bool:
        self._queue.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()
