"""Which ranks share memory: found by probing /dev/shm, not by hostname.

Every rank creates a tiny segment holding a random token and publishes its name and
token to the others (through whatever exchange the caller has: a torch.distributed
store, a process group, an MPI communicator); each rank then reads every rank's segment,
and the ranks whose token it can read are on its host (they see the same shared-memory
file system). Containers of one pod share ``/dev/shm`` but not a hostname; two hosts may
share a hostname: neither fools the probe. Used by the torch.distributed backend and by
persistent plans whose ranks span hosts.
"""

from __future__ import annotations

import os
import secrets
from typing import Callable, List, Sequence

SHM_DIR = "/dev/shm"
_TOKEN_BYTES = 16

#: exchange(data) -> every rank's data, in rank order (collective: every rank calls it).
Exchange = Callable[[bytes], List[bytes]]


def _read_token(name: str) -> bytes:
    if "/" in name or not name.startswith("tensorxfer-"):
        return b""
    try:
        fd = os.open(os.path.join(SHM_DIR, name), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return b""
    try:
        return os.read(fd, 2 * _TOKEN_BYTES + 1)
    finally:
        os.close(fd)


def group_by_visibility(views: Sequence[Sequence[int]]) -> List[List[int]]:
    """The hosts (lists of ranks, ordered by their lowest rank) from each rank's visible
    ranks; raises RuntimeError if visibility is not an equivalence."""
    groups: List[List[int]] = []
    for rank, view in enumerate(views):
        members = sorted(view)
        if rank not in members:
            raise RuntimeError(f"tensorxfer: rank {rank} cannot read its own probe segment in {SHM_DIR}")
        for other in members:
            if not 0 <= other < len(views) or sorted(views[other]) != members:
                seen = sorted(views[other]) if 0 <= other < len(views) else "nothing (no such rank)"
                raise RuntimeError(
                    f"tensorxfer: shared memory is not shared both ways: rank {rank} sees ranks "
                    f"{members}, rank {other} sees ranks {seen}")
        if members not in groups:
            groups.append(members)
    return sorted(groups)


def probe_hosts(exchange: Exchange) -> List[List[int]]:
    """Collective over ``exchange`` (every rank calls it, twice): the hosts, as lists of
    ranks that share this machine's shared memory, ordered by their lowest rank."""
    token = secrets.token_hex(_TOKEN_BYTES).encode("ascii")
    name = f"tensorxfer-{os.getpid()}-probe-{secrets.token_hex(8)}"
    fd = os.open(os.path.join(SHM_DIR, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    try:
        os.write(fd, token)
    finally:
        os.close(fd)
    try:
        seen = []
        for other, item in enumerate(exchange(name.encode("ascii") + b" " + token)):
            other_name, _, other_token = bytes(item).partition(b" ")
            if other_token and _read_token(other_name.decode("ascii", "replace")) == other_token:
                seen.append(other)
        views = [[int(x) for x in bytes(item).decode().split(",") if x] for item in
                 exchange(",".join(map(str, seen)).encode())]
    finally:
        # Every rank has published what it saw, so every read of this segment is over.
        os.unlink(os.path.join(SHM_DIR, name))
    return group_by_visibility(views)


def host_of_ranks(hosts: Sequence[Sequence[int]]) -> List[int]:
    """For every rank, the index of its host in ``hosts``."""
    where = {rank: index for index, ranks in enumerate(hosts) for rank in ranks}
    return [where[rank] for rank in range(len(where))]
