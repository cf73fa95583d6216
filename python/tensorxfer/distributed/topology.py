"""Which ranks share memory: found by probing /dev/shm, not by hostname.

Every rank creates a tiny segment holding a random token and publishes its
name and token through the process group's store; each rank then reads every
rank's segment, and the ranks whose token it can read are on its host (they
see the same shared-memory file system). Containers of one pod share
``/dev/shm`` but not a hostname; two hosts may share a hostname: neither
fools the probe.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence

from tensorxfer.runtime.group import host_identity

SHM_DIR = "/dev/shm"
_TOKEN_BYTES = 16


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


def _read_token(name: str) -> bytes:
    try:
        fd = os.open(os.path.join(SHM_DIR, name), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return b""
    try:
        return os.read(fd, 2 * _TOKEN_BYTES + 1)
    finally:
        os.close(fd)


def group_by_visibility(views: Sequence[Sequence[int]]) -> List[List[int]]:
    """Local groups from each rank's visible ranks; raises if visibility is not an equivalence."""
    groups: List[List[int]] = []
    for rank, view in enumerate(views):
        members = sorted(view)
        if rank not in members:
            raise RuntimeError(f"tensorxfer backend: rank {rank} cannot read its own probe segment in {SHM_DIR}")
        for other in members:
            if sorted(views[other]) != members:
                raise RuntimeError(
                    f"tensorxfer backend: shared memory is not shared both ways: rank {rank} sees ranks "
                    f"{members}, rank {other} sees ranks {sorted(views[other])}")
        if members not in groups:
            groups.append(members)
    return sorted(groups)


def probe(store: Any, rank: int, world_size: int, timeout_s: float) -> Topology:
    """Collective over ``store`` (every rank calls it): the ranks that share this host's memory."""
    token = secrets.token_hex(_TOKEN_BYTES).encode("ascii")
    name = f"tensorxfer-{os.getpid()}-probe-{secrets.token_hex(8)}"
    path = os.path.join(SHM_DIR, name)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    try:
        os.write(fd, token)
    finally:
        os.close(fd)
    try:
        store.set(f"probe/{rank}", name.encode("ascii") + b" " + token)
        store.wait([f"probe/{r}" for r in range(world_size)])
        seen = []
        for other in range(world_size):
            other_name, other_token = bytes(store.get(f"probe/{other}")).split(b" ", 1)
            if _read_token(other_name.decode("ascii")) == other_token:
                seen.append(other)
        store.set(f"seen/{rank}", ",".join(map(str, seen)))
        store.wait([f"seen/{r}" for r in range(world_size)])
        views = [[int(x) for x in bytes(store.get(f"seen/{r}")).decode().split(",")] for r in range(world_size)]
    finally:
        # Every rank has published what it saw, so every read of this segment is over.
        os.unlink(path)
    return Topology(rank, group_by_visibility(views))


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
    cpus = len(os.sched_getaffinity(0))
    return 0.0 if same_machine > max(cpus, local_size) else None
