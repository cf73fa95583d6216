"""The exceptions tensorxfer raises beyond the built-in ones.

Bad arguments raise ``ValueError`` / ``TypeError``, waits that time out raise
``TimeoutError`` and failed system calls raise ``OSError`` with ``errno`` set;
the classes below cover the rest.  The native core maps its errors onto these
(see ``cpp/include/tensorxfer/common/error.h``).

Waits and timeouts
------------------
Every call that waits (``SlotRing.acquire_free`` / ``acquire_ready``,
``HostStream.synchronize``, ``HostEvent.wait``, the replay backends'
``synchronize_ready``, and the group and collective waits) takes a
``timeout`` with one meaning:

* a number of seconds ``>= 0``: raise ``TimeoutError`` once it has passed;
  ``0`` checks once without waiting;
* ``None``: no deadline.  The wait still watches its peers and Ctrl-C;
* negative or NaN: ``ValueError``; a bool or a non-number: ``TypeError``
  (both name the call and its ``timeout``).

:func:`check_timeout` is the one parser of these rules (the native waits use
the same code); every Python wait reads its ``timeout`` with it.

Whatever the timeout, a wait on a process that has died raises
:class:`PeerLostError`, and Ctrl-C (SIGINT) raises ``KeyboardInterrupt``
within about 20 ms (waits release the GIL and check for signals between
slices of sleep).  An interrupted wait leaves the structure as it was: nothing
taken, nothing leaked, usable again.  Python runs signal handlers only in the
main thread, so Ctrl-C does not interrupt a wait on another thread: give those
a timeout.
"""


from typing import Any, Optional


class TensorxferError(RuntimeError):
    """Base of the tensorxfer-specific errors."""


class PeerLostError(TensorxferError):
    """A peer process has exited, so a wait on it can never finish.

    The peer is the process on the other side of a shared structure: a ring's
    producer or consumer, a group's rank. The message names it.
    """


#: The name this error had first; kept so existing ``except PeerLost`` clauses work.
PeerLost = PeerLostError


class CorruptSegmentError(TensorxferError, ValueError):
    """A shared segment failed validation (bad magic, version, sizes or state)."""


class UnsupportedError(TensorxferError):
    """The operation needs something this build or this machine lacks."""


class ClosedError(TensorxferError, ValueError):
    """An object was used after its ``close()``.

    The one error for "used after close" in every class, with the message
    ``"<kind> is closed"``. It is a ``ValueError`` (as for a closed Python file) and a
    ``RuntimeError`` (through :class:`TensorxferError`), so handlers written for either
    keep working.
    """


def check_timeout(timeout: Any, operation: str) -> Optional[float]:
    """Reads a wait's ``timeout`` by the package's rules (the module docstring).

    Args:
        timeout: seconds (an int or a float, ``>= 0``; ``0`` checks once) or ``None``
            (no deadline).
        operation: the waiting call's name, for the error messages.

    Returns:
        ``None``, or the seconds as a float.

    Raises:
        ValueError: ``timeout`` is negative or NaN.
        TypeError: ``timeout`` is a bool or not a number.

    Example:
        >>> check_timeout(2, "my wait")
        2.0
    """
    from tensorxfer import _core  # not at import: the native module imports this one to raise its errors

    result = _core.check_timeout(timeout, operation)
    return None if result is None else float(result)


__all__ = ["TensorxferError", "PeerLostError", "PeerLost", "CorruptSegmentError", "UnsupportedError", "ClosedError",
           "check_timeout"]
