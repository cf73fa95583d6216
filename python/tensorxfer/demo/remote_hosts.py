"""The demo's remote collectors: processes that play other hosts and feed the learner's ring over
torch.distributed (``tensorxfer.ipc.remote``).

As root, with ``unshare`` installed, each collector runs in its own IPC and mount namespaces
with its own ``/dev/shm`` (a tmpfs that goes with it): it can reach the learner only over TCP,
as a collector on another machine would.  Otherwise they are plain processes of this host, still
talking TCP (the summary says which).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from typing import Any, List

from tensorxfer.errors import PeerLostError

_START_TIMEOUT_S = 120.0
_STOP_TIMEOUT_S = 15.0
# A fresh /dev/shm in the new namespaces, then the collector itself.
_OWN_SHM = 'mount -t tmpfs -o size=1g,mode=1777 tmpfs /dev/shm && exec "$0" "$@"'


def can_isolate() -> bool:
    """True when collectors can run in namespaces of their own (root and unshare)."""
    return os.geteuid() == 0 and shutil.which("unshare") is not None


class RemoteCollectors:
    """Serves the ring to ``options.remote_collectors`` collectors with ids ``first_id`` and up."""

    def __init__(self, ring: Any, options: Any, first_id: int) -> None:
        from tensorxfer.ipc.remote import RemoteProducers

        self.options = options
        self.first_id = first_id
        self.count = options.remote_collectors
        credits = max(1, ring.depth // (self.count + 1))
        self.server = RemoteProducers.serve(ring, "tcp://127.0.0.1:0", credits=credits,
                                            timeout=float(options.stall_timeout))
        self.isolated = can_isolate()
        self.isolation = ("simulated hosts (own IPC and mount namespaces, own /dev/shm)" if self.isolated
                          else "processes of this host (simulated hosts need root and unshare)")
        self.processes: List[subprocess.Popen] = []
        self.stopping = False

    def command(self, collector_id: int) -> List[str]:
        options = self.options
        command = [sys.executable, "-m", "tensorxfer.demo.remote_collector", "--connect", self.server.init_method,
                   "--collector-id", str(collector_id),
                   "--num-collectors", str(options.collectors + options.remote_collectors),
                   "--store-rows", str(options.store_rows), "--obs-dim", str(options.obs_dim),
                   "--batch-rows", str(options.batch_rows), "--seed", str(options.seed)]
        if self.isolated:
            return ["unshare", "--ipc", "--mount", "--propagation", "private", "sh", "-c", _OWN_SHM, *command]
        return command

    def start(self) -> None:
        """Starts every remote collector and waits until each has connected (or one died)."""
        for index in range(self.count):
            self.processes.append(subprocess.Popen(self.command(self.first_id + index), stdin=subprocess.DEVNULL))
        deadline = time.monotonic() + _START_TIMEOUT_S
        while len(self.server.active()) < self.count:
            self.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"remote collectors did not connect within {_START_TIMEOUT_S:g} s")
            time.sleep(0.05)

    @property
    def pids(self) -> List[int]:
        return [process.pid for process in self.processes]

    def check_alive(self) -> None:
        """Raises PeerLostError naming the first remote collector that exited while it should run."""
        if self.stopping:
            return
        for index, process in enumerate(self.processes):
            if process.poll() is not None:
                raise PeerLostError(f"remote collector {self.first_id + index} (pid {process.pid}) exited with code "
                                    f"{process.returncode}; the learner cannot go on without it")

    def stop(self) -> None:
        """Closes the learner's side (each collector then exits on its own), waits, kills stragglers."""
        self.stopping = True
        self.server.close()
        deadline = time.monotonic() + _STOP_TIMEOUT_S
        for process in self.processes:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
