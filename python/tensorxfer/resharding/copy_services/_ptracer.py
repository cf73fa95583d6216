"""The ptrace permission that cross-memory attach needs under Yama (private; shm backend).

With ``/proc/sys/kernel/yama/ptrace_scope`` = 1, a process may read another's
memory (``process_vm_readv``) only if it is an ancestor of it, or the target
named it (or an ancestor of it) with ``prctl(PR_SET_PTRACER, pid)``. Yama keeps
one such pid per process and offers no way to read it back. So this module:

* grants only under scope 1 (scope 0 needs nothing; 2 and 3 are not lifted by it);
* names the narrowest pid that covers the readers: the one peer, or the parent
  every peer shares (a launcher: mpirun, torchrun, a test harness), and
  ``PR_SET_PTRACER_ANY`` only for readers with no common parent;
* keeps, per process, the grants of the services that hold one (the pid is one
  per process, so two services needing different readers widen it to ANY), and
  sets 0 -- the kernel's default, no exception -- when the last one is released.
"""

from __future__ import annotations

import ctypes
import os
from typing import Callable, List, Optional, Sequence

PR_SET_PTRACER = 0x59616D61
PR_SET_PTRACER_ANY = -1
NO_PTRACER = 0

#: The grants held by this process's services (one entry per service; process-wide
#: because the setting it mirrors is).
_held: List[int] = []


def yama_scope() -> Optional[int]:
    """Yama's ptrace_scope, or None without Yama."""
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as file:
            return int(file.read().strip())
    except (OSError, ValueError):
        return None


def set_ptracer(value: int) -> None:
    """prctl(PR_SET_PTRACER, value); OSError on failure."""
    libc = ctypes.CDLL(None, use_errno=True)
    argument = ctypes.c_ulong(value & ((1 << (8 * ctypes.sizeof(ctypes.c_ulong))) - 1))
    if libc.prctl(PR_SET_PTRACER, argument, ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"prctl(PR_SET_PTRACER, {value}): {os.strerror(error)}")


def _parent_of(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            fields = file.read().decode("ascii", "replace").rsplit(")", 1)[-1].split()
        return int(fields[1])
    except (OSError, ValueError, IndexError):
        return None


def reader_for(peer_pids: Sequence[int]) -> int:
    """The pid to name so that every peer may read this process: the peer itself,
    else the parent all peers share, else PR_SET_PTRACER_ANY."""
    peers = sorted(set(peer_pids))
    if len(peers) == 1:
        return peers[0]
    parents = {_parent_of(pid) for pid in peers}
    if len(parents) == 1:
        (parent,) = parents
        if parent is not None and parent > 1:
            return parent
    return PR_SET_PTRACER_ANY


def _effective() -> int:
    if not _held:
        return NO_PTRACER
    return _held[0] if len(set(_held)) == 1 else PR_SET_PTRACER_ANY


def _update(change: Callable[[], None]) -> bool:
    """Applies ``change`` to the held grants and the process's setting; False (and the
    grants as they were) if prctl refused."""
    before = list(_held)
    previous = _effective()
    change()
    if _effective() == previous:
        return True
    try:
        set_ptracer(_effective())
        return True
    except OSError:
        _held[:] = before
        return False


def grant(peer_pids: Sequence[int]) -> Optional[int]:
    """Lets the processes ``peer_pids`` read this one's memory where Yama would
    refuse it; returns the grant to :func:`release`, or None when none is needed
    (or prctl refused it)."""
    if yama_scope() != 1 or not peer_pids:
        return None
    value = reader_for(peer_pids)
    return value if _update(lambda: _held.append(value)) else None


def release(value: Optional[int]) -> None:
    """Takes back a grant: the setting narrows to what the other holders need, or 0.
    (If prctl refuses, the process keeps the wider permission: nothing else to undo.)"""
    if value is not None and value in _held:
        _update(lambda: _held.remove(value))
