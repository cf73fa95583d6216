"""Which ranks may read each other's memory by cross-memory attach (private; shm backend).

``process_vm_readv`` works between two processes when the kernel permits it
(same user, Yama's ptrace rules, no seccomp filter in the way) and the reader
can name the target's pid (same pid namespace). Rather than predicting it, the
ranks try: each publishes a random token, the others read it.
"""

from __future__ import annotations

import os
import struct
from typing import List, Optional, Tuple

import numpy as np

from tensorxfer import _core
from tensorxfer.resharding.copy_services import _ptracer
from tensorxfer.runtime.group import LocalGroup


def probe_cross_memory_attach(local: LocalGroup, enabled: bool,
                              timeout: Optional[float]) -> Tuple[np.ndarray, List[int], Optional[int]]:
    """(cma_pairs, pids, grant): cma_pairs[src, dst] says whether dst may read src's
    memory; pids are the ranks' pids; grant is the ptrace permission this rank holds
    for its peers (release it with ``_ptracer.release``), kept only if some peer may
    read this rank. Collective; probes nothing when cross-memory attach is off."""
    world = local.world_size
    pairs = np.zeros((world, world), bool)
    if not enabled or world == 1:
        return pairs, [], None
    token = np.frombuffer(os.urandom(16), np.uint8).copy()
    mine = struct.pack("<qQ", os.getpid(), token.ctypes.data) + token.tobytes()
    gathered = local.all_gather_bytes(mine, timeout)
    pids = [struct.unpack_from("<q", data)[0] for data in gathered]
    grant = _ptracer.grant([pid for rank, pid in enumerate(pids) if rank != local.rank])
    try:
        local.barrier(timeout)  # every rank granted before any probes
        readable = np.zeros(world, np.uint8)
        for peer, data in enumerate(gathered):
            if peer != local.rank:
                (address,) = struct.unpack_from("<Q", data, 8)
                readable[peer] = _core.probe_process_memory(pids[peer], address, bytes(data[16:32]))
        answers = local.all_gather_bytes(readable.tobytes(), timeout)  # token read by every peer by now
    except BaseException:
        _ptracer.release(grant)
        raise
    for dst, data in enumerate(answers):
        pairs[:, dst] = np.frombuffer(data, np.uint8).astype(bool)
    if not pairs[local.rank].any():
        _ptracer.release(grant)  # nobody can read this rank anyway
        grant = None
    return pairs, pids, grant

