"""Which ranks share memory: the probe of tensorxfer.runtime.host_probe, exchanged
through the process group's store."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, List, Optional

from tensorxfer import _core
from tensorxfer.runtime.group import host_identity
from tensorxfer.runtime.host_probe import probe_hosts


@dataclass(frozen=True)
class Topology:
    """The local groups (lists of ranks, ordered by their lowest rank) and this rank's place in them."""

    rank: int
    hosts: List[List[int]]

    @property
    def host_index(self) -> int:
        return next(index for index, ranks in enumerate(self.hosts) if self.rank in ranks)

    @property
    def local_ranks(self) -> List[int]:
        return self.hosts[self.host_index]

    @property
    def local_rank(self) -> int:
        return self.local_ranks.index(self.rank)

    @property
    def equal_hosts(self) -> bool:
        return len({len(ranks) for ranks in self.hosts}) == 1


def probe(store: Any, rank: int, world_size: int, timeout_s: float) -> Topology:
    """Collective over ``store`` (every rank calls it): the ranks that share this host's memory."""
    steps = iter(range(2))

    def exchange(data: bytes) -> List[bytes]:
        step = next(steps)
        store.set(f"probe/{step}/{rank}", data)
        keys = [f"probe/{step}/{r}" for r in range(world_size)]
        store.wait(keys)
        return [bytes(store.get(key)) for key in keys]

    return Topology(rank, probe_hosts(exchange))


def spin_us_for_machine(store: Any, rank: int, world_size: int, local_size: int) -> Optional[float]:
    """0 (sleep at once) when ranks of other hosts share this machine and all its ranks outnumber its CPUs.

    Ranks on other "hosts" (no shared /dev/shm: containers, simulated hosts) may
    still share this machine's CPUs; the Communicator's own choice counts only
    its host's ranks, and spinning there would starve the others.
    """
    override = os.environ.get("TENSORXFER_DIST_SPIN_US", "").strip()  # for experiments
    if override:
        return float(override)
    machine = host_identity()[1]
    store.set(f"machine/{rank}", machine)
    same_machine = sum(bytes(store.get(f"machine/{r}")).decode() == machine for r in range(world_size))
    cpus = _core.cpu_features()["usable_cpus"]  # the affinity mask, or TENSORXFER_CPU_COUNT
    return 0.0 if same_machine > max(cpus, local_size) else None
