"""The copy engine of the resharding paths (copy services, executor, persistent plans).

It is the process's engine that never polls between jobs. Resharding ranks copy in
step with peer processes on the same cores: a worker polling after a job takes the
CPU the peer rank needs right then. Measured on 2 vCPUs, 2 ranks, 10,000 x 4 KiB
each way (bench_copy_services --cases a --backends shm): the persistent plan's run
took 6.1-6.3 ms with sleeping workers against 6.9-7.0 ms polling 50 us, the shm
service's repeat 11.0-11.1 against 11.3-11.6 ms. ``pack_rows``, one process calling
back to back, keeps the polling engine.
"""

from __future__ import annotations

from tensorxfer import _core
from tensorxfer.ipc.pack import default_copy_engine


def resharding_copy_engine() -> _core.CopyEngine:
    """The per-process copy engine whose workers always sleep between jobs."""
    return default_copy_engine(idle_spin_us=0)
