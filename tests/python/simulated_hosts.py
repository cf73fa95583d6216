"""Simulated hosts: each one a process in its own IPC and mount namespaces with its own tmpfs /dev/shm.

Ranks enter a host with ``nsenter``; they share the network (the TCP store on
127.0.0.1) but not shared memory with the other hosts. Needs root. Used by
the torch backend's and the remote ring's tests, and by ``bench/python/bench_torch_backend.py`` and
``bench/python/bench_replay_hosts.py`` (which put ``tests/python`` on ``sys.path``). A test
fixture: it is not part of the installed package.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import List, Optional, Sequence

HOLDER = "mount -t tmpfs -o size=1g,mode=1777 tmpfs /dev/shm && echo ready && exec sleep 3600"


def unavailable_reason() -> Optional[str]:
    """Why hosts cannot be simulated here, or None."""
    if os.geteuid() != 0:
        return "simulating hosts needs root (unshare --ipc --mount and a tmpfs mount per host)"
    for tool in ("unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


class SimulatedHosts:
    """``SimulatedHosts([2, 2])``: two hosts of two ranks; ``wrappers`` prefixes each rank's command."""

    def __init__(self, sizes: Sequence[int]) -> None:
        self.sizes = list(sizes)
        self.holders: List[subprocess.Popen] = []
        try:
            for _ in self.sizes:
                holder = subprocess.Popen(["unshare", "--ipc", "--mount", "--propagation", "private",
                                           "sh", "-c", HOLDER], stdout=subprocess.PIPE, text=True)
                self.holders.append(holder)
                line = holder.stdout.readline() if holder.stdout else ""
                if line.strip() != "ready":
                    raise RuntimeError(f"could not start a simulated host (got {line!r})")
        except BaseException:
            self.close()
            raise

    def enter(self, host: int) -> List[str]:
        return ["nsenter", "-t", str(self.holders[host].pid), "--ipc", "--mount", "--"]

    @property
    def wrappers(self) -> List[List[str]]:
        """Rank r's prefix; ranks are numbered host by host."""
        return [self.enter(host) for host, size in enumerate(self.sizes) for _ in range(size)]

    def shm_listing(self, host: int) -> List[str]:
        """What is in that host's /dev/shm now."""
        done = subprocess.run(self.enter(host) + ["ls", "-A", "/dev/shm"], capture_output=True, text=True, check=True)
        return done.stdout.split()

    def close(self) -> None:
        for holder in self.holders:
            holder.kill()
            holder.wait()
            if holder.stdout is not None:
                holder.stdout.close()
        self.holders = []

    def __enter__(self) -> "SimulatedHosts":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
