"""A timeout for a block of code that works on any thread (no SIGALRM)."""

from __future__ import annotations

import contextlib
import ctypes
import threading
from typing import Iterator, Optional

from tensorxfer.inference._errors import UnifiedMemoryCompileTimeoutError

# PyThreadState_SetAsyncExc with an exception type, and with NULL (to cancel a pending one).
_set_async_exc = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.py_object)(
    ("PyThreadState_SetAsyncExc", ctypes.pythonapi)
)
_clear_async_exc = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p)(
    ("PyThreadState_SetAsyncExc", ctypes.pythonapi)
)


@contextlib.contextmanager
def compile_timeout(timeout_s: float) -> Iterator[None]:
    """Context manager to timeout compilation.

    Raises :class:`UnifiedMemoryCompileTimeoutError` in the thread running the
    block once ``timeout_s`` seconds have passed. Works on any thread (a timer
    thread interrupts the block; no ``SIGALRM``). Python code is interrupted at
    once; a blocking native call is interrupted when it returns.

    Args:
        timeout_s: timeout in seconds (> 0).
    """
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)):
        raise TypeError(f"timeout_s must be a number of seconds, got {type(timeout_s).__name__}")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    target = threading.get_ident()
    guard = threading.Lock()
    state = {"done": False, "fired": False}

    def fire() -> None:
        with guard:
            if state["done"]:
                return
            state["fired"] = True
            _set_async_exc(target, UnifiedMemoryCompileTimeoutError)

    timer = threading.Timer(timeout_s, fire)
    timer.daemon = True
    timer.start()
    error: Optional[BaseException] = None
    try:
        yield
    except UnifiedMemoryCompileTimeoutError as exc:
        error = exc
    finally:
        timer.cancel()
        fired = _finish_timeout(target, guard, state)
        if not fired and error is not None:
            raise error
    if fired:
        message = f"unified memory allocator setup timed out after {timeout_s} s"
        raise UnifiedMemoryCompileTimeoutError(message) from None


def _finish_timeout(target: int, guard: threading.Lock, state: dict) -> bool:
    """Disarms a _compile_timeout; returns whether it fired (cancelling a still-pending exception)."""
    while True:
        try:
            with guard:
                state["done"] = True
                fired = state["fired"]
            if fired:
                _clear_async_exc(target, None)
            return fired
        except UnifiedMemoryCompileTimeoutError:
            continue  # the timer's exception landed here; `fired` accounts for it
