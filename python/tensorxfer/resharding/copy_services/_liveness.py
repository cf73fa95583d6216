"""Is a peer process still alive? (private)

Ranks exchange an identity at the start of every run: host, boot id, pid
namespace, pid and the process start time. A peer on the same host and in the
same pid namespace is judged by /proc/<pid>/stat: gone, a zombie, or a different
process start time (pid reused) means it died. Other peers are never judged
dead here (their pid means nothing to us); the run's timeout covers them.
"""

from __future__ import annotations

import os
import socket
from typing import Dict, List, Optional, Tuple


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as file:
            return file.read().strip()
    except OSError:
        return ""


def _pid_namespace() -> str:
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return ""


def _stat(pid: int) -> Optional[Tuple[str, str]]:
    """(state, start time) of a process, or None if it does not exist."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            text = file.read().decode("ascii", "replace")
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return ("?", "")
    fields = text.rsplit(")", 1)[-1].split()
    if len(fields) < 20:
        return ("?", "")
    return (fields[0], fields[19])


def own_identity() -> bytes:
    """This process's identity, as bytes to all-gather."""
    stat = _stat(os.getpid())
    start = stat[1] if stat else ""
    return "|".join((socket.gethostname(), _boot_id(), _pid_namespace(), str(os.getpid()), start)).encode()


class PeerWatch:
    """Answers "has rank r died?" for peers whose identities were gathered."""

    def __init__(self, identities: List[bytes]) -> None:
        own = own_identity().decode().split("|")
        self._local: Dict[int, Tuple[int, str]] = {}  # rank -> (pid, start time) for peers we can judge
        for rank, identity in enumerate(identities):
            parts = identity.decode(errors="replace").split("|")
            if len(parts) != 5 or parts[:3] != own[:3] or not own[1] or not own[2]:
                continue
            try:
                self._local[rank] = (int(parts[3]), parts[4])
            except ValueError:
                continue

    def is_dead(self, rank: int) -> bool:
        """True only when rank is a same-host process that has certainly exited."""
        known = self._local.get(rank)
        if known is None:
            return False
        pid, start = known
        stat = _stat(pid)
        if stat is None:
            return True
        state, now_start = stat
        return state in ("Z", "X", "x") or (bool(start) and bool(now_start) and now_start != start)
