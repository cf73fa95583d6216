"""The exceptions tensorxfer raises beyond the built-in ones.

Bad arguments raise ``ValueError`` / ``TypeError``, waits that time out raise
``TimeoutError`` and failed system calls raise ``OSError`` with ``errno`` set;
the classes below cover the rest.  The native core maps its errors onto these
(see ``cpp/include/tensorxfer/common/error.h``).
"""


class TensorxferError(RuntimeError):
    """Base of the tensorxfer-specific errors."""


class PeerLostError(TensorxferError):
    """A process on the other side of a shared structure (a ring's producer or
    consumer, a group's rank) has exited, so the wait on it can never finish."""


#: The name this error had first; kept so existing ``except PeerLost`` clauses work.
PeerLost = PeerLostError


class CorruptSegmentError(TensorxferError, ValueError):
    """A shared segment failed validation (bad magic, version, sizes or state)."""


class UnsupportedError(TensorxferError):
    """The operation needs something this build or this machine lacks."""


__all__ = ["TensorxferError", "PeerLostError", "PeerLost", "CorruptSegmentError", "UnsupportedError"]
