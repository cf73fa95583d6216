"""Pre-faulting and page-locking host memory ranges (Linux ``madvise`` / ``mlock``).

The one place the replay backends touch host pages: ``prefault`` maps every
page of a range in before the first copy reads or writes it, ``lock`` /
``unlock`` page-lock it.  Locks cover whole pages and do not nest (two locked
ranges sharing a page are unlocked together).
"""

from __future__ import annotations

import ctypes
import mmap
import os
from typing import Tuple

PAGE_SIZE = mmap.PAGESIZE
_MADV_POPULATE_READ = 22  # Linux >= 5.14
_MADV_POPULATE_WRITE = 23

_libc = ctypes.CDLL(None, use_errno=True)
for _name in ("madvise", "mlock", "munlock"):
    _function = getattr(_libc, _name, None)
    if _function is not None:
        _function.restype = ctypes.c_int
        _function.argtypes = [ctypes.c_void_p, ctypes.c_size_t] + ([ctypes.c_int] if _name == "madvise" else [])


def page_range(address: int, nbytes: int) -> Tuple[int, int]:
    """The whole pages covering ``[address, address + nbytes)`` as ``(start, length)``."""
    start = address - address % PAGE_SIZE
    end = address + nbytes
    end += (-end) % PAGE_SIZE
    return start, end - start


def _touch_pages(address: int, nbytes: int) -> None:
    # Reads one byte per page: faults pages in without racing a writer of the range.
    first = page_range(address, 1)[0]
    page_count = (address + nbytes - 1 - first) // PAGE_SIZE + 1
    checksum = 0
    for index in range(page_count):
        checksum ^= ctypes.c_ubyte.from_address(max(address, first + index * PAGE_SIZE)).value
    del checksum


def prefault(address: int, nbytes: int, *, writable: bool) -> str:
    """Faults in every page of the range; returns how: "populate_write",
    "populate_read" (``MADV_POPULATE_*``, content untouched) or "touched" (one
    byte read per page, on kernels without ``MADV_POPULATE_*``)."""
    if nbytes <= 0:
        return "empty"
    madvise = getattr(_libc, "madvise", None)
    if madvise is not None:
        start, length = page_range(address, nbytes)
        advice = _MADV_POPULATE_WRITE if writable else _MADV_POPULATE_READ
        if madvise(start, length, advice) == 0:
            return "populate_write" if writable else "populate_read"
    _touch_pages(address, nbytes)
    return "touched"


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
