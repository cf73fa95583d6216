"""A timeout for slow setup work that never interrupts it.

Injecting an exception into a running thread (``PyThreadState_SetAsyncExc``)
can land inside ``import torch`` or CUDA initialisation and leave half-imported
modules and held locks behind.  Here the work runs in a daemon worker thread;
the caller waits for it with a timeout and, when the time is up, gets
:class:`UnifiedMemoryCompileTimeoutError` while the worker carries on and
finishes (hands its outcome to a callback) on its own.
"""

from __future__ import annotations

import contextlib
import numbers
import threading
import time
from typing import Any, Callable, Iterator, Optional, TypeVar

from tensorxfer.inference._errors import UnifiedMemoryCompileTimeoutError

Result = TypeVar("Result")
LateOutcome = Callable[[Any, Optional[BaseException]], None]


def _timeout_message(timeout_s: float) -> str:
    return f"unified memory allocator setup timed out after {timeout_s:g} s"


class TimedRunner:
    """Runs work under one deadline (the one of the ``compile_timeout`` block)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s
        self.worker: Optional[threading.Thread] = None  # the thread of the latest run

    def __call__(self, work: Callable[[], Result], *, on_late: Optional[LateOutcome] = None) -> Result:
        """Runs ``work()`` in a daemon worker thread and returns its result (or raises
        its exception) when it finishes before the deadline.  Otherwise raises
        :class:`UnifiedMemoryCompileTimeoutError` at the deadline, or re-raises
        an interruption of the wait (Ctrl-C); the worker is left alone, and when
        it finishes it calls ``on_late(result, error)`` (``error`` None on
        success) in the worker thread.  Never injects anything into a thread.
        """
        guard = threading.Lock()
        finished = threading.Event()
        outcome: dict = {"abandoned": False}

        def run() -> None:
            result: Any = None
            error: Optional[BaseException] = None
            try:
                result = work()
            except BaseException as exc:  # delivered to the caller or to on_late
                error = exc
            with guard:
                outcome["result"], outcome["error"] = result, error
                late = outcome["abandoned"]
                finished.set()
            if late and on_late is not None:
                on_late(result, error)

        worker = threading.Thread(target=run, name="tensorxfer-compile", daemon=True)
        self.worker = worker
        worker.start()
        in_time = False
        try:
            in_time = finished.wait(max(0.0, self.deadline - time.monotonic()))
        finally:
            with guard:
                in_time = finished.is_set()
                if not in_time:
                    outcome["abandoned"] = True  # the worker reports to on_late instead
        if not in_time:
            raise UnifiedMemoryCompileTimeoutError(_timeout_message(self.timeout_s))
        if outcome["error"] is not None:
            raise outcome["error"]
        return outcome["result"]


@contextlib.contextmanager
def compile_timeout(timeout_s: float) -> Iterator[TimedRunner]:
    """Context manager to timeout compilation.

    Yields a runner: ``run(work, on_late=None)`` runs ``work`` in a daemon
    worker thread and waits for it until ``timeout_s`` seconds after the block
    was entered; past that it raises :class:`UnifiedMemoryCompileTimeoutError`
    and lets the worker finish on its own (see :meth:`TimedRunner.__call__`).
    Nothing is ever interrupted; code running directly in the block (outside
    ``run``) is not timed, so put the slow work in ``run``.

    Args:
        timeout_s: timeout in seconds (> 0).
    """
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, numbers.Real):
        raise TypeError(f"timeout_s must be a number of seconds, got {type(timeout_s).__name__}")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    yield TimedRunner(float(timeout_s))
