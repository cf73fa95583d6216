"""Pre-faulting and page-locking host memory (``madvise`` through the core, ``mlock``).

The one place the replay backends touch host pages: ``prefault`` maps every
page of a view in before the first copy reads or writes it, ``lock`` /
``unlock`` page-lock a range.  Locks cover whole pages and do not nest (two locked
ranges sharing a page are unlocked together).
"""

from __future__ import annotations

import ctypes
import mmap
import os
from typing import Any, Tuple

from tensorxfer import _core

PAGE_SIZE = mmap.PAGESIZE

_libc = ctypes.CDLL(None, use_errno=True)
for _name in ("mlock", "munlock"):
    _function = getattr(_libc, _name, None)
    if _function is not None:
        _function.restype = ctypes.c_int
        _function.argtypes = [ctypes.c_void_p, ctypes.c_size_t]


def page_range(address: int, nbytes: int) -> Tuple[int, int]:
    """The whole pages covering ``[address, address + nbytes)`` as ``(start, length)``."""
    start = address - address % PAGE_SIZE
    end = address + nbytes
    end += (-end) % PAGE_SIZE
    return start, end - start


def prefault(view: Any, argument: str) -> str:
    """Faults in every page a host ``_core.TensorView`` covers without changing its
    content (``MADV_POPULATE_WRITE``/``_READ``, else an atomic touch per page; GIL
    released) and hints ``MADV_WILLNEED``.  Returns the method used."""
    return _core.populate_host_pages(view, argument)["method"]


def lock(address: int, nbytes: int) -> int:
    """Page-locks the range; returns 0 on success, else the errno (ENOMEM when
    ``RLIMIT_MEMLOCK`` is too small, EPERM without the privilege)."""
    mlock = getattr(_libc, "mlock", None)
    if mlock is None:
        return 38  # ENOSYS
    start, length = page_range(address, max(nbytes, 1))
    if mlock(start, length) == 0:
        return 0
    return ctypes.get_errno()


def unlock(address: int, nbytes: int) -> None:
    """Undoes ``lock`` on the range; never raises (the memory may be gone already)."""
    munlock = getattr(_libc, "munlock", None)
    if munlock is not None:
        start, length = page_range(address, max(nbytes, 1))
        munlock(start, length)


def errno_name(number: int) -> str:
    """``"ENOMEM (Cannot allocate memory)"`` style text for an errno."""
    import errno

    return f"{errno.errorcode.get(number, str(number))} ({os.strerror(number)})"


__all__ = ["PAGE_SIZE", "page_range", "prefault", "lock", "unlock", "errno_name"]
