"""Is a peer process still alive? (private; the mpi and torch backends, which have no LocalGroup)

Ranks exchange an identity at construction: host and boot id, pid namespace,
and the sync layer's process identity (pid and start time,
``sync/peer_liveness.h``). A peer on the same host and in the same pid
namespace is judged by the core: exited, a zombie or its pid reused means it
died. Other peers are never judged dead here (their pid means nothing to us);
the run's timeout covers them.
"""

from __future__ import annotations

import os
from typing import Dict, List, Tuple

from tensorxfer import _core
from tensorxfer.runtime.group import host_identity


def _pid_namespace() -> str:
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return ""


def own_identity() -> bytes:
    """This process's identity, as bytes to all-gather."""
    host, boot_id = host_identity()
    pid, start_ticks = _core.current_process_identity()
    return "|".join((host, boot_id, _pid_namespace(), str(pid), str(start_ticks))).encode()


class PeerWatch:
    """Answers "has rank r died?" for peers whose identities were gathered."""

    def __init__(self, identities: List[bytes]) -> None:
        own = own_identity().decode().split("|")
        self._local: Dict[int, Tuple[int, int]] = {}  # rank -> (pid, start ticks) for peers we can judge
        for rank, identity in enumerate(identities):
            parts = identity.decode(errors="replace").split("|")
            if len(parts) != 5 or parts[:3] != own[:3] or not own[1] or not own[2]:
                continue
            try:
                self._local[rank] = (int(parts[3]), int(parts[4]))
            except ValueError:
                continue

    def is_dead(self, rank: int) -> bool:
        """True only when rank is a same-host process that has certainly exited."""
        known = self._local.get(rank)
        return known is not None and not _core.process_is_alive(*known)
